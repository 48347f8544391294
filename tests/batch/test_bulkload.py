"""Bulk load (bad input): SSTables written by a job load atomically per
tablet, read like written cells (versions, later deletes, compactions), and bad files load
nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tabletstore.batch import awrite_sstables
from tabletstore.coordination import paths
from tabletstore.data.model import DeleteRow
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument
from tabletstore.master.bulk_load import DONE, LOADING, LoadRecord
from tabletstore.metadata.record import TabletRecord
from tabletstore.rpc import messages as m
from tabletstore.sstable.format import FORMAT_VERSION, parse_tail
from tabletstore.storage_s3 import layout
from tests.batch.conftest import cells_of, fill


def staging_dir(tmp_path: Path) -> Path:
    """The embedded database's staging area for bulk loads (file://{tmp_path}/db)."""
    return tmp_path / "db" / "objects" / "staging" / "anonymous"


def _data(lo: int, hi: int, ts: int = 7000) -> pa.Table:
    rows = [b"row%03d" % i for i in range(lo, hi)]
    return pa.table(
        {
            "row": pa.array(rows * 2, pa.binary()),
            "family": ["anchor"] * len(rows) + ["meta"] * len(rows),
            "qualifier": pa.array([b"bulk.com"] * len(rows) + [b"len"] * len(rows), pa.binary()),
            "value": pa.array([b"bulk %s" % r for r in rows] + [b"m %s" % r for r in rows]),
            "timestamp": [ts] * (2 * len(rows)),
        }
    )


async def _all(db: Database) -> list[dict[str, object]]:
    return cells_of([r async for r in db.table("web").read_rows()])


async def test_bulk_load_reads_like_written_cells(tmp_path: Path) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        await fill(db)
        out = await db.staging_url("out")
        # Two partitions of a job, disjoint in rows, across all three tablets.
        await awrite_sstables(_data(10, 60), out)
        await awrite_sstables(_data(60, 110), out)
        tablets, cells = await db.bulk_load("web", out)
        assert (tablets, cells) == (3, 200)
        t = db.table("web")
        row = await t.read_row(b"row050")
        assert row is not None
        assert [
            c.value for c in row.cells if c.family == "anchor" and c.qualifier == b"bulk.com"
        ] == [b"bulk row050"]
        # A delete after the load masks loaded cells (they are older than it), and the
        # loaded cells survive compactions.
        await t.mutate_row(b"row051", [DeleteRow()])
        before = await _all(db)
        await db.compact("web")
        assert await _all(db) == before
        assert await t.read_row(b"row051") is None
        # Loaded cells are in snapshots like any others.
        snap = await t.snapshot()
        assert any(r.cells for refs in snap.tablets[1].sstables.values() for r in refs)
    finally:
        await db.close()


async def test_bad_bulk_load_files_load_nothing(tmp_path: Path) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        await fill(db)
        before = await _all(db)
        # Overlapping files.
        overlap = await db.staging_url("overlap")
        await awrite_sstables(_data(10, 50), overlap)
        await awrite_sstables(_data(40, 90), overlap)
        with pytest.raises(InvalidArgument, match="overlap"):
            await db.bulk_load("web", overlap)
        # A family the table does not have.
        unknown = await db.staging_url("unknown")
        bad = _data(10, 20).set_column(1, "family", pa.array(["nosuch"] * 20))
        await awrite_sstables(bad, unknown)
        with pytest.raises(InvalidArgument, match="nosuch"):
            await db.bulk_load("web", unknown)
        # Plain Parquet that is not an SSTable (wrong schema, unsorted).
        plain = staging_dir(tmp_path) / "plain"
        plain.mkdir(parents=True)
        pq.write_table(_data(30, 20 + 30).sort_by([("row", "descending")]), plain / "x.parquet")
        with pytest.raises(InvalidArgument, match=r"not an SSTable|wrong schema"):
            await db.bulk_load("web", await db.staging_url("plain"))
        assert await _all(db) == before
        # Duplicate cells are refused when written.
        with pytest.raises(InvalidArgument, match="two cells"):
            await awrite_sstables(pa.concat_tables([_data(1, 3), _data(1, 3)]), overlap)
    finally:
        await db.close()


# ---------------------------------------------------------------- repeating and resuming


def _loaded_cells(records: list[TabletRecord]) -> int:
    """Cells in the tablets' SSTables: on a table only ever bulk-loaded, the cells loaded."""
    return sum(ref.cells for rec in records for refs in rec.sstables.values() for ref in refs)


async def _empty_web(db: Database) -> str:
    await db.create_table("web", ["anchor", "meta"], split_keys=[b"row040", b"row080"])
    return (await db.master.catalog.get_table("web")).table_id


async def _load_record(db: Database, table_id: str, load_id: str) -> LoadRecord:
    kv = await db.coordinator.get(paths.bulk_load(table_id, load_id))
    assert kv is not None
    return LoadRecord.from_bytes(kv.value)


async def test_a_bulk_load_run_again_loads_nothing(tmp_path: Path) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        table_id = await _empty_web(db)
        out = await db.staging_url("out")
        await awrite_sstables(_data(10, 110), out)
        assert await db.bulk_load("web", out) == (3, 200)
        expected = await _all(db)
        # The same files again, by content (the default id) and written again under other
        # names: the same load, done already.
        assert await db.bulk_load("web", out) == (0, 0)
        again = await db.staging_url("again")
        await awrite_sstables(_data(10, 110), again)
        assert await db.bulk_load("web", again) == (0, 0)
        records = await db.master.catalog.list_tablets(table_id)
        assert _loaded_cells(records) == 200
        assert await _all(db) == expected
        done = await _load_record(db, table_id, content_load_id_of(records))
        assert (done.state, done.tablets, done.cells) == (DONE, 3, 200)
        # A named load: once, then nothing; a bad name is refused before anything loads.
        assert await db.table("web").bulk_load(out, load_id="job-7") == (3, 200)
        assert await db.table("web").bulk_load(out, load_id="job-7") == (0, 0)
        with pytest.raises(InvalidArgument, match="bad bulk load id"):
            await db.bulk_load("web", out, load_id="a/b")
        with pytest.raises(InvalidArgument, match="system table"):
            await db.bulk_load("METADATA", out)
        # The same id for other files: refused, not silently skipped.
        other = await db.staging_url("other")
        await awrite_sstables(_data(10, 20, ts=9000), other)
        with pytest.raises(InvalidArgument, match="was of other files"):
            await db.bulk_load("web", other, load_id="job-7")
        assert _loaded_cells(await db.master.catalog.list_tablets(table_id)) == 400
    finally:
        await db.close()


def content_load_id_of(records: list[TabletRecord]) -> str:
    (load_id,) = {m.load_id for rec in records for m in rec.bulk_loads}
    return load_id


class _Crash(Exception):
    """The master dying in the middle of a load."""


async def test_a_bulk_load_interrupted_between_tablets_completes_when_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first tablet gets its part, then the master dies (it never reaches the others);
    a new master (the database opened again) runs the load again: the other tablets get
    theirs, the first is skipped, and no cell is loaded twice."""
    url = f"file://{tmp_path}/db"
    db = await Database.open(url)
    out = await db.staging_url("out")
    try:
        table_id = await _empty_web(db)
        await awrite_sstables(_data(10, 110), out)
        master = db.master
        real = master._worker
        calls: list[str] = []

        def dying(address: str, **kw: Any) -> Any:
            stub = real(address, **kw)

            class Stub:
                async def bulk_load_tablet(self, req: m.BulkLoadTabletRequest) -> Any:
                    calls.append(req.tablet_id)
                    if len(calls) > 1:
                        raise _Crash("the master died")
                    return await stub.bulk_load_tablet(req)

            return Stub()

        monkeypatch.setattr(master, "_worker", dying)
        with pytest.raises(_Crash):
            await db.table("web").bulk_load(out, load_id="job-1")
        monkeypatch.undo()
        records = await master.catalog.list_tablets(table_id)
        marked = [r.tablet_id for r in records if r.bulk_loads]
        assert len(marked) == 1 and _loaded_cells(records) > 0
        first = _loaded_cells(records)
        assert (await _load_record(db, table_id, "job-1")).state == LOADING
    finally:
        await db.close()
    db = await Database.open(url)
    try:
        tablets, cells = await db.table("web").bulk_load(out, load_id="job-1")
        assert (tablets, cells + first) == (2, 200)
        records = await db.master.catalog.list_tablets(table_id)
        assert _loaded_cells(records) == 200
        assert all(r.bulk_loads for r in records)
        assert (await _load_record(db, table_id, "job-1")).state == DONE
        assert len(await _all(db)) == 200
        assert await db.table("web").bulk_load(out, load_id="job-1") == (0, 0)
    finally:
        await db.close()


async def test_a_tablet_that_got_its_part_refuses_it_again(tmp_path: Path) -> None:
    """A lost reply, a second master racing the first: the worker checks the tablet's
    marks itself, under the tablet's lock."""
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        table_id = await _empty_web(db)
        out = await db.staging_url("out")
        keys = await awrite_sstables(_data(10, 110), out)
        (rec,) = [r for r in await db.master.catalog.list_tablets(table_id) if r.start_row == b""]
        # The master names the files by their keys in the database's own store.
        staged = tuple(layout.staging_prefix("anonymous", "out") + k for k in keys)
        req = m.BulkLoadTabletRequest(table_id, rec.tablet_id, db.store.url, staged, load_id="L")
        first, again = await asyncio.gather(
            db.worker.services.bulk_load_tablet(req), db.worker.services.bulk_load_tablet(req)
        )
        assert sorted([first.cells, again.cells]) == [0, 60]
        assert (await db.worker.services.bulk_load_tablet(req)).cells == 0
        records = await db.master.catalog.list_tablets(table_id)
        assert _loaded_cells(records) == 60
        # The whole load now: the first tablet's part is skipped.
        assert await db.table("web").bulk_load(out, load_id="L") == (2, 140)
        assert _loaded_cells(await db.master.catalog.list_tablets(table_id)) == 200
    finally:
        await db.close()


async def test_a_damaged_bulk_load_file_loads_nothing(tmp_path: Path) -> None:
    """A flipped byte in a block (its crc32c no longer matches) is refused by the master's
    check, whatever column it hits, before any tablet takes anything."""
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        table_id = await _empty_web(db)
        out = staging_dir(tmp_path) / "out"
        (key,) = await awrite_sstables(_data(10, 110), await db.staging_url("out"))
        path = out / key
        blob = bytearray(path.read_bytes())
        blob[len(blob) // 3] ^= 0xFF  # inside the data blocks, far from the footer
        path.write_bytes(bytes(blob))
        with pytest.raises(InvalidArgument, match="crc32c"):
            await db.bulk_load("web", await db.staging_url("out"))
        assert _loaded_cells(await db.master.catalog.list_tablets(table_id)) == 0
    finally:
        await db.close()


async def test_staging_files_are_format_1_and_loaded_sstables_the_tables_format(
    tmp_path: Path,
) -> None:
    """A job's staging files skip format 2's pages (read whole, never looked up by page),
    but what a tablet writes of a file it cuts (this one spans all three tablets: it is not
    adopted) is in the table's own format, with its page index."""
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        table_id = await _empty_web(db)
        out = staging_dir(tmp_path) / "out"
        (key,) = await awrite_sstables(_data(10, 110), await db.staging_url("out"))
        blob = (out / key).read_bytes()
        assert parse_tail(blob, len(blob)).footer.format_version == 1
        await db.bulk_load("web", await db.staging_url("out"))
        refs = [
            ref
            for rec in await db.master.catalog.list_tablets(table_id)
            for group in rec.sstables.values()
            for ref in group
        ]
        assert len(refs) == 3
        for ref in refs:
            data = await db.store.get(ref.key)
            assert data is not None
            footer = parse_tail(data, len(data)).footer
            assert footer.format_version == FORMAT_VERSION
            assert footer.pages is not None
    finally:
        await db.close()
