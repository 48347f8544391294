"""The batch reader's vectorised path (batch/arrow_rules.py) against the engine: a randomized
differential test. Random writes, rewrites of versions, deletes of every scope, flushes and
compactions go into a real table whose families have random GC rules; then a snapshot is
read by the vectorised path, by the per-cell engine path and by the client's read_rows, with
projections, timestamp ranges and row filters: all three must agree."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tabletstore import batch
from tabletstore.batch import reader
from tabletstore.batch.arrow_rules import vectorisable
from tabletstore.clock import micros, wall_time
from tabletstore.data.filters import (
    CellsPerColumnLimit,
    CellsPerRowLimit,
    CellsPerRowOffset,
    Chain,
    ColumnQualifierRegex,
    ColumnRange,
    FamilyNameRegex,
    Interleave,
    PassAll,
    RowFilter,
    RowKeyRegex,
    StripValue,
    TimestampRange,
    ValueRange,
    ValueRegex,
)
from tabletstore.data.model import DeleteCells, DeleteFamily, DeleteRow, SetCell
from tabletstore.data.schema import (
    ColumnFamily,
    GcRule,
    IntersectionRule,
    LocalityGroup,
    MaxAgeRule,
    MaxVersionsRule,
    UnionRule,
)
from tabletstore.embedded import Database
from tabletstore.sstable import SSTable
from tabletstore.storage_s3 import open_store
from tests.batch.conftest import cells_of

FAMILIES = ("f0", "f1", "f2")
ROWS = [b"r%02d" % i for i in range(16)]
QUALIFIERS = [b"", b"q0", b"q1", b"q2"]
HOUR = 3600.0

FILTERS: list[RowFilter | None] = [
    None,
    PassAll(),
    ValueRegex(rb"v[0-4].*"),
    ValueRegex(rb"(?s)v.*\n.*"),
    ColumnQualifierRegex(rb"q1|"),
    FamilyNameRegex("f[01]"),
    RowKeyRegex(rb"r0[0-7]"),
    Chain([ColumnRange("f0", b"q0", b"q2"), CellsPerColumnLimit(1)]),
    CellsPerRowLimit(3),
    CellsPerRowOffset(2),
    TimestampRange(1001, None),
    ValueRange(b"v3", b"v7", end_inclusive=True),
    Chain([FamilyNameRegex("f1|f2"), CellsPerRowLimit(2), StripValue()]),
    # Not vectorised: the per-cell path answers, the same way.
    Interleave([FamilyNameRegex("f0"), CellsPerColumnLimit(1)]),
]


def _rule(rng: random.Random) -> GcRule | None:
    simple: list[GcRule] = [
        MaxVersionsRule(max_versions=rng.randint(1, 3)),
        MaxAgeRule(max_age_seconds=HOUR),
    ]
    choice = rng.randrange(5)
    if choice < 2:
        return simple[choice]
    if choice == 2:
        return UnionRule(rules=simple)
    if choice == 3:
        return IntersectionRule(rules=simple)
    return None


def _ts(rng: random.Random, now: int) -> int:
    # Far from any max-age threshold (the client reads a moment after the snapshot), and
    # few distinct values, so versions are rewritten.
    if rng.random() < 0.5:
        return 1000 + rng.randrange(4)
    return now - int(60e6) + rng.randrange(4)


def _value(rng: random.Random) -> bytes:
    body = bytes(rng.choice(b"0123456789\n\xff") for _ in range(rng.randrange(4)))
    return b"v" + body


async def _fill(db: Database, rng: random.Random) -> None:
    now = micros(wall_time())
    families = [
        ColumnFamily(name=f, gc_rule=_rule(rng), locality_group="lg2" if f == "f2" else "default")
        for f in FAMILIES
    ]
    t = await db.create_table(
        "t",
        families,
        split_keys=[b"r05", b"r11"],
        locality_groups=[LocalityGroup(name="lg2", block_size=1024)],
    )
    for step in range(300):
        row = rng.choice(ROWS)
        fam = rng.choice(FAMILIES)
        qual = rng.choice(QUALIFIERS)
        r = rng.random()
        if r < 0.7:
            mutation: Any = SetCell(fam, qual, _value(rng), _ts(rng, now))
        elif r < 0.85:
            lo = rng.choice([None, 1000, 1001, 1002, now - int(60e6) + 1])
            hi = rng.choice([None, 1002, 1004, now - int(60e6) + 3, now])
            if lo is not None and hi is not None and hi <= lo:
                lo, hi = hi, lo
            if lo == hi:
                hi = None
            mutation = DeleteCells(fam, qual, lo, hi)
        elif r < 0.95:
            mutation = DeleteFamily(fam)
        else:
            mutation = DeleteRow()
        await t.mutate_row(row, [mutation])
        if step % 70 == 69:
            await db.flush("t")
        if step == 200:
            await db.compact("t")


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_vectorised_per_cell_and_client_reads_agree(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        await _fill(db, rng)
        t = db.table("t")
        snap = await batch.aopen_snapshot(db.store.url, (await t.snapshot()).snapshot_id)
        splits = await snap.asplits(max_split_bytes=1024)
        vectorised = 0
        for f in FILTERS:
            for kw in (
                {},
                {"columns": ["f0", "f2:q1"]},
                {"columns": ["f1"], "start_ts": 1001, "end_ts": 1 << 62},
                {"shape": "wide", "columns": ["f0:q0", "f1:", "f2:q2"]},
            ):
                fast: list[dict[str, object]] = []
                slow: list[dict[str, object]] = []
                for split in splits:
                    fast += [
                        r
                        async for b in batch.aread_split(split, filter=f, **kw)  # type: ignore[arg-type]
                        for r in b.to_pylist()
                    ]
                    slow += [
                        r
                        async for b in batch.aread_split(split, filter=f, arrow_path=False, **kw)  # type: ignore[arg-type]
                        for r in b.to_pylist()
                    ]
                assert fast == slow, (f, kw)
                vectorised += vectorisable(f)
                if not kw:
                    want = cells_of([r async for r in t.read_rows(filter=f)])
                    assert fast == want, f
        assert vectorised > len(FILTERS)
        # Every split has deletions or GC rules here, and the vectorised path takes each.
        store = open_store(db.store.url)
        try:
            for split in splits:
                tables = [
                    await SSTable.open(store, r.key, size=r.size)
                    for refs in split.tablet.sstables.values()
                    for r in refs
                ]
                gc = {name: fam.gc_rule for name, fam in split.schema.families.items()}
                arrow = await reader._arrow_cells(
                    tables,
                    split.tablet.cut_seq,
                    set(FAMILIES),
                    gc,
                    split.now_micros,
                    split.start_row,
                    split.end_row,
                )
                assert arrow is not None
        finally:
            await store.close()
    finally:
        await db.close()
