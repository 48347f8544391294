"""Aggregate column families through the public API on ``memory://`` and ``file://``:
creating them, adding and merging, reading the combined cells back after a restart, and the
errors for mutations that do not fit the family and for changing a family's value type."""

from __future__ import annotations

import struct

import pytest

from tabletstore import (
    AddToCell,
    AsyncClient,
    ColumnFamily,
    DeleteCells,
    InvalidArgument,
    MergeToCell,
    SetCell,
)
from tabletstore.data import hll
from tests.integration.api_support import db, db_url, reopen

__all__ = ["db", "db_url"]  # fixtures used by name


def i64(v: bytes | None) -> int:
    assert v is not None
    return int(struct.unpack(">q", v)[0])


async def test_add_merge_read_and_reopen(db: AsyncClient, db_url: str) -> None:
    table = await db.create_table(
        "stats",
        [ColumnFamily(name="views", value_type="sum"), "plain"],
    )
    await db.create_family("stats", "peak", value_type="max")
    await db.create_family("stats", "users", value_type="hll")
    for i in range(20):
        await table.mutate_row(
            b"page",
            [
                AddToCell("views", b"day", 1, 86_400_000_000),
                AddToCell("peak", b"day", i * 7 % 50, 86_400_000_000),
                AddToCell("users", b"day", b"user-%d" % (i % 8), 86_400_000_000),
            ],
        )
    await table.mutate_row(
        b"page", [MergeToCell("views", b"day", struct.pack(">q", 100), 86_400_000_000)]
    )
    await db.flush("stats")
    await table.mutate_row(b"page", [AddToCell("views", b"day", 5, 86_400_000_000)])
    row = await table.read_row(b"page")
    assert row is not None
    assert i64(row.latest("views", b"day")) == 125
    assert i64(row.latest("peak", b"day")) == 49
    users = row.latest("users", b"day")
    assert users is not None and hll.estimate(users) == 8
    db = await reopen(db, db_url)
    table = db.table("stats")
    row = await table.read_row(b"page")
    assert row is not None and i64(row.latest("views", b"day")) == 125
    await db.compact("stats")
    rows = [r async for r in table.read_rows()]
    assert len(rows[0].cells_of("views")) == 1 and i64(rows[0].latest("views", b"day")) == 125
    # A delete ends the bucket: the next add starts a new cell.
    await table.mutate_row(
        b"page", [DeleteCells("views", b"day"), AddToCell("views", b"day", 2, 86_400_000_000)]
    )
    row = await table.read_row(b"page")
    assert row is not None and i64(row.latest("views", b"day")) == 2
    schema = await db.describe_table("stats")
    assert schema.families["views"].value_type == "sum"
    assert schema.families["plain"].value_type is None
    await db.close()


async def test_errors_name_the_family(db: AsyncClient) -> None:
    table = await db.create_table("e", [ColumnFamily(name="n", value_type="sum"), "p"])
    with pytest.raises(InvalidArgument, match="e:n"):
        await table.mutate_row(b"r", [SetCell("n", b"q", b"v")])
    with pytest.raises(InvalidArgument, match="e:p"):
        await table.mutate_row(b"r", [AddToCell("p", b"q", 1)])
    with pytest.raises(InvalidArgument, match="64-bit integers"):
        await table.mutate_row(b"r", [AddToCell("n", b"q", b"one")])
    schema = await db.describe_table("e")
    changed = schema.families["n"].model_copy(update={"value_type": "max"})
    with pytest.raises(InvalidArgument, match="value type cannot change"):
        await db.update_family("e", changed)
    plain_to_agg = schema.families["p"].model_copy(update={"value_type": "sum"})
    with pytest.raises(InvalidArgument, match="e:p"):
        await db.update_family("e", plain_to_agg)
    with pytest.raises(InvalidArgument):
        await db.create_family("e", "bad", value_type="average")
