"""A worker's coalesced point read (one ``read_row`` naming many keys, issue 18): rows from
the memtable and from SSTables, present and absent, answered together exactly as one by one;
reads from memory run inline (worker/eager.py), reads from the store concurrently."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tabletstore import connect_async
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.embedded import Database
from tabletstore.errors import TabletStoreError
from tabletstore.rpc.messages import ReadRowsRequest, RowBatch


@pytest.fixture
async def db() -> AsyncIterator[Database]:
    client = await connect_async(f"memory://point-reads-{uuid.uuid4().hex}")
    assert isinstance(client, Database)
    try:
        yield client
    finally:
        await client.close()


async def test_many_keys_in_one_read_row_answer_as_one_by_one(db: Database) -> None:
    table = await db.create_table("t", ["f"], split_keys=[b"m"])
    stored = [b"a%03d" % i for i in range(0, 60, 2)]
    await table.mutate_rows([RowMutation(k, (SetCell("f", b"q", b"s" + k),)) for k in stored])
    await db.flush("t")  # these are read from SSTables (pages fetched from the store)
    fresh = [b"a%03d" % i for i in range(1, 60, 4)]
    await table.mutate_rows([RowMutation(k, (SetCell("f", b"q", b"m" + k),)) for k in fresh])
    info = await db.catalog.get_table("t")
    (tablet, _) = sorted(await db.catalog.list_tablets(info.table_id), key=lambda t: t.start_row)
    keys = tuple(b"a%03d" % i for i in range(59, -1, -1))  # present and absent, any order
    reply = await db.worker.read_row(ReadRowsRequest(info.table_id, tablet.tablet_id, keys=keys))
    assert isinstance(reply, RowBatch)
    one_by_one = []
    for key in keys:
        alone = await db.worker.read_row(
            ReadRowsRequest(info.table_id, tablet.tablet_id, keys=(key,))
        )
        assert isinstance(alone, RowBatch)
        one_by_one.extend(alone.rows)
    assert list(reply.rows) == one_by_one
    assert {r.key for r in reply.rows} == {*stored, *fresh}
    # A key the tablet does not hold fails the request (each caller's client retries its own).
    with pytest.raises(TabletStoreError):
        await db.worker.read_row(
            ReadRowsRequest(info.table_id, tablet.tablet_id, keys=(b"a001", b"z"))
        )
