"""Reads, through the public API on ``memory://`` and ``file://``: one row, many rows,
scans over row ranges and prefixes (across tablet boundaries), every server-side filter and the
chain / interleave / condition combinators, row limits, families, and streamed results (the
first row of a large scan costs a fraction of the scan's reads).

Filters run on a small fixed data set, once with every cell still in memtables and once after
a minor compaction (so the server merges memtable and SSTable sources before filtering).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tabletstore
from tabletstore import (
    ApplyLabel,
    AsyncClient,
    AsyncTable,
    BlockAll,
    CellsPerColumnLimit,
    CellsPerRowLimit,
    CellsPerRowOffset,
    Chain,
    ColumnFamily,
    ColumnQualifierRegex,
    ColumnRange,
    Condition,
    FamilyNameRegex,
    Interleave,
    InvalidArgument,
    LocalityGroup,
    PassAll,
    RowFilter,
    RowKeyRegex,
    RowMutation,
    RowRange,
    RowSample,
    RowSet,
    SetCell,
    Sink,
    StripValue,
    TimestampRange,
    ValueRange,
    ValueRegex,
)
from tabletstore.data.filters import compile_filter
from tabletstore.storage_s3 import find_layer
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tests.integration.api_support import (
    cells_by_row,
    db,
    db_url,
    keys_of,
    make_url,
    rows_of,
    values,
)

__all__ = ["db", "db_url"]  # fixtures used by name

Cells = list[tuple[str, bytes, int, bytes]]

# The data set: (row, family, qualifier, timestamp, value). Tablets split at b"row-2".
DATA: list[tuple[bytes, str, bytes, int, bytes]] = [
    (b"other-9", "cf", b"z", 1, b"zebra"),
    (b"row-1", "cf", b"a", 30, b"apple"),
    (b"row-1", "cf", b"a", 20, b"apricot"),
    (b"row-1", "cf", b"b", 10, b"banana"),
    (b"row-1", "meta", b"x", 5, b"1"),
    (b"row-2", "cf", b"a", 40, b"avocado"),
    (b"row-2", "cf", b"c", 15, b"cherry"),
    (b"row-2", "meta", b"y", 25, b"22"),
    (b"row-3", "meta", b"x", 50, b"333"),
]


def _expected(keep: set[tuple[bytes, bytes, int]]) -> dict[bytes, Cells]:
    """The data set restricted to (row, qualifier, ts) triples, in read order."""
    out: dict[bytes, Cells] = {}
    for row, fam, q, ts, v in DATA:
        if (row, q, ts) in keep:
            out.setdefault(row, []).append((fam, q, ts, v))
    return out


ALL = _expected({(r, q, ts) for r, _, q, ts, _ in DATA})


@pytest.fixture(params=["memtable", "sstable"])
async def data(request: pytest.FixtureRequest, db: AsyncClient) -> AsyncTable:
    t = await db.create_table("t", ["cf", "meta"], split_keys=[b"row-2"])
    rows: dict[bytes, list[SetCell]] = {}
    for row, fam, q, ts, v in DATA:
        rows.setdefault(row, []).append(SetCell(fam, q, v, ts))
    await t.mutate_rows([RowMutation(k, tuple(m)) for k, m in rows.items()])
    if request.param == "sstable":
        await db.flush("t")
    return t


FILTERS: list[tuple[str, RowFilter, dict[bytes, Cells]]] = [
    ("pass_all", PassAll(), ALL),
    ("block_all", BlockAll(), {}),
    (
        "family_regex",
        FamilyNameRegex("me.*"),
        _expected({(b"row-1", b"x", 5), (b"row-2", b"y", 25), (b"row-3", b"x", 50)}),
    ),
    (
        "qualifier_regex",
        ColumnQualifierRegex(b"[ab]"),
        _expected(
            {(b"row-1", b"a", 30), (b"row-1", b"a", 20), (b"row-1", b"b", 10), (b"row-2", b"a", 40)}
        ),
    ),
    (
        "column_range",
        ColumnRange("cf", b"b", b"c", end_inclusive=True),
        _expected({(b"row-1", b"b", 10), (b"row-2", b"c", 15)}),
    ),
    (
        "column_range_open_start",
        ColumnRange("cf", b"a", None, start_inclusive=False),
        _expected({(b"row-1", b"b", 10), (b"row-2", b"c", 15), (b"other-9", b"z", 1)}),
    ),
    (
        "timestamp_range",
        TimestampRange(15, 30),
        _expected({(b"row-1", b"a", 20), (b"row-2", b"c", 15), (b"row-2", b"y", 25)}),
    ),
    (
        "value_regex",
        ValueRegex(b"a.*"),
        _expected({(b"row-1", b"a", 30), (b"row-1", b"a", 20), (b"row-2", b"a", 40)}),
    ),
    ("value_range", ValueRange(b"b", b"c"), _expected({(b"row-1", b"b", 10)})),
    (
        "value_range_inclusive",
        ValueRange(b"22", b"333", start_inclusive=False, end_inclusive=True),
        _expected({(b"row-3", b"x", 50)}),
    ),
    (
        "row_key_regex",
        RowKeyRegex(b"row-[12]"),
        {k: v for k, v in ALL.items() if k in (b"row-1", b"row-2")},
    ),
    (
        "cells_per_column",
        CellsPerColumnLimit(1),
        {k: [c for c in v if c[2] != 20] for k, v in ALL.items()},
    ),
    (
        "cells_per_row_limit",
        CellsPerRowLimit(2),
        {k: v[:2] for k, v in ALL.items()},
    ),
    (
        "cells_per_row_offset",
        CellsPerRowOffset(2),
        {k: v[2:] for k, v in ALL.items() if v[2:]},
    ),
    (
        "strip_value",
        StripValue(),
        {k: [(f, q, ts, b"") for f, q, ts, _ in v] for k, v in ALL.items()},
    ),
    (
        "chain",
        Chain([FamilyNameRegex("cf"), CellsPerColumnLimit(1), ValueRegex(b".*e.*")]),
        _expected({(b"row-1", b"a", 30), (b"row-2", b"c", 15), (b"other-9", b"z", 1)}),
    ),
    (
        "interleave",
        Interleave([ColumnQualifierRegex(b"x"), ValueRegex(b"apple")]),
        _expected({(b"row-1", b"a", 30), (b"row-1", b"x", 5), (b"row-3", b"x", 50)}),
    ),
    (
        "interleave_keeps_duplicates",
        Interleave([ColumnQualifierRegex(b"x"), ValueRegex(b"333")]),
        {
            b"row-1": [("meta", b"x", 5, b"1")],
            b"row-3": [("meta", b"x", 50, b"333"), ("meta", b"x", 50, b"333")],
        },
    ),
    (
        "condition",
        Condition(ValueRegex(b"banana"), FamilyNameRegex("meta"), StripValue()),
        {
            k: [c for c in v if c[0] == "meta"]
            if k == b"row-1"
            else [(f, q, ts, b"") for f, q, ts, _ in v]
            for k, v in ALL.items()
        },
    ),
    (
        "condition_without_false_branch",
        Condition(ColumnQualifierRegex(b"c"), PassAll()),
        {b"row-2": ALL[b"row-2"]},
    ),
    (
        "sink_bypasses_later_filters",
        Chain([FamilyNameRegex("meta"), Sink(), BlockAll()]),
        _expected({(b"row-1", b"x", 5), (b"row-2", b"y", 25), (b"row-3", b"x", 50)}),
    ),
    (
        "nested",
        Chain(
            [
                Interleave(
                    [
                        FamilyNameRegex("meta"),
                        Chain([ColumnQualifierRegex(b"a"), CellsPerColumnLimit(1)]),
                    ]
                ),
                CellsPerRowLimit(1),
            ]
        ),
        {
            b"row-1": [("cf", b"a", 30, b"apple")],
            b"row-2": [("cf", b"a", 40, b"avocado")],
            b"row-3": [("meta", b"x", 50, b"333")],
        },
    ),
]


async def test_every_filter_on_scans_and_point_reads(data: AsyncTable) -> None:
    """Each filter of FILTERS over a scan, two point reads and a multi-key read; every
    mismatch is reported (one table serves all cases: setting one up is the costly part)."""
    wrong: list[str] = []
    for name, f, expected in FILTERS:
        scanned = cells_by_row(await rows_of(data, filter=f))
        if scanned != expected:
            wrong.append(f"{name}: scan gave {scanned}, expected {expected}")
        for key in (b"row-1", b"row-3"):
            got = values(await data.read_row(key, filter=f))
            if got != expected.get(key, []):
                wrong.append(f"{name}: read_row({key!r}) gave {got}")
        multi = cells_by_row(await rows_of(data, keys=[b"row-3", b"row-1", b"nope"], filter=f))
        if multi != {k: v for k, v in expected.items() if k in (b"row-1", b"row-3")}:
            wrong.append(f"{name}: keys read gave {multi}")
    assert not wrong, "\n".join(wrong)


async def test_apply_label_marks_cells(data: AsyncTable) -> None:
    f = Interleave(
        [
            Chain([FamilyNameRegex("meta"), ApplyLabel("m")]),
            Chain([ValueRegex(b"apple"), ApplyLabel("fruit")]),
        ]
    )
    row = await data.read_row(b"row-1", filter=f)
    assert row is not None
    assert [(c.qualifier, c.labels) for c in row.cells] == [(b"a", ("fruit",)), (b"x", ("m",))]


async def test_row_sample_keeps_some_rows(db: AsyncClient) -> None:
    t = await db.create_table("s", ["cf"])
    await t.mutate_rows(
        [RowMutation(b"%04d" % i, (SetCell("cf", b"q", b"v", 1),)) for i in range(300)]
    )
    sampled = await keys_of(t, filter=RowSample(0.5))
    assert 0 < len(sampled) < 300  # each row independently: failing by chance is ~2**-299
    assert sampled == sorted(sampled)


@pytest.mark.parametrize(
    "build",
    [
        lambda: ValueRegex(b"(unclosed"),
        lambda: RowKeyRegex(b"[z-a]"),
        lambda: ColumnQualifierRegex(b"a{2,1}"),
        lambda: FamilyNameRegex("*"),
        lambda: FamilyNameRegex("a:b"),
        lambda: CellsPerRowLimit(0),
        lambda: CellsPerRowOffset(-1),
        lambda: CellsPerColumnLimit(0),
        lambda: RowSample(1.5),
        lambda: ApplyLabel("UPPER"),
        lambda: TimestampRange(-1, None),
        lambda: Chain([ApplyLabel("a"), ApplyLabel("b")]),
        lambda: Condition(PassAll(), Sink()),
        lambda: ColumnRange("", b"a"),
        lambda: ValueRange("a", None),  # type: ignore[arg-type]
        lambda: Chain(["not a filter"]),  # type: ignore[list-item]
    ],
)
def test_malformed_filters_are_invalid_arguments(build: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        compile_filter(build())  # type: ignore[operator] # patterns: when compiled
    assert str(info.value) and "\n" not in str(info.value)


def test_filters_nest_at_most_twenty_levels() -> None:
    f: RowFilter = PassAll()
    for _ in range(20):
        f = Chain([f])
    with pytest.raises(InvalidArgument, match="20 levels"):
        Chain([f])


# ---------------------------------------------------------------------------- row selection


async def test_read_row_missing_and_families(data: AsyncTable) -> None:
    assert await data.read_row(b"absent") is None
    assert await data.read_row(b"row-3", families=["cf"]) is None
    row = await data.read_row(b"row-1", families=["meta"])
    assert values(row) == [("meta", b"x", 5, b"1")]
    both = await data.read_row(b"row-1", families=["meta", "cf"])
    assert values(both) == ALL[b"row-1"]


SELECTIONS: list[tuple[dict[str, object], list[bytes]]] = [
    ({}, [b"other-9", b"row-1", b"row-2", b"row-3"]),
    ({"start": b"row-1"}, [b"row-1", b"row-2", b"row-3"]),
    ({"end": b"row-2"}, [b"other-9", b"row-1"]),
    ({"start": b"row-1", "end": b"row-3"}, [b"row-1", b"row-2"]),
    ({"start": b"row-2", "end": b"row-2"}, []),
    ({"prefix": b"row-"}, [b"row-1", b"row-2", b"row-3"]),
    ({"prefix": b"row-2"}, [b"row-2"]),
    ({"prefix": b"zzz"}, []),
    ({"keys": [b"row-3", b"other-9", b"row-3", b"missing"]}, [b"other-9", b"row-3"]),
    ({"keys": []}, []),
    ({"limit": 2}, [b"other-9", b"row-1"]),
    ({"limit": 0}, []),
    ({"start": b"row-1", "limit": 2}, [b"row-1", b"row-2"]),
    (
        {
            "row_set": RowSet(
                keys=[b"other-9"], ranges=[RowRange(b"row-2", b"row-3", end_inclusive=True)]
            )
        },
        [b"other-9", b"row-2", b"row-3"],
    ),
    (
        {
            "row_set": RowSet(
                ranges=[RowRange(b"row-1", b"row-2", start_inclusive=False, end_inclusive=True)]
            )
        },
        [b"row-2"],
    ),
    ({"row_set": RowSet.prefix(b"other")}, [b"other-9"]),
    ({"families": ["meta"]}, [b"row-1", b"row-2", b"row-3"]),
    ({"families": ["meta"], "limit": 1}, [b"row-1"]),
    ({"filter": FamilyNameRegex("meta"), "limit": 2}, [b"row-1", b"row-2"]),
    ({"filter": BlockAll(), "limit": 2}, []),
]


async def test_row_selection(data: AsyncTable) -> None:
    """Each selection of SELECTIONS (ranges, prefixes, keys, row sets, limits, families)."""
    wrong = []
    for kw, expected in SELECTIONS:
        got = await keys_of(data, **kw)
        if got != expected:
            wrong.append(f"read_rows({kw}) gave {got}, expected {expected}")
    assert not wrong, "\n".join(wrong)


async def test_prefix_with_ff_bytes_and_scans_across_many_tablets(db: AsyncClient) -> None:
    t = await db.create_table("t", ["cf"], split_keys=[b"b", b"b\xff", b"c", b"m"])
    keys = [b"a", b"b", b"b\x00", b"b\xff", b"b\xff\xff", b"b\xff\xff\x01", b"c", b"l", b"m", b"zz"]
    await t.mutate_rows([RowMutation(k, (SetCell("cf", b"q", k, 1),)) for k in keys])
    assert await keys_of(t) == keys
    assert await keys_of(t, prefix=b"b\xff") == [b"b\xff", b"b\xff\xff", b"b\xff\xff\x01"]
    assert await keys_of(t, prefix=b"b") == keys[1:6]
    assert await keys_of(t, start=b"b\x00", end=b"m") == keys[2:8]
    assert await keys_of(t, start=b"b", limit=4) == keys[1:5]
    assert await keys_of(t, keys=list(reversed(keys))) == keys
    assert [r.latest("cf", b"q") for r in await rows_of(t)] == keys


async def test_conflicting_or_bad_selections_are_invalid(data: AsyncTable) -> None:
    for kw in (
        {"prefix": b"a", "start": b"b"},
        {"keys": [b"a"], "row_set": RowSet.all()},
        {"limit": -1},
        {"families": ["ghost"]},
        {"keys": [b""]},
    ):
        with pytest.raises(InvalidArgument):
            await rows_of(data, **kw)
    with pytest.raises(InvalidArgument, match="start"):
        RowRange(b"b", b"a")


# ---------------------------------------------------------------------------- streaming


async def test_scan_results_are_streamed() -> None:
    """Reading the first row of a large scan reads a small part of the table's SSTables and
    stopping early is clean; the full scan then reads (about) all of them. (memory:// only:
    streaming happens above the object store.)"""
    db = await tabletstore.Database.open(make_url("memory", Path()), instrument=True)
    try:
        lg = LocalityGroup(name="small", block_size=4096, compression="none")
        t = await db.create_table(
            "big", [ColumnFamily(name="cf", locality_group="small")], locality_groups=[lg]
        )
        value = bytes(range(256)) * 4
        for start in range(0, 2000, 500):
            await t.mutate_rows(
                [
                    RowMutation(b"%06d" % i, (SetCell("cf", b"q", value, 1),))
                    for i in range(start, start + 500)
                ]
            )
        await db.flush("big")
        store = find_layer(db.store, InstrumentedObjectStore)
        assert store is not None

        before = store.stats()
        rows: AsyncIterator[tabletstore.Row] = t.read_rows()
        first = await anext(rows)
        await rows.aclose()  # type: ignore[attr-defined]
        first_cost = (store.stats() - before).bytes_read
        assert first.key == b"000000"

        before = store.stats()
        n = sum([1 async for _ in t.read_rows(start=b"000000")])
        full_cost = (store.stats() - before).bytes_read
        assert n == 2000
        assert full_cost > 2000 * len(value) // 2
        assert first_cost < full_cost // 4, (first_cost, full_cost)
    finally:
        await db.close()
