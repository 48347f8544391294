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


async def test_a_family_added_by_a_schema_change_takes_aggregate_writes(
    h: TabletHarness,
) -> None:
    """The tablet keeps the aggregate families' value types per schema: a write after
    set_schema sees the new schema's families (and no longer the dropped ones)."""
    t = h.tablet
    assert t is not None
    await t.apply(b"r", [AddToCell("s", b"q", 2, 1000)])
    old = agg_schema()
    families = {**old.families, "n": ColumnFamily(name="n", value_type="sum")}
    del families["s"]
    t.set_schema(old.model_copy(update={"families": families}))
    await t.apply(b"r", [AddToCell("n", b"q", 5, 1000), AddToCell("n", b"q", 6, 1000)])
    assert await value(h, b"r", "n") == 11
    with pytest.raises(Exception, match="'s'"):
        await t.apply(b"r", [AddToCell("s", b"q", 1, 1000)])


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


class AggregateModel:
    """What reads must return: per bucket, the adds applied after the last deletion covering
    it, summed (``s``) or maxed (``m``); Cloud Bigtable's semantics."""

    def __init__(self) -> None:
        self.ops: dict[bytes, list[tuple[object, ...]]] = {}

    def apply(self, row: bytes, muts: list[object]) -> None:
        for m in muts:
            if isinstance(m, AddToCell):
                self.ops.setdefault(row, []).append(
                    ("add", m.family, m.qualifier, m.timestamp, m.value)
                )
            elif isinstance(m, DeleteCells):
                self.ops.setdefault(row, []).append(
                    ("del", m.family, m.qualifier, m.start or 0, m.end)
                )
            else:
                self.ops.setdefault(row, []).append(("row",))

    def expected(self) -> dict[bytes, dict[tuple[str, bytes, int], int]]:
        out: dict[bytes, dict[tuple[str, bytes, int], int]] = {}
        for row, ops in self.ops.items():
            cells: dict[tuple[str, bytes, int], int] = {}
            for op in ops:
                if op[0] == "row":
                    cells.clear()
                elif op[0] == "del":
                    _, fam, q, start, end = op
                    for key in [k for k in cells if k[0] == fam and k[1] == q]:
                        if start <= key[2] and (end is None or key[2] < end):  # type: ignore[operator]
                            del cells[key]
                else:
                    _, fam, q, ts, v = op
                    key = (fam, q, ts)  # type: ignore[assignment]
                    old = cells.get(key)  # type: ignore[arg-type]
                    if old is None:
                        cells[key] = v  # type: ignore[index,assignment]
                    elif fam == "s":
                        cells[key] = old + v  # type: ignore[index,operator]
                    else:
                        cells[key] = max(old, v)  # type: ignore[index,call-overload]
            if cells:
                out[row] = cells
        return out


async def scanned(h: TabletHarness) -> dict[bytes, dict[tuple[str, bytes, int], int]]:
    out: dict[bytes, dict[tuple[str, bytes, int], int]] = {}
    for row in await h.scan_all():
        if row.key == b"slow":
            continue
        cells = {(c.family, c.qualifier, c.timestamp): i64(c.value) for c in row.cells}
        assert len(cells) == len(row.cells), "one cell per bucket"
        out[row.key] = cells  # type: ignore[assignment]
        assert h.tablet is not None
        point = await h.tablet.read_row(row.key)
        assert point is not None and point.cells == row.cells
    return out


@pytest.mark.parametrize("seed", range(6))
async def test_random_histories_with_compactions_crashes_and_lagging_redo_points(seed: int) -> None:
    import random

    schema = TableSchema(
        name="counters",
        families={
            "s": ColumnFamily(name="s", value_type="sum"),
            "m": ColumnFamily(name="m", value_type="max", locality_group="other"),
            "p": ColumnFamily(name="p"),
        },
        locality_groups={
            "default": LocalityGroup(name="default", block_size=1024),
            "other": LocalityGroup(name="other", block_size=1024),
        },
    )
    small = TabletOptions(memtable_flush_bytes=1500, max_sstables_per_group=3)
    h = TabletHarness(FaultyObjectStore(MemoryObjectStore()), options=small, schema=schema)
    await h.start()
    rng = random.Random(seed)
    model = AggregateModel()
    rows = [b"a", b"b", b"c", b"d"]

    def rand_muts() -> list[object]:
        out: list[object] = []
        for _ in range(rng.randint(1, 3)):
            kind = rng.choices(["add", "del", "row"], [12, 2, 1])[0]
            fam, q = rng.choice("sm"), rng.choice([b"q0", b"q1"])
            if kind == "add":
                out.append(AddToCell(fam, q, rng.randint(-50, 50), rng.choice([1000, 2000, 3000])))
            elif kind == "del":
                start = rng.choice([None, 1000, 2000])
                out.append(DeleteCells(fam, q, start, rng.choice([None, 3000])))
            else:
                out.append(DeleteRow())
        return out

    try:
        for step in range(120):
            t = h.tablet
            assert t is not None and h.log is not None
            action = rng.choices(
                ["write", "minor", "major", "merge", "crash", "lag"], [40, 3, 1, 2, 3, 3]
            )[0]
            if action == "write":
                row, muts = rng.choice(rows), rand_muts()
                await t.apply(row, muts)  # type: ignore[arg-type]
                model.apply(row, muts)
            elif action == "minor":
                await t.minor_compact()
            elif action == "major":
                await t.major_compact()
            elif action == "merge":
                await t.merge_if_needed()
            elif action == "crash":
                await h.settle()
                await h.recover()
            else:
                # A write of another row stalls in its log append while a freeze happens:
                # the redo point then lags behind parts the new SSTable holds.
                gate, entered = asyncio.Event(), asyncio.Event()

                async def stall(
                    row: bytes,
                    cells: object,
                    entered: asyncio.Event = entered,
                    gate: asyncio.Event = gate,
                ) -> None:
                    if row == b"slow":
                        entered.set()
                        await gate.wait()

                h.log.before_append = stall
                slow = asyncio.ensure_future(t.apply(b"slow", [SetCell("p", b"q", b"v")]))
                await entered.wait()
                for _ in range(3):
                    row, muts = rng.choice(rows), rand_muts()
                    await t.apply(row, muts)  # type: ignore[arg-type]
                    model.apply(row, muts)
                await t.minor_compact()
                gate.set()
                await slow
                h.log.before_append = None
                if rng.random() < 0.7:
                    await h.settle()
                    await h.recover()
            if step % 10 == 9 or action in ("crash", "lag"):
                await h.settle()
                got = await scanned(h)
                assert got == model.expected(), f"seed {seed} step {step} ({action})"
    finally:
        await h.close()
