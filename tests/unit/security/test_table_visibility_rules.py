"""What a principal may know of a table (security/table_visibility.py), the METADATA row cut
to routing (metadata/rows.py) and the worker's cached view of the schemas
(worker/tablet_service_guard.TableSchemas)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import pytest

from tabletstore.data.model import Cell, Mutation, Row, SetCell
from tabletstore.data.query import RowRange
from tabletstore.data.schema import Acl, ColumnFamily, TableSchema
from tabletstore.metadata.record import LogRef, TabletEvent, TabletRecord
from tabletstore.metadata.rows import (
    METADATA_TABLE_ID,
    ROOT_END,
    decode_row,
    record_mutations,
    routing_only,
    row_table_id,
    split_mutations,
)
from tabletstore.rpc.auth import principal_scope
from tabletstore.rpc.messages import ReadRowsRequest, RowBatch
from tabletstore.rpc.row_pieces import STREAM_ITEM_BYTES, RowAssembler, row_bytes, split_row
from tabletstore.security.principal import Principal
from tabletstore.security.table_visibility import TableLike, may_know_table, may_see_keys
from tabletstore.worker.tablet_service_guard import TableSchemas, guard

ALICE = Principal("alice", "client")
BOB = Principal("bob", "client")


def _schema(acl: Acl, admins: list[str] | None = None) -> TableSchema:
    return TableSchema(name="t", families={"f": ColumnFamily(name="f", acl=acl)}, admins=admins)


def test_keys_need_admin_or_read_and_existence_any_right() -> None:
    private = _schema(Acl(readers=["alice"], writers=["alice"]), admins=["alice"])
    assert may_see_keys(ALICE, private) and may_know_table(ALICE, private)
    assert not may_see_keys(BOB, private) and not may_know_table(BOB, private)
    drop_box = _schema(Acl(readers=["alice"], writers=["alice", "bob"]), admins=["alice"])
    assert not may_see_keys(BOB, drop_box) and may_know_table(BOB, drop_box)
    administered = _schema(Acl(readers=["alice"], writers=["alice"]), admins=["bob"])
    assert may_see_keys(BOB, administered)
    assert may_see_keys(BOB, _schema(Acl())) and may_see_keys(BOB, TableSchema(name="empty"))
    # Without an admin list anyone authenticated may administer it, so may know of it; its
    # keys still follow the ACLs.
    unadministered = _schema(Acl(readers=["alice"], writers=["alice"]))
    assert may_know_table(BOB, unadministered) and not may_see_keys(BOB, unadministered)
    # The cluster's own identities and a server without auth see everything.
    for who in (Principal("w1", "worker"), Principal("fd", "function"), None):
        assert may_see_keys(who, private) and may_know_table(who, private)


def test_routing_only_keeps_what_a_client_routes_by() -> None:
    record = TabletRecord(
        "t-0123",
        "x",
        b"a",
        b"secret",
        logs=(LogRef("w1", 2),),
        location="h:1",
        epoch=7,
        events=(TabletEvent(1.0, "split", "at b'secret-2'"),),
    )
    child = TabletRecord("t-0123", "y", b"a", b"secret-2", location="h:2", epoch=8, redo_seq=5)
    row = Row(
        record.row_key,
        [
            *(_cell(m) for m in record_mutations(record)),
            *(_cell(m) for m in split_mutations([child])),
        ],
    )
    cut = routing_only(row)
    assert cut is not None
    decoded = decode_row(cut)
    assert decoded is not None
    assert decoded.record == TabletRecord("t-0123", "x", b"a", b"secret", location="h:1", epoch=7)
    assert decoded.pending == (
        TabletRecord("t-0123", "y", b"a", b"secret-2", location="h:2", epoch=8),
    )
    assert b"secret-2'" not in b"".join(c.value for c in cut.cells)
    assert routing_only(Row(record.row_key, [])) is None
    assert row_table_id(record.row_key) == "t-0123"
    assert row_table_id(b"no separator") is None


def _cell(mutation: Mutation) -> Cell:
    assert isinstance(mutation, SetCell)
    return Cell(mutation.family, mutation.qualifier, 0, mutation.value)


async def test_schemas_are_read_again_after_ttl_or_for_a_new_table_not_too_often() -> None:
    now = [0.0]
    tables: dict[str, TableLike] = {"a": _schema(Acl())}
    reads = 0
    gate = asyncio.Event()

    async def read() -> Mapping[str, TableLike]:
        nonlocal reads
        reads += 1
        await gate.wait()
        return dict(tables)

    schemas = TableSchemas(read, ttl=2.0, min_interval=0.2, clock=lambda: now[0])
    gate.set()
    assert await schemas.get("a") is not None and reads == 1
    assert await schemas.get("a") is not None and reads == 1  # cached
    assert await schemas.get("gone") is None and reads == 1  # too soon to read again
    now[0] = 0.3
    tables["b"] = _schema(Acl())
    assert await schemas.get("b") is not None and reads == 2  # a table made since
    now[0] = 2.5
    gate.clear()
    # Concurrent requests share one read.
    waiting = [asyncio.ensure_future(schemas.get("a")) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert all(s is not None for s in await asyncio.gather(*waiting)) and reads == 3


async def test_a_failed_read_fails_its_waiters_and_the_next_read_tries_again() -> None:
    calls = 0

    async def read() -> Mapping[str, TableLike]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("catalog down")
        return {}

    schemas = TableSchemas(read, clock=lambda: 0.0)
    with pytest.raises(RuntimeError, match="catalog down"):
        await schemas.get("a")
    assert await schemas.get("a") is None and calls == 2


async def test_the_guard_cuts_a_metadata_stream_and_keeps_large_rows_in_pieces() -> None:
    """A client's METADATA scan through the worker's guard: the rows of a table it may not know
    are gone, a readable table's row comes whole (a large one in pieces again), METADATA's own
    rows are cut to routing; a worker's scan is untouched."""
    big = TabletRecord(
        "mine-1", "x", b"", None, location="h:1", events=(TabletEvent(1.0, "n", "x" * 3_000_000),)
    )
    theirs = TabletRecord("theirs-1", "y", b"", None, location="h:1")
    meta = TabletRecord(METADATA_TABLE_ID, "m00000", ROOT_END, None, location="h:0", redo_seq=9)
    rows = [Row(r.row_key, [_cell(m) for m in record_mutations(r)]) for r in (meta, big, theirs)]

    async def read_rows(request: ReadRowsRequest) -> AsyncIterator[object]:
        for row in sorted(rows, key=lambda r: r.key):
            if row_bytes(row) > STREAM_ITEM_BYTES:
                for piece in split_row(row):
                    yield piece
            else:
                yield RowBatch((row,))

    schemas: dict[str, TableLike] = {
        "mine-1": _schema(Acl(readers=["bob"])),
        "theirs-1": _schema(Acl(readers=["alice"], writers=["alice"]), admins=["alice"]),
    }

    async def read_schemas() -> Mapping[str, TableLike]:
        return schemas

    guarded = guard({"read_rows": read_rows}, tables=TableSchemas(read_schemas))["read_rows"]
    request = ReadRowsRequest(METADATA_TABLE_ID, "root", ranges=(RowRange(b"", None),))

    async def scan(who: Principal) -> list[Row]:
        assembler = RowAssembler()
        out: list[Row] = []
        with principal_scope(who):
            async for item in guarded(request):  # type: ignore[attr-defined]
                assert _batch_bytes(item) <= STREAM_ITEM_BYTES
                out.extend(assembler.rows(item))
        assembler.finish()
        return out

    routing = TabletRecord(METADATA_TABLE_ID, "m00000", ROOT_END, None, location="h:0")
    assert _records(await scan(BOB)) == [routing, big]
    everything = sorted((meta, big, theirs), key=lambda r: r.row_key)
    assert _records(await scan(Principal("w1", "worker"))) == everything


def _records(rows: list[Row]) -> list[TabletRecord]:
    decoded = [decode_row(r) for r in rows]
    return [d.record for d in decoded if d is not None]


def _batch_bytes(item: object) -> int:
    """The estimated size of a stream item that is a batch (pieces are bounded by design)."""
    return sum(row_bytes(r) for r in item.rows) if isinstance(item, RowBatch) else 0
