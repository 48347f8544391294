"""The front door's change streams (bigtable_api/change_streams.py): the initial partitions,
a ReadChangeStream whose DataChanges are the table's mutations as Cloud Bigtable spells them,
a heartbeat's continuation token resuming exactly, a CloseStream naming a split's halves, and
the bad requests; and both methods answer through the gRPC server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.cloud.bigtable_v2.types import bigtable as bt

from tabletstore.bigtable_api import change_streams
from tabletstore.bigtable_api.front_door import BackgroundServer, BigtableData
from tabletstore.bigtable_api.instances import Namespaces
from tabletstore.client.change_plan import ChangePartition, PartitionEnd
from tabletstore.data.model import AddToCell, DeleteCells, DeleteFamily, DeleteRow, SetCell
from tabletstore.data.schema import ColumnFamily
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument

pytestmark = pytest.mark.timeout(120)

TABLE = "projects/p/instances/i/tables/c"
BUCKET = 86_400_000_000


def _request(part: Any, **kw: Any) -> Any:
    req = bt.ReadChangeStreamRequest.pb()(table_name=TABLE, **kw)
    if part is not None:
        req.partition.CopyFrom(part)
    return req


async def _all(agen: Any) -> list[Any]:
    return [x async for x in agen]


async def _write(db: Database) -> float:
    began = time.time()
    table = await db.create_table(
        "c",
        ["f", "g", ColumnFamily(name="n", value_type="sum")],
        split_keys=[b"m"],
        changes=3600.0,
    )
    await table.mutate_row(b"a", [SetCell("f", b"q", b"one", 1000), SetCell("g", b"x", b"2", 5)])
    await table.mutate_row(b"a", [DeleteCells("f", b"q", start=10, end=2000)])
    await table.mutate_row(b"a", [DeleteFamily("g")])
    await table.mutate_row(b"p", [AddToCell("n", b"c", 7, BUCKET)])
    await table.mutate_row(b"p", [DeleteRow()])
    return began


async def test_read_change_stream_spells_the_mutations_as_cloud_bigtable(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        began = await _write(db)
        data = BigtableData(db, namespaces=Namespaces("i"))
        gen = bt.GenerateInitialChangeStreamPartitionsRequest.pb()(table_name=TABLE)
        parts = [
            r.partition for r in await _all(data.generate_initial_change_stream_partitions(gen))
        ]
        assert [(p.row_range.start_key_closed, p.row_range.end_key_open) for p in parts] == [
            (b"", b"m"),
            (b"m", b""),
        ]
        req = _request(parts[0], end_time={"seconds": int(time.time()) + 1})
        req.start_time.FromNanoseconds(int(began * 1e9))
        got = await _all(data.read_change_stream(req))
        changes = [r.data_change for r in got if r.WhichOneof("stream_record") == "data_change"]
        assert [c.row_key for c in changes] == [b"a", b"a", b"a"]
        assert all(c.done and c.token and c.type_ == 1 for c in changes)
        assert changes[0].commit_timestamp.seconds >= int(began)
        first = [ch.mutation for ch in changes[0].chunks]
        assert [m.set_cell.value for m in first] == [b"one", b"2"]
        assert first[0].set_cell.family_name == "f" and first[0].set_cell.timestamp_micros == 1000
        column = changes[1].chunks[0].mutation.delete_from_column
        assert (column.family_name, column.column_qualifier) == ("f", b"q")
        assert (
            column.time_range.start_timestamp_micros,
            column.time_range.end_timestamp_micros,
        ) == (
            10,
            2000,
        )
        assert changes[2].chunks[0].mutation.delete_from_family.family_name == "g"
        beats = [r.heartbeat for r in got if r.WhichOneof("stream_record") == "heartbeat"]
        assert beats and beats[-1].estimated_low_watermark.seconds > 0
        assert beats[-1].continuation_token.partition == parts[0]

        # The other partition: an AddToCell input and a row deletion.
        req = _request(parts[1], end_time={"seconds": int(time.time()) + 1})
        req.start_time.FromNanoseconds(int(began * 1e9))
        got = await _all(data.read_change_stream(req))
        changes = [r.data_change for r in got if r.WhichOneof("stream_record") == "data_change"]
        add = changes[0].chunks[0].mutation.add_to_cell
        assert (add.family_name, add.column_qualifier.raw_value, add.input.int_value) == (
            "n",
            b"c",
            7,
        )
        assert add.timestamp.raw_timestamp_micros == BUCKET
        assert changes[1].chunks[0].mutation.HasField("delete_from_row")

        # A continuation token from the first change resumes after it.
        token = changes[0].token
        req = _request(parts[1], end_time={"seconds": int(time.time()) + 1})
        req.continuation_tokens.tokens.add(partition=parts[1], token=token)
        again = await _all(data.read_change_stream(req))
        rest = [r.data_change for r in again if r.WhichOneof("stream_record") == "data_change"]
        assert [c.token for c in rest] == [changes[1].token]

        # Bad requests.
        with pytest.raises(InvalidArgument, match="needs a partition"):
            await _all(data.read_change_stream(_request(None)))
        bad = _request(parts[1])
        bad.partition.row_range.start_key_open = b"a"
        with pytest.raises(InvalidArgument, match="start_key_closed"):
            await _all(data.read_change_stream(bad))


def test_a_close_stream_names_the_new_partitions_and_each_ones_token() -> None:
    end = PartitionEnd(
        ChangePartition(b"c", b"k"),
        (
            (ChangePartition(b"c", b"f"), "t1"),
            (ChangePartition(b"f", None), "t2"),  # merged with the range after it
        ),
    )
    close = change_streams.close_response(end).close_stream
    assert close.status.code == grpc.StatusCode.OUT_OF_RANGE.value[0]
    assert [
        (p.row_range.start_key_closed, p.row_range.end_key_open) for p in close.new_partitions
    ] == [
        (b"c", b"f"),
        (b"f", b""),
    ]
    assert [
        (t.partition.row_range.start_key_closed, t.partition.row_range.end_key_open, t.token)
        for t in close.continuation_tokens
    ] == [(b"c", b"f", "t1"), (b"f", b"k", "t2")]


async def test_both_methods_answer_through_the_grpc_server(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await _write(db)
    with (
        BackgroundServer(f"file://{tmp_path}", plain_instance="i") as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        partitions = channel.unary_stream(
            "/google.bigtable.v2.Bigtable/GenerateInitialChangeStreamPartitions",
            request_serializer=bt.GenerateInitialChangeStreamPartitionsRequest.pb().SerializeToString,
            response_deserializer=bt.GenerateInitialChangeStreamPartitionsResponse.pb().FromString,
        )
        name = "projects/p/instances/i/tables/c"
        req = bt.GenerateInitialChangeStreamPartitionsRequest.pb()(table_name=name)
        got = list(partitions(req, timeout=30))
        assert len(got) == 2
        read = channel.unary_stream(
            "/google.bigtable.v2.Bigtable/ReadChangeStream",
            request_serializer=bt.ReadChangeStreamRequest.pb().SerializeToString,
            response_deserializer=bt.ReadChangeStreamResponse.pb().FromString,
        )
        req = bt.ReadChangeStreamRequest.pb()(table_name=name, partition=got[0].partition)
        req.continuation_tokens.tokens.add(token="not a token")
        with pytest.raises(grpc.RpcError) as info:
            list(read(req, timeout=30))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a change-stream token" in (info.value.details() or "")
