"""Whatever can be written can be read back (docs/architecture/design.md §9): rows larger than a
frame.

Two 10 MB cells in one row were both acknowledged, then ``read_row`` and any
scan over the row failed (``response of 20000065 bytes exceeds 16 MiB``). Here, through the
public API: a row of two 10 MB cells and a row of one ~20 MB cell, between small neighbours,
read back exactly by ``read_row``, scans, key sets and limits

* on the embedded default (no frames in-process; the worker's stream items are checked to be
  bounded, and the write limits to be enforced with a clear error),
* on a real cluster (etcd, moto's S3 server, a master and two workers as processes; slow),
* through the Cloud Bigtable front door over that cluster with the official client (slow).
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tabletstore import connect_async
from tabletstore.client.client import AsyncClient
from tabletstore.client.table import AsyncTable
from tabletstore.data.filters import FamilyNameRegex
from tabletstore.data.model import (
    MAX_MUTATION_BYTES,
    MAX_QUALIFIER,
    MAX_VALUE,
    AppendValue,
    Row,
    RowMutation,
    SetCell,
)
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument, Unavailable
from tabletstore.rpc.codec import Codec
from tabletstore.rpc.messages import LargeRow, ReadRowsRequest, RowBatch, RowPiece
from tabletstore.rpc.row_pieces import STREAM_ITEM_BYTES, RowAssembler
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Method
from tabletstore.rpc.wire import register_all
from tests.integration.cluster_harness import Cluster
from tests.integration.test_cluster import _start, wait_served

pytestmark = pytest.mark.timeout(300)

MB = 1_000_000


class BigRows:
    """The data set: small rows around a row of two 10 MB cells and a row of one ~20 MB cell,
    on both sides of the table's split at ``m``."""

    def __init__(self) -> None:
        rnd = random.Random(7)
        self.a, self.b = rnd.randbytes(10 * MB), rnd.randbytes(10 * MB)
        self.huge = rnd.randbytes(20 * MB + 3)
        self.small = {k: b"small-" + k for k in (b"a", b"c", b"e", b"n", b"z")}

    async def write(self, table: AsyncTable) -> None:
        await table.mutate_rows(
            [RowMutation(k, (SetCell("f", b"s", v, timestamp=1),)) for k, v in self.small.items()]
        )
        # Two 10 MB cells written one at a time (each write fits a
        # 16 MiB frame, the row does not), and a small cell in another family.
        await table.mutate_row(b"b", [SetCell("f", b"one", self.a, timestamp=5)])
        await table.mutate_row(
            b"b", [SetCell("f", b"two", self.b, timestamp=5), SetCell("g", b"tag", b"x", 5)]
        )
        # One value larger than a 16 MiB frame, in one write.
        await table.mutate_row(b"d", [SetCell("f", b"huge", self.huge, timestamp=6)])

    def check_b(self, row: Row | None) -> None:
        assert row is not None and row.key == b"b"
        got = [(c.family, c.qualifier, c.timestamp, len(c.value)) for c in row.cells]
        assert got == [("f", b"one", 5, 10 * MB), ("f", b"two", 5, 10 * MB), ("g", b"tag", 5, 1)]
        assert row.cells[0].value == self.a and row.cells[1].value == self.b

    def check_d(self, row: Row | None) -> None:
        assert row is not None and row.key == b"d" and len(row.cells) == 1
        assert row.cells[0].value == self.huge

    def check_small(self, row: Row) -> None:
        assert [c.value for c in row.cells] == [self.small[row.key]], row.key

    async def check(self, table: AsyncTable) -> None:
        self.check_b(await table.read_row(b"b"))
        self.check_d(await table.read_row(b"d"))
        fam = await table.read_row(b"b", families=["g"])
        assert fam is not None and [c.value for c in fam.cells] == [b"x"]
        tagged = await table.read_row(b"b", filter=FamilyNameRegex("g"))
        assert tagged is not None and [c.qualifier for c in tagged.cells] == [b"tag"]

        # A scan over everything: order, exact bytes, and the small rows after each big one
        # (the stream goes on after a row sent in pieces).
        rows = [r async for r in table.read_rows()]
        assert [r.key for r in rows] == [b"a", b"b", b"c", b"d", b"e", b"n", b"z"]
        self.check_b(rows[1])
        self.check_d(rows[3])
        for row in rows[::2] + rows[5:]:
            self.check_small(row)
        # Key sets, ranges and limits that start, stop or resume around the big rows.
        got = [r async for r in table.read_rows(keys=[b"z", b"d", b"c", b"b"])]
        assert [r.key for r in got] == [b"b", b"c", b"d", b"z"]
        self.check_b(got[0])
        self.check_d(got[2])
        limited = [r.key async for r in table.read_rows(start=b"b", limit=3)]
        assert limited == [b"b", b"c", b"d"]
        ranged = [r async for r in table.read_rows(start=b"c", end=b"e")]
        assert [r.key for r in ranged] == [b"c", b"d"]
        self.check_d(ranged[1])


@pytest.fixture(scope="module")
def big_rows() -> BigRows:
    return BigRows()


# ------------------------------------------------------------------------------ embedded


@pytest.fixture
async def db() -> AsyncIterator[Database]:
    client = await connect_async(f"memory://large-rows-{uuid.uuid4().hex}")
    assert isinstance(client, Database)
    try:
        yield client
    finally:
        await client.close()


async def test_large_rows_read_back_embedded(db: Database, big_rows: BigRows) -> None:
    table = await db.create_table("big", ["f", "g"], split_keys=[b"m"])
    await big_rows.write(table)
    await big_rows.check(table)
    await db.flush("big")  # and again from SSTables
    await big_rows.check(table)


async def test_worker_streams_large_rows_in_bounded_items(db: Database, big_rows: BigRows) -> None:
    """What the worker hands the transport: every item fits a small frame once encoded (a
    20 MB row was one 20 MB item), and point reads of a large row say "stream it"."""
    table = await db.create_table("big", ["f", "g"], split_keys=[b"m"])
    await big_rows.write(table)
    codec = register_all(Codec())
    info = await db.catalog.get_table("big")
    tablet = next(iter(await db.catalog.list_tablets(info.table_id)))
    req = ReadRowsRequest(info.table_id, tablet.tablet_id, ranges=(), keys=(b"a", b"b", b"d"))
    assembler = RowAssembler()
    rows: list[Row] = []
    items = 0
    async for item in db.worker.services.read_rows(req):
        items += 1
        assert len(codec.encode(item)) <= 2 * STREAM_ITEM_BYTES
        rows.extend(assembler.rows(codec.decode(codec.encode(item))))
    assembler.finish()
    assert items > 40
    assert [r.key for r in rows] == [b"a", b"b", b"d"]
    big_rows.check_b(rows[1])
    big_rows.check_d(rows[2])

    point = ReadRowsRequest(info.table_id, tablet.tablet_id, keys=(b"d",))
    assert isinstance(await db.worker.services.read_row(point), LargeRow)
    small = ReadRowsRequest(info.table_id, tablet.tablet_id, keys=(b"a",))
    assert isinstance(await db.worker.services.read_row(small), RowBatch)


async def test_writes_beyond_the_readable_limits_are_refused(db: Database) -> None:
    table = await db.create_table("limits", ["f"])
    half = b"\0" * (MAX_VALUE // 2 + 1)
    # Each value is allowed; together they pass the row-mutation limit (80 MiB).
    with pytest.raises(InvalidArgument, match=f"the limit is {MAX_MUTATION_BYTES} "):
        await table.mutate_row(b"r", [SetCell("f", bytes([i]), half) for i in range(3)])
    with pytest.raises(InvalidArgument, match=f"the limit is {MAX_QUALIFIER}"):
        await table.mutate_row(b"r", [SetCell("f", b"q" * (MAX_QUALIFIER + 1), b"")])
    # An append may not grow a value past MAX_VALUE (it was accepted before, unreadable later).
    await table.mutate_row(b"r", [SetCell("f", b"q", half)])
    with pytest.raises(InvalidArgument, match=f"the limit is {MAX_VALUE}"):
        await table.read_modify_write_row(b"r", [AppendValue("f", b"q", half)])
    row = await table.read_row(b"r")
    assert row is not None and [len(c.value) for c in row.cells] == [len(half)]


# ------------------------------------------------------------------------------ real cluster


@pytest.fixture(scope="module")
def cluster(
    etcd_server: str, s3_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    made = Cluster.on(
        etcd_server, s3_server, tmp_path_factory.mktemp("large-rows"), "cluster", lease_ttl=5.0
    )
    try:
        yield _start(made, masters=1, workers=2)
    finally:
        made.close()


@pytest.fixture
async def cluster_client(cluster: Cluster) -> AsyncIterator[AsyncClient]:
    client = await connect_async(cluster.url)
    try:
        yield client
    finally:
        await client.close()


@pytest.mark.slow
async def test_large_rows_read_back_on_a_cluster(
    cluster_client: AsyncClient, big_rows: BigRows
) -> None:
    table = await cluster_client.create_table("big", ["f", "g"], split_keys=[b"m"])
    await wait_served(cluster_client, "big", 2)
    await big_rows.write(table)
    await big_rows.check(table)
    await cluster_client.flush("big")
    await big_rows.check(table)
    await cluster_client.delete_table("big")


@pytest.mark.slow
async def test_a_batch_larger_than_a_frame_is_written_on_a_cluster(
    cluster_client: AsyncClient,
) -> None:
    """mutate_rows of 100 MB for one tablet goes in several requests, not one refused frame."""
    table = await cluster_client.create_table("batch", ["f"])
    await wait_served(cluster_client, "batch", 1)
    values = {b"r%02d" % i: os.urandom(5 * MB) for i in range(20)}
    await table.mutate_rows([RowMutation(k, (SetCell("f", b"v", v),)) for k, v in values.items()])
    got = {r.key: r.cells[0].value async for r in table.read_rows()}
    assert got == values
    await cluster_client.delete_table("batch")


@pytest.mark.slow
def test_large_row_through_the_bigtable_front_door(
    cluster: Cluster, big_rows: BigRows, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The official client writes and reads a 20 MB row through the front door over the
    cluster; gRPC clients receive 4 MiB messages by default, so the row arrives in pieces."""
    pytest.importorskip("google.cloud.bigtable")
    from google.cloud.bigtable.data import BigtableDataClient, ReadRowsQuery, RowRange
    from google.cloud.bigtable.data import SetCell as PbSetCell

    from tabletstore.bigtable_api.front_door import BackgroundServer

    asyncio.run(_create_table(cluster.url, "front"))
    # Instance "i" serves the tables made with the tabletstore API.
    with BackgroundServer(cluster.url, plain_instance="i") as server:
        monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", server.address)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            client = BigtableDataClient(project="p")
        try:
            table = client.get_table("i", "front")
            table.mutate_row(b"a", PbSetCell("cf", b"s", b"small-a", timestamp_micros=1000))
            table.mutate_row(
                b"big",
                [
                    PbSetCell("cf", b"one", big_rows.a, timestamp_micros=2000),
                    PbSetCell("cf", b"two", big_rows.b, timestamp_micros=2000),
                ],
            )
            table.mutate_row(b"c", PbSetCell("cf", b"s", b"small-c", timestamp_micros=1000))
            row = table.read_row(b"big")
            assert row is not None
            assert [c.value for c in row] == [big_rows.a, big_rows.b]
            rows = table.read_rows(ReadRowsQuery(row_ranges=RowRange(b"a", b"d")))
            assert [r.row_key for r in rows] == [b"a", b"big", b"c"]
            assert [c.value for c in rows[1]] == [big_rows.a, big_rows.b]
            assert [c.value for c in rows[2]] == [b"small-c"]
        finally:
            client.close()


async def _create_table(url: str, name: str) -> None:
    client = await connect_async(url)
    try:
        await client.create_table(name, ["cf"])
        await wait_served(client, name, 1)
    finally:
        await client.close()


async def test_a_stream_broken_inside_a_large_row_resumes_after_the_last_whole_row(
    db: Database, big_rows: BigRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's stream dies after a few pieces of row ``b``: the client never hands out
    half a row, and its retry resumes after ``a``, reading ``b`` whole and nothing twice."""
    table = await db.create_table("big", ["f", "g"], split_keys=[b"m"])
    await big_rows.write(table)
    transport = db._transport
    real = transport.stream
    READ_ROWS = TABLET.method(TabletService.read_rows)
    broken: list[int] = []

    async def breaks_once(
        address: str,
        method: Method,
        request: object,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> AsyncIterator[object]:
        n = 0
        async for item in real(address, method, request, timeout=timeout):
            if method is READ_ROWS and not broken and isinstance(item, RowPiece):
                n += 1
                if n == 3:
                    broken.append(n)
                    raise Unavailable("connection lost (injected)")
            yield item

    monkeypatch.setattr(transport, "stream", breaks_once)
    rows = [r async for r in table.read_rows()]
    assert broken == [3]
    assert [r.key for r in rows] == [b"a", b"b", b"c", b"d", b"e", b"n", b"z"]
    big_rows.check_b(rows[1])
    big_rows.check_d(rows[3])
