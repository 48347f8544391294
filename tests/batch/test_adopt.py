"""Adopted bulk-load SSTables (the bulk load figure): a job's files that lie inside one
tablet are added to it as they are, with a ``seq_base`` in their reference, and behave exactly
like written cells: reads, versions, deletions on both sides of the load, compactions, the
snapshot reader, a reload of the tablet; refused inputs leave nothing behind; references of
the old format stay readable."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tabletstore import batch
from tabletstore.batch import awrite_sstables
from tabletstore.data.model import DeleteCells, DeleteRow, RowMutation, SetCell
from tabletstore.data.schema import ColumnFamily, MaxVersionsRule
from tabletstore.embedded import Database
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.master.bulk_load import STAGED
from tabletstore.metadata.record import SSTableRef, TabletRecord
from tests.batch.conftest import cells_of

SPLITS = [b"row040", b"row080"]


def _data(lo: int, hi: int, ts: int = 7000) -> pa.Table:
    rows = [b"row%03d" % i for i in range(lo, hi)]
    return pa.table(
        {
            "row": pa.array(rows * 2, pa.binary()),
            "family": ["anchor"] * len(rows) + ["contents"] * len(rows),
            "qualifier": pa.array([b"bulk.com"] * len(rows) + [b"html"] * len(rows), pa.binary()),
            "value": pa.array([b"bulk %s" % r for r in rows] + [b"page %s" % r for r in rows]),
            "timestamp": [ts] * len(rows) + [ts + 1] * len(rows),
        }
    )


def _mutations(data: pa.Table) -> list[RowMutation]:
    """The same cells as client writes (one mutation per cell: rows appear twice)."""
    return [
        RowMutation(r["row"], (SetCell(r["family"], r["qualifier"], r["value"], r["timestamp"]),))
        for r in data.to_pylist()
    ]


async def _create(db: Database, name: str) -> None:
    await db.create_table(
        name,
        ["anchor", ColumnFamily(name="contents", gc_rule=MaxVersionsRule(max_versions=1))],
        split_keys=SPLITS,
    )


async def _before(db: Database, name: str) -> None:
    """Cells written before the load: older versions, a newer version, deletes that are
    older than the load (they must not mask it)."""
    t = db.table(name)
    for i in range(0, 120, 3):
        await t.mutate_row(b"row%03d" % i, [SetCell("contents", b"html", b"old", 1000)])
    await t.mutate_row(b"row020", [SetCell("contents", b"html", b"newer than the load", 9000)])
    await t.mutate_row(b"row021", [DeleteRow()])
    await t.mutate_row(b"row085", [DeleteCells("anchor", b"bulk.com")])
    await db.flush(name)


async def _after(db: Database, name: str) -> None:
    """Writes after the load: deletes that mask loaded cells, a rewrite of a loaded cell."""
    t = db.table(name)
    await t.mutate_row(b"row050", [DeleteRow()])
    await t.mutate_row(b"row090", [DeleteCells("anchor", b"bulk.com", 7000, 7001)])
    await t.mutate_row(b"row100", [SetCell("anchor", b"bulk.com", b"rewritten", 7000)])
    await t.mutate_row(b"row101", [SetCell("contents", b"html", b"newest", 8000)])


async def _read(db: Database, name: str) -> list[dict[str, object]]:
    return cells_of([r async for r in db.table(name).read_rows()])


async def _records(db: Database, name: str) -> list[TabletRecord]:
    info = await db.master.catalog.get_table(name)
    return await db.master.catalog.list_tablets(info.table_id)


def _adopted(records: list[TabletRecord]) -> list[SSTableRef]:
    return [r for rec in records for refs in rec.sstables.values() for r in refs if r.seq_base]


async def test_adopted_files_behave_like_written_cells(tmp_path: Path) -> None:
    """The same history on two tables, the cells once bulk-loaded (adopted) and once written:
    every read is the same, before and after compactions, through the snapshot reader, and
    after the database is opened again."""
    url = f"file://{tmp_path}/db"
    db = await Database.open(url)
    try:
        data = _data(10, 110)
        for name in ("loaded", "written"):
            await _create(db, name)
            await _before(db, name)
        out = await db.staging_url("out")
        keys = await awrite_sstables(data, out, split_keys=SPLITS, file_cells=50)
        assert len(keys) >= 3  # cut at both tablet boundaries, and by size
        assert await db.bulk_load("loaded", out) == (3, data.num_rows)
        await db.table("written").mutate_rows(_mutations(data))
        adopted = _adopted(await _records(db, "loaded"))
        assert len(adopted) == len(keys)
        assert all(f"/{STAGED}/" in r.key and r.max_seq == r.seq_base for r in adopted)
        assert await _read(db, "loaded") == await _read(db, "written")
        for name in ("loaded", "written"):
            await _after(db, name)
        expected = await _read(db, "written")
        assert await _read(db, "loaded") == expected
        row = await db.table("loaded").read_row(b"row020")
        assert row is not None and [c.value for c in row.cells if c.family == "contents"] == [
            b"newer than the load"
        ]
        assert await db.table("loaded").read_row(b"row050") is None
        # The snapshot reader applies the references' seq bases too (vectorised and per-cell).
        snap = await db.table("loaded").snapshot()
        opened = await batch.aopen_snapshot(db.store.url, snap.snapshot_id)
        for arrow_path in (True, False):
            got = []
            for split in await opened.asplits():
                async for b in batch.aread_split(split, arrow_path=arrow_path):
                    got.extend(b.to_pylist())
            assert got == expected
    finally:
        await db.close()
    # Opened again: the seq bases come back from METADATA; a write after the reload is
    # newer than every loaded cell.
    db = await Database.open(url)
    try:
        assert await _read(db, "loaded") == expected
        await db.table("loaded").mutate_row(b"row060", [DeleteRow()])
        await db.table("written").mutate_row(b"row060", [DeleteRow()])
        expected = await _read(db, "written")
        assert await _read(db, "loaded") == expected
        # Compactions (merging, then major) rewrite the adopted SSTables with their seqs.
        await db.flush("loaded")
        await db.compact("loaded")
        assert not _adopted(await _records(db, "loaded"))
        assert await _read(db, "loaded") == expected
    finally:
        await db.close()


async def test_a_file_across_a_tablet_boundary_is_cut_and_the_others_adopted(
    tmp_path: Path,
) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        await _create(db, "web")
        out = await db.staging_url("out")
        await awrite_sstables(_data(0, 30), out)  # inside the first tablet
        await awrite_sstables(_data(30, 50), out)  # across row040: the cell path
        await awrite_sstables(_data(90, 110), out)  # inside the last tablet
        assert await db.bulk_load("web", out) == (3, 140)
        records = await _records(db, "web")
        assert len(_adopted(records)) == 2
        got = await _read(db, "web")
        assert len(got) == 140
        assert [c["row"] for c in got] == sorted(c["row"] for c in got)  # type: ignore[type-var]
        # A file holding families of two locality groups is not adopted either (a group's
        # SSTables hold its families only): covered by test_bulkload's fill()-based tests.
    finally:
        await db.close()


async def test_refused_inputs_leave_no_staged_copy_and_load_nothing(tmp_path: Path) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        await _create(db, "web")
        before = await _read(db, "web")
        table_id = (await db.master.catalog.get_table("web")).table_id
        # Good adoptable files next to an overlapping pair, then next to a bad family.
        overlap = await db.staging_url("overlap")
        await awrite_sstables(_data(0, 30), overlap)
        await awrite_sstables(_data(90, 110), overlap)
        await awrite_sstables(_data(95, 100, ts=1), overlap)
        with pytest.raises(InvalidArgument, match="overlap"):
            await db.bulk_load("web", overlap)
        unknown = await db.staging_url("unknown")
        await awrite_sstables(_data(0, 30), unknown)
        bad = _data(90, 100).set_column(1, "family", pa.array(["nosuch"] * 20))
        await awrite_sstables(bad, unknown)
        with pytest.raises(InvalidArgument, match="nosuch"):
            await db.bulk_load("web", unknown)
        assert await _read(db, "web") == before
        assert not _adopted(await _records(db, "web"))
        assert not [k async for k in db.store.list(f"tables/{table_id}/{STAGED}/")]
        # A load that is done already stages nothing either.
        out = await db.staging_url("out")
        await awrite_sstables(_data(0, 30), out)
        assert await db.bulk_load("web", out) == (1, 60)
        assert await db.bulk_load("web", out) == (0, 0)
        assert len([k async for k in db.store.list(f"tables/{table_id}/{STAGED}/")]) == 1
    finally:
        await db.close()


def test_sstable_references_of_both_versions_read() -> None:
    old = {
        "key": "tables/t/a/default/x.parquet",
        "size": 10,
        "cells": 2,
        "min_seq": 5,
        "max_seq": 9,
        "first_row": "YQ==",
        "last_row": "Yg==",
        "tail_size": 3,
    }
    ref = SSTableRef.from_json(old)
    assert (ref.seq_base, ref.first_row, ref.max_seq) == (0, b"a", 9)
    assert ref.to_json() == old  # a plain reference is written as before: no version
    adopted = SSTableRef.from_json({**old, "version": 2, "seq_base": 70, "max_seq": 70})
    assert adopted.seq_base == 70
    assert SSTableRef.from_json(adopted.to_json()) == adopted
    assert adopted.to_json()["version"] == 2
    with pytest.raises(Corruption, match="version 3"):
        SSTableRef.from_json({**old, "version": 3})


async def test_a_compaction_run_elsewhere_applies_the_seq_bases(tmp_path: Path) -> None:
    """The serverless major compaction (functions/compaction.py) rewrites adopted SSTables
    with their seq bases, as the worker's own does: a delete written before the load must not
    mask the loaded cells, one written after it must."""
    from tabletstore.master.remote_compaction import hand_over, prepare
    from tabletstore.rpc.services import TABLET

    db = await Database.open(f"file://{tmp_path}/db")
    try:
        data = _data(10, 110)
        for name in ("loaded", "written"):
            await _create(db, name)
            await _before(db, name)
        out = await db.staging_url("out")
        await awrite_sstables(data, out, split_keys=SPLITS, file_cells=50)
        await db.bulk_load("loaded", out)
        await db.table("written").mutate_rows(_mutations(data))
        for name in ("loaded", "written"):
            await _after(db, name)
            await db.flush(name)
        expected = await _read(db, "written")
        worker = TABLET.client(db._transport, db.worker.address)
        for rec in await _records(db, "loaded"):
            prepared = await prepare(
                db.master.catalog, db.store, rec.table_id, rec.tablet_id, clock=db.master.clock
            )
            await hand_over(prepared, worker)
        assert not _adopted(await _records(db, "loaded"))
        assert await _read(db, "loaded") == expected
    finally:
        await db.close()
