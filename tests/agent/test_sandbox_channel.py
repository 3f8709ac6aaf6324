"""The host side of a runtime's channel over plain pipes (no runtime): a close from another
thread wakes a call in flight, and no descriptor is closed while that call can still read it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from pyvision_jax.agent.sandbox.channel import CallTimeout, ChannelClosed, RuntimeChannel
from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.runtime.protocol import HEADER


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.fixture
def pipes():
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    yield request_read, request_write, reply_read, reply_write
    for fd in (request_read, reply_write):
        os.close(fd)


def _read_request(fd: int, timeout_s: float = 5.0) -> bytes:
    """The request frame the channel sent (waits for it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return os.read(fd, 1 << 16)
        except BlockingIOError:
            time.sleep(0.01)
    raise AssertionError("no request arrived")


def test_close_from_another_thread_wakes_the_call_and_defers_closing_its_descriptors(pipes):
    request_read, request_write, reply_read, _ = pipes
    os.set_blocking(request_read, False)
    hold, held, release = threading.Event(), threading.Event(), threading.Event()

    def cancelled() -> bool:
        """Holds the call inside its wait (the channel still in flight) while the test looks."""
        if hold.is_set():
            held.set()
            release.wait(10)
        return False

    channel = RuntimeChannel(request_write, reply_read, SandboxConfig(), cancelled)
    outcome: dict[str, object] = {}

    def call() -> None:
        started = time.monotonic()
        try:
            channel.call({"op": "run", "code": "pass"}, timeout_s=30)
        except Exception as exc:  # the outcome is what the test asserts
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    caller = threading.Thread(target=call)
    caller.start()
    frame = _read_request(request_read)
    assert len(frame) > HEADER.size  # the call has sent its request and now waits for the reply
    hold.set()
    assert held.wait(5)  # the call is inside its wait for the reply
    channel.close()
    reused = [os.pipe() for _ in range(4)]
    # while the call can still read, its descriptors stay open and are not handed out again
    assert _open(reply_read) and _open(request_write)
    assert not {reply_read, request_write} & {fd for pair in reused for fd in pair}
    release.set()
    caller.join(5)
    assert not caller.is_alive()
    assert isinstance(outcome["error"], ChannelClosed)
    assert outcome["seconds"] < 5
    for pair in reused:
        for fd in pair:
            os.close(fd)
    assert not _open(reply_read) and not _open(request_write)
    with pytest.raises(ChannelClosed):
        channel.call({"op": "run", "code": "pass"}, timeout_s=1)


def test_close_with_no_call_in_flight_closes_at_once_and_twice_is_harmless(pipes):
    _, request_write, reply_read, _ = pipes
    channel = RuntimeChannel(request_write, reply_read, SandboxConfig(), lambda: False)
    channel.close()
    assert not _open(reply_read) and not _open(request_write)
    channel.close()


def test_a_call_with_no_reply_times_out_and_the_channel_stays_usable_to_close(pipes):
    _, request_write, reply_read, _ = pipes
    channel = RuntimeChannel(request_write, reply_read, SandboxConfig(), lambda: False)
    with pytest.raises(CallTimeout):
        channel.call({"op": "run", "code": "pass"}, timeout_s=0.2)
    assert _open(reply_read)
    channel.close()
    assert not _open(reply_read)
