"""Tablet behaviour case by case (§2, §3, §5.3, §5.4), on the in-memory store.

The state machine (tests/property/test_tablet_state_machine.py) checks random histories
against the model; these pin individual contracts: dropped families, ACLs, row ranges, scans
with limits and filters, in-memory locality groups, read-modify-write timestamps, where a
merged SSTable goes, and closing with a flush.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tabletstore.data.filters import ColumnQualifierRegex
from tabletstore.data.model import (
    AppendValue,
    Cell,
    DeleteCells,
    DeleteRow,
    IncrementValue,
    Row,
    SetCell,
)
from tabletstore.data.query import RowRange
from tabletstore.data.schema import Acl, ColumnFamily, TableSchema
from tabletstore.engine import iterators, memtable
from tabletstore.engine.tablet import Tablet
from tabletstore.errors import (
    InvalidArgument,
    NotFound,
    NotServing,
    PermissionDenied,
    Unavailable,
)
from tabletstore.options import TabletOptions
from tabletstore.sstable.reader import SSTableCore
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore
from tests.tablet_harness import SECOND, TabletHarness, TabletModel, make_schema

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


def without(schema: TableSchema, family: str) -> TableSchema:
    fams = {k: v for k, v in schema.families.items() if k != family}
    return schema.model_copy(update={"families": fams})


def sstable_cells(h: TabletHarness, group: str) -> int:
    assert h.tablet is not None
    return sum(r.cells for r in h.tablet.record.sstables.get(group, ()))


async def test_a_dropped_family_is_invisible_at_once_and_compacted_away(
    h: TabletHarness,
) -> None:
    tablet = h.tablet
    assert tablet is not None
    await tablet.apply(b"r1", [SetCell("b", b"x", b"keep"), SetCell("c", b"y", b"gone")])
    await tablet.apply(b"r2", [SetCell("c", b"y", b"only-c")])
    await tablet.minor_compact()  # c's cells now sit in an SSTable of group "cold"
    await tablet.apply(b"r3", [SetCell("c", b"y", b"memtable")])
    h.set_schema(without(h.schema, "c"))

    r1 = Row(b"r1", [Cell("b", b"x", h.now_micros(), b"keep")])
    assert await tablet.read_row(b"r1") == r1
    assert await tablet.read_row(b"r2") is None
    assert await tablet.read_row(b"r3") is None
    assert [r async for r in tablet.scan(RowRange.all())] == [r1]
    # A row holding only dropped cells has no cells for a predicate to match.
    assert not await tablet.check_and_mutate(b"r2", None, [], [SetCell("a", b"q", b"v")])
    with pytest.raises(NotFound):
        await tablet.apply(b"r1", [SetCell("c", b"y", b"v")])

    # The next compactions leave them out: minor (memtable) and merging/major (SSTables).
    await tablet.minor_compact()
    await tablet.major_compact()
    assert sstable_cells(h, "cold") == 1
    # Recreating the family after the compaction starts it empty.
    h.set_schema(make_schema())
    r2 = await tablet.read_row(b"r2")  # holds the false branch's write only
    assert r2 is not None and [c.family for c in r2.cells] == ["a"]
    assert await tablet.read_row(b"r1") == r1


async def test_rows_outside_the_tablet_and_closed_tablets_are_not_served(
    store: FaultyObjectStore,
) -> None:
    h = TabletHarness(store, options=BIG, tablet_id="t00001")
    tablet = await h.start()
    try:
        assert tablet.contains(b"anything")
        await tablet.apply(b"k", [SetCell("a", b"q", b"v")])
        await tablet.close(flush=True)
        with pytest.raises(NotServing):
            await tablet.read_row(b"k")
        with pytest.raises(NotServing):
            await tablet.apply(b"k", [SetCell("a", b"q", b"v")])
        record = await h.record()
        assert record.redo_seq >= 1 and len(tablet.state.memtable) == 0
        # Closed with a flush: a new owner has nothing to replay.
        await h.recover()
        assert h.tablet is not None and len(h.tablet.state.memtable) == 0
        assert await h.tablet.read_row(b"k") is not None
    finally:
        await h.close()


async def test_row_outside_the_range_is_not_serving(store: FaultyObjectStore) -> None:
    h = TabletHarness(store, options=BIG)
    await h.start()
    try:
        assert h.catalog is not None
        rec = await h.record()
        from dataclasses import replace

        await h.catalog.update(rec, replace(rec, start_row=b"m", end_row=b"t"))
        tablet = await h.recover()
        with pytest.raises(NotServing, match="outside tablet"):
            await tablet.apply(b"a", [SetCell("a", b"q", b"v")])
        with pytest.raises(NotServing):
            await tablet.read_row(b"t")
        await tablet.apply(b"m", [SetCell("a", b"q", b"v")])
        # Scans are clipped to the tablet.
        rows = [r.key async for r in tablet.scan(RowRange(b"a", b"z"))]
        assert rows == [b"m"]
    finally:
        await h.close()


async def test_acls_limit_what_an_identity_reads_and_writes(store: FaultyObjectStore) -> None:
    base = make_schema()
    fams = dict(base.families)
    fams["c"] = fams["c"].model_copy(update={"acl": Acl(readers=["alice"], writers=["alice"])})
    h = TabletHarness(store, options=BIG, schema=base.model_copy(update={"families": fams}))
    tablet = await h.start()
    try:
        await tablet.apply(
            b"r", [SetCell("a", b"q", b"1"), SetCell("c", b"q", b"2")], identity="alice"
        )
        with pytest.raises(PermissionDenied):
            await tablet.apply(b"r", [SetCell("c", b"q", b"3")], identity="bob")
        with pytest.raises(PermissionDenied):
            await tablet.apply(b"r", [DeleteRow()], identity="bob")
        with pytest.raises(PermissionDenied):
            await tablet.read_modify_write(b"r", [AppendValue("c", b"q", b"x")], identity="bob")
        bob = await tablet.read_row(b"r", identity="bob")
        alice = await tablet.read_row(b"r", identity="alice")
        assert bob is not None and {c.family for c in bob.cells} == {"a"}
        assert alice is not None and {c.family for c in alice.cells} == {"a", "c"}
        assert [r.cells async for r in tablet.scan(RowRange.all(), identity="bob")] == [bob.cells]
    finally:
        await h.close()


async def test_a_schema_change_of_acls_applies_to_the_next_read(store: FaultyObjectStore) -> None:
    # The tablet remembers that an identity may read every family (it is asked on every
    # point read); per identity and per schema, so neither another reader nor a new ACL
    # reads through it.
    base = make_schema()
    h = TabletHarness(store, options=BIG, schema=base)
    tablet = await h.start()
    try:
        await tablet.apply(b"r", [SetCell("a", b"q", b"1"), SetCell("c", b"q", b"2")])
        for identity in ("bob", "bob", "alice"):
            got = await tablet.read_row(b"r", identity=identity)
            assert got is not None and {c.family for c in got.cells} == {"a", "c"}
        fams = dict(base.families)
        fams["c"] = fams["c"].model_copy(update={"acl": Acl(readers=["alice"])})
        tablet.set_schema(base.model_copy(update={"families": fams}))
        bob = await tablet.read_row(b"r", identity="bob")
        alice = await tablet.read_row(b"r", identity="alice")
        assert bob is not None and {c.family for c in bob.cells} == {"a"}
        assert alice is not None and {c.family for c in alice.cells} == {"a", "c"}
        again = await tablet.read_row(b"r", identity="bob")
        assert again is not None and {c.family for c in again.cells} == {"a"}
    finally:
        await h.close()


async def test_scan_limit_families_and_filter(h: TabletHarness) -> None:
    tablet = h.tablet
    assert tablet is not None
    model = TabletModel(h.schema)
    for i in range(30):
        muts = [SetCell("a", b"q%d" % (i % 2), b"%d" % i), SetCell("b", b"x", b"b")]
        await tablet.apply(b"row%02d" % i, muts)
        model.apply(b"row%02d" % i, muts, h.now_micros())
        if i % 10 == 9:
            await tablet.minor_compact()
    now = h.now_micros()
    got = [r async for r in tablet.scan(RowRange(b"row05", b"row20"), limit=4)]
    assert got == model.scan(now, b"row05", b"row20")[:4]
    only_b = [r async for r in tablet.scan(RowRange.all(), families={"b"})]
    assert [r.key for r in only_b] == sorted(model.rows)
    assert all(c.family == "b" for r in only_b for c in r.cells)
    q1 = [r async for r in tablet.scan(RowRange.all(), filter=ColumnQualifierRegex(b"q1"))]
    assert [r.key for r in q1] == [b"row%02d" % i for i in range(1, 30, 2)]
    assert [r async for r in tablet.scan(RowRange.all(), limit=0)] == []


async def test_a_limited_scan_reads_the_memtable_only_as_far_as_it_returns(
    h: TabletHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan used to copy every memtable cell from its start to the tablet's end before
    returning its first row: 15 ms of the event loop for 100 rows of a 16 MB memtable."""
    tablet = h.tablet
    assert tablet is not None
    for i in range(5000):
        await tablet.apply(b"row%05d" % i, [SetCell("b", b"x", b"v")])
    made = 0
    real = memtable._as_cell

    def counted(entry: Any) -> Any:
        nonlocal made
        made += 1
        return real(entry)

    monkeypatch.setattr(memtable, "_as_cell", counted)
    got = [r.key async for r in tablet.scan(RowRange(b"row01000", None), limit=10)]
    assert got == [b"row%05d" % i for i in range(1000, 1010)]
    assert made <= 2 * iterators.BATCH_SIZE, f"{made} memtable cells read for 10 rows"


async def test_a_scan_suspended_between_batches_sees_each_row_whole_once(
    h: TabletHarness,
) -> None:
    """The memtable is read as the scan goes, so writes land while it is suspended: each row
    is still returned once and whole (a row's cells are copied when the scan reaches it),
    the rows behind it as they were, the rows ahead with or without the new cells."""
    tablet = h.tablet
    assert tablet is not None
    for i in range(0, 3000, 2):
        await tablet.apply(b"row%05d" % i, [SetCell("a", b"x", b"1"), SetCell("b", b"x", b"1")])
    await tablet.minor_compact()  # an SSTable source too: the merge awaits between batches
    for i in range(1, 3000, 2):
        await tablet.apply(b"row%05d" % i, [SetCell("a", b"x", b"1"), SetCell("b", b"x", b"1")])
    seen: list[Row] = []
    async for row in tablet.scan(RowRange.all()):
        seen.append(row)
        if len(seen) % 100 == 0:  # writes while the scan is suspended, behind and ahead
            n = len(seen)
            for row_no in (n - 50, min(n + 500, 2999)):
                await tablet.apply(
                    b"row%05d" % row_no, [SetCell("a", b"x", b"2"), SetCell("b", b"x", b"2")]
                )
    assert [r.key for r in seen] == [b"row%05d" % i for i in range(3000)]
    for row in seen:
        values = {c.value for c in row.cells if c.qualifier == b"x"}
        # Whole: both families' newest version from one mutation (the older one may show
        # beneath it under the GC rules, never a family without the other).
        assert {c.family for c in row.cells} == {"a", "b"}, row
        assert values <= {b"1", b"2"}, row


async def test_in_memory_locality_group_reads_cost_no_requests(
    h: TabletHarness, store: FaultyObjectStore
) -> None:
    tablet = h.tablet
    assert tablet is not None
    for i in range(50):
        await tablet.apply(b"r%02d" % i, [SetCell("a", b"q", b"v" * 50), SetCell("b", b"x", b"w")])
    await tablet.minor_compact()
    before = store.calls[Op.GET] + store.calls[Op.GET_RANGE]
    for i in range(50):
        assert await tablet.read_row(b"r%02d" % i, families={"a"}) is not None
    assert store.calls[Op.GET] + store.calls[Op.GET_RANGE] == before
    assert await tablet.read_row(b"r07", families={"b"}) is not None
    assert store.calls[Op.GET] + store.calls[Op.GET_RANGE] > before


async def test_read_modify_write_result_is_the_newest_version(h: TabletHarness) -> None:
    tablet = h.tablet
    assert tablet is not None
    future = h.now_micros() + 100 * SECOND
    await tablet.apply(b"r", [SetCell("a", b"n", (5).to_bytes(8, "big"), future)])
    out = await tablet.read_modify_write(b"r", [IncrementValue("a", b"n", 2)])
    assert out == Row(b"r", [Cell("a", b"n", future, (7).to_bytes(8, "big"))])
    row = await tablet.read_row(b"r")
    assert row is not None and row.latest("a", b"n") == (7).to_bytes(8, "big")
    # Two rules on one column compose; a missing column counts as 0 / empty.
    out = await tablet.read_modify_write(
        b"r",
        [
            IncrementValue("b", b"c", 3),
            IncrementValue("b", b"c", -10),
            AppendValue("c", b"s", b"x"),
        ],
    )
    assert [c.value for c in out.cells] == [(-7).to_bytes(8, "big", signed=True), b"x"]
    await tablet.apply(b"r", [SetCell("b", b"t", b"abc")])
    with pytest.raises(InvalidArgument, match="not a 64-bit"):
        await tablet.read_modify_write(b"r", [IncrementValue("b", b"t", 1)])


async def _a_large_sstable_behind_three_small_ones(h: TabletHarness) -> Tablet:
    """Four SSTables of row ``r``, v0 (large) to v3: a merge takes the three small ones."""
    tablet = h.tablet
    assert tablet is not None
    for k in range(4):
        value = b"v%d" % k + (os.urandom(100_000) if k == 0 else b"")
        await tablet.apply(b"r", [SetCell("b", b"x", value, h.now_micros())])
        await tablet.minor_compact()
    return tablet


async def test_merged_sstable_takes_the_place_of_its_newest_input(h: TabletHarness) -> None:
    tablet = await _a_large_sstable_behind_three_small_ones(h)
    keys_before = [r.key for r in tablet.record.sstables["cold"]]
    assert len(keys_before) == 4
    await tablet.merge_if_needed()
    keys_after = [r.key for r in tablet.record.sstables["cold"]]
    # The newest three were merged into one, which stands in front of the oldest.
    assert len(keys_after) == 2 and keys_after[1] == keys_before[3]
    assert [t.key for t in tablet.state.sstables["cold"]] == keys_after
    row = await tablet.read_row(b"r")
    assert row is not None and row.latest("b", b"x") == b"v3"


async def test_a_merge_drops_its_inputs_blocks_from_the_block_cache(
    h: TabletHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replaced SSTables are closed (their blocks evicted), the one kept is not."""
    tablet = await _a_large_sstable_behind_three_small_ones(h)
    before = {t.key: t for t in tablet.state.sstables["cold"]}
    closed: list[str] = []
    real_close = type(next(iter(before.values()))).close

    def close(self: Any) -> None:
        closed.append(self.key)
        real_close(self)

    monkeypatch.setattr(type(next(iter(before.values()))), "close", close)
    await tablet.merge_if_needed()
    after = [r.key for r in tablet.record.sstables["cold"]]
    replaced = set(before) - set(after)
    assert len(replaced) == 3 and sorted(closed) == sorted(replaced)
    row = await tablet.read_row(b"r")
    assert row is not None and row.latest("b", b"x") == b"v3"


async def test_log_positions_bound_what_recovery_reads(h: TabletHarness) -> None:
    """§5.3: a redo point is a position in the log. Loading records the log's segment mark,
    a minor compaction the mark at its freeze, trim_logs (nothing in memory) the mark now;
    a crash then replays from there, and every write is back."""
    tablet = h.tablet
    assert tablet is not None and h.log is not None
    ref = h.log.log_ref
    assert tablet.record.logs[-1] == ref and tablet.record.log_start(ref) == 0
    for i in range(5):
        await tablet.apply(b"r%d" % i, [SetCell("a", b"q", b"v%d" % i)])
    await tablet.minor_compact()
    flushed_at = tablet.record.log_start(ref)
    assert flushed_at == h.log.writer.next_segment == 5  # one segment per acknowledged write
    for i in range(5, 8):
        await tablet.apply(b"r%d" % i, [SetCell("a", b"q", b"v%d" % i)])
    assert tablet.record.log_start(ref) == flushed_at
    tablet = await h.recover()
    rows = await h.scan_all()
    assert [r.key for r in rows] == [b"r%d" % i for i in range(8)]
    # The new incarnation: its log from the mark at load; the old one keeps its position.
    new_ref = h.log.log_ref
    assert tablet.record.log_start(new_ref) == 0 and tablet.record.log_start(ref) == flushed_at
    await tablet.minor_compact()
    await tablet.apply(b"r8", [SetCell("a", b"q", b"v8")])
    await tablet.minor_compact()
    await tablet.trim_logs()  # nothing in memory: the record alone moves to the log's end
    assert tablet.record.logs == (new_ref,)
    assert tablet.record.log_start(new_ref) == h.log.writer.next_segment
    await tablet.apply(b"r9", [SetCell("a", b"q", b"v9")])
    await h.recover()
    assert [r.key for r in await h.scan_all()] == [b"r%d" % i for i in range(10)]


async def test_writes_held_for_a_new_log_are_refused_naming_why_the_old_one_failed(
    h: TabletHarness,
) -> None:
    """A client retries a refusal until its deadline and then reports the last one: while its
    worker moves to a new commit log, that refusal must say what broke the old log (a full
    disk), not only that a move is under way."""
    tablet = h.tablet
    assert tablet is not None and h.log is not None
    tablet.hold_writes(Unavailable("cannot create file:///db/objects/log: No space left on device"))
    with pytest.raises(Unavailable, match=r"new commit log.*No space left on device"):
        await tablet.apply(b"r", [SetCell("a", b"q", b"v")])
    await tablet.add_log(h.log.log_ref)
    await tablet.apply(b"r", [SetCell("a", b"q", b"v")])
    tablet.hold_writes()  # no known cause: the refusal says only what is under way
    with pytest.raises(Unavailable, match="moving to a new commit log; the write was not applied"):
        await tablet.apply(b"r", [SetCell("a", b"q", b"w")])


async def test_a_minor_compaction_reads_the_frozen_memtable_off_the_event_loop(
    h: TabletHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 16 MB memtable is ~14,500 cells: sorting them into locality groups on the loop held
    # it 30-70 ms per minor compaction (every request of the worker waited that long).
    from tabletstore.engine.tablet_sstables import TabletSSTables

    tablet = h.tablet
    assert tablet is not None
    loop_thread = threading.get_ident()
    seen: list[int] = []
    split = TabletSSTables.split_by_group

    def recording(self: TabletSSTables, memtables: Any) -> Any:
        seen.append(threading.get_ident())
        return split(self, memtables)

    monkeypatch.setattr(TabletSSTables, "split_by_group", recording)
    await tablet.apply(b"r1", [SetCell("a", b"q", b"v1"), SetCell("b", b"x", b"v2")])
    await tablet.minor_compact()
    assert seen and all(t != loop_thread for t in seen)
    assert sstable_cells(h, "hot") + sstable_cells(h, "cold") == 2
    row = await tablet.read_row(b"r1")
    assert row is not None and [c.value for c in row.cells] == [b"v1", b"v2"]


@pytest.mark.parametrize("flushed", [False, True])
async def test_a_row_of_one_put_obeys_gc_and_the_families_asked(
    h: TabletHarness, flushed: bool
) -> None:
    """A row whose only cell is one put takes a short way through the read; it
    must still honour its family's age rule and the families the read names."""
    tablet = h.tablet
    assert tablet is not None
    await tablet.apply(b"ra", [SetCell("a", b"q", b"va")])  # a: max versions only
    await tablet.apply(b"rb", [SetCell("b", b"x", b"vb")])  # b: versions or older than 5 s
    if flushed:
        await tablet.minor_compact()
    written = h.now_micros()
    assert await tablet.read_row(b"rb") == Row(b"rb", [Cell("b", b"x", written, b"vb")])
    assert await tablet.read_row(b"ra", families={"b"}) is None
    assert await tablet.read_row(b"ra", families={"a"}) == Row(
        b"ra", [Cell("a", b"q", written, b"va")]
    )
    h.clock.advance(6)
    assert await tablet.read_row(b"rb") is None
    assert await tablet.read_row(b"ra") == Row(b"ra", [Cell("a", b"q", written, b"va")])


async def _pages_of(store: MemoryObjectStore, keys: list[str]) -> int:
    pages = 0
    for key in keys:
        data = await store.get(key)
        assert data is not None
        index = SSTableCore.from_tail(key, len(data), data).pages
        assert index is not None
        pages += index.pages
    return pages


async def test_a_minor_compaction_writes_larger_pages_than_a_major_one() -> None:
    """Every acknowledged write is encoded once by a minor compaction, and encoding costs a
    zstd call per page of each column: a minor compaction writes large pages (fewer calls),
    the compactions that rewrite its output small ones (the unit a cold point read decodes)."""
    store = MemoryObjectStore()
    schema = TableSchema(name="pages", families={"v": ColumnFamily(name="v")})
    h = TabletHarness(store, options=BIG, schema=schema)
    tablet = await h.start()
    try:
        value = os.urandom(1000)
        for i in range(400):
            await tablet.apply(b"r%05d" % i, [SetCell("v", b"q", value)])
        await tablet.minor_compact()
        minor = await _pages_of(store, [r.key for r in tablet.record.sstables["default"]])
        await tablet.major_compact()
        major = await _pages_of(store, [r.key for r in tablet.record.sstables["default"]])
    finally:
        await h.close()
    # 400 KB of values: ~50 pages of 8 KiB, ~13 of 32 KiB.
    assert minor * 3 <= major, f"minor compaction: {minor} pages, major: {major}"


async def test_a_wall_clock_stepped_back_hides_no_later_write(h: TabletHarness) -> None:
    """Server-assigned timestamps come from the wall clock; a step back (an NTP step, an
    operator setting the clock) must not stamp a later write below an earlier one, or the
    acknowledged later write would be hidden behind the older version."""
    tablet = h.tablet
    assert tablet is not None
    await tablet.apply(b"r", [SetCell("a", b"q", b"before")])
    await tablet.apply_many([(b"m", [SetCell("a", b"q", b"before")])])
    h.clock.step(-30.0)
    await tablet.apply(b"r", [SetCell("a", b"q", b"after")])
    await tablet.apply_many([(b"m", [SetCell("a", b"q", b"after")])])
    assert await tablet.check_and_mutate(b"r", None, [SetCell("a", b"q", b"third")], [])
    for row, newest in ((b"r", b"third"), (b"m", b"after")):
        got = await tablet.read_row(row)
        assert got is not None and got.cells[0].value == newest, got
    # Forward again: timestamps take up the clock's time (no drift once it is past them).
    h.clock.step(60.0)
    await tablet.apply(b"r", [SetCell("a", b"q", b"fourth")])
    got = await tablet.read_row(b"r")
    assert got is not None and got.cells[0].value == b"fourth"
    assert got.cells[0].timestamp == h.now_micros()


async def test_a_write_after_a_step_back_is_newer_than_a_read_modify_write(
    h: TabletHarness,
) -> None:
    tablet = h.tablet
    assert tablet is not None
    h.clock.advance(5.0)  # past every earlier write's timestamp
    await tablet.read_modify_write(b"x", [AppendValue("a", b"q", b"appended")])
    h.clock.step(-30.0)
    await tablet.apply(b"x", [SetCell("a", b"q", b"put")])
    got = await tablet.read_row(b"x")
    assert got is not None and got.cells[0].value == b"put", got


async def test_the_timestamp_floor_moves_with_the_tablet(h: TabletHarness) -> None:
    """A worker whose clock ran ahead flushed the tablet (as an unload or a split does); the
    next server, whose clock is behind, starts at the floor the record carries."""
    tablet = h.tablet
    assert tablet is not None
    h.clock.step(30.0)
    await tablet.apply(b"r", [SetCell("a", b"q", b"ahead")])
    await tablet.minor_compact()
    assert (await h.record()).timestamp_floor == h.now_micros()
    h.clock.step(-60.0)
    moved = await h.recover()
    await moved.apply(b"r", [SetCell("a", b"q", b"behind")])
    got = await moved.read_row(b"r")
    assert got is not None and got.cells[0].value == b"behind", got


async def _only_version_left(h: TabletHarness) -> int:
    """Row r's column c:q with two versions, each in its own SSTable, a third SSTable of
    its family b (in c's locality group), then the newer version deleted (the deletion in the memtable). Family c
    collects a version only when it is both past the newest one and older than 4 s; the
    older version is the column's only one from now on, so no moment makes it garbage.
    Returns its timestamp, with the clock 10 s on."""
    tablet = h.tablet
    assert tablet is not None
    t0 = h.now_micros()
    await tablet.apply(b"r", [SetCell("c", b"q", b"old", t0)])
    await tablet.minor_compact()
    await tablet.apply(b"r", [SetCell("c", b"q", b"new", t0 + SECOND)])
    await tablet.minor_compact()
    await tablet.apply(b"r", [SetCell("b", b"x", b"b", t0)])
    await tablet.minor_compact()
    await tablet.apply(b"r", [DeleteCells("c", b"q", t0 + SECOND)])
    h.clock.advance(10)
    assert await tablet.read_row(b"r", families={"c"}) == Row(b"r", [Cell("c", b"q", t0, b"old")])
    return t0


async def test_a_merge_of_every_sstable_counts_versions_with_the_memtables_deletions(
    h: TabletHarness,
) -> None:
    """A merging compaction that takes all of a group's SSTables is a major one: it collects
    by version count. Counted without the memtable's deletion of the newer version, the older
    one was the second version, old enough, and dropped."""
    tablet = h.tablet
    assert tablet is not None
    t0 = await _only_version_left(h)
    assert len((await h.record()).sstables["cold"]) == 3
    await tablet.merge_if_needed()
    assert len((await h.record()).sstables["cold"]) == 1  # the merge ran, as a major one
    old = Row(b"r", [Cell("c", b"q", t0, b"old")])
    assert await tablet.read_row(b"r", families={"c"}) == old
    await tablet.major_compact()
    assert await tablet.read_row(b"r", families={"c"}) == old


async def test_a_major_compaction_counts_versions_with_deletions_written_after_its_flush(
    h: TabletHarness,
) -> None:
    """A major compaction flushes the memtable first, but writes go on while it reads the
    SSTables: a deletion that lands in between must count like one flushed."""
    tablet = h.tablet
    assert tablet is not None
    t0 = h.now_micros()
    await tablet.apply(b"r", [SetCell("c", b"q", b"old", t0)])
    await tablet.apply(b"r", [SetCell("c", b"q", b"new", t0 + SECOND)])
    runner = tablet._compactions
    flush = runner.minor_compact

    async def flush_then_delete() -> None:
        await flush()
        await tablet.apply(b"r", [DeleteCells("c", b"q", t0 + SECOND)])
        h.clock.advance(10)

    runner.minor_compact = flush_then_delete  # type: ignore[method-assign]
    await tablet.major_compact()
    del runner.minor_compact
    assert await tablet.read_row(b"r") == Row(b"r", [Cell("c", b"q", t0, b"old")])
