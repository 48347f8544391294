"""Snapshots and the bucket-only reader (and bad input): on real data the
reader's cells equal the client's read_rows as of the snapshot, whatever happens after."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import duckdb
import pytest

from tabletstore import batch
from tabletstore.batch import reader
from tabletstore.batch.engines import duckdb_relation
from tabletstore.coordination import open_coordinator
from tabletstore.data.filters import ColumnQualifierRegex, ValueRegex
from tabletstore.data.model import DeleteRow, SetCell
from tabletstore.data.query import RowRange
from tabletstore.errors import Corruption, NotFound
from tabletstore.metadata.catalog import ClusterSettings
from tabletstore.metadata.store_location import locate_store
from tabletstore.sstable import SSTable
from tabletstore.storage_s3 import layout, open_store
from tests.batch.conftest import Loaded, cells_of


async def _read_all(store_url: str, snapshot_id: str, **kw: object) -> list[dict[str, object]]:
    snap = await batch.aopen_snapshot(store_url, snapshot_id)
    out: list[dict[str, object]] = []
    for split in await snap.asplits(max_split_bytes=kw.pop("max_split_bytes", 1 << 30)):  # type: ignore[arg-type]
        async for b in batch.aread_split(split, **kw):  # type: ignore[arg-type]
            out.extend(b.to_pylist())
    return out


async def test_snapshot_reads_as_the_client_did_at_the_cut(loaded: Loaded) -> None:
    db, t = loaded.db, loaded.db.table(loaded.table)
    expected = cells_of([r async for r in t.read_rows()])
    snap = await t.snapshot()
    # After the cut: new rows, deletes, and compactions that drop what they mask.
    await t.mutate_row(b"row001", [DeleteRow()])
    await t.mutate_row(b"row002", [SetCell("contents", b"html", b"newer", 5000)])
    await t.mutate_row(b"zzz", [SetCell("anchor", b"x", b"late")])
    await db.compact(loaded.table)
    got = await _read_all(db.store.url, snap.snapshot_id)
    assert got == expected
    assert len(snap.tablets) == 3
    # Finer splits at block boundaries (a tablet cut in several) read the same cells.
    snapshot = await batch.aopen_snapshot(db.store.url, snap.snapshot_id)
    fine = await snapshot.asplits(max_split_bytes=2048)
    assert len(fine) > len(snap.tablets)
    assert await _read_all(db.store.url, snap.snapshot_id, max_split_bytes=2048) == expected


async def test_projection_ranges_timestamps_and_filters_match_the_client(loaded: Loaded) -> None:
    db, t = loaded.db, loaded.db.table(loaded.table)
    snap = await t.snapshot()
    url = db.store.url
    want = cells_of(
        [r async for r in t.read_rows(start=b"row030", end=b"row090", families=["contents"])]
    )
    got = await _read_all(
        url, snap.snapshot_id, columns=["contents"], row_range=RowRange(b"row030", b"row090")
    )
    assert got == want
    f = ValueRegex(rb".*link 1.*")
    assert await _read_all(url, snap.snapshot_id, filter=f) == cells_of(
        [r async for r in t.read_rows(filter=f)]
    )
    only = await _read_all(url, snap.snapshot_id, columns=["anchor:site3.com"])
    assert only == cells_of(
        [r async for r in t.read_rows(filter=ColumnQualifierRegex(rb"site3\.com"))]
    )
    newest = await _read_all(
        url, snap.snapshot_id, columns=["contents"], start_ts=1001, end_ts=1002
    )
    assert newest and all(c["timestamp"] == 1001 for c in newest)


async def test_wide_shape_has_the_newest_value_of_each_column(loaded: Loaded) -> None:
    db, t = loaded.db, loaded.db.table(loaded.table)
    snap = await t.snapshot()
    cols = ["contents:html", "meta:len"]
    rows = await _read_all(db.store.url, snap.snapshot_id, shape="wide", columns=cols)
    expected = []
    async for r in t.read_rows(families=["contents", "meta"]):
        newest: dict[str, bytes] = {}
        for c in r.cells:
            newest.setdefault(f"{c.family}:{c.qualifier.decode()}", c.value)
        expected.append({"row": r.key, **{c: newest.get(c) for c in cols}})
    assert rows == expected


async def test_duckdb_relation_equals_the_client(loaded: Loaded) -> None:
    db, t = loaded.db, loaded.db.table(loaded.table)
    snap = await t.snapshot()
    con = duckdb.connect()
    # The sync reader runs its own event loop: call it off this one.
    await asyncio.to_thread(duckdb_relation, con, db.store.url, snap.snapshot_id, view="web")
    got = con.sql("select * from web order by row, family, qualifier, timestamp desc").fetchall()
    want = [tuple(c.values()) for c in cells_of([r async for r in t.read_rows()])]
    assert [(bytes(a), b, bytes(c), d, bytes(e)) for a, b, c, d, e in got] == want
    per_domain = await asyncio.to_thread(
        lambda: con.sql(
            "select qualifier, count(*) from web where family = 'anchor' group by 1 order by 1"
        ).fetchall()
    )
    assert sum(n for _, n in per_domain) == sum(1 for c in want if c[1] == "anchor")


async def test_snapshots_are_listed_pinned_by_gc_and_expire(loaded: Loaded) -> None:
    db, t = loaded.db, loaded.db.table(loaded.table)
    keep = await t.snapshot()
    short = await t.snapshot(ttl=0.5)
    assert [m.snapshot_id for m in await db.list_snapshots(loaded.table)] == [
        keep.snapshot_id,
        short.snapshot_id,
    ]
    await db.compact(loaded.table)  # every SSTable the snapshots name is replaced
    assert short.expires_at is not None
    await asyncio.sleep(max(0.0, short.expires_at - time.time()) + 0.01)  # until it expires
    await db.gc(grace=0)  # deletes the expired manifest only; its SSTables stay this round
    assert [m.snapshot_id for m in await db.list_snapshots(loaded.table)] == [keep.snapshot_id]
    await db.gc(grace=0)
    # The kept snapshot still reads whole: GC left every SSTable it names.
    expected = await _read_all(db.store.url, keep.snapshot_id)
    assert expected and all([await db.store.head(k) is not None for k in keep.sstable_keys()])
    await db.delete_snapshot(keep.snapshot_id)
    await db.gc(grace=0)
    gone = [k for k in keep.sstable_keys() if await db.store.head(k) is None]
    assert gone, "deleting the snapshot must free what only it kept"
    with pytest.raises(NotFound, match="which is gone"):
        await _read_all_manifest(db, keep)


async def _read_all_manifest(db: object, manifest: batch.SnapshotManifest) -> None:
    snap = batch.Snapshot(db.store.url, manifest)  # type: ignore[attr-defined]
    for split in await snap.asplits():
        async for _ in batch.aread_split(split):
            pass


async def test_bad_input_names_the_problem(loaded: Loaded) -> None:
    db = loaded.db
    with pytest.raises(NotFound, match="nosuch"):
        await db.snapshot("nosuch")
    with pytest.raises(NotFound, match="no snapshot 's-missing'"):
        await batch.aopen_snapshot(db.store.url, "s-missing")
    snap = await db.snapshot(loaded.table)
    bad = layout.snapshot_key(snap.table_id, "s-corrupt")
    doc = json.loads(snap.to_bytes())
    doc["tablets"] = doc["tablets"][1:]
    await db.store.create(bad, json.dumps(doc).encode())
    with pytest.raises(Corruption, match=r"s-corrupt\.json"):
        await batch.aopen_snapshot(db.store.url, "s-corrupt")


async def test_the_database_url_opens_its_snapshots(loaded: Loaded) -> None:
    """open_snapshot takes the embedded database's URL and directory as well as the store
    URL of its objects; a missing snapshot names the store searched and the database."""
    db = loaded.db
    snap = await db.snapshot(loaded.table)
    expected = await _read_all(db.store.url, snap.snapshot_id)
    directory = db.url.removeprefix("file://")
    for url in (db.url, directory, f"file://{directory}/"):
        opened = await batch.aopen_snapshot(url, snap.snapshot_id)
        assert opened.store_url == db.store.url
        assert await _read_all(url, snap.snapshot_id) == expected
    with pytest.raises(NotFound) as missing:
        await batch.aopen_snapshot(db.url, "s-missing")
    assert f"in the store {db.store.url} (the objects of database {db.url})" in str(missing.value)


async def test_a_cluster_url_resolves_to_the_store_its_master_recorded(etcd_server: str) -> None:
    url = f"etcd://{etcd_server}/locate-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotFound, match="no cluster is set up"):
        await batch.aopen_snapshot(url, "s-any")
    store_url = "memory://located-store"
    coordinator = open_coordinator(url)
    try:
        await ClusterSettings(store_url=store_url).save(coordinator)
    finally:
        await coordinator.close()
    location = await locate_store(url)
    assert location.url == store_url
    with pytest.raises(NotFound) as missing:
        await batch.aopen_snapshot(url, "s-missing")
    assert f"in the store {store_url} (the objects of database {url})" in str(missing.value)


async def test_writes_racing_the_cut_fall_wholly_on_one_side(loaded: Loaded) -> None:
    """A writer runs while snapshots are taken: every write acknowledged before the call is
    in, none started after it returned, and a write held at the cut (it waited for the
    hold, then landed in the memtable before the snapshot's SSTables were written) is
    excluded by the tablet's seq mark."""
    db, t = loaded.db, loaded.db.table(loaded.table)
    acked: list[tuple[int, float, float]] = []  # (n, started, acknowledged)
    stop = asyncio.Event()
    progress = asyncio.Event()

    async def writer() -> None:
        n = 0
        while not stop.is_set():
            started = time.monotonic()
            await t.mutate_row(b"race%05d" % n, [SetCell("anchor", b"n", b"%d" % n)])
            acked.append((n, started, time.monotonic()))
            progress.set()
            n += 1

    task = asyncio.create_task(writer())
    try:
        for _ in range(3):
            target = len(acked) + 20
            while len(acked) < target:
                progress.clear()
                await progress.wait()
            before = time.monotonic()
            snap = await t.snapshot()
            after = time.monotonic()
            rows = {
                c["row"]
                for c in await _read_all(db.store.url, snap.snapshot_id, columns=["anchor:n"])
            }
            for n, started, done in list(acked):
                key = b"race%05d" % n
                if done < before:
                    assert key in rows, f"write {n} acknowledged before the snapshot is missing"
                if started > after:
                    assert key not in rows, f"write {n} started after the snapshot is in it"
    finally:
        stop.set()
        await task


async def test_a_write_held_at_the_cut_is_after_it(loaded: Loaded) -> None:
    db, t = loaded.db, loaded.db.table(loaded.table)
    tablet = next(
        x
        for (tid, _), x in db.worker.tablets.items()
        if x.contains(b"row001") and tid != "METADATA" and x.record.table_id.startswith("web")
    )
    cut = await tablet.hold_for_snapshot(10.0)
    write = asyncio.create_task(t.mutate_row(b"row001", [DeleteRow()]))
    await asyncio.sleep(0.05)
    assert not write.done(), "a write must wait while the cut holds"
    assert tablet.release_snapshot_hold(cut)
    await write  # now in the memtable the cut captured, with a seq past the mark
    sstables = await tablet.write_snapshot(cut)
    seqs = [r.max_seq for refs in sstables.values() for r in refs]
    assert max(seqs) <= cut.mark


@pytest.mark.parametrize("compacted", [False, True])
async def test_the_arrow_path_reads_what_the_per_cell_path_reads(
    loaded: Loaded, compacted: bool
) -> None:
    """Before a major compaction (deletion entries, versions to collect) and after it,
    every split takes the Arrow path and reads exactly what the per-cell engine path reads,
    in every projection."""
    db, t = loaded.db, loaded.db.table(loaded.table)
    if compacted:
        await db.compact(loaded.table)
        await t.mutate_row(b"row002", [SetCell("anchor", b"site2.com", b"again", 1)])
    snap = await batch.aopen_snapshot(db.store.url, (await t.snapshot()).snapshot_id)
    took_arrow = 0
    for kw in (
        {"columns": ["anchor", "meta"]},
        {"columns": ["anchor:site3.com", "meta"], "start_ts": 0, "end_ts": 1 << 62},
        {"columns": ["anchor"], "row_range": RowRange(b"row010", b"row095")},
        {},
        {"shape": "wide", "columns": ["anchor:site3.com", "meta:len", "anchor:site4.com"]},
        {"shape": "wide", "columns": ["meta:len"], "start_ts": 0, "end_ts": 1 << 62},
        {"shape": "wide", "columns": ["anchor:nosuch.com"]},
    ):
        for split in await snap.asplits(max_split_bytes=2048):
            fast = [b async for b in batch.aread_split(split, **kw)]  # type: ignore[arg-type]
            slow = [b async for b in batch.aread_split(split, arrow_path=False, **kw)]  # type: ignore[arg-type]
            rows = [r for b in fast for r in b.to_pylist()]
            assert rows == [r for b in slow for r in b.to_pylist()]
            store = open_store(db.store.url)
            try:
                tables = [
                    await SSTable.open(store, r.key, size=r.size)
                    for g, refs in split.tablet.sstables.items()
                    if g == "default"
                    for r in refs
                ]
                families = {"anchor"}
                arrow = await reader._arrow_cells(
                    tables,
                    split.tablet.cut_seq,
                    families,
                    {},
                    split.now_micros,
                    split.start_row,
                    split.end_row,
                )
                took_arrow += arrow is not None
            finally:
                await store.close()
    assert took_arrow == 7 * len(await snap.asplits(max_split_bytes=2048))
