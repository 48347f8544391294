"""The replicator takes a partition's changes in runs (what the stream had ready together) and
applies a run's rows at once: ``_runs`` cuts the runs, ``_all_or_none`` applies them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tabletstore.client.replicator import _all_or_none, _runs


async def _stream(bursts: list[list[int]], gate: asyncio.Event) -> AsyncIterator[int]:
    for burst in bursts:
        for item in burst:
            yield item
        gate.clear()
        await gate.wait()  # the stream waits for its next listing


async def test_a_burst_the_stream_delivers_at_once_is_one_run() -> None:
    gate = asyncio.Event()
    runs = _runs(_stream([[1, 2, 3], [4, 5], [6]], gate), 100)
    got = [await anext(runs)]
    gate.set()
    got.append(await anext(runs))
    gate.set()
    got.append(await anext(runs))
    await runs.aclose()
    assert got == [[1, 2, 3], [4, 5], [6]]


async def test_runs_are_cut_at_the_limit_and_end_with_the_stream() -> None:
    async def items() -> AsyncIterator[int]:
        for i in range(7):
            yield i

    got = [run async for run in _runs(items(), 3)]
    assert [i for run in got for i in run] == list(range(7))
    assert all(1 <= len(run) <= 3 for run in got)


async def test_an_error_of_the_stream_comes_after_the_items_before_it() -> None:
    async def items() -> AsyncIterator[int]:
        yield 1
        yield 2
        raise ConnectionError("the source went away")

    seen: list[int] = []
    with pytest.raises(ConnectionError, match="went away"):
        async for run in _runs(items(), 10):
            seen += run
    assert seen == [1, 2]


async def test_the_first_failure_cancels_the_other_rows_and_is_raised_as_it_is() -> None:
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def slow() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def failing() -> None:
        await started.wait()
        raise LookupError("replica refused")

    with pytest.raises(LookupError, match="refused"):
        await asyncio.wait_for(_all_or_none([slow(), failing()]), timeout=30)
    assert cancelled == [True]
