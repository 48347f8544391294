"""Bulk load (issue 14 item 4, bad input): SSTables written by a job load atomically per
tablet, read like written cells (versions, later deletes, compactions), and bad files load
nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tabletstore.batch import awrite_sstables
from tabletstore.data.model import DeleteRow
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument
from tests.batch.conftest import cells_of, fill


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
        out = f"file://{tmp_path}/out"
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
        overlap = f"file://{tmp_path}/overlap"
        await awrite_sstables(_data(10, 50), overlap)
        await awrite_sstables(_data(40, 90), overlap)
        with pytest.raises(InvalidArgument, match="overlap"):
            await db.bulk_load("web", overlap)
        # A family the table does not have.
        unknown = f"file://{tmp_path}/unknown"
        bad = _data(10, 20).set_column(1, "family", pa.array(["nosuch"] * 20))
        await awrite_sstables(bad, unknown)
        with pytest.raises(InvalidArgument, match="nosuch"):
            await db.bulk_load("web", unknown)
        # Plain Parquet that is not an SSTable (wrong schema, unsorted).
        plain = tmp_path / "plain"
        plain.mkdir()
        pq.write_table(_data(30, 20 + 30).sort_by([("row", "descending")]), plain / "x.parquet")
        with pytest.raises(InvalidArgument, match=r"not an SSTable|wrong schema"):
            await db.bulk_load("web", f"file://{plain}")
        assert await _all(db) == before
        # Duplicate cells are refused when written.
        with pytest.raises(InvalidArgument, match="two cells"):
            await awrite_sstables(pa.concat_tables([_data(1, 3), _data(1, 3)]), overlap)
    finally:
        await db.close()
