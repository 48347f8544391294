"""The replicator takes a partition's changes in runs (what the stream had ready together) and
applies a run's rows at once: ``_runs`` cuts the runs, ``_all_or_none`` applies them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from tabletstore.client.change_plan import Change, ChangePartition
from tabletstore.client.replication_plan import starting
from tabletstore.client.replicator import TableReplicator, _all_or_none, _runs
from tabletstore.data.validation import REPLICATOR


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


async def test_a_run_retried_after_an_error_applies_only_what_it_had_not() -> None:
    """A run fails part way (one row's write raised): the partition resumes before the run,
    and the rows already applied in this process are not applied again (the chaos replica
    check would count them as repeated), each row's changes still in order."""
    part = ChangePartition(b"", None)
    source, replica = SimpleNamespace(), SimpleNamespace(identity=REPLICATOR)
    replicator = TableReplicator(source, "s3://src", replica, "t")  # type: ignore[arg-type]
    replicator.progress = starting("s3://src", "t", [part], 0.0)
    replicator._saved_at = float("inf")  # no progress record to write here
    calls: list[tuple[bytes, int]] = []
    fail = {(b"b", 1)}

    async def apply(change: Change) -> None:
        calls.append((change.row, change.seq))
        if (change.row, change.seq) in fail:
            fail.clear()
            raise RuntimeError("the replica refused once")

    replicator._apply = apply  # type: ignore[method-assign]
    run = [
        Change(b"a", 1.0, 1, (), "t1"),
        Change(b"b", 1.0, 1, (), "t2"),
        Change(b"a", 1.0, 2, (), "t3"),
    ]
    with pytest.raises(RuntimeError):
        await replicator._apply_run(part, run)
    assert replicator.progress.applied_changes == 0
    await replicator._apply_run(part, run)
    assert sorted(calls) == [(b"a", 1), (b"a", 2), (b"b", 1), (b"b", 1)]
    assert [c for c in calls if c[0] == b"a"] == [(b"a", 1), (b"a", 2)]
    assert replicator.progress.applied_changes == 3
    assert dict(replicator.progress.followed)[part] == ("t3",)
