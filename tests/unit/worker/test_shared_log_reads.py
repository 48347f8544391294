"""A worker recovering several tablets from one dead log reads it once
(worker/shared_log_reads.py): the N-fold read of §6 "Commit-log implementation", bounded within
one worker."""

from __future__ import annotations

import asyncio

import pytest

from tabletstore.clock import ManualClock
from tabletstore.commitlog import CommitLogWriter
from tabletstore.errors import Corruption
from tabletstore.keys import Cell, CellKind
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.layout import log_segment_key
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore
from tabletstore.worker.shared_log_reads import SharedLogReads, tablet_cells


def put(row: bytes, seq: int) -> list[Cell]:
    return [Cell(row, "f", b"q", 1000, seq, CellKind.PUT, b"v%d" % seq)]


def tablet(tablet_id: str, start: bytes, end: bytes | None, redo: int = 0) -> TabletRecord:
    return TabletRecord(
        table_id="t", tablet_id=tablet_id, start_row=start, end_row=end, redo_seq=redo
    )


async def write_dead_log(store: MemoryObjectStore, segments: int = 20) -> None:
    async with CommitLogWriter(store, "dead", 1, max_segment_bytes=1) as log:
        for n in range(segments):
            row = b"r%02d" % n
            await log.append("t", row, put(row, log.allocate(1)))


async def test_concurrent_recoveries_share_one_fenced_read() -> None:
    inner = MemoryObjectStore()
    await write_dead_log(inner)
    store = FaultyObjectStore(inner)
    counter = store.delay(0.0, Op.GET, key="logs/*", times=None)
    reads = SharedLogReads(store, ManualClock())
    ref = LogRef("dead", 1)
    left, right = tablet("a", b"", b"r10", redo=3), tablet("b", b"r10", None)
    got = await asyncio.gather(reads.records(ref), reads.records(ref), reads.records(ref))
    assert got[0] is got[1] is got[2]
    assert counter.seen == 21  # each segment and the fence once, for three loads
    assert [c.row for c in tablet_cells(got[0], left)] == [b"r%02d" % n for n in range(3, 10)]
    assert [c.row for c in tablet_cells(got[0], right)] == [b"r%02d" % n for n in range(10, 20)]
    assert await inner.get(log_segment_key("dead", 1, 20)) == b""  # fenced once


async def test_a_damaged_log_is_corruption_for_every_load_and_never_cached() -> None:
    store = MemoryObjectStore()
    await write_dead_log(store)
    await store.delete(log_segment_key("dead", 1, 5))
    clock = ManualClock()
    reads = SharedLogReads(store, clock, keep=1.0)
    for _ in range(2):
        with pytest.raises(Corruption, match="missing"):
            await reads.records(LogRef("dead", 1))


async def test_records_expire_after_their_last_use() -> None:
    store = MemoryObjectStore()
    await write_dead_log(store, 3)
    clock = ManualClock()
    reads = SharedLogReads(store, clock, keep=5.0)
    first = await reads.records(LogRef("dead", 1))
    clock.advance(4.0)
    assert await reads.records(LogRef("dead", 1)) is first
    clock.advance(6.0)
    assert await reads.records(LogRef("dead", 1)) is not first
