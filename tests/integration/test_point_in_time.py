"""Point-in-time restore on the embedded default: a history check and the bad requests.

Seeded random writes, deletions and aggregate additions run against a table with history,
across flushes, major compactions, checkpoints, splits (a small split size) and a restart;
after some acknowledged operations a wall-clock marker is taken together with a model of
every acknowledged write. A restore as of each marker equals its model cell for cell, and
equals what the live table read at that marker. Bad requests change nothing.
"""

from __future__ import annotations

import copy
import random
import struct
import time
from pathlib import Path

import pyarrow as pa
import pytest

from tabletstore.batch import awrite_sstables
from tabletstore.data.model import AddToCell, DeleteCells, DeleteRow, SetCell
from tabletstore.data.schema import ColumnFamily
from tabletstore.embedded import Database
from tabletstore.errors import AlreadyExists, Corruption, InvalidArgument
from tabletstore.master import gc_plan
from tabletstore.metadata.load_part import LoadPart, list_load_parts
from tabletstore.metadata.record import TabletRecord
from tabletstore.options import TabletOptions
from tabletstore.storage_s3 import layout

pytestmark = pytest.mark.timeout(300)

HOUR = 3600.0
BUCKET = 86_400_000_000
SPLIT = TabletOptions(split_bytes=24 * 1024, memtable_flush_bytes=32 * 1024)
#: (row, family, qualifier, timestamp) -> value
Model = dict[tuple[bytes, str, bytes, int], bytes]


class History:
    """The acknowledged writes: plain cells by version, sums by (row, qualifier)."""

    def __init__(self) -> None:
        self.cells: Model = {}
        self.sums: dict[tuple[bytes, bytes], int] = {}

    def view(self) -> Model:
        out = dict(self.cells)
        for (row, q), total in self.sums.items():
            out[(row, "n", q, BUCKET)] = struct.pack(">q", total)
        return out


async def _read(db: Database, table: str) -> Model:
    out: Model = {}
    async for row in db.table(table).read_rows():
        for c in row.cells:
            out[(row.key, c.family, c.qualifier, c.timestamp)] = c.value
    return out


async def _step(db: Database, rnd: random.Random, model: History, ts: int) -> None:
    table = db.table("t")
    row = b"row%03d" % rnd.randrange(40)
    q = b"q%d" % rnd.randrange(3)
    roll = rnd.random()
    if roll < 0.6:
        value = rnd.randbytes(200)
        await table.mutate_row(row, [SetCell("f", q, value, ts)])
        model.cells[(row, "f", q, ts)] = value
    elif roll < 0.75:
        n = rnd.randrange(1, 100)
        await table.mutate_row(row, [AddToCell("n", q, n, BUCKET)])
        model.sums[(row, q)] = model.sums.get((row, q), 0) + n
    elif roll < 0.9:
        await table.mutate_row(row, [DeleteCells("f", q)])
        for key in [k for k in model.cells if k[0] == row and k[2] == q]:
            del model.cells[key]
    else:
        await table.mutate_row(row, [DeleteRow()])
        for key in [k for k in model.cells if k[0] == row]:
            del model.cells[key]
        for key in [k for k in model.sums if k[0] == row]:
            del model.sums[key]


async def test_restore_as_of_each_marker_equals_the_acknowledged_writes(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    rnd = random.Random(33)
    model = History()
    markers: list[tuple[float, Model]] = []
    ts = 1_000_000
    db = await Database.open(url, tablet_options=SPLIT)
    try:
        await db.create_table("t", ["f", ColumnFamily(name="n", value_type="sum")], history=HOUR)
        assert len(await db.checkpoint()) == 1
        for step in range(360):
            ts += 1
            await _step(db, rnd, model, ts)
            if step % 60 == 30:
                await db.flush("t")
            if step % 120 == 90:
                await db.compact("t")
            if step == 150:
                await db.checkpoint()
            if step == 200:  # a restart: the next incarnation's log, tablets reloaded
                await db.close()
                db = await Database.open(url, tablet_options=SPLIT)
            if step % 45 == 44:
                expected = model.view()
                assert await _read(db, "t") == expected, f"live read at step {step}"
                markers.append((time.time(), copy.deepcopy(expected)))
        info = await db.master.catalog.get_table("t")
        tablets = await db.master.catalog.list_tablets(info.table_id)
        assert len(tablets) > 1, "the small split size split the table"
        for i, (instant, expected) in enumerate(markers):
            report = await db.restore_as_of("t", instant, f"r{i}")
            got = await _read(db, f"r{i}")
            assert got == expected, f"marker {i}: {report.summary()}"
            report = await db.clone_as_of("t", instant, f"c{i}")
            assert await _read(db, f"c{i}") == expected, f"marker {i}: {report.summary()}"
        assert len(markers) == 8
    finally:
        await db.close()


def _keys(records: list[TabletRecord]) -> set[str]:
    return {r.key for rec in records for refs in rec.sstables.values() for r in refs}


async def test_a_clone_as_of_an_instant_shares_the_checkpoint_and_diverges(
    tmp_path: Path,
) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("t", ["f"], split_keys=[b"r50"], history=HOUR)
        t = db.table("t")
        for i in range(100):
            await t.mutate_row(b"r%02d" % i, [SetCell("f", b"q", b"old", 1)])
        await db.flush("t")
        await db.checkpoint()
        for i in range(0, 100, 10):  # the log tail after the checkpoint
            await t.mutate_row(b"r%02d" % i, [SetCell("f", b"q", b"tail", 2)])
        await t.mutate_row(b"r05", [DeleteRow()])
        expected = await _read(db, "t")
        marker = time.time()
        await t.mutate_row(b"r01", [SetCell("f", b"q", b"after", 3)])
        await db.compact("t")  # the source's SSTables change; the checkpoint's stay
        report = await db.clone_as_of("t", marker, "c")
        assert report.cloned and report.shared_sstables >= 2, report.summary()
        assert report.summary().startswith("cloned t as of ")
        assert await _read(db, "c") == expected
        catalog = db.master.catalog
        src = await catalog.get_table("t")
        clone = await catalog.get_table("c")
        checkpoint = max(await db.list_snapshots(), key=lambda m: m.created_at)
        checkpoint_keys = {
            r.key for tab in checkpoint.tablets for refs in tab.sstables.values() for r in refs
        }
        clone_records = await catalog.list_tablets(clone.table_id)
        # Zero-copy: the checkpoint's SSTables are named as they are; the clone's own
        # objects are the log tail only (11 cells: 10 puts and a row deletion).
        assert checkpoint_keys <= _keys(clone_records)
        own = {
            k for k in _keys(clone_records) if k.startswith(layout.tables_prefix(clone.table_id))
        }
        assert own == _keys(clone_records) - checkpoint_keys
        written = sum(
            r.cells
            for rec in clone_records
            for refs in rec.sstables.values()
            for r in refs
            if r.key in own
        )
        assert written == 11
        # The two diverge: writes to either reach only that one.
        await db.table("c").mutate_row(b"r02", [SetCell("f", b"q", b"to-clone", 4)])
        await t.mutate_row(b"r03", [SetCell("f", b"q", b"to-source", 4)])
        got_src, got_clone = await _read(db, "t"), await _read(db, "c")
        assert (b"r02", "f", b"q", 4) not in got_src
        assert (b"r03", "f", b"q", 4) not in got_clone
        assert got_clone[(b"r02", "f", b"q", 4)] == b"to-clone"
        with pytest.raises(AlreadyExists, match="already exists"):
            await db.clone_as_of("t", marker, "c")
        # GC counts the clone's references: with the source and its checkpoints gone, the
        # checkpoint's SSTables stay while the clone names them, and go once it does not.
        before = await _read(db, "c")
        await db.delete_table("t")
        for m in await db.list_snapshots():
            await db.delete_snapshot(m.snapshot_id)
        await db.gc(grace=0)
        stored = {o.key async for o in db.store.list(layout.TABLES)}
        assert checkpoint_keys <= stored
        assert await _read(db, "c") == before
        await db.compact("c")
        await db.gc(grace=0)
        stored = {o.key async for o in db.store.list(layout.TABLES)}
        assert not checkpoint_keys & stored
        assert await _read(db, "c") == before
        assert src.table_id != clone.table_id


async def test_bad_requests_are_refused_and_change_nothing(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("t", ["f"], history=HOUR)
        await db.create_table("plain", ["f"])
        await db.table("t").mutate_row(b"r", [SetCell("f", b"q", b"v")])
        now = time.time()
        with pytest.raises(InvalidArgument, match="no checkpoint yet"):
            await db.restore_as_of("t", now, "x")
        await db.checkpoint()
        before = sorted(await db.list_tables())
        snapshots = await db.list_snapshots()
        cases = [
            ("t", now - 2 * HOUR, "x", InvalidArgument, "outside the history window"),
            ("t", time.time() + 60, "x", InvalidArgument, "in the future"),
            ("t", now - 60, "x", InvalidArgument, "earliest instant"),
            ("t", time.time(), "plain", AlreadyExists, "already exists"),
            ("t", time.time(), "t", AlreadyExists, "already exists"),
            ("plain", time.time(), "x", InvalidArgument, "keeps no history"),
            ("t", time.time(), "bad name!", InvalidArgument, "bad name"),
        ]
        for table, instant, new, error, match in cases:
            with pytest.raises(error, match=match):
                await db.restore_as_of(table, instant, new)
            with pytest.raises(error, match=match):
                await db.clone_as_of(table, instant, new)
        assert sorted(await db.list_tables()) == before
        assert len(await db.list_snapshots()) == len(snapshots)
        objects = [o.key async for o in db.store.list("tables/")]
        assert not [k for k in objects if "/x-" in k or k.startswith("tables/x")]
        # A window can be set on an existing table and removed again.
        await db.set_history("plain", 2 * HOUR)
        assert (await db.describe_table("plain")).history == 2 * HOUR
        await db.set_history("plain", None)
        assert (await db.describe_table("plain")).history is None
        with pytest.raises(InvalidArgument, match="history window"):
            await db.set_history("plain", -5)


async def test_the_database_default_window_applies_to_tables_without_their_own(
    tmp_path: Path,
) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("plain", ["f"])
        await db.create_table("own", ["f"], history=2 * HOUR)
        assert await db.history_default() is None
        with pytest.raises(InvalidArgument, match="keeps no history"):
            await db.restore_as_of("plain", time.time(), "x")
        await db.set_history_default(HOUR)
        assert await db.history_default() == HOUR
        taken = await db.checkpoint()
        assert sorted(m.table for m in taken) == ["own", "plain"]
        t = db.table("plain")
        await t.mutate_row(b"r", [SetCell("f", b"q", b"before", 1)])
        marker = time.time()
        await t.mutate_row(b"r", [SetCell("f", b"q", b"after", 2)])
        await db.restore_as_of("plain", marker, "back")
        assert await _read(db, "back") == {(b"r", "f", b"q", 1): b"before"}
        # The default's window bounds the instants, a table's own window its own.
        with pytest.raises(InvalidArgument, match="outside the history window"):
            await db.restore_as_of("plain", time.time() - 1.5 * HOUR, "x")
        with pytest.raises(InvalidArgument, match="earliest instant"):
            await db.restore_as_of("own", time.time() - 1.5 * HOUR, "x")
        with pytest.raises(InvalidArgument, match="history window must be"):
            await db.set_history_default(-1)
        await db.set_history_default(None)
        with pytest.raises(InvalidArgument, match="keeps no history"):
            await db.restore_as_of("plain", marker, "x")
        assert sorted(await db.list_tables()) == ["back", "own", "plain"]


async def test_setting_a_window_takes_the_first_checkpoint_at_once(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("t", ["f"])
        await db.table("t").mutate_row(b"r", [SetCell("f", b"q", b"v", 1)])
        assert await db.list_snapshots() == []
        await db.set_history("t", HOUR)
        (first,) = await db.list_snapshots()
        assert first.table == "t"
        marker = time.time()
        await db.restore_as_of("t", marker, "back")  # no checkpoint round needed
        assert await _read(db, "back") == {(b"r", "f", b"q", 1): b"v"}
        await db.set_history("t", 2 * HOUR)  # within the interval: no second checkpoint
        assert len(await db.list_snapshots()) == 1


def _load(rows: list[bytes], value: bytes, ts: int) -> pa.Table:
    return pa.table(
        {
            "row": pa.array(rows, pa.binary()),
            "family": ["f"] * len(rows),
            "qualifier": pa.array([b"q"] * len(rows), pa.binary()),
            "value": pa.array([value] * len(rows), pa.binary()),
            "timestamp": [ts] * len(rows),
        }
    )


async def test_bulk_loads_before_the_instant_are_restored_and_later_ones_not(
    tmp_path: Path,
) -> None:
    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"], split_keys=[b"r5"], history=HOUR)
        t = db.table("t")
        await t.mutate_row(b"r0", [SetCell("f", b"q", b"written", 1)])
        await db.checkpoint()
        before_a = await _read(db, "t"), time.time()
        out_a = await db.staging_url("a")
        await awrite_sstables(_load([b"r1", b"r6"], b"A", 5), out_a)
        assert await db.bulk_load("t", out_a) == (2, 2)
        after_a = await _read(db, "t"), time.time()
        await t.mutate_row(b"r0", [SetCell("f", b"q", b"later", 2)])
        out_b = await db.staging_url("b")
        await awrite_sstables(_load([b"r2", b"r7"], b"B", 5), out_b)
        assert await db.bulk_load("t", out_b) == (2, 2)
        after_b = await _read(db, "t"), time.time()
        assert (b"r7", "f", b"q", 5) in after_b[0] and (b"r7", "f", b"q", 5) not in after_a[0]
        table_id = (await db.master.catalog.get_table("t")).table_id
        parts = await list_load_parts(db.store, table_id)
        assert len(parts) == 4 and all(p.cells == 1 for p in parts)
        # Compacted away from the table, the loaded SSTables stay for the window (GC rule 9).
        await db.compact("t")
        report = await db.gc(grace=0, fence_grace=0)
        assert report.counts.get(gc_plan.Reason.KEEP_HISTORY_LOAD) == 4, report.counts
        for i, (expected, instant) in enumerate([before_a, after_a, after_b]):
            await db.restore_as_of("t", instant, f"r{i}")
            assert await _read(db, f"r{i}") == expected, i
            await db.clone_as_of("t", instant, f"c{i}")
            assert await _read(db, f"c{i}") == expected, i
        # A finished load whose part went unrecorded is refused past it, not rebuilt without.
        b_part = parts[-1]  # oldest commit first: one of load B's
        assert b_part.load_id == parts[-2].load_id != parts[0].load_id
        keys = [o.key async for o in db.store.list(layout.load_part_prefix(table_id))]
        for key in keys:
            data = await db.store.get(key)
            assert data is not None
            if LoadPart.from_bytes(data) == b_part:
                await db.store.delete(key)
        with pytest.raises(Corruption, match="only 1 are recorded"):
            await db.restore_as_of("t", after_b[1], "x")
        await db.restore_as_of("t", after_a[1], "y")
        assert await _read(db, "y") == after_a[0]
