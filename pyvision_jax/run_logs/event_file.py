"""A TensorBoard event file written synchronously, in the caller's thread.

The stock `tensorboard.summary.DirectoryOutput` hands records to a background thread; when a
write fails there (a full disk) the thread prints its own traceback to stderr before the error
reaches the caller, so a run that should end with one line ends with a screen of them. Here each
record goes to the file as one unbuffered write at `emit_scalar`: a failure raises `OSError`
there, nothing is left buffered for a later flush or for garbage collection to retry, and the
files read back with `tensorboard.backend.event_processing` like the stock writer's.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary import Output
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

_FILE_VERSION = "brain.Event:2"
_FILE_NUMBERS = itertools.count()


class _WholeWrites:
    """An unbuffered binary file whose `write` loops until every byte is written."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "xb", buffering=0)  # noqa: SIM115 - closed by close()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self._file.write(view)
            view = view[written:]

    def flush(self) -> None:
        """Nothing is buffered."""

    def close(self) -> None:
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed


class SynchronousEventOutput(Output):
    """Writes scalar summaries to a new event file under `logdir`, one record per call."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        logdir = os.fspath(logdir)
        os.makedirs(logdir, exist_ok=True)
        # TensorBoard reads a directory's event files in name order: the fields are padded so
        # that files opened within one second (or by processes whose pids differ in length)
        # sort in the order they were written.
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid():07d}"
        self.path = os.path.join(logdir, f"{name}.{next(_FILE_NUMBERS):06d}")
        self._records = RecordWriter(_WholeWrites(self.path))
        self._write(event_pb2.Event(wall_time=time.time(), file_version=_FILE_VERSION))

    def _write(self, event: event_pb2.Event) -> None:
        if self._records.closed:
            raise RuntimeError(f"event file {self.path} is closed")
        self._records.write(event.SerializeToString())

    def emit_scalar(
        self,
        *,
        plugin_name: str,
        tag: str,
        data: Any,
        step: Any,
        wall_time: float,
        tag_metadata: bytes | None = None,
        description: str | None = None,
    ) -> None:
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin_name, content=tag_metadata),
            summary_description=description,
            data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR,
        )
        event = event_pb2.Event(wall_time=wall_time, step=int(step))
        event.summary.value.add(tag=tag, tensor=tensor_util.make_tensor_proto(data), metadata=metadata)
        self._write(event)

    def flush(self) -> None:
        """Every record is on disk (in the page cache) when `emit_scalar` returns."""

    def close(self) -> None:
        if not self._records.closed:
            self._records.close()
