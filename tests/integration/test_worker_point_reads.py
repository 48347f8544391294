"""A worker's coalesced point read (one ``read_row`` naming many keys): rows from
the memtable and from SSTables, present and absent, answered together exactly as one by one;
reads from memory run inline (worker/eager_gather.py), reads from the store concurrently."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from tabletstore import connect_async
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.embedded import Database
from tabletstore.errors import NotServing, TabletStoreError
from tabletstore.rpc.messages import (
    EntryError,
    PointReadsRequest,
    ReadRowsRequest,
    RowBatch,
    TabletKeys,
)
from tabletstore.storage_s3 import find_layer
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore


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
    reply = await db.worker.services.read_row(
        ReadRowsRequest(info.table_id, tablet.tablet_id, keys=keys)
    )
    assert isinstance(reply, RowBatch)
    one_by_one = []
    for key in keys:
        alone = await db.worker.services.read_row(
            ReadRowsRequest(info.table_id, tablet.tablet_id, keys=(key,))
        )
        assert isinstance(alone, RowBatch)
        one_by_one.extend(alone.rows)
    assert list(reply.rows) == one_by_one
    assert {r.key for r in reply.rows} == {*stored, *fresh}
    # A key the tablet does not hold fails the request (each caller's client retries its own).
    with pytest.raises(TabletStoreError):
        await db.worker.services.read_row(
            ReadRowsRequest(info.table_id, tablet.tablet_id, keys=(b"a001", b"z"))
        )


async def test_read_points_answers_each_tablet_as_read_row(db: Database) -> None:
    """``read_points`` (a cluster client's reads of several tablets in one request): each
    part answered as ``read_row`` of its keys would be, a part naming a tablet not served
    here answered with its own error, the others unaffected."""
    table = await db.create_table("t", ["f"], split_keys=[b"m"])
    stored = [b"a1", b"a3", b"x1", b"x3"]
    await table.mutate_rows([RowMutation(k, (SetCell("f", b"q", b"s" + k),)) for k in stored])
    await db.flush("t")
    await table.mutate_rows([RowMutation(b"x2", (SetCell("f", b"q", b"fresh"),))])
    info = await db.catalog.get_table("t")
    low, high = sorted(await db.catalog.list_tablets(info.table_id), key=lambda t: t.start_row)
    parts = (
        TabletKeys(info.table_id, high.tablet_id, (b"x3", b"x2", b"x0")),
        TabletKeys(info.table_id, "no-such-tablet", (b"a1",)),
        TabletKeys(info.table_id, low.tablet_id, (b"a3", b"a2", b"a1")),
        TabletKeys(info.table_id, low.tablet_id, (b"a1", b"x1")),  # x1 is not in low
    )
    reply = await db.worker.services.read_points(PointReadsRequest(parts))
    assert len(reply.answers) == 4
    for i in (0, 2):
        expected = await db.worker.services.read_row(
            ReadRowsRequest(info.table_id, parts[i].tablet_id, keys=parts[i].keys)
        )
        assert reply.answers[i] == expected
    high_rows = reply.answers[0]
    assert isinstance(high_rows, RowBatch)
    assert [r.key for r in high_rows.rows] == [b"x3", b"x2"]
    assert high_rows.rows[1].cells[0].value == b"fresh"
    for i in (1, 3):
        refused = reply.answers[i]
        assert isinstance(refused, EntryError) and refused.index == i
        assert isinstance(refused.exception(), TabletStoreError)
    assert isinstance(reply.answers[1], EntryError)
    assert isinstance(reply.answers[1].exception(), NotServing)


async def test_interleaved_sequential_readers_through_read_points_read_ahead() -> None:
    """32 clients each reading a short range row by row through one worker, in lockstep,
    their reads coalesced 16 to a ``read_points`` request (bench.paper's sequential reads
    over RPC): the worker reads ahead for them as for one process's reader, so
    the GETs stay within two per reader plus one per block, never about one per page (142
    GETs for these 160 pages before; 69 now)."""
    db = await Database.open(f"memory://point-reads-{uuid.uuid4().hex}", instrument=True)
    try:
        table = await db.create_table("t", ["f"])
        readers, per = 32, 40
        rows = readers * per
        value = bytes(range(256)) * 4  # 1 KiB: about 8 rows per page, 64 per block
        for start in range(0, rows, 256):
            await table.mutate_rows(
                [
                    RowMutation(b"r%06d" % i, (SetCell("f", b"q", value),))
                    for i in range(start, min(rows, start + 256))
                ]
            )
        await db.flush("t")
        await db.compact("t")  # one SSTable, none of its pages cached yet
        info = await db.catalog.get_table("t")
        (tablet,) = await db.catalog.list_tablets(info.table_id)
        counted = find_layer(db.store, InstrumentedObjectStore)
        assert counted is not None
        counted.reset()
        for step in range(per):
            keys = [b"r%06d" % (k * per + step) for k in range(readers)]
            replies = await asyncio.gather(
                *(
                    db.worker.services.read_points(
                        PointReadsRequest(
                            (TabletKeys(info.table_id, tablet.tablet_id, tuple(keys[i : i + 16])),)
                        )
                    )
                    for i in range(0, readers, 16)
                )
            )
            got = [row.key for reply in replies for part in reply.answers for row in part.rows]
            assert got == keys
        gets = counted.stats()[Op.GET_RANGE].requests
        pages = rows // 8
        assert gets <= 2 * readers + rows // 64, (gets, pages)
    finally:
        await db.close()
