"""ReadRows through the front door as the service streams it (one response per row, or per
bounded size of a larger row; and, the front door's default, several small rows per response
up to a bound) and the official clients' resume path: a gRPC server interceptor cuts streams
after N responses, often in the middle of a row, and the clients retry with the rows they
already have removed from the request.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.bigtable")

import grpc
from google.cloud.bigtable import Client
from google.cloud.bigtable.data import (
    BigtableDataClient,
    ReadRowsQuery,
    RowMutationEntry,
    RowRange,
    SetCell,
)

from tabletstore.bigtable_api.front_door import BackgroundServer

PROJECT, INSTANCE = "resume-project", "resume-instance"
READ_ROWS = "/google.bigtable.v2.Bigtable/ReadRows"
#: Row i's value: rows divisible by 5 are larger than one response (several messages each).
BIG_EVERY = 5

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


class StreamCutter(grpc.aio.ServerInterceptor):
    """Aborts the first ``cuts`` ReadRows streams with UNAVAILABLE after ``after`` responses;
    records every ReadRows request and how many responses each stream sent."""

    def __init__(self) -> None:
        self.cuts = 0
        self.after = 0
        self.requests: list[Any] = []
        self.sent: list[int] = []

    def arm(self, cuts: int, after: int) -> None:
        self.cuts, self.after = cuts, after
        self.requests.clear()
        self.sent.clear()

    async def intercept_service(
        self, continuation: Any, handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler_call_details.method != READ_ROWS or handler is None:
            return handler
        inner = handler.unary_stream

        async def cut(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            self.requests.append(request)
            self.sent.append(0)
            stream = len(self.sent) - 1
            async for resp in inner(request, context):
                yield resp
                self.sent[stream] += 1
                if self.cuts > 0 and self.sent[stream] >= self.after:
                    self.cuts -= 1
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "injected: stream cut")

        return grpc.unary_stream_rpc_method_handler(
            cut,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@pytest.fixture(scope="module")
def cutter() -> StreamCutter:
    return StreamCutter()


@pytest.fixture(scope="module")
def server(cutter: StreamCutter) -> Iterator[BackgroundServer]:
    with BackgroundServer(
        f"memory://resume-{uuid.uuid4().hex}",
        max_value_chunk=500,
        max_response_bytes=1000,
        max_rows_bytes=0,  # one response per row, as Google's emulator sends them
        interceptors=[cutter],
    ) as srv:
        yield srv


def value(i: int) -> bytes:
    return bytes([65 + i % 26]) * (2600 if i % BIG_EVERY == 0 else 50)


@pytest.fixture(scope="module")
def table_id(server: BackgroundServer) -> str:
    tid = f"r-{uuid.uuid4().hex[:10]}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIGTABLE_EMULATOR_HOST", server.address)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            admin = Client(project=PROJECT, admin=True)
            admin.instance(INSTANCE).table(tid).create(column_families={"cf": None})
            admin.close()
            with BigtableDataClient(project=PROJECT) as client:
                client.get_table(INSTANCE, tid).bulk_mutate_rows(
                    [
                        RowMutationEntry(b"k%03d" % i, [SetCell("cf", b"q", value(i), 1000)])
                        for i in range(40)
                    ]
                )
    return tid


@pytest.fixture
def data_table(
    server: BackgroundServer, table_id: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", server.address)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with BigtableDataClient(project=PROJECT) as client:
            yield client.get_table(INSTANCE, table_id)


def test_one_response_per_small_row_and_bounded_responses_for_large_rows(
    data_table: Any, cutter: StreamCutter
) -> None:
    cutter.arm(cuts=0, after=0)
    rows = data_table.read_rows(ReadRowsQuery())
    assert [r.row_key for r in rows] == [b"k%03d" % i for i in range(40)]
    assert [r.cells[0].value for r in rows] == [value(i) for i in range(40)]
    # 32 small rows: one response each; 8 rows of 2600 bytes: five each (500-byte chunks).
    assert cutter.sent == [32 + 8 * 5]


@pytest.mark.parametrize("after", [1, 2, 3, 7])
def test_a_range_scan_resumes_after_cuts_mid_stream(
    data_table: Any, cutter: StreamCutter, after: int
) -> None:
    """Every stream but the last is cut after ``after`` responses (mid-row whenever that
    falls in a large row); every row still arrives once, whole, in order, and each retry asks
    only for the rows after the last one the client committed."""
    cutter.arm(cuts=4, after=after)
    rows = data_table.read_rows(
        ReadRowsQuery(row_ranges=RowRange(b"k002", b"k030")), operation_timeout=120
    )
    assert [r.row_key for r in rows] == [b"k%03d" % i for i in range(2, 30)]
    assert [r.cells[0].value for r in rows] == [value(i) for i in range(2, 30)]
    assert len(cutter.requests) == 5
    starts = [bytes(req.rows.row_ranges[0].start_key_open) for req in cutter.requests[1:]]
    assert starts == sorted(starts) and all(b"k002" <= s < b"k030" for s in starts)
    assert all(bytes(req.rows.row_ranges[0].end_key_open) == b"k030" for req in cutter.requests)


def test_row_keys_and_limit_resume_with_the_received_rows_removed(
    data_table: Any, cutter: StreamCutter
) -> None:
    keys = [b"k%03d" % i for i in (0, 1, 3, 5, 6, 10, 11, 15, 20, 25, 33)]
    # A large row takes 5 responses: every stream commits rows before it is cut.
    cutter.arm(cuts=2, after=8)
    rows = data_table.read_rows(ReadRowsQuery(row_keys=keys, limit=9), operation_timeout=120)
    assert [r.row_key for r in rows] == keys[:9]
    assert len(cutter.requests) == 3
    for before, after in zip(cutter.requests, cutter.requests[1:], strict=False):
        left = set(after.rows.row_keys)
        assert left < set(before.rows.row_keys)
        assert after.rows_limit == 9 - (len(keys) - len(left))


def test_a_cut_in_the_middle_of_a_row_reads_that_row_again_whole(
    data_table: Any, cutter: StreamCutter
) -> None:
    """k000 takes five responses: streams cut after two commit nothing, so the client asks
    again for the same rows, and the row arrives once, whole."""
    cutter.arm(cuts=2, after=2)
    rows = data_table.read_rows(ReadRowsQuery(row_keys=[b"k000", b"k001"]), operation_timeout=120)
    assert [(r.row_key, r.cells[0].value) for r in rows] == [
        (b"k000", value(0)),
        (b"k001", value(1)),
    ]
    assert len(cutter.requests) == 3
    assert all(set(r.rows.row_keys) == {b"k000", b"k001"} for r in cutter.requests)


def test_the_legacy_client_resumes_too(
    server: BackgroundServer, table_id: str, cutter: StreamCutter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", server.address)
    cutter.arm(cuts=3, after=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        admin = Client(project=PROJECT, admin=True)
        try:
            rows = list(admin.instance(INSTANCE).table(table_id).read_rows())
        finally:
            admin.close()
    assert [r.row_key for r in rows] == [b"k%03d" % i for i in range(40)]
    assert [r.cells["cf"][b"q"][0].value for r in rows] == [value(i) for i in range(40)]
    assert len(cutter.requests) == 4


# -- packed responses: several small rows per message (the front door's default) ---------------
@pytest.fixture(scope="module")
def packed_cutter() -> StreamCutter:
    return StreamCutter()


@pytest.fixture(scope="module")
def packed_server(packed_cutter: StreamCutter) -> Iterator[BackgroundServer]:
    """Small rows (about 70 serialized bytes) go out up to 400 bytes of them per response."""
    with BackgroundServer(
        f"memory://packed-{uuid.uuid4().hex}",
        max_value_chunk=500,
        max_response_bytes=1000,
        max_rows_bytes=400,
        interceptors=[packed_cutter],
    ) as srv:
        yield srv


@pytest.fixture
def packed_table(packed_server: BackgroundServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", packed_server.address)
    tid = f"p-{uuid.uuid4().hex[:10]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        admin = Client(project=PROJECT, admin=True)
        admin.instance(INSTANCE).table(tid).create(column_families={"cf": None})
        admin.close()
        with BigtableDataClient(project=PROJECT) as client:
            table = client.get_table(INSTANCE, tid)
            table.bulk_mutate_rows(
                [
                    RowMutationEntry(b"k%03d" % i, [SetCell("cf", b"q", value(i), 1000)])
                    for i in range(40)
                ]
            )
            yield table


def test_small_rows_share_responses_and_large_rows_go_alone(
    packed_table: Any, packed_cutter: StreamCutter
) -> None:
    packed_cutter.arm(cuts=0, after=0)
    rows = packed_table.read_rows(ReadRowsQuery())
    assert [r.row_key for r in rows] == [b"k%03d" % i for i in range(40)]
    assert [r.cells[0].value for r in rows] == [value(i) for i in range(40)]
    # The 4 small rows between two large ones fit one 400-byte response; each large row takes
    # five responses of its own (500-byte value chunks): 8 * 5 + 8 runs of small rows.
    assert packed_cutter.sent == [8 * 5 + 8]


@pytest.mark.parametrize("after", [1, 3, 6])
def test_a_scan_of_packed_responses_resumes_after_cuts(
    packed_table: Any, packed_cutter: StreamCutter, after: int
) -> None:
    """Streams cut after ``after`` responses, between or inside runs of packed rows and in the
    middle of large rows: every row arrives once, whole and in order, and every retry starts
    after the last row the client committed."""
    packed_cutter.arm(cuts=4, after=after)
    rows = packed_table.read_rows(
        ReadRowsQuery(row_ranges=RowRange(b"k001", b"k039")), operation_timeout=120
    )
    assert [r.row_key for r in rows] == [b"k%03d" % i for i in range(1, 39)]
    assert [r.cells[0].value for r in rows] == [value(i) for i in range(1, 39)]
    assert len(packed_cutter.requests) == 5
    starts = [bytes(req.rows.row_ranges[0].start_key_open) for req in packed_cutter.requests[1:]]
    assert starts == sorted(starts) and all(b"k001" <= s < b"k039" for s in starts)


def test_packed_row_keys_with_a_limit_resume_with_the_received_rows_removed(
    packed_table: Any, packed_cutter: StreamCutter
) -> None:
    keys = [b"k%03d" % i for i in (1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13)]  # all small rows
    # The first response holds five rows (5 * 76 serialized bytes <= 400); the stream is cut
    # after it, and the retry asks for the six others, with the limit lowered by five.
    packed_cutter.arm(cuts=1, after=1)
    rows = packed_table.read_rows(ReadRowsQuery(row_keys=keys, limit=10), operation_timeout=120)
    assert [r.row_key for r in rows] == keys[:10]
    assert len(packed_cutter.requests) == 2
    first, retry = packed_cutter.requests
    assert set(retry.rows.row_keys) == set(keys[5:])
    assert set(first.rows.row_keys) == set(keys)
    assert retry.rows_limit == 5
