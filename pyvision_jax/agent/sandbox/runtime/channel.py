"""The runtime's side of the channel: request frames read from the host, reply frames written
back, and the watch that ends the runtime when its owner is gone."""

from __future__ import annotations

import builtins
import json
import os
import select
from typing import Any

from .protocol import HEADER, MAGIC, MAX_REQUEST_JSON_BYTES

globals()["__builtins__"] = dict(vars(builtins))  # a private copy: see the package docstring

REQUEST_FD = 1021
REPLY_FD = 1022

_os_read = os.read
_os_write = os.write
_os_exit = os._exit
_json_dumps = json.dumps
_json_loads = json.loads
_header_pack = HEADER.pack
_header_unpack = HEADER.unpack
_bytes_join = b"".join


def _read_exact(fd: int, size: int) -> bytes:
    chunks = []
    remaining = size
    while remaining:
        chunk = _os_read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("host closed the request channel")
        chunks.append(chunk)
        remaining -= len(chunk)
    return _bytes_join(chunks)


def read_frame(fd: int) -> Any:
    magic, json_size, blob_size = _header_unpack(_read_exact(fd, HEADER.size))
    if magic != MAGIC or json_size > MAX_REQUEST_JSON_BYTES or blob_size:
        raise ValueError("malformed request frame")
    return _json_loads(_read_exact(fd, json_size).decode("utf-8"))


def write_frame(fd: int, message: dict[str, Any], blobs: tuple[bytes, ...] | list[bytes] = ()) -> None:
    payload = _json_dumps(message, ensure_ascii=False).encode("utf-8")
    blob = _bytes_join(blobs)
    view = memoryview(_bytes_join([_header_pack(MAGIC, len(payload), len(blob)), payload, blob]))
    while view:
        written = _os_write(fd, view)
        view = view[written:]


def watch_host(fd: int) -> None:
    """Exit as soon as the host side of the request channel is gone (owner died)."""
    poller = select.poll()
    poller.register(fd, 0)
    while True:
        for _, events in poller.poll():
            if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                _os_exit(0)
