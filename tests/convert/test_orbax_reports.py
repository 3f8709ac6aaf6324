"""The stray reports orbax's failed reads leave are dropped; every other asyncio report passes."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from pyvision_jax.convert.orbax_reports import drop_stray_orbax_reports

DAMAGED_READ = (
    'NOT_FOUND: Error opening "zarr" driver: Error reading "params.visual.blocks.mlp.up_proj.kernel/.zarray" '
    'in OCDBT database at local file "/tmp/run2/checkpoints/2/state/"'
)


async def _fail(error: BaseException) -> None:
    raise error


def _report_an_unretrieved_task(error: BaseException) -> None:
    """asyncio logs "Task exception was never retrieved" when a failed task nobody awaited is
    collected; `ensure_future` on an awaitable wraps it in `_wrap_awaitable`, as orbax's reads are."""

    class Awaitable:
        def __await__(self):
            return _fail(error).__await__()

    loop = asyncio.new_event_loop()
    try:
        task = asyncio.ensure_future(Awaitable(), loop=loop)
        loop.run_until_complete(asyncio.wait([task]))
    finally:
        loop.close()
    del task
    gc.collect()


@pytest.fixture
def asyncio_records(caplog):
    drop_stray_orbax_reports()
    caplog.set_level(logging.ERROR, logger="asyncio")
    return caplog


def test_an_unretrieved_tensorstore_read_wrapped_by_asyncio_is_dropped(asyncio_records):
    _report_an_unretrieved_task(ValueError(DAMAGED_READ))
    assert not [r for r in asyncio_records.records if "never retrieved" in r.getMessage()]


def test_an_unretrieved_task_of_other_code_is_still_reported(asyncio_records):
    _report_an_unretrieved_task(ValueError("a bug in user code"))
    messages = [r.getMessage() for r in asyncio_records.records]
    assert any(m.startswith("Task exception was never retrieved") and "a bug in user code" in m for m in messages)
