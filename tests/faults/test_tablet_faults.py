"""The tablet under faults at its crash boundaries (§5.3, §5.4; docs/architecture/design.md §6, §9).

Every test drives a :class:`~tabletstore.engine.tablet.Tablet` built by tests/tablet_harness.py over
each backend (memory, file, S3 on moto) wrapped in a FaultyObjectStore, and checks it against
the dict model after the fault and after a crash and recovery:

* an SSTable PUT fails during a minor compaction (called directly: the error is returned and
  the next compaction writes everything; in the background: it is retried, the tablet takes
  writes until its memtables reach their limit and serves reads, and once the store heals the
  same tablet takes writes again, without a reload);
* an ambiguous record update in a background compaction marks the tablet failed, to be
  reloaded (its worker does so; here the harness), and nothing acknowledged is lost; a
  background merge that cannot read an input fails that merge only, not the tablet;
* the catalog update fails after the SSTable upload (minor and merging compactions);
* a corrupted SSTable block: reads raise Corruption, never return wrong data;
* a crash after acknowledging writes and before any flush (twice in a row);
* a write in flight while the memtable freezes: the redo point stays below it;
* a zombie tablet (its worker lost the tablet) cannot commit a compaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tabletstore.data.model import DeleteCells, DeleteRow, Mutation, Row, SetCell
from tabletstore.data.query import RowRange
from tabletstore.errors import Corruption, Fenced, Indeterminate, Unavailable
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import TabletRecord
from tabletstore.options import TabletOptions
from tabletstore.storage_s3.base import ObjectStore, Op
from tabletstore.testing.faulty_store import FaultyObjectStore
from tests.tablet_harness import SECOND, TabletHarness, TabletModel, until

BIG = TabletOptions(memtable_flush_bytes=1 << 30, max_sstables_per_group=2)


@pytest.fixture
async def faulty(object_store: ObjectStore) -> FaultyObjectStore:
    return FaultyObjectStore(object_store)


@pytest.fixture
async def harness(faulty: FaultyObjectStore) -> AsyncIterator[TabletHarness]:
    h = TabletHarness(faulty, options=BIG)
    await h.start()
    yield h
    faulty.clear()
    await h.close()


def row_mutation(i: int, now: int) -> list[Mutation]:
    muts: list[Mutation] = [
        SetCell("a", b"q%d" % (i % 3), b"a%d" % i),
        SetCell("b", b"x", b"b%d" % i * 40, now - (i % 4) * SECOND),
        SetCell("c", b"y", b"c%d" % i),
    ]
    if i % 7 == 3:
        muts.append(DeleteCells("a", b"q0"))
    if i % 11 == 5:
        muts = [DeleteRow(), *muts[:1]]
    return muts


async def write(h: TabletHarness, model: TabletModel, lo: int, hi: int) -> None:
    assert h.tablet is not None
    for i in range(lo, hi):
        row = b"r%03d" % (i % 37)
        muts = row_mutation(i, h.now_micros())
        await h.tablet.apply(row, muts)
        model.apply(row, muts, h.now_micros())


async def check(h: TabletHarness, model: TabletModel) -> None:
    assert h.tablet is not None
    now = h.now_micros()
    assert await h.scan_all() == model.scan(now)
    for row in sorted(model.rows)[::5]:
        assert await h.tablet.read_row(row) == model.read_row(row, now)


class FlakyCatalog:
    """A catalog whose next ``fail`` updates raise ``error`` (the coordinator is away)."""

    def __init__(self, inner: Catalog) -> None:
        self.inner = inner
        self.fail = 0
        self.error: Exception = Unavailable("injected: coordinator unreachable")

    async def update(
        self, old: TabletRecord, new: TabletRecord, *, wait: float | None = None
    ) -> TabletRecord:
        if self.fail:
            self.fail -= 1
            raise self.error
        return await self.inner.update(old, new, wait=wait)


# ---------------------------------------------------------------------------------------------


async def test_failed_sstable_put_in_a_minor_compaction_loses_nothing(
    harness: TabletHarness, faulty: FaultyObjectStore
) -> None:
    h, model = harness, TabletModel(harness.schema)
    await write(h, model, 0, 40)
    faulty.fail(Op.PUT, key="tables/*")
    assert h.tablet is not None
    with pytest.raises(Unavailable):
        await h.tablet.minor_compact()
    await check(h, model)  # the frozen memtable still serves reads
    # A direct compaction's error goes to its caller; the write path keeps working.
    await write(h, model, 40, 60)
    await h.tablet.minor_compact()  # writes both memtables out
    assert not h.tablet.state.frozen
    await check(h, model)
    await h.recover()
    await check(h, model)


async def test_a_failing_background_flush_is_retried_and_the_tablet_takes_writes_again(
    faulty: FaultyObjectStore,
) -> None:
    """One transient store failure (a 503 storm, a timeout) used to make the tablet refuse
    every write until it was reloaded. Now the flush is retried: writes go on while the
    memtables fit their limit, are refused naming the failure past it, and the same tablet
    takes them again once the store heals."""
    limit = 64_000
    options = TabletOptions(memtable_flush_bytes=2000, memtable_limit_bytes=limit)
    h = TabletHarness(faulty, options=options)
    tablet = await h.start()
    model = TabletModel(h.schema)
    faulty.fail(Op.PUT, key="tables/*", times=None)
    try:
        i = 0
        while not tablet.state.frozen:  # a background flush starts
            await write(h, model, i, i + 1)
            i += 1
        await until(lambda: tablet._core.flush_failure is not None)
        failed_at = i
        async with asyncio.timeout(60):
            while True:
                try:
                    await write(h, model, i, i + 1)
                except Unavailable as exc:
                    refused = exc
                    break
                i += 1
                await asyncio.sleep(0)  # the background compaction's turn
        assert "writing them out fails" in str(refused), refused
        assert tablet.must_reload is None
        assert i > failed_at  # refused only past the limit, not at the failure
        assert tablet._core.memtable_bytes() >= limit
        await check(h, model)  # reads are served from the memtables
        faulty.clear()
        # A retry writes the memtables out: the same tablet takes writes, never reloaded.
        async with asyncio.timeout(60):
            while tablet._core.flush_failure is not None:
                try:
                    await write(h, model, i, i + 1)
                except Unavailable:
                    await asyncio.sleep(0.05)
                else:
                    i += 1
        assert h.tablet is tablet and tablet.must_reload is None
        await write(h, model, i, i + 40)
        await h.settle()
        assert tablet._core.flush_failure is None
        await check(h, model)
        await h.recover()  # and the SSTables and the log hold every acknowledged write
        await check(h, model)
    finally:
        faulty.clear()
        await h.close()


async def test_an_ambiguous_record_update_in_a_background_flush_fails_the_tablet(
    faulty: FaultyObjectStore,
) -> None:
    """Retrying against a record that may have changed would commit on a stale one: the
    tablet fails instead (its worker reloads it), and a reload loses nothing."""
    flaky: list[FlakyCatalog] = []

    def wrap(c: Catalog) -> FlakyCatalog:
        flaky.append(FlakyCatalog(c))
        return flaky[-1]

    h = TabletHarness(faulty, options=TabletOptions(memtable_flush_bytes=2000), wrap_catalog=wrap)
    tablet = await h.start()
    model = TabletModel(h.schema)
    failed: list[object] = []
    tablet.on_failed = failed.append
    flaky[-1].fail, flaky[-1].error = 1, Indeterminate("injected: the record update's answer")
    try:
        i = 0
        async with asyncio.timeout(60):
            while tablet.must_reload is None:
                try:
                    await write(h, model, i, i + 1)
                except Unavailable as exc:
                    # It waited for the flush (the memtable limit) that failed the tablet.
                    assert "must be reloaded" in str(exc)
                    break
                await asyncio.sleep(0)
                i += 1
        assert failed == [tablet]
        with pytest.raises(Unavailable, match="must be reloaded"):
            await write(h, model, i, i + 1)
        await check(h, model)
        await h.recover()
        await check(h, model)
    finally:
        await h.close()


async def test_a_failing_background_merge_leaves_the_tablet_writable(
    faulty: FaultyObjectStore,
) -> None:
    """A merge reads its inputs back: one it cannot read (a corrupt SSTable) fails that merge
    only, never the tablet, whose memtable is in SSTables already."""
    options = TabletOptions(memtable_flush_bytes=2000, max_sstables_per_group=2)
    h = TabletHarness(faulty, options=options)
    tablet = await h.start()
    model = TabletModel(h.schema)
    try:
        i = 0
        async with asyncio.timeout(60):
            while not tablet.record.sstables:
                await write(h, model, i, i + 1)
                await asyncio.sleep(0)
                i += 1
            first = min(ref.key for refs in tablet.record.sstables.values() for ref in refs)
            # Every merge of its group reads this SSTable whole, and cannot.
            bad = faulty.fail(Op.GET, key=first, exc=Corruption("injected: bad"), times=None)
            while bad.fired < 2:
                await write(h, model, i, i + 1)
                await asyncio.sleep(0)
                i += 1
        await h.settle()
        assert tablet.must_reload is None and tablet.flush_failure is None
        await write(h, model, i, i + 20)
        faulty.clear()
        await h.settle()
        await check(h, model)
        await h.recover()
        await check(h, model)
    finally:
        faulty.clear()
        await h.close()


@pytest.mark.parametrize("stage", ["minor", "merging"])
async def test_catalog_failure_after_sstable_upload_loses_nothing(
    faulty: FaultyObjectStore, stage: str
) -> None:
    flaky: list[FlakyCatalog] = []

    def wrap(c: Catalog) -> FlakyCatalog:
        flaky.append(FlakyCatalog(c))
        return flaky[-1]

    h = TabletHarness(faulty, options=BIG, wrap_catalog=wrap)
    tablet = await h.start()
    model = TabletModel(h.schema)
    try:
        for k in range(3 if stage == "merging" else 0):
            await write(h, model, 20 * k, 20 * k + 20)
            await tablet.minor_compact()
        before = await h.record()
        await write(h, model, 60, 80)
        flaky[-1].fail = 1
        puts = faulty.calls[Op.PUT]
        with pytest.raises(Unavailable, match="coordinator unreachable"):
            if stage == "minor":
                await tablet.minor_compact()
            else:
                await tablet.minor_compact()  # succeeds: 3 SSTables per group
                flaky[-1].fail = 1
                await tablet.merge_if_needed()
        assert faulty.calls[Op.PUT] > puts  # the SSTable was uploaded
        if stage == "minor":
            assert (await h.record()).sstables == before.sstables
        await check(h, model)
        await write(h, model, 80, 90)
        await tablet.minor_compact()
        await tablet.merge_if_needed()
        await check(h, model)
        await h.recover()
        await check(h, model)
    finally:
        await h.close()


async def test_corrupted_sstable_block_is_corruption_never_wrong_data(
    harness: TabletHarness, faulty: FaultyObjectStore
) -> None:
    h, model = harness, TabletModel(harness.schema)
    await write(h, model, 0, 80)
    assert h.tablet is not None
    await h.tablet.minor_compact()
    await check(h, model)
    # Every read of the cold group's SSTable returns a flipped byte.
    faulty.corrupt(key="tables/*/cold/*")
    row = sorted(model.rows)[3]
    with pytest.raises(Corruption):
        await h.tablet.read_row(row)
    got = []
    with pytest.raises(Corruption):
        async for r in h.tablet.scan(RowRange.all()):
            got.append(r)
    # The hot group is in memory, so reading only it still works and is right.
    expected = model.read_row(row, h.now_micros())
    assert expected is not None and expected.cells_of("a")
    assert await h.tablet.read_row(row, families={"a"}) == Row(row, expected.cells_of("a"))
    with pytest.raises(Corruption):
        await h.tablet.major_compact()
    faulty.clear()
    # Nothing bad was cached or committed: once the bytes read right again, so does the tablet.
    await check(h, model)
    # A single corrupted read fails that read only.
    faulty.corrupt(key="tables/*/cold/*", times=1)
    with pytest.raises(Corruption):
        await h.tablet.read_row(row)
    assert await h.tablet.read_row(row) == model.read_row(row, h.now_micros())


async def test_crash_before_any_flush_replays_every_acknowledged_write(
    harness: TabletHarness,
) -> None:
    h, model = harness, TabletModel(harness.schema)
    await write(h, model, 0, 150)
    await h.recover()
    await check(h, model)
    await write(h, model, 150, 200)
    await h.recover()  # twice without a flush: the record lists both old logs
    assert len((await h.record()).logs) == 3
    await check(h, model)
    assert h.tablet is not None
    await h.tablet.minor_compact()
    assert h.log is not None and (await h.record()).logs == (h.log.log_ref,)
    await write(h, model, 200, 220)
    await h.recover()
    await check(h, model)


async def test_redo_point_stays_below_a_write_in_flight_at_freeze(
    harness: TabletHarness,
) -> None:
    h, model = harness, TabletModel(harness.schema)
    tablet, log = h.tablet, h.log
    assert tablet is not None and log is not None
    await write(h, model, 0, 10)
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def stall(row: bytes, cells: object) -> None:
        if row == b"slow":
            entered.set()
            await gate.wait()

    log.before_append = stall
    now = h.now_micros()
    slow = asyncio.ensure_future(tablet.apply(b"slow", [SetCell("a", b"q", b"late")]))
    await entered.wait()  # its sequence number is allocated; it is not logged yet
    slow_seq = min(tablet._core.in_flight)
    await write(h, model, 10, 20)  # later seqs, logged and in the memtable
    await tablet.minor_compact()  # freezes with the slow write still in flight
    record = await h.record()
    assert record.redo_seq == slow_seq - 1
    gate.set()
    await slow
    model.apply(b"slow", [SetCell("a", b"q", b"late")], now)
    log.before_append = None
    await h.recover()
    await check(h, model)
    assert h.tablet is not None
    assert await h.tablet.read_row(b"slow") == model.read_row(b"slow", h.now_micros())


async def test_a_zombie_tablet_cannot_commit_a_compaction(harness: TabletHarness) -> None:
    h, model = harness, TabletModel(harness.schema)
    await write(h, model, 0, 30)
    zombie = h.tablet
    assert zombie is not None
    await h.recover()  # a new owner took the tablet (new epoch)
    await write(h, model, 30, 40)
    before = await h.record()
    with pytest.raises(Fenced):
        await zombie.minor_compact()
    assert (await h.record()).sstables == before.sstables
    await check(h, model)


async def test_writes_wait_while_a_slow_flush_holds_the_memtable_limit(
    faulty: FaultyObjectStore,
) -> None:
    """A minor compaction that is slow (its PUT takes 0.3 s), not failing: the memtables held
    stay within ``memtable_limit_bytes`` (plus the one write that crossed it) because writes
    wait for the flush (LevelDB's MakeRoomForWrite) instead of growing the memtable for as
    long as the flush takes; every write is acknowledged and reads back."""
    limit = 8000
    options = TabletOptions(memtable_flush_bytes=2000, memtable_limit_bytes=limit)
    h = TabletHarness(faulty, options=options)
    tablet = await h.start()
    model = TabletModel(h.schema)
    faulty.delay(0.3, Op.PUT, key="tables/*")
    held: list[int] = []
    try:
        for i in range(120):
            await write(h, model, i, i + 1)
            held.append(tablet._core.memtable_bytes())
        assert max(held) < limit + 1000, max(held)
        faulty.clear()
        await h.settle()
        await check(h, model)
    finally:
        faulty.clear()
        await h.close()
