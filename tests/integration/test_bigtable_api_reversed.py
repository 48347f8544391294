"""Reversed scans through the front door (``ReadRowsRequest.reversed``), with Google's
generated ``BigtableClient`` (the handwritten Python clients do not expose ``reversed``):
rows in descending key order, with row sets, limits and filters, across tablets."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.bigtable")

import grpc
from google.cloud.bigtable import Client
from google.cloud.bigtable.data import BigtableDataClient, RowMutationEntry, SetCell
from google.cloud.bigtable_v2 import BigtableClient
from google.cloud.bigtable_v2.services.bigtable.transports import BigtableGrpcTransport

from tabletstore.bigtable_api.front_door import BackgroundServer

PROJECT, INSTANCE = "rev-project", "rev-instance"

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


@pytest.fixture(scope="module")
def setup() -> Iterator[tuple[BigtableClient, str]]:
    with (
        BackgroundServer(
            f"memory://rev-{uuid.uuid4().hex}", max_value_chunk=100, max_response_bytes=300
        ) as server,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setenv("BIGTABLE_EMULATOR_HOST", server.address)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            admin = Client(project=PROJECT, admin=True)
            admin.instance(INSTANCE).table("t").create(
                column_families={"cf": None}, initial_split_keys=[b"k10", b"k20"]
            )
            admin.close()
            with BigtableDataClient(project=PROJECT) as client:
                client.get_table(INSTANCE, "t").bulk_mutate_rows(
                    [
                        RowMutationEntry(
                            b"k%02d" % i, [SetCell("cf", b"q", b"v" * (250 if i % 4 else 5), 1000)]
                        )
                        for i in range(30)
                    ]
                )
        channel = grpc.insecure_channel(server.address)
        try:
            yield (
                BigtableClient(transport=BigtableGrpcTransport(channel=channel)),
                (f"projects/{PROJECT}/instances/{INSTANCE}/tables/t"),
            )
        finally:
            channel.close()


def read(client: BigtableClient, request: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    """(key, value) of each committed row, in the order the stream sends them."""
    out: list[tuple[bytes, bytes]] = []
    key, value = b"", b""
    for resp in client.read_rows(request=request):
        for chunk in resp.chunks:
            if chunk.row_key:
                if chunk.row_key != key:
                    value = b""
                key = chunk.row_key
            value += chunk.value
            if chunk.commit_row:
                out.append((key, value))
                value = b""
    return out


def test_reversed_reads_descend(setup: tuple[BigtableClient, str]) -> None:
    client, table = setup
    forward = read(client, {"table_name": table})
    assert [k for k, _ in forward] == [b"k%02d" % i for i in range(30)]
    backward = read(client, {"table_name": table, "reversed": True})
    assert backward == forward[::-1]
    limited = read(client, {"table_name": table, "reversed": True, "rows_limit": 4})
    assert [k for k, _ in limited] == [b"k29", b"k28", b"k27", b"k26"]
    ranged = read(
        client,
        {
            "table_name": table,
            "reversed": True,
            "rows": {
                "row_keys": [b"k02", b"k25"],
                "row_ranges": [{"start_key_closed": b"k08", "end_key_open": b"k13"}],
            },
            "filter": {"row_key_regex_filter": b".*[0-2]"},
        },
    )
    assert [k for k, _ in ranged] == [b"k12", b"k11", b"k10", b"k02"]
