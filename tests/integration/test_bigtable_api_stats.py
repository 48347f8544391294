"""Request stats (``request_stats_view``) and ``last_scanned_row_key`` through the front door:
a filtered scan that drops long runs of rows tells the client how far it got, the official
data client resumes a cut stream from there, and ``REQUEST_STATS_FULL`` answers the rows and
cells seen and returned."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.bigtable")

import grpc
from google.cloud.bigtable import Client
from google.cloud.bigtable.data import BigtableDataClient, ReadRowsQuery, RowMutationEntry, SetCell
from google.cloud.bigtable.data import row_filters as rf
from google.cloud.bigtable_v2 import BigtableClient
from google.cloud.bigtable_v2.services.bigtable.transports import BigtableGrpcTransport

from tabletstore.bigtable_api.front_door import BackgroundServer
from tabletstore.bigtable_api.translate import ReadRowsResponsePB
from tabletstore.engine.scan_stats import REPORT_DROPPED_ROWS

PROJECT, INSTANCE = "stats-project", "stats-instance"
READ_ROWS = "/google.bigtable.v2.Bigtable/ReadRows"
ROWS = 2 * REPORT_DROPPED_ROWS + 500
KEEP = rb"k0(0003|2400)"  # two rows pass the filter, far apart

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def key(i: int) -> bytes:
    return b"k%05d" % i


class Recorder(grpc.aio.ServerInterceptor):
    """Records ReadRows requests and responses; cuts the first stream (UNAVAILABLE) right
    after its first ``last_scanned_row_key`` response when ``cut`` is set."""

    def __init__(self) -> None:
        self.cut = False
        self.requests: list[Any] = []
        self.responses: list[list[Any]] = []

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if details.method != READ_ROWS or handler is None:
            return handler
        inner = handler.unary_stream

        async def record(request: Any, context: Any) -> AsyncIterator[Any]:
            self.requests.append(request)
            sent: list[Any] = []
            self.responses.append(sent)
            async for resp in inner(request, context):
                yield resp
                if type(resp) is bytes:  # packed rows go out already serialized
                    resp = ReadRowsResponsePB.FromString(resp)
                sent.append(resp)
                if self.cut and resp.last_scanned_row_key:
                    self.cut = False
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "injected: stream cut")

        return grpc.unary_stream_rpc_method_handler(
            record,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def server(recorder: Recorder) -> Iterator[BackgroundServer]:
    with (
        BackgroundServer(f"memory://stats-{uuid.uuid4().hex}", interceptors=[recorder]) as srv,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setenv("BIGTABLE_EMULATOR_HOST", srv.address)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            admin = Client(project=PROJECT, admin=True)
            admin.instance(INSTANCE).table("t").create(
                column_families={"cf": None}, initial_split_keys=[key(1500)]
            )
            admin.close()
            with BigtableDataClient(project=PROJECT) as client:
                client.get_table(INSTANCE, "t").bulk_mutate_rows(
                    [
                        RowMutationEntry(
                            key(i),
                            [SetCell("cf", b"a", b"x", 1000), SetCell("cf", b"b", b"y", 1000)],
                        )
                        for i in range(ROWS)
                    ]
                )
        yield srv


@pytest.fixture
def table(server: BackgroundServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", server.address)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with BigtableDataClient(project=PROJECT) as client:
            yield client.get_table(INSTANCE, "t")


def test_a_filtered_scan_reports_the_last_scanned_row_key(table: Any, recorder: Recorder) -> None:
    recorder.requests.clear()
    recorder.responses.clear()
    rows = table.read_rows(ReadRowsQuery(row_filter=rf.RowKeyRegexFilter(KEEP)))
    assert [r.row_key for r in rows] == [key(3), key(2400)]
    scanned = [
        bytes(r.last_scanned_row_key) for r in recorder.responses[0] if r.last_scanned_row_key
    ]
    assert scanned == sorted(scanned) and len(scanned) >= 2
    assert any(key(3) < k < key(2400) for k in scanned)
    # An unfiltered scan sends none: every scanned row is returned.
    recorder.responses.clear()
    assert len(table.read_rows(ReadRowsQuery(limit=10))) == 10
    assert not any(r.last_scanned_row_key for r in recorder.responses[0])


def test_the_client_resumes_after_the_last_scanned_row_key(table: Any, recorder: Recorder) -> None:
    recorder.requests.clear()
    recorder.responses.clear()
    recorder.cut = True
    rows = table.read_rows(
        ReadRowsQuery(row_filter=rf.RowKeyRegexFilter(KEEP)), operation_timeout=120
    )
    assert [r.row_key for r in rows] == [key(3), key(2400)]
    assert len(recorder.requests) == 2
    last_scanned = bytes(recorder.responses[0][-1].last_scanned_row_key)
    assert last_scanned > key(3)
    retry = recorder.requests[1]
    assert bytes(retry.rows.row_ranges[0].start_key_open) == last_scanned


def test_request_stats_full(server: BackgroundServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        client = BigtableClient(transport=BigtableGrpcTransport(channel=channel))
        name = f"projects/{PROJECT}/instances/{INSTANCE}/tables/t"
        responses = list(
            client.read_rows(
                request={
                    "table_name": name,
                    "filter": {"row_key_regex_filter": KEEP},
                    "request_stats_view": "REQUEST_STATS_FULL",
                }
            )
        )
        stats = responses[-1].request_stats.full_read_stats_view
        it = stats.read_iteration_stats
        assert (it.rows_seen_count, it.cells_seen_count) == (ROWS, 2 * ROWS)
        assert (it.rows_returned_count, it.cells_returned_count) == (2, 4)
        assert stats.request_latency_stats.frontend_server_latency.total_seconds() > 0
        # Without a filter, with a limit, and reversed: what was returned was seen.
        for extra in ({"rows_limit": 7}, {"rows_limit": 7, "reversed": True}):
            responses = list(
                client.read_rows(request={"table_name": name, "request_stats_view": 2, **extra})
            )
            it = responses[-1].request_stats.full_read_stats_view.read_iteration_stats
            assert (it.rows_returned_count, it.cells_returned_count) == (7, 14)
            assert it.rows_seen_count >= 7 and it.cells_seen_count >= 14
        # No stats unless asked.
        responses = list(client.read_rows(request={"table_name": name, "rows_limit": 2}))
        assert not any("request_stats" in r for r in responses)
