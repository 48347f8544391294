"""ReadRows of one row key is answered as a point read, without a stream or a scan's setup:
the same responses a scan's encoder makes, and every other request left to ReadRows proper."""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud.bigtable_v2.types import bigtable as bt

from tabletstore.bigtable_api.chunks import ChunkEncoder
from tabletstore.bigtable_api.front_door import BigtableData
from tabletstore.data.model import Cell, Row

TABLE = "projects/p/instances/i/tables/t"
ROW = Row(b"k1", (Cell("cf", b"a", 2000, b"x" * 50), Cell("cf", b"b", 1000, b"y" * 3000)))


class Table:
    def __init__(self) -> None:
        self.reads: list[tuple[bytes, Any]] = []

    async def read_row(self, key: bytes, *, filter: Any = None) -> Row | None:
        self.reads.append((key, filter))
        return ROW if key == ROW.key else None


class Client:
    def __init__(self) -> None:
        self.t = Table()

    def table(self, name: str) -> Table:
        return self.t


def _request(*keys: bytes, **kw: Any) -> Any:
    req = bt.ReadRowsRequest.pb()(table_name=TABLE, **kw)
    req.rows.row_keys.extend(keys)
    return req


def _serialized(responses: list[Any]) -> list[bytes]:
    return [r if type(r) is bytes else r.SerializeToString() for r in responses]


@pytest.mark.parametrize("max_response_bytes", [1024 * 1024, 1024])
async def test_one_key_gets_the_encoders_responses(max_response_bytes: int) -> None:
    client = Client()
    data = BigtableData(
        client,  # type: ignore[arg-type]
        max_value_chunk=1000,
        max_response_bytes=max_response_bytes,
    )
    got = await data.read_one_row(_request(b"k1", rows_limit=1))
    assert got is not None
    encoder = ChunkEncoder(max_value_chunk=1000, max_response_bytes=max_response_bytes)
    expected = list(encoder.add(ROW))
    last = encoder.flush()
    expected += [last] if last is not None else []
    assert _serialized(got) == _serialized(expected)
    assert (len(got) == 1) == (max_response_bytes > 4000)  # a larger row: several responses
    assert client.t.reads == [(b"k1", None)]
    assert await data.read_one_row(_request(b"nope")) == []


async def test_other_reads_are_left_to_read_rows() -> None:
    client = Client()
    data = BigtableData(client)  # type: ignore[arg-type]
    ranged = _request(b"k1")
    ranged.rows.row_ranges.add(start_key_closed=b"a")
    for req in (
        _request(),  # the whole table
        _request(b"k1", b"k2"),
        ranged,
        _request(b""),  # an empty key names no row
        _request(b"k1", rows_limit=-1),  # read_rows names the bad limit
        _request(b"k1", request_stats_view=bt.ReadRowsRequest.RequestStatsView.REQUEST_STATS_FULL),
    ):
        assert await data.read_one_row(req) is None
    assert client.t.reads == []
