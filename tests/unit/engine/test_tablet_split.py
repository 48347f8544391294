"""Splitting and merging tablets at the tablet level (§5, §5.2), on the in-memory store.

What the worker and master do, done by hand on a :class:`TabletHarness`: split a tablet with
:meth:`Tablet.splitting` and commit the children through the catalog, load them, and check
every row against the model (deletions and versions included); major-compact a child and
check it wrote only its rows; merge two tablets back into one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import random
from collections.abc import AsyncIterator

import pytest

from tabletstore.data.model import DeleteCells, DeleteRow, Mutation, SetCell
from tabletstore.data.query import RowRange
from tabletstore.engine import split_key as splitting
from tabletstore.engine.compaction_budget import CompactionBudget
from tabletstore.engine.tablet import Tablet
from tabletstore.errors import Fenced, NotServing, Unavailable
from tabletstore.master import tablet_merges as merging
from tabletstore.metadata.record import TabletRecord
from tabletstore.options import TabletOptions
from tabletstore.process_pool import ProcessPool
from tabletstore.sstable import BlockCache, read_sstable_bytes, reader
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore
from tests.tablet_harness import PutGate, TabletHarness, TabletModel, until

OPTS = TabletOptions(memtable_flush_bytes=1 << 30, max_sstables_per_group=8)


@pytest.fixture
async def h() -> AsyncIterator[TabletHarness]:
    harness = TabletHarness(MemoryObjectStore(), options=OPTS)
    await harness.start()
    yield harness
    await harness.close()


async def fill(h: TabletHarness, model: TabletModel, rows: int = 60) -> None:
    """Versions, cell and row deletions, spread over three SSTables and the memtable."""
    assert h.tablet is not None
    rnd = random.Random(7)
    for round_ in range(4):
        for i in range(rows):
            row = b"r%03d" % i
            muts: list[Mutation] = [
                SetCell("a", b"x", b"v%d-%d" % (round_, i), (round_ + 1) * 1000),
                SetCell("b", b"y", b"w" * rnd.randrange(1, 200)),
            ]
            if i % 7 == round_:
                muts = [DeleteRow()]
            elif i % 5 == round_:
                muts.append(DeleteCells("a", b"x", 0, 2000))
            await h.tablet.apply(row, muts)
            model.apply(row, muts, h.now_micros())
        if round_ < 3:
            await h.tablet.minor_compact()
        h.clock.advance(0.1)


async def load(
    h: TabletHarness,
    record: TabletRecord,
    block_cache: BlockCache | None = None,
    executor: concurrent.futures.Executor | None = None,
) -> Tablet:
    assert h.catalog is not None and h.log is not None
    return await Tablet.load(
        record,
        h.schema,
        store=h.store,
        log_sink=h.log,
        catalog=h.catalog,
        replay=h._replay,
        clock=h.clock,
        options=h.options,
        block_cache=block_cache,
        executor=executor,
    )


async def split(
    h: TabletHarness,
    block_cache: BlockCache | None = None,
    executor: concurrent.futures.Executor | None = None,
) -> tuple[Tablet, Tablet, bytes]:
    """What ``TabletSplits._split_locked`` (worker/splits.py) does, with the harness's catalog."""
    assert h.tablet is not None and h.catalog is not None
    tablet = h.tablet
    key = splitting.choose_split_key(b"", None, tablet.block_spans())
    assert key is not None
    async with tablet.splitting() as parent:
        left, right = splitting.split_records(
            parent,
            key,
            left_id="left",
            right_id="right",
            left_epoch=parent.epoch + 1,
            right_epoch=parent.epoch + 1,
            location=None,
            at=h.clock.time(),
        )
        await h.catalog.replace_tablets([parent], [left, right])
    assert len(tablet.state.memtable) == 0  # every acknowledged write is in SSTables
    return (
        await load(h, left, block_cache, executor),
        await load(h, right, block_cache, executor),
        key,
    )


async def rows_of(*tablets: Tablet) -> list[object]:
    out = []
    for t in tablets:
        out.extend([r async for r in t.scan(RowRange.all())])
    return out


async def test_every_row_is_readable_from_the_right_child(h: TabletHarness) -> None:
    model = TabletModel(h.schema)
    await fill(h, model)
    parent = h.tablet
    assert parent is not None
    left, right, key = await split(h)
    assert b"r010" < key < b"r050", "near the middle by bytes"
    now = h.now_micros()
    assert await rows_of(left, right) == model.scan(now)
    assert await rows_of(left) == model.scan(now, end=key)
    assert await rows_of(right) == model.scan(now, start=key)
    for i in range(60):
        row = b"r%03d" % i
        child = left if row < key else right
        assert await child.read_row(row) == model.read_row(row, now)
        with pytest.raises(NotServing):
            await (right if child is left else left).read_row(row)
    # The parent serves nothing any more.
    with pytest.raises(NotServing):
        await parent.read_row(b"r000")
    with pytest.raises(NotServing):
        await parent.apply(b"r000", [SetCell("a", b"x", b"late")])
    assert h.catalog is not None
    listed = await h.catalog.list_tablets(h.table_id)
    assert [r.tablet_id for r in listed] == ["left", "right"]


async def test_a_childs_compaction_writes_only_its_rows(h: TabletHarness) -> None:
    model = TabletModel(h.schema)
    await fill(h, model)
    left, right, key = await split(h)
    assert not splitting.owns_its_sstables(left.record)
    for child in (left, right):
        await child.major_compact()
        assert splitting.owns_its_sstables(child.record)
        for refs in child.record.sstables.values():
            for ref in refs:
                data = await h.store.get(ref.key)
                assert data is not None
                assert all(child.contains(c.row) for c in read_sstable_bytes(data))
    model.major_compact(h.now_micros())
    now = h.now_micros()
    assert await rows_of(left) == model.scan(now, end=key)
    assert await rows_of(right) == model.scan(now, start=key)
    # Sizes are now the children's own: together about the parent's live data.
    assert left.record.size > 0 and right.record.size > 0


class BytesPerKey(InstrumentedObjectStore):
    """Counts the bytes read of each object."""

    def __init__(self, inner: MemoryObjectStore) -> None:
        super().__init__(inner)
        self.read: dict[str, int] = {}

    async def get(self, key: str) -> bytes | None:
        data = await super().get(key)
        self.read[key] = self.read.get(key, 0) + len(data or b"")
        return data

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        data = await super().get_range(key, offset, length)
        self.read[key] = self.read.get(key, 0) + len(data or b"")
        return data


@pytest.mark.parametrize("where", ["thread", "processes"])
async def test_a_childs_compaction_reads_its_half_of_the_parents_sstables(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each child fetches the blocks that can hold its rows (and the tails), not the whole of
    every SSTable it shares with its sibling: about half of what the parent holds."""
    monkeypatch.setattr(reader, "EXCERPT_MIN_SAVING", 1)  # these SSTables are small
    store = BytesPerKey(MemoryObjectStore())
    h = TabletHarness(store, options=OPTS)
    await h.start()
    pool = ProcessPool(1, name="test-compaction") if where == "processes" else None
    try:
        model = TabletModel(h.schema)
        await fill(h, model, rows=300)
        left, right, key = await split(h, executor=pool)
        refs = [r for group in left.record.sstables.values() for r in group]
        shared = sum(r.size - r.tail_size for r in refs)
        tails = sum(r.tail_size for r in refs)
        for child in (left, right):
            store.read.clear()
            await child.major_compact()
            read = sum(store.read.get(r.key, 0) for r in refs)
            # Each SSTable's blocks are ~30 of 1 KiB: the block at the cut is read twice.
            assert tails < read < 0.6 * shared + tails, (read, shared, tails)
        now = h.now_micros()
        model.major_compact(now)
        assert await rows_of(left) == model.scan(now, end=key)
        assert await rows_of(right) == model.scan(now, start=key)
        for child in (left, right):
            await child.close(flush=False)
    finally:
        if pool is not None:
            pool.shutdown()
        await h.close()


def open_cores(tablet: Tablet) -> set[int]:
    return {id(t._core) for tables in tablet.state.sstables.values() for t in tables}


async def test_the_children_share_their_parents_sstable_indexes(h: TabletHarness) -> None:
    model = TabletModel(h.schema)
    await fill(h, model)
    cache = BlockCache(capacity_bytes=1 << 24)
    left, right, key = await split(h, cache)
    # One index per parent SSTable in memory, not one per child.
    assert open_cores(left) == open_cores(right)
    assert cache.open_cores == len(open_cores(left)) > 1
    for child in (left, right):
        await child.major_compact()
    gc.collect()
    # Once rewritten, each child holds only its own SSTables' indexes.
    assert cache.open_cores == len(open_cores(left) | open_cores(right))
    assert not open_cores(left) & open_cores(right)
    now = h.now_micros()
    model.major_compact(now)
    assert await rows_of(left) == model.scan(now, end=key)
    assert await rows_of(right) == model.scan(now, start=key)


async def test_writes_during_a_split_are_refused_and_a_failed_commit_resumes_them(
    h: TabletHarness,
) -> None:
    assert h.tablet is not None and h.catalog is not None
    tablet = h.tablet
    await tablet.apply(b"a", [SetCell("a", b"x", b"1")])
    await tablet.apply(b"b", [SetCell("a", b"x", b"2")])
    with pytest.raises(Fenced):
        async with tablet.splitting() as parent:
            with pytest.raises(NotServing, match="splitting"):
                await tablet.apply(b"c", [SetCell("a", b"x", b"3")])
            assert parent.size > 0 and len(tablet.state.memtable) == 0
            stale = TabletRecord(parent.table_id, parent.tablet_id, b"", None, epoch=99)
            await h.catalog.replace_tablets([stale], [stale])
    # The split failed: the tablet serves writes again.
    await tablet.apply(b"c", [SetCell("a", b"x", b"3")])
    assert (await tablet.read_row(b"c")) is not None


async def test_a_split_waits_for_writes_in_flight(h: TabletHarness) -> None:
    assert h.tablet is not None and h.log is not None
    tablet = h.tablet
    gate = asyncio.Event()

    async def stall(row: bytes, cells: object) -> None:
        await gate.wait()

    h.log.before_append = stall
    write = asyncio.ensure_future(tablet.apply(b"k", [SetCell("a", b"x", b"v")]))
    await asyncio.sleep(0)
    entered = asyncio.Event()

    async def split_body() -> TabletRecord:
        async with tablet.splitting() as parent:
            entered.set()
            raise_after = parent
        return raise_after

    splitter = asyncio.ensure_future(split_body())
    await asyncio.sleep(0.01)
    assert not entered.is_set(), "the split must wait for the write in flight"
    h.log.before_append = None
    gate.set()
    await write
    parent = await splitter
    # The write that was in flight is in the flushed SSTables the children will share.
    assert parent.redo_seq >= 1 and parent.size > 0


async def test_writes_are_served_while_the_split_writes_the_memtable_out() -> None:
    """§5.4's first minor compaction runs while the tablet serves: only the second, of what
    arrived meanwhile, has writes refused."""
    store = PutGate(MemoryObjectStore(), "tables/*")
    h = TabletHarness(store, options=OPTS)
    tablet = await h.start()
    try:
        model = TabletModel(h.schema)
        await fill(h, model)
        store.shut()
        splitter = asyncio.ensure_future(split(h))
        async with asyncio.timeout(30):
            await store.waiting.wait()  # the split's flush is stuck on its SSTable PUT
        late = [SetCell("a", b"x", b"during the flush", 9000)]
        await tablet.apply(b"r001", late)  # refused with NotServing before the change
        model.apply(b"r001", late, h.now_micros())
        store.open()
        async with asyncio.timeout(30):
            left, right, _ = await splitter
        now = h.now_micros()
        assert await rows_of(left, right) == model.scan(now)
        assert (await left.read_row(b"r001")) == model.read_row(b"r001", now)
    finally:
        await h.close()


@pytest.mark.parametrize("queued", ["merge", "major compaction"])
async def test_a_split_does_not_wait_for_compactions_queued_for_room(queued: str) -> None:
    """A merge or major compaction waiting for room in the worker's compaction budget gives up
    when its tablet starts to split (the children rewrite its SSTables anyway): the split does
    not wait for every other tablet's compactions, writes refused all the while."""
    budget = CompactionBudget(1)
    options = TabletOptions(memtable_flush_bytes=1 << 30, max_sstables_per_group=2)
    h = TabletHarness(MemoryObjectStore(), options=options, compaction_budget=budget)
    tablet = await h.start()
    try:
        model = TabletModel(h.schema)
        await fill(h, model)  # three SSTables per group: a merge is due
        major = None
        async with budget.hold(1):  # another tablet's long compaction
            if queued == "merge":
                tablet._compactions.spawn_flush()  # minor, then the merge: it waits for room
            else:
                major = asyncio.ensure_future(tablet.major_compact())
            await until(lambda: budget.waiting == 1)
            async with asyncio.timeout(30):  # before the change: until the room is free
                left, right, _ = await split(h)
            assert budget.waiting == 0, "it left the queue"
        if major is not None:
            with pytest.raises((NotServing, Unavailable)):
                await major
        assert await rows_of(left, right) == model.scan(h.now_micros())
    finally:
        await h.close()


async def test_a_failed_split_resumes_its_tablets_merges(h: TabletHarness) -> None:
    assert h.tablet is not None and h.catalog is not None
    tablet = h.tablet
    catalog = h.catalog

    async def failed_split() -> None:
        with pytest.raises(Fenced):
            async with tablet.splitting() as parent:
                stale = TabletRecord(parent.table_id, parent.tablet_id, b"", None, epoch=99)
                await catalog.replace_tablets([stale], [stale])

    await tablet.apply(b"a", [SetCell("a", b"x", b"1")])
    await failed_split()
    # Merges and major compactions run again, and another split may start.
    for i in range(10):
        await tablet.apply(b"b", [SetCell("a", b"x", b"%d" % i)])  # overlapping SSTables
        await tablet.minor_compact()
    await tablet.merge_if_needed()
    assert len(tablet.record.sstables["hot"]) <= OPTS.max_sstables_per_group
    await tablet.major_compact()
    assert len(tablet.record.sstables["hot"]) == 1
    await failed_split()


async def test_merge_two_tablets_back_into_one(h: TabletHarness) -> None:
    model = TabletModel(h.schema)
    await fill(h, model)
    left, right, _ = await split(h)
    for child in (left, right):
        await child.major_compact()
    model.major_compact(h.now_micros())
    await left.apply(b"r001", [SetCell("a", b"x", b"after-split", 9000)])
    model.apply(b"r001", [SetCell("a", b"x", b"after-split", 9000)], h.now_micros())
    for child in (left, right):
        await child.close(flush=True)
        assert child.record.logs == (), "a flushed unload leaves nothing to replay"
    assert h.catalog is not None
    stored = await h.catalog.list_tablets(h.table_id)
    pair = merging.small_pairs(stored, 1 << 30)
    assert len(pair) == 1
    merged = merging.merged_record(pair[0], tablet_id="merged", at=h.clock.time())
    await h.catalog.replace_tablets(list(stored), [merged])
    assert [r.tablet_id for r in await h.catalog.list_tablets(h.table_id)] == ["merged"]
    tablet = await load(h, merged)
    assert await rows_of(tablet) == model.scan(h.now_micros())
    await tablet.major_compact()
    assert await rows_of(tablet) == model.scan(h.now_micros())


async def test_split_key_inside_a_single_block(h: TabletHarness) -> None:
    assert h.tablet is not None
    for i in range(20):
        await h.tablet.apply(b"k%02d" % i, [SetCell("b", b"y", b"v")])
    await h.tablet.minor_compact()
    blocks = [
        b for tables in h.tablet.state.sstables.values() for t in tables for b in t.footer.blocks
    ]
    assert len(blocks) == 1  # the whole tablet in one block
    assert await h.tablet.split_key() == b"k10"
