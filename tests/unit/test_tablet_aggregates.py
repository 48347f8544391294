"""Aggregate families in a tablet: writes, reads, flushes, merging and major compactions,
deletions, and recovery from the commit log without counting a write twice (§5.3, §5.4)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import pytest

from tabletstore.data import hll
from tabletstore.data.model import (
    AddToCell,
    DeleteCells,
    DeleteRow,
    MergeToCell,
    SetCell,
)
from tabletstore.data.query import RowRange
from tabletstore.data.schema import ColumnFamily, LocalityGroup, TableSchema
from tabletstore.errors import InvalidArgument
from tabletstore.options import TabletOptions
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore
from tests.tablet_harness import TabletHarness

BIG = TabletOptions(memtable_flush_bytes=1 << 30, max_sstables_per_group=8)


def agg_schema() -> TableSchema:
    return TableSchema(
        name="counters",
        families={
            "s": ColumnFamily(name="s", value_type="sum"),
            "lo": ColumnFamily(name="lo", value_type="min"),
            "hi": ColumnFamily(name="hi", value_type="max", locality_group="other"),
            "u": ColumnFamily(name="u", value_type="hll", locality_group="other"),
            "p": ColumnFamily(name="p"),
        },
        locality_groups={
            "default": LocalityGroup(name="default"),
            "other": LocalityGroup(name="other", compression="none", block_size=1024),
        },
    )


@pytest.fixture
async def h() -> AsyncIterator[TabletHarness]:
    harness = TabletHarness(
        FaultyObjectStore(MemoryObjectStore()), options=BIG, schema=agg_schema()
    )
    await harness.start()
    yield harness
    await harness.close()


def i64(v: bytes | None) -> int | None:
    return None if v is None else int(struct.unpack(">q", v)[0])


async def value(h: TabletHarness, row: bytes, fam: str, q: bytes = b"q") -> int | None:
    assert h.tablet is not None
    got = await h.tablet.read_row(row)
    if got is None:
        return None
    v = got.latest(fam, q)
    if fam == "u":
        return None if v is None else hll.estimate(v)
    return i64(v)


async def test_writes_combine_through_flushes_and_compactions(h: TabletHarness) -> None:
    t = h.tablet
    assert t is not None
    expected = 0
    for step in range(12):
        await t.apply(
            b"r",
            [
                AddToCell("s", b"q", step, 1000),
                AddToCell("lo", b"q", 50 - step, 1000),
                AddToCell("hi", b"q", step * 3, 1000),
                AddToCell("u", b"q", b"user%d" % (step % 5), 1000),
            ],
        )
        expected += step
        if step % 4 == 3:
            await t.minor_compact()
        assert await value(h, b"r", "s") == expected
    assert len(t.record.sstables["default"]) == 3
    assert await value(h, b"r", "lo") == 39
    assert await value(h, b"r", "hi") == 33
    assert await value(h, b"r", "u") == 5
    await t.merge_if_needed()
    await t.major_compact()
    assert len(t.record.sstables["default"]) == 1
    assert await value(h, b"r", "s") == expected
    row = await t.read_row(b"r")
    assert row is not None and len(row.cells_of("s")) == 1
    # Each timestamp is its own bucket; a scan sees the same as a point read.
    await t.apply(
        b"r", [AddToCell("s", b"q", 7, 2000), MergeToCell("s", b"q", struct.pack(">q", 1), 2000)]
    )
    rows = [r async for r in t.scan(RowRange.all())]
    assert [(c.timestamp, i64(c.value)) for c in rows[0].cells_of("s")] == [
        (2000, 8),
        (1000, expected),
    ]


async def test_deletions_mask_earlier_writes_only(h: TabletHarness) -> None:
    t = h.tablet
    assert t is not None
    await t.apply(b"r", [AddToCell("s", b"q", 5, 1000)])
    await t.minor_compact()
    await t.apply(b"r", [AddToCell("s", b"q", 5, 1000)])
    await t.apply(b"r", [DeleteCells("s", b"q")])
    await t.apply(b"r", [AddToCell("s", b"q", 2, 1000)])
    assert await value(h, b"r", "s") == 2
    await t.minor_compact()
    assert await value(h, b"r", "s") == 2
    await t.apply(b"r", [DeleteRow(), AddToCell("s", b"q", 1, 1000)])
    await t.major_compact()
    assert await value(h, b"r", "s") == 1


async def test_wrong_mutation_kinds_are_refused(h: TabletHarness) -> None:
    t = h.tablet
    assert t is not None
    with pytest.raises(InvalidArgument, match="counters:s"):
        await t.apply(b"r", [SetCell("s", b"q", b"x")])
    with pytest.raises(InvalidArgument, match="counters:p"):
        await t.apply(b"r", [AddToCell("p", b"q", 1)])


async def test_recovery_replays_each_write_once(h: TabletHarness) -> None:
    t = h.tablet
    assert t is not None
    for _ in range(3):
        await t.apply(b"r", [AddToCell("s", b"q", 1, 1000)])
    await t.minor_compact()
    for _ in range(4):
        await t.apply(b"r", [AddToCell("s", b"q", 1, 1000), AddToCell("u", b"q", b"x")])
    await h.recover()
    assert await value(h, b"r", "s") == 7
    assert h.tablet is not None
    await h.tablet.minor_compact()
    await h.recover()
    assert await value(h, b"r", "s") == 7


async def test_replay_past_a_lagging_redo_point_does_not_count_twice(h: TabletHarness) -> None:
    """A write of another row in flight at the freeze holds the redo point below parts the
    new SSTable holds; replay sends those parts again and must not add them twice."""
    t = h.tablet
    assert t is not None and h.log is not None
    await t.apply(b"r", [AddToCell("s", b"q", 1, 1000)])
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def stall(row: bytes, cells: object) -> None:
        if row == b"slow":
            entered.set()
            await gate.wait()

    h.log.before_append = stall
    slow = asyncio.ensure_future(t.apply(b"slow", [SetCell("p", b"q", b"v")]))
    await entered.wait()
    await t.apply(b"r", [AddToCell("s", b"q", 10, 1000)])
    await t.apply(b"r", [AddToCell("s", b"q", 100, 1000)])
    await t.minor_compact()
    record = await h.record()
    assert record.redo_seq < max(r.max_seq for r in record.sstables["default"])
    gate.set()
    await slow
    h.log.before_append = None
    await t.apply(b"r", [AddToCell("s", b"q", 1000, 1000)])
    assert await value(h, b"r", "s") == 1111
    await h.recover()
    assert await value(h, b"r", "s") == 1111
    assert h.tablet is not None
    assert (await h.tablet.read_row(b"slow")) is not None
