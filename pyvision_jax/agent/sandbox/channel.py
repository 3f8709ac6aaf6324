"""The host's side of a runtime's channel: numbered request and reply frames over two pipes,
each call bounded by a deadline, so that a reply can only answer the request it was sent for.

Closing the channel from another thread wakes a call in flight (it raises ChannelClosed) and
leaves the descriptors to that call to close on its way out: a descriptor closed under a
blocked read could be reused by the next pipe the process opens, and the read would then take
another runtime's bytes."""

from __future__ import annotations

import json
import os
import select
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxStartError
from pyvision_jax.agent.sandbox.runtime.protocol import HEADER, MAGIC, READY_OP, REPLY_OP


class CallTimeout(Exception):
    """A call overran its deadline."""


class ChannelClosed(Exception):
    """The runtime's end of the channel is gone."""


class ProtocolError(Exception):
    """The runtime sent something that is not a well-formed answer."""


def wait_ready(
    fd: int, deadline: float, cancelled: Callable[[], bool], *, event: int = select.POLLIN, wake_fd: int | None = None
) -> None:
    """Waits for `event` (data, by default) on `fd`: CallTimeout past `deadline`,
    SandboxStartError once `cancelled()`, ChannelClosed once `wake_fd` is readable."""
    poller = select.poll()
    poller.register(fd, event)
    if wake_fd is not None:
        poller.register(wake_fd, select.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CallTimeout()
        if cancelled():
            raise SandboxStartError("the start was cancelled")
        ready = dict(poller.poll(max(1, min(100, int(remaining * 1000)))))
        if wake_fd is not None and wake_fd in ready:
            raise ChannelClosed()
        if ready:
            return


class RuntimeChannel:
    """The host's ends of the request and reply pipes of one runtime (both non-blocking).

    `cancelled` is consulted while waiting for a reply, to abandon a start in progress.
    """

    def __init__(self, request_fd: int, reply_fd: int, config: SandboxConfig, cancelled: Callable[[], bool]):
        self._request_fd = request_fd
        self._reply_fd = reply_fd
        self._config = config
        self._cancelled = cancelled
        self._seq = 0
        self._wake_read, self._wake_write = os.pipe()
        self._state_lock = threading.Lock()
        self._in_flight = 0
        self._closed = False
        for fd in (request_fd, reply_fd, self._wake_read, self._wake_write):
            os.set_blocking(fd, False)

    @contextmanager
    def _exchange(self) -> Iterator[None]:
        """One request or reply exchange: refused once closed; the last one out after a
        close closes the descriptors."""
        with self._state_lock:
            if self._closed:
                raise ChannelClosed()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._state_lock:
                self._in_flight -= 1
                if self._closed and not self._in_flight:
                    self._close_descriptors()

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        wait_ready(fd, deadline, self._cancelled, event=event, wake_fd=self._wake_read)

    def _read_exact(self, size: int, deadline: float) -> bytes:
        buffer = bytearray()
        while len(buffer) < size:
            try:
                chunk = os.read(self._reply_fd, min(size - len(buffer), 1 << 22))
            except BlockingIOError:
                self._wait(self._reply_fd, select.POLLIN, deadline)
                continue
            except OSError as exc:
                raise ChannelClosed() from exc
            if not chunk:
                raise ChannelClosed()
            buffer += chunk
        return bytes(buffer)

    def _max_blob_bytes(self) -> int:
        return self._config.max_images_per_call * (4 * self._config.max_image_pixels + (1 << 20))

    def _receive(self, deadline: float) -> tuple[dict[str, Any], bytes]:
        magic, json_size, blob_size = HEADER.unpack(self._read_exact(HEADER.size, deadline))
        if magic != MAGIC:
            raise ProtocolError("reply frame has a bad magic number")
        max_json = 4 * self._config.max_stdout_bytes + (1 << 20)
        if json_size > max_json or blob_size > self._max_blob_bytes():
            raise ProtocolError(f"reply frame too large ({json_size} + {blob_size} bytes)")
        try:
            message = json.loads(self._read_exact(json_size, deadline))
        except ValueError as exc:
            raise ProtocolError(f"reply is not valid JSON: {exc}") from exc
        if not isinstance(message, dict):
            raise ProtocolError("reply is not a JSON object")
        return message, self._read_exact(blob_size, deadline)

    def _send(self, message: dict[str, Any], deadline: float) -> None:
        payload = json.dumps(message).encode("utf-8")
        view = memoryview(HEADER.pack(MAGIC, len(payload), 0) + payload)
        while view:
            try:
                view = view[os.write(self._request_fd, view) :]
            except BlockingIOError:
                self._wait(self._request_fd, select.POLLOUT, deadline)
            except OSError as exc:
                raise ChannelClosed() from exc

    def receive_ready(self, deadline: float) -> dict[str, Any]:
        """The runtime's first frame, which says whether it started."""
        with self._exchange():
            ready, _ = self._receive(deadline)
        if ready.get("op") != READY_OP or ready.get("seq") != 0:
            raise ProtocolError(f"unexpected first frame {ready!r}")
        return ready

    def call(self, message: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], bytes]:
        """Sends one request and returns its reply; raises CallTimeout, ChannelClosed or
        ProtocolError (after which the runtime must be killed)."""
        self._seq += 1
        deadline = time.monotonic() + timeout_s
        with self._exchange():
            self._send(dict(message, seq=self._seq), deadline)
            reply, blob = self._receive(deadline)
        if reply.get("op") != REPLY_OP or reply.get("seq") != self._seq:
            raise ProtocolError(f"reply answers request {reply.get('seq')!r}, not {self._seq}")
        sizes = reply.get("image_sizes")
        if (
            not isinstance(sizes, list)
            or not all(isinstance(n, int) and n >= 0 for n in sizes)
            or sum(sizes) != len(blob)
            or len(sizes) > self._config.max_images_per_call
        ):
            raise ProtocolError("reply image sizes do not match its payload")
        return reply, blob

    def close(self) -> None:
        """Closes the channel; safe from any thread, at any time, more than once."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            if self._in_flight:
                os.write(self._wake_write, b"x")
            else:
                self._close_descriptors()

    def _close_descriptors(self) -> None:
        for fd in (self._request_fd, self._reply_fd, self._wake_read, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass
