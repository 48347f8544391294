"""Data, through the public API on ``memory://`` and ``file://``: RowMutation (set and
delete cell, delete column with a time range, delete family, delete row) applied atomically per
row; batches across rows (each row atomic on its own, per-row results, partial failure reported
per row); the limits (row key <= 64 KiB, unknown family, value size, bad timestamps) with clear
errors; durability across a clean restart and reopening ``memory://`` by name.
"""

from __future__ import annotations

import time

import pytest

import tabletstore
from tabletstore import (
    AsyncClient,
    AsyncTable,
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    InvalidArgument,
    MutationError,
    MutationsFailed,
    NotFound,
    RowMutation,
    SetCell,
    TabletStoreError,
)
from tabletstore.data.model import MAX_ROW_KEY, MAX_VALUE
from tests.integration.api_support import db, db_url, reopen, rows_of, values

__all__ = ["db", "db_url"]  # fixtures used by name


@pytest.fixture
async def table(db: AsyncClient) -> AsyncTable:
    return await db.create_table("t", ["cf", "other"])


# ---------------------------------------------------------------------------- set / versions


async def test_set_cell_versions_are_newest_first(table: AsyncTable) -> None:
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"v1", 10)])
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"v3", 30), SetCell("cf", b"q", b"v2", 20)])
    row = await table.read_row(b"r")
    assert values(row) == [
        ("cf", b"q", 30, b"v3"),
        ("cf", b"q", 20, b"v2"),
        ("cf", b"q", 10, b"v1"),
    ]
    assert row is not None and row.latest("cf", b"q") == b"v3"
    assert row.to_dict() == {"cf": {b"q": [(30, b"v3"), (20, b"v2"), (10, b"v1")]}}


async def test_same_timestamp_overwrites(table: AsyncTable) -> None:
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"first", 5)])
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"second", 5)])
    assert values(await table.read_row(b"r")) == [("cf", b"q", 5, b"second")]


async def test_server_timestamp_is_now_in_microseconds(table: AsyncTable) -> None:
    before = int(time.time() * 1_000_000)
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"v")])
    after = int(time.time() * 1_000_000)
    [(_, _, ts, value)] = values(await table.read_row(b"r"))
    assert value == b"v"
    assert before - 1_000_000 <= ts <= after + 1_000_000


async def test_binary_keys_qualifiers_and_values(table: AsyncTable) -> None:
    key, qual, val = b"\x00\xff\n\x80", b"\xff\x00", bytes(range(256))
    await table.mutate_row(key, [SetCell("cf", qual, val, 1), SetCell("cf", b"", b"", 1)])
    assert values(await table.read_row(key)) == [("cf", b"", 1, b""), ("cf", qual, 1, val)]


# ---------------------------------------------------------------------------- deletes


async def _three_versions(table: AsyncTable, row: bytes = b"r") -> None:
    await table.mutate_row(
        row,
        [SetCell("cf", b"q", b"v%d" % ts, ts) for ts in (10, 20, 30)]
        + [SetCell("cf", b"keep", b"k", 10), SetCell("other", b"q", b"o", 10)],
    )


@pytest.mark.parametrize(
    ("start", "end", "left"),
    [
        (None, None, []),
        (20, None, [10]),
        (None, 20, [30, 20]),
        (15, 30, [30, 10]),
        (20, 21, [30, 10]),
        (40, 50, [30, 20, 10]),
    ],
)
async def test_delete_column_with_time_range(
    table: AsyncTable, start: int | None, end: int | None, left: list[int]
) -> None:
    await _three_versions(table)
    await table.mutate_row(b"r", [DeleteCells("cf", b"q", start, end)])
    row = await table.read_row(b"r")
    assert row is not None
    assert [c.timestamp for c in row.cells_of("cf", b"q")] == left
    assert row.latest("cf", b"keep") == b"k" and row.latest("other", b"q") == b"o"


async def test_delete_family_and_row(table: AsyncTable) -> None:
    await _three_versions(table, b"a")
    await _three_versions(table, b"b")
    await table.mutate_row(b"a", [DeleteFamily("cf")])
    assert values(await table.read_row(b"a")) == [("other", b"q", 10, b"o")]
    await table.mutate_row(b"b", [DeleteRow()])
    assert await table.read_row(b"b") is None
    assert [r.key for r in await rows_of(table)] == [b"a"]


async def test_writes_after_a_delete_are_visible_even_with_older_timestamps(
    table: AsyncTable,
) -> None:
    """A delete removes what exists when it is applied, not later writes (Bigtable)."""
    await _three_versions(table)
    await table.mutate_row(b"r", [DeleteRow()])
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"again", 5)])
    assert values(await table.read_row(b"r")) == [("cf", b"q", 5, b"again")]
    await table.mutate_row(b"r", [DeleteCells("cf", b"q")])
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"back", 1)])
    assert values(await table.read_row(b"r")) == [("cf", b"q", 1, b"back")]


async def test_mutations_of_a_row_apply_in_order(table: AsyncTable) -> None:
    await table.mutate_row(b"a", [SetCell("cf", b"q", b"v", 1), DeleteRow()])
    assert await table.read_row(b"a") is None
    await table.mutate_row(b"b", [DeleteRow(), SetCell("cf", b"q", b"v", 1)])
    assert values(await table.read_row(b"b")) == [("cf", b"q", 1, b"v")]
    await table.mutate_row(
        b"c", [SetCell("cf", b"q", b"v", 1), DeleteFamily("cf"), SetCell("cf", b"x", b"w", 1)]
    )
    assert values(await table.read_row(b"c")) == [("cf", b"x", 1, b"w")]


async def test_deletes_mask_flushed_and_compacted_cells(db: AsyncClient, table: AsyncTable) -> None:
    await _three_versions(table)
    await db.flush("t")
    await table.mutate_row(b"r", [DeleteCells("cf", b"q", 20, None)])
    assert [c.timestamp for c in (await table.read_row(b"r")).cells_of("cf", b"q")] == [10]  # type: ignore[union-attr]
    await db.flush("t")
    await db.compact("t")
    assert [c.timestamp for c in (await table.read_row(b"r")).cells_of("cf", b"q")] == [10]  # type: ignore[union-attr]
    await table.mutate_row(b"r", [DeleteRow()])
    await db.compact("t")
    assert await table.read_row(b"r") is None


# ---------------------------------------------------------------------------- row atomicity


async def test_row_mutation_with_one_bad_mutation_applies_nothing(table: AsyncTable) -> None:
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"before", 1)])
    with pytest.raises(NotFound, match="nope"):
        await table.mutate_row(
            b"r", [SetCell("cf", b"q", b"after", 2), SetCell("nope", b"q", b"x", 2)]
        )
    with pytest.raises(InvalidArgument, match="time range"):
        await table.mutate_row(b"r", [DeleteRow(), DeleteCells("cf", b"q", 5, 1)])
    assert values(await table.read_row(b"r")) == [("cf", b"q", 1, b"before")]


async def test_concurrent_row_mutations_are_atomic(table: AsyncTable) -> None:
    """Readers never see half of a row mutation: every write sets both columns together."""
    import asyncio

    async def writer(i: int) -> None:
        v = b"%04d" % i
        await table.mutate_row(b"r", [SetCell("cf", b"a", v, 0), SetCell("other", b"b", v, 0)])

    async def reader() -> list[tuple[bytes | None, bytes | None]]:
        seen = []
        for _ in range(20):
            row = await table.read_row(b"r")
            if row is not None:
                seen.append((row.latest("cf", b"a"), row.latest("other", b"b")))
            await asyncio.sleep(0)
        return seen

    results = await asyncio.gather(*(writer(i) for i in range(40)), reader(), reader())
    for seen in results[-2:]:
        assert seen is not None
        for a, b in seen:
            assert a == b


# ---------------------------------------------------------------------------- batches


async def test_mutate_rows_applies_every_row(table: AsyncTable) -> None:
    entries = [RowMutation(b"r%02d" % i, (SetCell("cf", b"q", b"%d" % i, 1),)) for i in range(50)]
    assert await table.mutate_rows(entries) is None
    rows = await rows_of(table)
    assert [r.key for r in rows] == [e.row for e in entries]
    assert [r.latest("cf", b"q") for r in rows] == [b"%d" % i for i in range(50)]
    await table.mutate_rows([])


async def test_mutate_rows_reports_partial_failure_per_row(table: AsyncTable) -> None:
    entries = [
        RowMutation(b"ok1", (SetCell("cf", b"q", b"1", 1),)),
        RowMutation(b"bad-family", (SetCell("cf", b"q", b"x", 1), SetCell("nope", b"q", b"x", 1))),
        RowMutation(b"ok2", (SetCell("cf", b"q", b"2", 1), DeleteFamily("other"))),
        RowMutation(b"", (SetCell("cf", b"q", b"x", 1),)),
        RowMutation(b"no-mutations", ()),
        RowMutation(b"ok3", (DeleteRow(), SetCell("other", b"q", b"3", 1))),
    ]
    with pytest.raises(MutationsFailed) as info:
        await table.mutate_rows(entries)
    failed = info.value.failures
    assert [(f.index, f.row) for f in failed] == [
        (1, b"bad-family"),
        (3, b""),
        (4, b"no-mutations"),
    ]
    assert all(isinstance(f, MutationError) for f in failed)
    assert isinstance(failed[0].error, NotFound) and "nope" in str(failed[0].error)
    assert isinstance(failed[1].error, InvalidArgument) and "empty" in str(failed[1].error)
    assert isinstance(failed[2].error, InvalidArgument)
    assert "3 of 6 row mutations failed" in str(info.value)
    assert info.value.may_have_applied is False
    assert await table.read_row(b"bad-family") is None  # the failed row applied nothing
    got = {r.key: values(r) for r in await rows_of(table)}
    assert got == {
        b"ok1": [("cf", b"q", 1, b"1")],
        b"ok2": [("cf", b"q", 1, b"2")],
        b"ok3": [("other", b"q", 1, b"3")],
    }


async def test_mutate_rows_same_row_twice_and_across_tablets(db: AsyncClient) -> None:
    t = await db.create_table("split", ["cf"], split_keys=[b"g", b"p"])
    entries = [RowMutation(bytes([c]), (SetCell("cf", b"q", b"x", 1),)) for c in b"azkqbm"]
    entries.append(RowMutation(b"a", (SetCell("cf", b"q2", b"y", 1),)))
    await t.mutate_rows(entries)
    assert [r.key for r in await rows_of(t)] == [b"a", b"b", b"k", b"m", b"q", b"z"]
    assert len((await t.read_row(b"a")).cells) == 2  # type: ignore[union-attr]
    with pytest.raises(MutationsFailed) as info:
        await t.mutate_rows(
            [
                RowMutation(b"c", (SetCell("cf", b"q", b"ok", 1),)),
                RowMutation(b"x", (SetCell("zz", b"q", b"no", 1),)),
                RowMutation(b"h", (SetCell("cf", b"q", b"ok", 1),)),
            ]
        )
    assert [f.index for f in info.value.failures] == [1]
    assert {b"c", b"h"} <= set(r.key for r in await rows_of(t))


# ---------------------------------------------------------------------------- limits


async def test_row_key_limits(table: AsyncTable) -> None:
    biggest = b"k" * MAX_ROW_KEY
    await table.mutate_row(biggest, [SetCell("cf", b"q", b"v", 1)])
    assert values(await table.read_row(biggest)) == [("cf", b"q", 1, b"v")]
    too_big = b"k" * (MAX_ROW_KEY + 1)
    for call in (
        table.mutate_row(too_big, [SetCell("cf", b"q", b"v")]),
        table.read_row(too_big),
        table.check_and_mutate_row(too_big, None, true_mutations=[DeleteRow()]),
        table.read_modify_write_row(too_big, []),
    ):
        with pytest.raises(InvalidArgument, match="65537 bytes; the limit is 65536"):
            await call
    with pytest.raises(InvalidArgument, match="empty"):
        await table.mutate_row(b"", [SetCell("cf", b"q", b"v")])
    with pytest.raises(InvalidArgument, match="bytes"):
        await table.mutate_row("str-key", [SetCell("cf", b"q", b"v")])  # type: ignore[arg-type]
    with pytest.raises(MutationsFailed) as info:
        await table.mutate_rows([RowMutation(too_big, (SetCell("cf", b"q", b"v"),))])
    assert "65536" in str(info.value.failures[0].error)
    assert MAX_ROW_KEY == 64 * 1024


async def test_unknown_family_is_named(table: AsyncTable) -> None:
    for muts in (
        [SetCell("ghost", b"q", b"v")],
        [DeleteCells("ghost", b"q")],
        [DeleteFamily("ghost")],
    ):
        with pytest.raises(NotFound, match="no column family 'ghost'"):
            await table.mutate_row(b"r", muts)
    with pytest.raises(InvalidArgument, match="ghost"):
        await table.read_row(b"r", families=["ghost"])


async def test_value_size_limit(table: AsyncTable) -> None:
    too_big = b"\0" * (MAX_VALUE + 1)
    with pytest.raises(InvalidArgument, match=f"{MAX_VALUE + 1} bytes; the limit is {MAX_VALUE}"):
        await table.mutate_row(b"r", [SetCell("cf", b"q", too_big)])
    big = b"x" * (1024 * 1024)
    await table.mutate_row(b"r", [SetCell("cf", b"q", big, 1)])
    assert (await table.read_row(b"r")).latest("cf", b"q") == big  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mutation", "match"),
    [
        (SetCell("cf", b"q", b"v", -1), "timestamp"),
        (SetCell("cf", b"q", b"v", 2**63), "timestamp"),
        (DeleteCells("cf", b"q", 10, 5), "time range"),
        (DeleteCells("cf", b"q", -5, None), "time range"),
        (SetCell("cf", "str", b"v"), "bytes"),  # type: ignore[arg-type]
        (SetCell("cf", b"q", "str"), "bytes"),  # type: ignore[arg-type]
        (SetCell("cf", b"q", b"v", True), "timestamp .* must be an int, not bool"),
        (SetCell("cf", b"q", b"v", 1.5), "timestamp .* must be an int, not float"),  # type: ignore[arg-type]
        (DeleteCells("cf", b"q", None, False), "must be an int, not bool"),
    ],
)
async def test_bad_mutations_are_invalid_arguments(
    table: AsyncTable, mutation: object, match: str
) -> None:
    with pytest.raises(InvalidArgument, match=match):
        await table.mutate_row(b"r", [mutation])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="no mutations"):
        await table.mutate_row(b"r", [])
    assert await table.read_row(b"r") is None


async def test_a_refused_timestamp_leaves_the_tablet_flushing(
    db: AsyncClient, table: AsyncTable
) -> None:
    """A bool timestamp used to be stored (True passed the range check), and from then on
    every minor compaction of the tablet failed on the SSTable's int64 column."""
    with pytest.raises(InvalidArgument, match="not bool"):
        await table.mutate_row(b"r", [SetCell("cf", b"q", b"v", True)])
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"ok", 7)])
    await db.flush("t")
    await db.compact("t")
    assert values(await table.read_row(b"r")) == [("cf", b"q", 7, b"ok")]


async def test_errors_are_one_hierarchy(table: AsyncTable) -> None:
    with pytest.raises(TabletStoreError):
        await table.mutate_row(b"", [SetCell("cf", b"q", b"v")])
    assert issubclass(MutationsFailed, TabletStoreError)


# ---------------------------------------------------------------------------- durability


async def test_acknowledged_writes_survive_a_clean_restart(db: AsyncClient, db_url: str) -> None:
    """Close and reopen (memory:// by name in the same process): memtable contents, flushed
    SSTables and deletes are all there."""
    t = await db.create_table("t", ["cf"], split_keys=[b"m"])
    await t.mutate_rows(
        [RowMutation(b"%03d" % i, (SetCell("cf", b"q", b"%d" % i, 1),)) for i in range(30)]
    )
    await db.flush("t")
    await t.mutate_row(b"005", [DeleteRow()])
    await t.mutate_row(b"zzz", [SetCell("cf", b"q", b"last", 1)])
    db2 = await reopen(db, db_url)
    try:
        t2 = db2.table("t")
        got = {r.key: r.latest("cf", b"q") for r in await rows_of(t2)}
        want = {b"%03d" % i: b"%d" % i for i in range(30) if i != 5} | {b"zzz": b"last"}
        assert got == want
        await t2.mutate_row(b"new", [SetCell("cf", b"q", b"after", 1)])
        assert (await t2.read_row(b"new")) is not None
    finally:
        await db2.close()


async def test_memory_database_reopens_by_name_after_close() -> None:
    """``memory://name`` is shared by name within a process: closing a handle and connecting
    again to the same name sees the same tables and data."""
    url = "memory://api-reopen-by-name"
    db = await tabletstore.connect_async(url)
    t = await db.create_table("t", ["cf"])
    await t.mutate_row(b"r", [SetCell("cf", b"q", b"v", 1)])
    await db.close()
    db2 = await tabletstore.connect_async(url)
    try:
        assert await db2.list_tables() == ["t"]
        assert values(await db2.table("t").read_row(b"r")) == [("cf", b"q", 1, b"v")]
    finally:
        await db2.close()
