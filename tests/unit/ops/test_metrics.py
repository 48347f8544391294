"""Prometheus metrics (tabletstore.ops.metrics) and the HTTP endpoint (tabletstore.ops.status_http)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tabletstore.commitlog.spill import SpillStats
from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument, NotFound, NotServing, Unavailable
from tabletstore.metadata.record import TabletEvent
from tabletstore.ops.metrics import (
    CompactionCounter,
    MasterMetrics,
    ProcessMetrics,
    WorkerMetrics,
    WorkerSources,
    compaction_kind,
    outcome_of,
)
from tabletstore.ops.status_http import (
    MasterStatus,
    StatusServer,
    WorkerStatus,
    master_status,
    parse_status,
    worker_status,
)
from tabletstore.rpc.codec import Codec
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.tcp import RpcClient, RpcServer
from tabletstore.rpc.transport import Method

pytestmark = pytest.mark.timeout(60)


def sample(metrics: ProcessMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


# ---------------------------------------------------------------------------- handler wrapper


class Service:
    async def echo(self, request: Any) -> Any:
        return request

    async def fail(self, request: Any) -> Any:
        raise NotServing("not here")

    async def crash(self, request: Any) -> Any:
        raise RuntimeError("bug")

    async def count(self, request: int) -> AsyncIterator[int]:
        for i in range(request):
            if i == 3 and request == 4:
                raise NotFound("item 3 is gone")
            yield i


def wrapped() -> tuple[ProcessMetrics, dict[str, Any]]:
    metrics = ProcessMetrics("worker", "w-test")
    svc = Service()
    names = ("echo", "fail", "crash", "count")
    return metrics, metrics.instrument({n: getattr(svc, n) for n in names})


async def test_unary_handler_counts_outcomes_and_latency() -> None:
    metrics, handlers = wrapped()
    assert inspect.iscoroutinefunction(handlers["echo"])
    assert await handlers["echo"]("hi") == "hi"
    assert await handlers["echo"]("again") == "again"
    with pytest.raises(NotServing):
        await handlers["fail"](None)
    with pytest.raises(RuntimeError):
        await handlers["crash"](None)
    total = "tabletstore_rpc_requests_total"
    assert sample(metrics, total, method="echo", outcome="ok") == 2
    assert sample(metrics, total, method="fail", outcome="NotServing") == 1
    assert sample(metrics, total, method="crash", outcome="internal") == 1
    assert sample(metrics, "tabletstore_rpc_latency_seconds_count", method="echo") == 2
    assert sample(metrics, "tabletstore_rpc_latency_seconds_count", method="fail") == 1


async def test_streaming_handler_stays_a_generator_and_counts_when_it_ends() -> None:
    metrics, handlers = wrapped()
    count = handlers["count"]
    assert inspect.isasyncgenfunction(count)
    assert [i async for i in count(3)] == [0, 1, 2]
    with pytest.raises(NotFound):
        async for _ in count(4):
            pass
    stream = count(100)
    assert await stream.__anext__() == 0
    await stream.aclose()  # the caller stopped reading
    total = "tabletstore_rpc_requests_total"
    assert sample(metrics, total, method="count", outcome="ok") == 1
    assert sample(metrics, total, method="count", outcome="NotFound") == 1
    assert sample(metrics, total, method="count", outcome="cancelled") == 1
    assert sample(metrics, "tabletstore_rpc_latency_seconds_count", method="count") == 3


def test_outcome_labels() -> None:
    assert outcome_of(Unavailable("x")) == "Unavailable"
    assert outcome_of(ExceptionGroup("g", [NotServing("x")])) == "NotServing"
    assert outcome_of(asyncio.CancelledError()) == "cancelled"
    assert outcome_of(ValueError("x")) == "internal"


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    text: str


async def test_wrapped_handlers_serve_over_a_real_rpc_server() -> None:
    """The RPC server accepts the wrappers as unary and streaming handlers."""
    codec = Codec()
    codec.register(1, Ping)
    metrics = ProcessMetrics("worker", "w-rpc")

    async def echo(req: Ping) -> Ping:
        return req

    async def count(req: Ping) -> AsyncIterator[str]:
        for ch in req.text:
            yield ch

    server = RpcServer(metrics.instrument({"echo": echo, "count": count}), codec=codec)
    await server.start()
    try:
        async with RpcClient("127.0.0.1", server.port, codec=codec) as client:
            assert await client.call("echo", Ping("a")) == Ping("a")
            assert [c async for c in client.stream("count", Ping("abc"))] == ["a", "b", "c"]
    finally:
        await server.close(grace=0.5)
    total = "tabletstore_rpc_requests_total"
    assert sample(metrics, total, method="echo", outcome="ok") == 1
    assert sample(metrics, total, method="count", outcome="ok") == 1


def test_registries_are_per_process() -> None:
    a, b = WorkerMetrics("w-a"), WorkerMetrics("w-b")
    a.rpc_requests.labels(method="m", outcome="ok").inc()
    assert sample(a, "tabletstore_rpc_requests_total", method="m", outcome="ok") == 1
    assert sample(b, "tabletstore_rpc_requests_total", method="m", outcome="ok") is None
    assert sample(a, "tabletstore_process_info", role="worker", id="w-a") == 1


def test_the_sort_spill_is_exported_at_scrape_time() -> None:
    stats = SpillStats(memory_bytes=10, disk_bytes=300, kept_in_memory=2, kept_on_disk=3)
    metrics = WorkerMetrics("w-spill")
    metrics.observe(WorkerSources(tablets=dict, sort_spill=lambda: stats))
    runs = "tabletstore_sort_spill_runs_total"
    assert sample(metrics, runs, tier="memory") == 2
    assert sample(metrics, runs, tier="disk") == 3
    assert sample(metrics, runs, tier="not_kept") == 0
    assert sample(metrics, "tabletstore_sort_spill_bytes", tier="disk") == 300
    stats.hits, stats.hit_bytes, stats.bad_copies = 4, 4096, 1  # read when scraped, not copied
    assert sample(metrics, "tabletstore_sort_spill_hits_total") == 4
    assert sample(metrics, "tabletstore_sort_spill_hit_bytes_total") == 4096
    assert sample(metrics, "tabletstore_sort_spill_bad_copies_total") == 1


# ---------------------------------------------------------------------------- compactions


def ev(at: float, kind: str, detail: str = "") -> TabletEvent:
    return TabletEvent(at, kind, detail)


def test_compaction_kind() -> None:
    assert compaction_kind("minor_compaction") == "minor"
    assert compaction_kind("major_compaction") == "major"
    assert compaction_kind("assigned") is None


def test_compaction_counter_counts_only_this_workers_new_events() -> None:
    counter = CompactionCounter("w1")
    key = ("t", "t00000")
    history = [
        ev(1, "created"),
        ev(2, "assigned", "w0"),
        ev(3, "minor_compaction"),  # the previous owner's
        ev(4, "assigned", "w1"),
        ev(5, "minor_compaction"),
    ]
    counter.sweep(key, history)
    assert counter.totals == {"minor": 1}
    counter.sweep(key, history)  # nothing new: nothing counted twice
    assert counter.totals == {"minor": 1}
    history += [ev(6, "merging_compaction"), ev(7, "minor_compaction")]
    counter.sweep(key, history)
    assert counter.totals == {"minor": 2, "merging": 1}


def test_compaction_counter_leaves_a_split_childs_inherited_events_to_its_parent() -> None:
    counter = CompactionCounter("w1")
    parent = [ev(1, "assigned", "w1"), *(ev(i, "minor_compaction") for i in range(2, 12))]
    counter.sweep(("t", "p"), parent)
    assert counter.totals == {"minor": 10}
    # Both children carry the parent's events, then their split: none of those are theirs.
    child = [*parent, ev(12, "split", "from p")]
    counter.forget([])
    counter.sweep(("t", "l"), child)
    counter.sweep(("t", "r"), child)
    assert counter.totals == {"minor": 10}
    counter.sweep(("t", "l"), [*child, ev(13, "major_compaction")])
    assert counter.totals == {"minor": 10, "major": 1}
    # A merged tablet's history starts at its merge too.
    counter.sweep(("t", "m"), [*child, ev(14, "minor_compaction"), ev(15, "merged", "l + r")])
    assert counter.totals == {"minor": 10, "major": 1}


def test_compaction_counter_follows_a_sliding_window_of_events() -> None:
    counter = CompactionCounter("w1")
    key = ("t", "t00000")
    window = [ev(0, "assigned", "w1"), *(ev(i, "minor_compaction") for i in range(1, 4))]
    counter.sweep(key, window)
    assert counter.totals == {"minor": 3}
    # Two more events push the two oldest out of a 4-event window.
    window = [*window[2:], ev(4, "major_compaction"), ev(5, "minor_compaction")]
    counter.sweep(key, window)
    assert counter.totals == {"minor": 4, "major": 1}
    # Identical-looking events (same time, kind) still count as new when appended.
    window = [*window[1:], ev(5, "minor_compaction")]
    counter.sweep(key, window)
    assert counter.totals == {"minor": 5, "major": 1}


def test_compaction_counter_forgets_unloaded_tablets() -> None:
    counter = CompactionCounter("w1")
    counter.sweep(("t", "a"), [ev(1, "assigned", "w1"), ev(2, "minor_compaction")])
    counter.forget([])
    # Reloaded later: counting starts again after the new assigned event.
    counter.sweep(
        ("t", "a"),
        [ev(1, "assigned", "w1"), ev(2, "minor_compaction"), ev(3, "assigned", "w1")],
    )
    assert counter.totals == {"minor": 1}


# ---------------------------------------------------------------------------- master


def test_master_metrics_rounds_leadership_and_gc_hook() -> None:
    now = [100.0]
    metrics = MasterMetrics("127.0.0.1:1", clock=lambda: now[0])
    leading = [False]
    metrics.watch_leading(lambda: leading[0])
    assert sample(metrics, "tabletstore_master_leading") == 0
    leading[0] = True
    assert sample(metrics, "tabletstore_master_leading") == 1
    metrics.assignment_round(3)
    now[0] = 101.0
    metrics.assignment_failed(Unavailable("etcd is down"))
    assert sample(metrics, "tabletstore_master_assignment_rounds_total", outcome="ok") == 1
    assert sample(metrics, "tabletstore_master_assignment_rounds_total", outcome="failed") == 1
    assert metrics.last_round is not None and metrics.last_round.at == 101.0
    assert sample(metrics, "tabletstore_master_last_assignment_timestamp_seconds") == 101.0
    assert metrics.last_round.error is not None
    assert "etcd is down" in metrics.last_round.error
    metrics.gc_round(deleted_objects=4, deleted_bytes=4096)
    assert sample(metrics, "tabletstore_gc_deleted_objects_total") == 4
    assert sample(metrics, "tabletstore_gc_deleted_bytes_total") == 4096
    assert sample(metrics, "tabletstore_gc_rounds_total") == 1
    with pytest.raises(InvalidArgument, match="non-negative"):
        metrics.gc_round(deleted_objects=-1, deleted_bytes=0)
    metrics.process_id = "127.0.0.1:2"
    assert sample(metrics, "tabletstore_process_info", role="master", id="127.0.0.1:2") == 1
    assert sample(metrics, "tabletstore_process_info", role="master", id="127.0.0.1:1") is None


@dataclasses.dataclass
class FakeLease:
    ttl: float = 10.0
    last_renewed: float = 5.0
    expired: bool = False


def test_lease_remaining_reads_the_lease_on_its_clock() -> None:
    metrics = MasterMetrics()
    assert metrics.lease_remaining() is None
    lease = FakeLease()
    metrics.watch_lease(lambda: lease, monotonic=lambda: 8.0)  # type: ignore[arg-type,return-value]
    assert metrics.lease_remaining() == 7.0
    assert sample(metrics, "tabletstore_lease_remaining_seconds") == 7.0
    lease.expired = True
    assert metrics.lease_remaining() == 0.0


# ---------------------------------------------------------------------------- embedded worker


async def test_embedded_database_collectors_move_with_traffic() -> None:
    db = await Database.open("memory://test-metrics-embedded", instrument=True)
    try:
        table = await db.create_table("t", ["f"])
        for i in range(10):
            await table.mutate_row(b"r%02d" % i, [SetCell("f", b"q", b"v%d" % i)])
        await db.flush("t")
        assert len([r async for r in table.read_rows()]) == 10
        text = await db.metrics_text()
    finally:
        await db.close()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def value(name: str, **labels: str) -> float:
        found = [s for s in samples if s.name == name]
        assert found, f"{name} is not exported"
        return sum(s.value for s in found if all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("tabletstore_rpc_requests_total", method="mutate_rows", outcome="ok") >= 10
    assert value("tabletstore_rpc_requests_total", method="read_rows", outcome="ok") >= 1
    assert value("tabletstore_tablets_served") >= 1
    assert value("tabletstore_sstables") >= 1
    assert value("tabletstore_compactions_total", kind="minor") >= 1
    assert value("tabletstore_commit_log_appends_total") >= 10
    assert value("tabletstore_commit_log_segments_total") >= 1
    # Every segment PUT, timed: as many as there were segments, all under +Inf.
    segments = value("tabletstore_commit_log_segments_total")
    assert value("tabletstore_commit_log_put_seconds_count") == segments
    assert value("tabletstore_commit_log_put_seconds_bucket", le="+Inf") == segments
    assert value("tabletstore_commit_log_put_seconds_sum") > 0
    assert value("tabletstore_sort_spill_runs_total", tier="memory") == 0
    assert value("tabletstore_object_store_requests_total", op="PUT") >= 2
    assert value("tabletstore_block_cache_capacity_bytes") > 0
    assert (
        value("tabletstore_block_cache_hits_total") + value("tabletstore_block_cache_misses_total")
        >= 1
    )


# ---------------------------------------------------------------------------- HTTP endpoint


async def http_get(url: str, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        request = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


async def test_status_server_serves_metrics_status_and_errors() -> None:
    db = await Database.open("memory://test-metrics-http")
    try:
        await db.create_table("t", ["f"])
        await db.table("t").mutate_row(b"k", [SetCell("f", b"q", b"v")])

        async def status(url: str) -> WorkerStatus:
            return await worker_status(db.worker, db.metrics, metrics_url=url)

        async with StatusServer(db.metrics, status) as http:
            assert http.url.startswith("http://127.0.0.1:")
            code, headers, body = await http_get(http.url, "/metrics")
            assert code == 200 and headers["Content-Type"].startswith("text/plain")
            assert b"tabletstore_rpc_requests_total" in body

            code, headers, body = await http_get(http.url, "/status?pretty=1")
            assert code == 200 and headers["Content-Type"] == "application/json"
            st = parse_status(body)
            assert isinstance(st, WorkerStatus) and st.id == "embedded"
            assert st.metrics_url == http.url
            assert st.lease_remaining_seconds is not None and st.lease_remaining_seconds > 0
            # The worker also serves METADATA's tablets (table id "!metadata").
            (tablet,) = [t for t in st.tablets if not t.table_id.startswith("!")]
            assert tablet.requests >= 1 and tablet.memtable_bytes > 0

            assert (await http_get(http.url, "/"))[0] == 200
            assert (await http_get(http.url, "/nope"))[0] == 404
            assert (await http_get(http.url, "/metrics", method="POST"))[0] == 405
            code, _, body = await http_get(http.url, "/metrics", method="HEAD")
            assert code == 200 and body == b""
    finally:
        await db.close()


async def test_status_server_answers_503_when_the_status_cannot_be_built() -> None:
    metrics = WorkerMetrics("w-down")

    async def status(url: str) -> WorkerStatus:
        raise Unavailable("etcd at 127.0.0.1:1 is unreachable")

    async with StatusServer(metrics, status) as http:
        code, _, body = await http_get(http.url, "/status")
    assert code == 503
    assert "unreachable" in json.loads(body)["error"]


async def test_status_server_rejects_a_malformed_request_line() -> None:
    async with StatusServer(WorkerMetrics("w"), lambda url: asyncio.sleep(0)) as http:  # type: ignore[arg-type,return-value]
        host, port = http.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"garbage\r\n\r\n")
        raw = await reader.read()
        writer.close()
        await writer.wait_closed()
    assert raw.split(b" ", 2)[1] == b"400"  # aiohttp answers HTTP/1.0 to a request it cannot parse


def test_a_bad_port_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgument, match="65535"):
        StatusServer(WorkerMetrics("w"), lambda url: asyncio.sleep(0), port=70000)  # type: ignore[arg-type,return-value]


async def test_master_status_reads_workers_events_and_the_last_round() -> None:
    db = await Database.open("memory://test-metrics-master")
    try:
        await db.create_table("t", ["f"])
        metrics = MasterMetrics("inproc://master")
        metrics.watch_leading(lambda: True)
        metrics.assignment_round(2)
        st = await master_status(db.master, metrics, address="inproc://master", events=5)
    finally:
        await db.close()
    assert st.leading and st.id == "inproc://master"
    assert st.live_workers == {"embedded": "inproc://embedded"}
    assert st.last_assignment is not None and st.last_assignment.assigned == 2
    assert 1 <= len(st.recent_events) <= 5
    assert any(e.kind == "assigned" for e in st.recent_events)
    again = parse_status(st.model_dump_json())
    assert isinstance(again, MasterStatus) and again == st


def test_parse_status_names_what_is_wrong() -> None:
    with pytest.raises(InvalidArgument, match="not a tabletstore /status document"):
        parse_status(b'{"role": "worker", "id": 3}')
    with pytest.raises(InvalidArgument):
        parse_status(b'{"role": "janitor"}')


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.closed = False

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> Any:
        self.calls.append(method.name)
        if request == "refuse":
            raise Unavailable("worker is gone")
        return "done"

    async def stream(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> AsyncIterator[Any]:
        yield method.name

    async def close(self) -> None:
        self.closed = True


async def test_master_counts_tablets_loaded_through_its_transport() -> None:
    metrics = MasterMetrics("127.0.0.1:1")
    inner = RecordingTransport()
    transport = metrics.count_loads(inner)
    load = TABLET.method(TabletService.load_tablet)
    assert await transport.call("w", load, "t1") == "done"
    assert await transport.call("w", TABLET.method(TabletService.update_schema), "t") == "done"
    with pytest.raises(Unavailable):
        await transport.call("w", load, "refuse")
    read = TABLET.method(TabletService.read_rows)
    assert [x async for x in transport.stream("w", read, None)] == ["read_rows"]
    await transport.close()
    assert inner.closed and inner.calls == ["load_tablet", "update_schema", "load_tablet"]
    assert sample(metrics, "tabletstore_master_tablets_assigned_total") == 1


def test_rpc_latency_histogram_exports_cumulative_buckets() -> None:
    """The in-place counts come out as a Prometheus histogram: bounds inclusive, buckets
    cumulative, +Inf = count, and the sum."""
    m = ProcessMetrics("worker", "w")
    hist = m.rpc_latency.labels(method="read_row")
    for seconds in (0.0003, 0.0005, 0.003, 100.0):
        hist.observe(seconds)
    m.rpc_requests.labels(method="read_row", outcome="ok").inc(3)
    m.rpc_requests.labels(method="read_row", outcome="NotFound").inc()
    name = "tabletstore_rpc_latency_seconds"
    assert sample(m, f"{name}_bucket", method="read_row", le="0.0005") == 2
    assert sample(m, f"{name}_bucket", method="read_row", le="0.001") == 2
    assert sample(m, f"{name}_bucket", method="read_row", le="0.005") == 3
    assert sample(m, f"{name}_bucket", method="read_row", le="30.0") == 3
    assert sample(m, f"{name}_bucket", method="read_row", le="+Inf") == 4
    assert sample(m, f"{name}_count", method="read_row") == 4
    assert sample(m, f"{name}_sum", method="read_row") == pytest.approx(100.0038)
    total = "tabletstore_rpc_requests_total"
    assert sample(m, total, method="read_row", outcome="ok") == 3
    assert sample(m, total, method="read_row", outcome="NotFound") == 1
