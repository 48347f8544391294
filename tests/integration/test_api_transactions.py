"""Single-row transactions through the public API on ``memory://`` and ``file://``:
check-and-mutate (predicate filter, true and false mutations) and read-modify-write (append,
increment of 64-bit big-endian counters), each atomic under concurrency.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from tabletstore import (
    AppendValue,
    AsyncClient,
    AsyncTable,
    Chain,
    ColumnQualifierRegex,
    DeleteFamily,
    DeleteRow,
    FamilyNameRegex,
    IncrementValue,
    InvalidArgument,
    NotFound,
    SetCell,
    ValueRange,
    ValueRegex,
)
from tests.integration.api_support import db, db_url, values

__all__ = ["db", "db_url"]  # fixtures used by name


def be64(n: int) -> bytes:
    return struct.pack(">q", n)


@pytest.fixture
async def table(db: AsyncClient) -> AsyncTable:
    return await db.create_table("t", ["cf", "stats"], split_keys=[b"m"])


# ---------------------------------------------------------------------------- check-and-mutate


async def test_check_and_mutate_true_branch(table: AsyncTable) -> None:
    await table.mutate_row(b"r", [SetCell("cf", b"state", b"open", 1)])
    matched = await table.check_and_mutate_row(
        b"r",
        Chain([ColumnQualifierRegex(b"state"), ValueRegex(b"open")]),
        true_mutations=[SetCell("cf", b"state", b"closed", 2)],
        false_mutations=[SetCell("cf", b"error", b"x", 2)],
    )
    assert matched is True
    assert values(await table.read_row(b"r")) == [
        ("cf", b"state", 2, b"closed"),
        ("cf", b"state", 1, b"open"),
    ]


async def test_check_and_mutate_false_branch(table: AsyncTable) -> None:
    await table.mutate_row(b"r", [SetCell("cf", b"n", b"5", 1)])
    matched = await table.check_and_mutate_row(
        b"r",
        ValueRange(b"6", None),
        true_mutations=[DeleteRow()],
        false_mutations=[SetCell("cf", b"low", b"yes", 1)],
    )
    assert matched is False
    assert values(await table.read_row(b"r")) == [("cf", b"low", 1, b"yes"), ("cf", b"n", 1, b"5")]


async def test_check_and_mutate_without_predicate_tests_row_existence(table: AsyncTable) -> None:
    create = [SetCell("cf", b"owner", b"me", 1)]
    assert await table.check_and_mutate_row(b"new", None, false_mutations=create) is False
    assert await table.check_and_mutate_row(b"new", None, false_mutations=create) is True
    assert await table.check_and_mutate_row(b"new", None, true_mutations=[DeleteFamily("cf")])
    assert await table.read_row(b"new") is None


async def test_check_and_mutate_only_one_branch_given(table: AsyncTable) -> None:
    # A matching predicate with only false mutations changes nothing, and vice versa.
    await table.mutate_row(b"r", [SetCell("cf", b"q", b"v", 1)])
    assert await table.check_and_mutate_row(
        b"r", FamilyNameRegex("cf"), false_mutations=[DeleteRow()]
    )
    assert not await table.check_and_mutate_row(
        b"r", FamilyNameRegex("stats"), true_mutations=[DeleteRow()]
    )
    assert values(await table.read_row(b"r")) == [("cf", b"q", 1, b"v")]


async def test_check_and_mutate_validation(table: AsyncTable) -> None:
    with pytest.raises(InvalidArgument, match="true or false mutations"):
        await table.check_and_mutate_row(b"r", None)
    # A bad mutation in either branch rejects the whole request, applying nothing.
    with pytest.raises(NotFound, match="ghost"):
        await table.check_and_mutate_row(
            b"r",
            None,
            true_mutations=[SetCell("ghost", b"q", b"v")],
            false_mutations=[SetCell("cf", b"q", b"v", 1)],
        )
    assert await table.read_row(b"r") is None
    with pytest.raises(InvalidArgument):
        await table.check_and_mutate_row(b"", None, true_mutations=[DeleteRow()])


async def test_check_and_mutate_is_atomic_under_contention(table: AsyncTable) -> None:
    """Twenty clients race to take a lock row: exactly one sees it free and takes it."""

    async def take(i: int) -> bool:
        matched = await table.check_and_mutate_row(
            b"lock", None, false_mutations=[SetCell("cf", b"owner", b"%d" % i, 1)]
        )
        return not matched

    won = await asyncio.gather(*(take(i) for i in range(20)))
    assert sum(won) == 1
    row = await table.read_row(b"lock")
    assert row is not None and row.latest("cf", b"owner") == b"%d" % won.index(True)


async def test_compare_and_set_counter_loop(table: AsyncTable) -> None:
    """A CAS loop built on check-and-mutate counts exactly, with concurrent writers."""
    await table.mutate_row(b"z", [SetCell("cf", b"v", b"0", 0)])

    async def bump() -> None:
        while True:
            row = await table.read_row(b"z")
            assert row is not None
            cur = row.latest("cf", b"v")
            assert cur is not None
            new = b"%d" % (int(cur) + 1)
            if await table.check_and_mutate_row(
                b"z",
                Chain([ColumnQualifierRegex(b"v"), ValueRegex(cur)]),
                true_mutations=[SetCell("cf", b"v", new, 0)],
            ):
                return

    await asyncio.gather(*(bump() for _ in range(10)))
    row = await table.read_row(b"z")
    assert row is not None and row.latest("cf", b"v") == b"10"


# ---------------------------------------------------------------------------- read-modify-write


async def test_append(table: AsyncTable) -> None:
    row = await table.read_modify_write_row(b"r", [AppendValue("cf", b"log", b"a")])
    assert [(c.qualifier, c.value) for c in row.cells] == [(b"log", b"a")]
    row = await table.read_modify_write_row(
        b"r", [AppendValue("cf", b"log", b"b"), AppendValue("cf", b"log", b"c")]
    )
    assert row.key == b"r" and [(c.qualifier, c.value) for c in row.cells] == [(b"log", b"abc")]
    latest = await table.read_row(b"r")
    assert latest is not None and latest.latest("cf", b"log") == b"abc"


async def test_increment_counters(table: AsyncTable) -> None:
    row = await table.read_modify_write_row(b"r", [IncrementValue("stats", b"n", 5)])
    assert row.cells[0].value == be64(5)
    row = await table.read_modify_write_row(
        b"r",
        [
            IncrementValue("stats", b"n", -7),
            IncrementValue("stats", b"m", 1),
            AppendValue("cf", b"s", b"x"),
        ],
    )
    got = {(c.family, c.qualifier): c.value for c in row.cells}
    assert got == {("stats", b"n"): be64(-2), ("stats", b"m"): be64(1), ("cf", b"s"): b"x"}
    read = await table.read_row(b"r")
    assert read is not None and read.latest("stats", b"n") == be64(-2)
    # An existing 8-byte big-endian value written by a plain SetCell is a counter too.
    await table.mutate_row(b"s", [SetCell("stats", b"n", be64(41))])
    row = await table.read_modify_write_row(b"s", [IncrementValue("stats", b"n", 1)])
    assert row.cells[0].value == be64(42)


async def test_increment_wraps_like_a_64_bit_counter(table: AsyncTable) -> None:
    await table.mutate_row(b"r", [SetCell("stats", b"n", be64(2**63 - 1))])
    row = await table.read_modify_write_row(b"r", [IncrementValue("stats", b"n", 1)])
    assert row.cells[0].value == be64(-(2**63))


async def test_increment_errors(table: AsyncTable) -> None:
    await table.mutate_row(b"r", [SetCell("stats", b"text", b"abc", 1)])
    with pytest.raises(InvalidArgument, match="3 bytes, not a 64-bit big-endian"):
        await table.read_modify_write_row(b"r", [IncrementValue("stats", b"text", 1)])
    with pytest.raises(InvalidArgument, match="64 bits"):
        await table.read_modify_write_row(b"r", [IncrementValue("stats", b"n", 2**63)])
    with pytest.raises(NotFound, match="ghost"):
        await table.read_modify_write_row(b"r", [IncrementValue("ghost", b"n", 1)])
    with pytest.raises(InvalidArgument, match="no rules"):
        await table.read_modify_write_row(b"r", [])
    # A failed rule applies nothing of its request.
    with pytest.raises(InvalidArgument):
        await table.read_modify_write_row(
            b"r", [AppendValue("cf", b"a", b"x"), IncrementValue("stats", b"text", 1)]
        )
    assert values(await table.read_row(b"r")) == [("stats", b"text", 1, b"abc")]


async def test_increment_result_is_newest_even_with_future_timestamps(table: AsyncTable) -> None:
    future = 2**62
    await table.mutate_row(b"r", [SetCell("stats", b"n", be64(10), future)])
    row = await table.read_modify_write_row(b"r", [IncrementValue("stats", b"n", 1)])
    assert row.cells[0].value == be64(11)
    read = await table.read_row(b"r")
    assert read is not None and read.latest("stats", b"n") == be64(11)


async def test_concurrent_increments_are_atomic(db: AsyncClient, table: AsyncTable) -> None:
    async def inc(row: bytes) -> int:
        r = await table.read_modify_write_row(row, [IncrementValue("stats", b"n", 1)])
        return struct.unpack(">q", r.cells[0].value)[0]

    rows = [b"a", b"z"]  # one per tablet
    results = await asyncio.gather(*(inc(rows[i % 2]) for i in range(60)))
    for row in rows:
        seen = sorted(v for i, v in enumerate(results) if rows[i % 2] == row)
        assert seen == list(range(1, 31)), "every increment saw a distinct, gapless value"
    await db.flush("t")
    for row in rows:
        read = await table.read_row(row)
        assert read is not None and read.latest("stats", b"n") == be64(30)


async def test_a_millisecond_write_after_an_increment_is_not_hidden_by_it() -> None:
    """The Cloud Bigtable front door stamps writes with its clock truncated to the millisecond;
    an increment within the same millisecond used to be stamped at the microsecond, so a write
    acknowledged after it read back older (happybase's counter_set read 3 instead of 10)."""
    from tabletstore.clock import ManualClock
    from tabletstore.data.model import IncrementValue, SetCell
    from tabletstore.embedded import Database

    clock = ManualClock(start=1_700_000_000.000_5)  # half-way through a millisecond
    async with await Database.open("memory://rmw-granularity", clock=clock) as database:
        t = await database.create_table("c", ["f"])
        await t.read_modify_write_row(b"r", [IncrementValue("f", b"n", 3)])
        now_ms = int(clock.time() * 1_000_000) // 1000 * 1000
        await t.mutate_row(b"r", [SetCell("f", b"n", be64(10), now_ms)])
        row = await t.read_row(b"r")
        assert row is not None and row.cells[0].value == be64(10)
