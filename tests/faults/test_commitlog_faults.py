"""Commit-log writer under failing PUTs, lost acknowledgements and fencing races.

The invariant pinned throughout: after recovery fences the log, every acknowledged append is
read back, and nothing the writer failed with a definite error (Unavailable, Fenced) is.
Indeterminate appends may or may not be read back.
"""

from __future__ import annotations

import asyncio

import pytest

from tabletstore.clock import ManualClock
from tabletstore.commitlog import CommitLogReader, CommitLogWriter, fence
from tabletstore.errors import Fenced, Indeterminate, TabletStoreError, Unavailable
from tabletstore.keys import Cell, CellKind
from tabletstore.storage_s3.base import ObjectStore, Op
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.storage_s3.retrying import RetryingObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore


def one_cell(row: bytes, seq: int) -> list[Cell]:
    return [Cell(row, "cf", b"q", 1, seq, CellKind.PUT, b"v")]


async def recovered_rows(
    store: ObjectStore, worker: str = "w", incarnation: int = 1
) -> list[bytes]:
    await fence(store, worker, incarnation)
    reader = CommitLogReader(store, worker, incarnation)
    return [r.row async for r in reader.records()]


async def run_waves(
    log: CommitLogWriter, waves: int, per_wave: int
) -> dict[bytes, BaseException | None]:
    """Append ``waves`` groups of concurrent appends; the outcome of each row."""
    outcome: dict[bytes, BaseException | None] = {}

    async def one(row: bytes) -> None:
        try:
            await log.append("t", row, one_cell(row, log.allocate(1)))
            outcome[row] = None
        except TabletStoreError as exc:
            outcome[row] = exc

    for w in range(waves):
        await asyncio.gather(*(one(b"w%02d-%03d" % (w, i)) for i in range(per_wave)))
    return outcome


def check_outcomes(outcome: dict[bytes, BaseException | None], read: list[bytes]) -> None:
    durable = set(read)
    assert len(read) == len(durable), "a record was read twice"
    for row, result in outcome.items():
        if result is None:
            assert row in durable, f"acknowledged {row!r} lost"
        elif isinstance(result, (Unavailable, Fenced)):
            assert row not in durable, f"{row!r} failed definitely but is in the log"
        else:
            assert isinstance(result, Indeterminate), result


@pytest.mark.parametrize("nth", [1, 2, 3, 5])
async def test_put_failing_mid_stream_stops_the_log(nth: int) -> None:
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.fail(Op.PUT, key="logs/*", nth=nth)
    async with CommitLogWriter(faulty, "w", 1) as log:
        outcome = await run_waves(log, waves=6, per_wave=10)
        assert isinstance(log.failed, Unavailable)
        with pytest.raises(Unavailable, match="new incarnation"):
            await log.append("t", b"late", one_cell(b"late", log.allocate(1)))
    kinds = {type(e) for e in outcome.values()}
    # The failed PUT stored nothing and the writer's plug holds its number: its writes are
    # definitely not logged (Unavailable); only segments sent after it stay Indeterminate.
    assert Unavailable in kinds
    assert (type(None) in kinds) == (nth > 1)
    assert log.stats.segments == nth - 1
    check_outcomes(outcome, await recovered_rows(faulty.inner))


async def test_a_lost_ack_is_settled_by_reading_the_segment_back() -> None:
    """The PUT landed but its answer was lost: the writer's create-only plug collides with
    the segment, which is its own, so the writes are acknowledged and the log goes on."""
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.lose_ack(Op.PUT, key="logs/*", nth=2)
    async with CommitLogWriter(faulty, "w", 1) as log:
        outcome = await run_waves(log, waves=4, per_wave=5)
        assert log.failed is None
    assert all(r is None for r in outcome.values()), outcome
    read = await recovered_rows(faulty.inner)
    check_outcomes(outcome, read)
    assert sorted(read) == sorted(outcome)


async def test_a_lost_ack_that_cannot_be_settled_stays_indeterminate() -> None:
    """The PUT landed, its answer was lost, and the store fails the settling too: the writes
    are Indeterminate (they are in the log and a replay brings them back)."""
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.lose_ack(Op.PUT, key="logs/*", nth=2)
    faulty.fail(Op.PUT, key="logs/*", nth=3, times=None)
    async with CommitLogWriter(faulty, "w", 1) as log:
        outcome = await run_waves(log, waves=4, per_wave=5)
    read = await recovered_rows(faulty.inner)
    check_outcomes(outcome, read)
    lost = [row for row, r in outcome.items() if isinstance(r, Indeterminate)]
    assert lost and set(lost) <= set(read)  # here they did happen


async def test_retrying_store_turns_a_lost_ack_into_success() -> None:
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.lose_ack(Op.PUT, key="logs/*", nth=2)
    faulty.fail(Op.PUT, key="logs/*", nth=4)
    store = RetryingObjectStore(faulty, clock=ManualClock(), base_delay=0.0, max_delay=0.0)
    async with CommitLogWriter(store, "w", 1) as log:
        outcome = await run_waves(log, waves=5, per_wave=5)
        assert log.failed is None
    assert all(r is None for r in outcome.values())
    read = await recovered_rows(faulty.inner)
    assert sorted(read) == sorted(outcome)


class Gate:
    """Holds creates of one key until opened (a slow PUT racing with recovery)."""

    def __init__(self, inner: ObjectStore, key_suffix: str) -> None:
        self.faulty = FaultyObjectStore(inner)
        self.suffix = key_suffix
        self.open = asyncio.Event()
        self.waiting = asyncio.Event()
        original = self.faulty.create

        async def create(key: str, data: bytes) -> None:
            if key.endswith(self.suffix) and data:
                self.waiting.set()
                await self.open.wait()
            await original(key, data)

        self.faulty.create = create  # type: ignore[method-assign]


async def test_fence_while_a_put_is_in_flight() -> None:
    inner = MemoryObjectStore()
    gate = Gate(inner, "00000000000000000001.log")
    async with CommitLogWriter(gate.faulty, "w", 1) as log:
        await log.append("t", b"before", one_cell(b"before", log.allocate(1)))
        slow = asyncio.create_task(log.append("t", b"slow", one_cell(b"slow", log.allocate(1))))
        await gate.waiting.wait()
        assert await fence(inner, "w", 1) == 1  # recovery wins the race for number 1
        gate.open.set()
        with pytest.raises(Fenced):
            await slow
        with pytest.raises(Fenced):
            await log.append("t", b"after", one_cell(b"after", log.allocate(1)))
    assert [r.row async for r in CommitLogReader(inner, "w", 1).records()] == [b"before"]


async def test_many_random_failures_never_lose_an_acknowledged_append() -> None:
    for seed in range(12):
        faulty = FaultyObjectStore(MemoryObjectStore())
        nth = 1 + seed % 6
        if seed % 3 == 0:
            faulty.lose_ack(Op.PUT, key="logs/*", nth=nth)
        else:
            faulty.fail(Op.PUT, key="logs/*", nth=nth)
        async with CommitLogWriter(faulty, "w", 1, max_segment_bytes=200) as log:
            outcome = await run_waves(log, waves=4, per_wave=3 + seed)
        check_outcomes(outcome, await recovered_rows(faulty.inner))
