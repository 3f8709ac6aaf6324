"""The host's side of a runtime's channel: numbered request and reply frames over two pipes,
each call bounded by a deadline, so that a reply can only answer the request it was sent for."""

from __future__ import annotations

import json
import os
import select
import time
from typing import Any, Callable

from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxStartError
from pyvision_jax.agent.sandbox.runtime.protocol import HEADER, MAGIC, READY_OP, REPLY_OP


class CallTimeout(Exception):
    """A call overran its deadline."""


class ChannelClosed(Exception):
    """The runtime's end of the channel is gone."""


class ProtocolError(Exception):
    """The runtime sent something that is not a well-formed answer."""


def wait_readable(fd: int, deadline: float, cancelled: Callable[[], bool]) -> None:
    """Waits until `fd` has data; CallTimeout past `deadline`, SandboxStartError once
    `cancelled()`."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CallTimeout()
        if cancelled():
            raise SandboxStartError("the start was cancelled")
        if poller.poll(max(1, min(100, int(remaining * 1000)))):
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
        os.set_blocking(request_fd, False)
        os.set_blocking(reply_fd, False)

    def _read_exact(self, size: int, deadline: float) -> bytes:
        buffer = bytearray()
        while len(buffer) < size:
            try:
                chunk = os.read(self._reply_fd, min(size - len(buffer), 1 << 22))
            except BlockingIOError:
                wait_readable(self._reply_fd, deadline, self._cancelled)
                continue
            except OSError as exc:  # the pipe was closed under the call (the sandbox is closing)
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
        poller = select.poll()
        poller.register(self._request_fd, select.POLLOUT)
        while view:
            try:
                view = view[os.write(self._request_fd, view) :]
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CallTimeout() from None
                poller.poll(max(1, int(remaining * 1000)))
            except (BrokenPipeError, OSError) as exc:
                raise ChannelClosed() from exc

    def receive_ready(self, deadline: float) -> dict[str, Any]:
        """The runtime's first frame, which says whether it started."""
        ready, _ = self._receive(deadline)
        if ready.get("op") != READY_OP or ready.get("seq") != 0:
            raise ProtocolError(f"unexpected first frame {ready!r}")
        return ready

    def call(self, message: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], bytes]:
        """Sends one request and returns its reply; raises CallTimeout, ChannelClosed or
        ProtocolError (after which the runtime must be killed)."""
        self._seq += 1
        deadline = time.monotonic() + timeout_s
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
        for fd in (self._request_fd, self._reply_fd):
            try:
                os.close(fd)
            except OSError:
                pass
