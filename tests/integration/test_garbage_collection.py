"""Garbage collection end to end (docs/architecture/design.md §6 rule 5, §9's last invariant).

On the embedded default: compactions, a deleted table and a restart leave garbage; one
collection deletes exactly that garbage and every row still reads back. On a catalog whose
records still list a dead worker's log: its segments and fence are never deleted.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tabletstore.clock import ManualClock, SystemClock
from tabletstore.commitlog import fence
from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.model import SetCell
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.embedded import Database
from tabletstore.master import gc_plan as gc
from tabletstore.master.gc import GarbageCollector, GcReport, collect, list_objects, mark
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.memory import MemoryObjectStore


async def _keys(db: Database, prefix: str) -> set[str]:
    return {info.key async for info in db.store.list(prefix)}


async def _referenced(db: Database, table_id: str) -> set[str]:
    return {
        ref.key
        for rec in await db.master.catalog.list_tablets(table_id)
        for refs in rec.sstables.values()
        for ref in refs
    }


async def _write(db: Database, table: str, rows: range, value: bytes) -> None:
    t = db.table(table)
    for i in rows:
        await t.mutate_row(f"row{i:04d}".encode(), [SetCell("f", b"q", value)])


async def _check_rows(db: Database, table: str, expected: dict[bytes, bytes]) -> None:
    got = {row.key: row.latest("f", b"q") async for row in db.table(table).read_rows()}
    assert got == expected


async def test_collect_deletes_exactly_the_garbage_and_rows_survive(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    expected: dict[bytes, bytes] = {}
    async with await Database.open(url) as db:
        await db.create_table("t", ["f"])
        await db.create_table("gone", ["f"])
        for batch in range(3):  # three minor compactions, then a major one: 3 SSTables garbage
            await _write(db, "t", range(batch * 10, batch * 10 + 10), b"v%d" % batch)
            await db.flush("t")
        await db.compact("t")
        expected.update({f"row{i:04d}".encode(): b"v%d" % (i // 10) for i in range(30)})
        await _write(db, "gone", range(5), b"x")
        await db.flush("gone")
        gone_id = (await db.master.catalog.get_table("gone")).table_id
        await db.delete_table("gone")
        # Within the grace period nothing is deleted.
        young = await db.gc()
        assert young.deleted == 0 and young.counts.get(gc.Reason.KEEP_YOUNG)
        first = _incarnation(db)

    # Two restarts: the second incarnation fences the first and, once every tablet has been
    # flushed under it (closing flushes), no record lists the first log any more.
    async with await Database.open(url) as db:
        await _write(db, "t", range(30, 35), b"new")
        await db.flush("t")
        expected.update({f"row{i:04d}".encode(): b"new" for i in range(30, 35)})
    async with await Database.open(url) as db:
        current = _incarnation(db)
        assert current.incarnation == first.incarnation + 2
        t_id = (await db.master.catalog.get_table("t")).table_id
        old_log = layout.log_prefix(first.worker_id, first.incarnation)
        listed = await list_objects(db.store)
        live = await mark(db.master.catalog, db.coordinator, db.store, listed)
        assert first not in live.logs, "every tablet was flushed since the first incarnation"
        sstables = {o.key for o in listed if o.key.startswith(layout.TABLES)}
        finished_logs = {
            o.key
            for o in listed
            if o.key.startswith(layout.LOGS)
            and (ref := _log_of(o.key)) not in live.logs
            and ref != current
        }
        assert await _keys(db, old_log) <= finished_logs
        garbage = (sstables - live.sstables) | finished_logs
        assert len(await _keys(db, layout.tables_prefix(t_id)) - live.sstables) >= 3
        assert await _keys(db, layout.tables_prefix(gone_id)) <= garbage
        assert await _keys(db, old_log)

        dry = await db.gc(grace=0, fence_grace=0, dry_run=True)
        assert dry.dry_run and set(dry.deleted_keys) == garbage
        assert await _keys(db, old_log)  # a dry run deletes nothing

        report = await db.gc(grace=0, fence_grace=0)
        assert set(report.deleted_keys) == garbage
        assert report.deleted == len(garbage) and report.deleted_bytes > 0
        assert report.unknown == ()
        assert await _keys(db, layout.tables_prefix(t_id)) == await _referenced(db, t_id)
        assert await _keys(db, layout.tables_prefix(gone_id)) == set()
        assert await _keys(db, old_log) == set()
        assert {o.key async for o in db.store.list("")} == {o.key for o in listed} - garbage
        await _check_rows(db, "t", expected)
        assert (await db.gc(grace=0, fence_grace=0)).deleted == 0

    async with await Database.open(url) as db:  # and after another recovery
        await _check_rows(db, "t", expected)


def _log_of(key: str) -> LogRef:
    parsed = layout.parse_log_segment_key(key)
    return LogRef(parsed.worker_id, parsed.incarnation)


def _incarnation(db: Database) -> LogRef:
    """The embedded worker's current commit log."""
    log = db.worker._log
    assert log is not None
    return log.log_ref


async def test_fence_lingers_after_its_log_is_collected(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    async with await Database.open(url) as db:
        await db.create_table("t", ["f"])
        await _write(db, "t", range(3), b"v")
        first = _incarnation(db)
    async with await Database.open(url) as db:  # closing flushes under the second log
        await _write(db, "t", range(3, 6), b"v")
    async with await Database.open(url) as db:
        old_log = layout.log_prefix(first.worker_id, first.incarnation)
        await fence(db.store, first.worker_id, first.incarnation)  # as recovery does
        fences = {info.key async for info in db.store.list(old_log) if info.size == 0}
        assert fences and await _keys(db, old_log) - fences
        report = await db.gc(grace=0)  # the default fence grace is a day
        assert await _keys(db, old_log) == fences
        assert report.counts[gc.Reason.KEEP_FENCE] == len(fences)


def _record(table_id: str, tablet_id: str, logs: tuple[LogRef, ...]) -> TabletRecord:
    return TabletRecord(table_id, tablet_id, b"", None, logs=logs)


async def test_log_and_fence_of_an_unrecovered_worker_are_kept() -> None:
    """A worker died; its tablets' records still list its log (recovery not finished): its
    segments and the fence recovery created must survive any number of collections."""
    coord = MemoryCoordinator()
    store = MemoryObjectStore("memory://gc-dead-worker", shared=False)
    catalog = Catalog(coord)
    dead = LogRef("dead", 7)
    schema = TableSchema(name="t", families={"f": ColumnFamily(name="f")})
    await catalog.create_table(schema, [_record("t-1", "t0", (dead,))])
    needed = [layout.log_segment_key("dead", 7, i) for i in range(3)]
    fence = layout.log_segment_key("dead", 7, 3)
    done = [layout.log_segment_key("dead", 6, i) for i in range(2)]
    for key in (*needed, *done):
        await store.create(key, b"segment bytes")
    await store.create(fence, b"")
    await store.create("stray/object", b"?")
    clock = SystemClock()
    try:
        for _ in range(2):
            report = await collect(store, catalog, coord, clock=clock, grace=0, fence_grace=0)
            remaining = {info.key async for info in store.list("")}
            assert {*needed, fence, "stray/object"} == remaining
            assert report.unknown == ("stray/object",)
        assert set(report.deleted_keys) <= set(done)
        # Once recovery finished (the record no longer lists the log), it is garbage.
        rec = await catalog.get_tablet("t-1", "t0")
        await catalog.update(rec, _record("t-1", "t0", ()))
        await collect(store, catalog, coord, clock=clock, grace=0, fence_grace=0)
        assert {info.key async for info in store.list("")} == {"stray/object"}
    finally:
        await store.close()
        await coord.close()


async def test_live_workers_current_log_is_kept_even_if_no_record_lists_it() -> None:
    """A live worker's current incarnation (``settings/incarnation.<worker>``) is written to
    before any record lists it; its older incarnations are garbage once unlisted."""
    coord = MemoryCoordinator()
    store = MemoryObjectStore("memory://gc-live-worker", shared=False)
    catalog = Catalog(coord)
    await coord.put(paths.server("w"), b"127.0.0.1:1")
    await coord.put(paths.setting("incarnation.w"), b"3")
    await coord.put(paths.server("v"), b"127.0.0.1:2")  # no incarnation counter: keep all
    current = [layout.log_segment_key("w", 3, i) for i in range(2)]
    older = [layout.log_segment_key("w", 2, i) for i in range(2)]
    unknown_incarnation = [layout.log_segment_key("v", 0, 0), layout.log_segment_key("v", 1, 0)]
    for key in (*current, *older, *unknown_incarnation):
        await store.create(key, b"segment bytes")
    try:
        report = await collect(store, catalog, coord, clock=SystemClock(), grace=0, fence_grace=0)
        assert set(report.deleted_keys) == set(older)
        assert report.counts[gc.Reason.KEEP_LIVE_LOG] == 4
        assert {info.key async for info in store.list("")} == {*current, *unknown_incarnation}
    finally:
        await store.close()
        await coord.close()


async def test_master_collector_holds_garbage_for_a_grace_after_finding_it() -> None:
    coord = MemoryCoordinator()
    store = MemoryObjectStore("memory://gc-collector", shared=False)
    catalog = Catalog(coord)
    key = layout.sstable_key("t-1", "t0", "default", "old")
    await store.create(key, b"sstable")
    clock = ManualClock(start=time.time() + 10.0)  # the store stamps objects with wall time
    reports: list[GcReport] = []
    collector = GarbageCollector(
        store, catalog, coord, clock=clock, interval=1.0, grace=5.0, on_report=reports.append
    )
    try:
        first = await collector.maybe_run()
        assert first is not None and first.deleted == 0
        assert first.counts == {gc.Reason.KEEP_RECENTLY_UNREFERENCED: 1}
        assert await collector.maybe_run() is None  # within the interval
        clock.advance(5.0)
        second = await collector.maybe_run()
        assert second is not None and second.deleted_keys == (key,)
        assert await store.head(key) is None
        assert [r.deleted for r in reports] == [0, 1]
    finally:
        await collector.close()
        await store.close()
        await coord.close()


async def test_a_new_leaders_collector_goes_on_from_the_last_ones_memory() -> None:
    """A master that starts leading adopts when the last leader found each object deletable,
    so garbage is collected although the leader changes more often than a grace period."""
    coord = MemoryCoordinator()
    store = MemoryObjectStore("memory://gc-new-leader", shared=False)
    catalog = Catalog(coord)
    key = layout.sstable_key("t-1", "t0", "default", "old")
    await store.create(key, b"sstable")
    later = layout.sstable_key("t-1", "t0", "default", "later")
    clock = ManualClock(start=time.time() + 10.0)  # the store stamps objects with wall time

    def leader() -> GarbageCollector:
        return GarbageCollector(store, catalog, coord, clock=clock, interval=1.0, grace=5.0)

    try:
        first = leader()
        held = await first.maybe_run()
        assert held is not None and held.deleted == 0 and set(held.since) == {key}
        await store.create(later, b"sstable")  # found by the second leader only
        clock.advance(3.0)
        second = leader()  # the first leader died; its memory is in the bucket
        report = await second.maybe_run()
        assert report is not None and report.deleted == 0 and set(report.since) == {key, later}
        clock.advance(2.5)
        third = leader()
        report = await third.maybe_run()
        assert report is not None and report.deleted_keys == (key,)
        assert report.counts[gc.Reason.KEEP_RECENTLY_UNREFERENCED] == 1  # later: 2.5 s of 5
        assert await store.head(key) is None and await store.head(later) is not None
        # A memory older than the grace is not adopted: the grace starts over.
        clock.advance(6.0)
        report = await leader().maybe_run()
        assert report is not None and report.deleted == 0 and report.since[later] == clock.time()
    finally:
        await store.close()
        await coord.close()


async def test_the_plan_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan is O(objects) of CPU: on the master's event loop, a big bucket's would stall
    the lease keep-alives past the lease (a master lost its lease every few seconds)."""
    coord = MemoryCoordinator()
    store = MemoryObjectStore("memory://gc-off-loop", shared=False)
    threads: list[threading.Thread] = []
    real = gc.plan

    def plan(*args: Any, **kwargs: Any) -> gc.GcPlan:
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(gc, "plan", plan)
    await store.create(layout.sstable_key("t-1", "t0", "default", "old"), b"sstable")
    try:
        report = await collect(store, Catalog(coord), coord, clock=SystemClock(), grace=0)
        assert report.deleted == 1
        assert threads and threads[0] is not threading.main_thread()
    finally:
        await store.close()
        await coord.close()


def test_cli_gc_reports_and_deletes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tabletstore.cli.main import main

    url = f"file://{tmp_path}"
    for argv in (
        ["createtable", "t", "families=f"],
        ["set", "t", "r1", "f:c=1"],
        ["flush", "t"],
        ["set", "t", "r2", "f:c=2"],
        ["compact", "t"],
    ):
        r = CliRunner().invoke(main, ["--url", url, *argv], catch_exceptions=False)
        assert r.exit_code == 0, r.output
    dry = CliRunner().invoke(main, ["--url", url, "gc", "--grace", "0", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would delete" in dry.output and "SSTable no record references" in dry.output
    done = CliRunner().invoke(main, ["--url", url, "gc", "--grace", "0"])
    assert done.exit_code == 0 and "deleted" in done.output.splitlines()[0], done.output
    r = CliRunner().invoke(main, ["--url", url, "lookup", "t", "r1"], catch_exceptions=False)
    assert r.exit_code == 0 and '"1"' in r.output, r.output
    bad = CliRunner().invoke(main, ["--url", url, "gc", "--grace", "-1"])
    assert bad.exit_code == 2
