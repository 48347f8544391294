"""A batch of row mutations as one commit-log append (``Tablet.apply_many``, §3 batches, §5.3).

Each entry is atomic on its own and acknowledged only once its record is durable; a bad entry
fails alone; entries of one row apply in their order; the row locks keep single-row
transactions on the same rows whole; a failed log PUT acknowledges nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from tabletstore.data.model import IncrementValue, Mutation, SetCell
from tabletstore.errors import NotFound, NotServing, TabletStoreError
from tabletstore.options import TabletOptions
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore
from tests.tablet_harness import LogGate, TabletHarness

BIG = TabletOptions(memtable_flush_bytes=1 << 30, max_sstables_per_group=2)


@pytest.fixture
async def store() -> FaultyObjectStore:
    return FaultyObjectStore(MemoryObjectStore())


@pytest.fixture
async def h(store: FaultyObjectStore) -> AsyncIterator[TabletHarness]:
    harness = TabletHarness(store, options=BIG)
    await harness.start()
    yield harness
    await harness.close()


def put(value: bytes, ts: int = 1000) -> list[Mutation]:
    return [SetCell("a", b"q", value, ts)]


async def test_each_entry_applies_alone_in_order_and_survives_a_crash(
    h: TabletHarness,
) -> None:
    assert h.catalog is not None
    rec = await h.record()
    await h.catalog.update(rec, replace(rec, start_row=b"b", end_row=b"y"))
    tablet = await h.recover()
    entries: list[tuple[bytes, list[Mutation]]] = [
        (b"k1", put(b"first")),
        (b"a-outside", put(b"x")),
        (b"k2", [SetCell("no-such-family", b"q", b"x", 1000)]),
        (b"k1", put(b"second")),  # same row, same timestamp: the later entry wins
        (b"k3", put(b"three")),
    ]
    errors = await tablet.apply_many(entries)
    assert errors[0] is None and errors[3] is None and errors[4] is None
    assert isinstance(errors[1], NotServing)
    assert isinstance(errors[2], NotFound)
    assert tablet._writes.row_locks.locks == {} and tablet._writes.row_locks.users == {}

    async def values() -> dict[bytes, bytes | None]:
        out: dict[bytes, bytes | None] = {}
        assert h.tablet is not None
        for key in (b"k1", b"k2", b"k3"):
            row = await h.tablet.read_row(key)
            out[key] = None if row is None else row.latest("a", b"q")
        return out

    expected = {b"k1": b"second", b"k2": None, b"k3": b"three"}
    assert await values() == expected
    # Acknowledged means logged: a crash and a replay of the log bring back the same rows.
    await h.crash()
    await h.recover()
    assert await values() == expected


async def test_a_failed_log_put_acknowledges_no_entry(
    h: TabletHarness, store: FaultyObjectStore
) -> None:
    tablet = h.tablet
    assert tablet is not None
    store.fail(Op.PUT, key=f"*{h.worker_id}*")
    errors = await tablet.apply_many([(b"r%d" % i, put(b"v")) for i in range(5)])
    assert all(isinstance(e, TabletStoreError) for e in errors), errors
    for i in range(5):
        assert await tablet.read_row(b"r%d" % i) is None
    assert tablet._writes.row_locks.locks == {}


async def test_row_locks_keep_read_modify_writes_whole(h: TabletHarness) -> None:
    """Batches writing other columns of a row never lose an increment of that row, and two
    batches with the same rows in opposite orders do not deadlock."""
    tablet = h.tablet
    assert tablet is not None
    rows = [b"r%02d" % i for i in range(8)]

    async def increments() -> None:
        for _ in range(20):
            for row in rows[:2]:
                await tablet.read_modify_write(row, [IncrementValue("a", b"n", 1)])

    async def batches(order: list[bytes]) -> None:
        for j in range(20):
            errors = await tablet.apply_many([(r, put(b"%d" % j, 0)) for r in order])
            assert errors == [None] * len(order)

    await asyncio.wait_for(
        asyncio.gather(increments(), batches(rows), batches(rows[::-1])), timeout=60
    )
    for row in rows[:2]:
        got = await tablet.read_row(row)
        assert got is not None and int.from_bytes(got.latest("a", b"n") or b"", "big") == 20
    assert tablet._writes.row_locks.locks == {} and tablet._writes.row_locks.users == {}


async def test_a_batch_in_flight_holds_the_log_position_back() -> None:
    """A minor compaction while a batch's log PUT is in flight must not move the tablet's log
    position (§5.3 redo point) past the segment that batch is in: the batch's cells reach the
    memtable after the freeze, so recovery has to read that segment (the acknowledged write
    was lost when apply_many took no in-flight mark)."""
    harness = TabletHarness(MemoryObjectStore(), options=BIG)
    gated = LogGate(MemoryObjectStore(), harness.worker_id)
    harness.store = gated  # type: ignore[assignment]
    tablet = await harness.start()
    try:
        assert harness.log is not None
        await tablet.apply(b"before", put(b"v0"))
        gated.gate = asyncio.Event()
        batch = asyncio.create_task(tablet.apply_many([(b"k", put(b"v1"))]))
        await asyncio.wait_for(gated.waiting.wait(), timeout=30)
        await tablet.minor_compact()  # flushes "before"; "k" is not in the memtable yet
        gated.gate.set()
        assert await asyncio.wait_for(batch, timeout=30) == [None]
        await harness.crash()
        tablet = await harness.recover()
        row = await tablet.read_row(b"k")
        assert row is not None and row.latest("a", b"q") == b"v1"
    finally:
        await harness.close()
