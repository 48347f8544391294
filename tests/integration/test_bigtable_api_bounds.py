"""The Cloud Bigtable front door's message limit: a request larger than
``limits.MAX_REQUEST_BYTES`` is refused by gRPC before it is buffered, not accepted up to 256 MiB.

The refusal is checked against a server with a small limit (the same gRPC option, cheap to
exceed); the default server's limit is checked to be the request limit."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("google.cloud.bigtable")

import grpc
from google.cloud.bigtable_v2.types import bigtable as bt
from google.cloud.bigtable_v2.types import data as btd

from tabletstore import limits
from tabletstore.bigtable_api.front_door import MAX_MESSAGE_BYTES, BigtableApiServer
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument

_LIMIT = 1 << 20  # the small server's limit


@pytest.fixture
async def db() -> AsyncIterator[Database]:
    database = await Database.open(f"memory://fd-bounds-{uuid.uuid4().hex}")
    await database.create_table("t", ["cf"])
    try:
        yield database
    finally:
        await database.close()


def _mutate_row(value: bytes) -> bytes:
    request = bt.MutateRowRequest.pb()(
        table_name="projects/p/instances/i/tables/t",
        row_key=b"r",
        mutations=[
            btd.Mutation.pb()(
                set_cell=btd.Mutation.SetCell.pb()(
                    family_name="cf", column_qualifier=b"q", timestamp_micros=1000, value=value
                )
            )
        ],
    )
    out: bytes = request.SerializeToString()
    return out


async def test_the_default_message_limit_is_the_request_limit(db: Database) -> None:
    assert MAX_MESSAGE_BYTES == limits.MAX_REQUEST_BYTES
    assert limits.MAX_VALUE < limits.MAX_MUTATION_BYTES < MAX_MESSAGE_BYTES
    assert BigtableApiServer(db).max_message_bytes == limits.MAX_REQUEST_BYTES
    with pytest.raises(InvalidArgument, match="max_message_bytes"):
        BigtableApiServer(db, max_message_bytes=10)


async def test_an_oversized_message_is_refused_and_a_normal_one_served(db: Database) -> None:
    server = BigtableApiServer(db, max_message_bytes=_LIMIT, plain_instance="i")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            call = channel.unary_unary("/google.bigtable.v2.Bigtable/MutateRow")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(_mutate_row(b"x" * (2 * _LIMIT)), timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert str(_LIMIT) in (info.value.details() or "")
            # The connection and the server carry on: a value under the limit is written.
            await call(_mutate_row(b"y" * (_LIMIT // 2)), timeout=30)
        row = await db.table("t").read_row(b"r")
        assert row is not None and row.cells[0].value == b"y" * (_LIMIT // 2)
    finally:
        await server.stop()
