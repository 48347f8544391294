"""The status pages' pieces: history and rates (ops/history.py), the views (ops/views.py), the
HTML (ops/status_pages.py) and the page's routes (ops/status_http.py), on an embedded database."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from importlib import resources
from typing import Any

import aiohttp
import pytest

from tabletstore.client.change_plan import ChangePartition
from tabletstore.client.replication_plan import starting
from tabletstore.client.replicator import read_progress
from tabletstore.coordination import paths
from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument, Unavailable
from tabletstore.ops.history import (
    History,
    Sample,
    Sampler,
    point_between,
    quantile,
    request_totals,
)
from tabletstore.ops.metrics import LATENCY_BUCKETS, MasterMetrics, WorkerMetrics
from tabletstore.ops.status_api import (
    Charts,
    ClusterView,
    RequestTotals,
    WorkerStatus,
    WorkerView,
)
from tabletstore.ops.status_http import StatusServer, serve_master, serve_worker
from tabletstore.ops.status_pages import render_master, static_file
from tabletstore.ops.views import cluster_view, page_urls, publish_page, worker_status

pytestmark = pytest.mark.timeout(60)


def totals(
    requests: int, *, errors: int = 0, s3: int = 0, fast: int | None = None
) -> RequestTotals:
    """``requests`` of which ``fast`` took at most 1 ms and the rest 10..25 ms."""
    fast = requests if fast is None else fast
    buckets = [fast if b <= 0.001 else (fast if b < 0.025 else requests) for b in LATENCY_BUCKETS]
    return RequestTotals(
        requests=requests,
        errors=errors,
        latency_sum_seconds=fast * 0.001 + (requests - fast) * 0.02,
        latency_buckets=[*buckets, requests],
        s3_requests=s3,
        s3_errors=0,
    )


# ---------------------------------------------------------------------------- history


def test_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    bounds = [1.0, 2.0, 4.0]
    assert quantile(0.5, bounds, [0, 10, 10, 10]) == pytest.approx(1.5)
    assert quantile(0.99, bounds, [100, 100, 100, 100]) == pytest.approx(0.99)
    assert quantile(0.99, bounds, [0, 0, 0, 5]) == 4.0  # in +Inf: the largest bound
    assert quantile(0.99, bounds, [0, 0, 0, 0]) is None
    with pytest.raises(InvalidArgument, match=r"\[0, 1\]"):
        quantile(1.5, bounds, [0, 0, 0, 0])
    with pytest.raises(InvalidArgument, match="3 bounds need 4 counts"):
        quantile(0.5, bounds, [0, 0])


def test_a_point_is_the_rates_between_two_samples() -> None:
    a = Sample(100.0, totals(1000, s3=50), {"t/a": 10})
    b = Sample(102.0, totals(1200, errors=4, s3=70, fast=1100), {"t/a": 30})
    p = point_between(a, b)
    assert p is not None
    assert p.requests_per_second == 100 and p.errors_per_second == 2
    assert p.s3_requests_per_second == 10
    # 100 fast (1 ms) and 100 slow (20 ms) requests in the interval.
    assert p.latency_mean_ms == pytest.approx(10.5)
    assert p.latency_p99_ms is not None and 10 < p.latency_p99_ms <= 25
    assert point_between(b, b) is None


def test_a_restarted_process_counts_from_zero() -> None:
    a = Sample(100.0, totals(1000), {})
    b = Sample(110.0, totals(50), {})
    p = point_between(a, b)
    assert p is not None and p.requests_per_second == 5


def test_history_is_bounded_and_gives_tablet_rates() -> None:
    h = History(capacity=3)
    for i in range(10):
        h.add(Sample(float(i), totals(i * 10), {"t/a": i * 4, "t/b": 7}))
    assert len(h) == 3 and len(h.points()) == 2
    assert h.requests_per_second() == 10
    assert h.tablet_rates() == {"t/a": 4.0, "t/b": 0.0}
    # Only the last two samples keep their tablet counts (bounded memory).
    assert [len(s.tablet_requests) for s in h._samples] == [0, 2, 2]
    with pytest.raises(InvalidArgument):
        History(capacity=1)


async def test_sampler_keeps_a_history_per_worker_and_forgets_those_gone() -> None:
    now = [0.0]
    readings: list[dict[str, Any]] = []

    def status(worker: str, n: int) -> WorkerStatus:
        return WorkerStatus(
            id=worker,
            address="a",
            metrics_url=None,
            lease_remaining_seconds=1.0,
            tablets=[],
            memtable_bytes=0,
            sstable_bytes=0,
            totals=totals(n),
        )

    async def read() -> Any:
        return readings.pop(0)

    sampler = Sampler(read, interval=1.0, capacity=5, clock=lambda: now[0])
    readings += [
        {"w1": ("http://w1", status("w1", 0)), "w2": (None, "no answer within 2 s")},
        {"w1": ("http://w1", status("w1", 20)), "w2": (None, "no answer within 2 s")},
        {"w2": ("http://w2", status("w2", 5))},
    ]
    for _ in range(2):
        await sampler.sample_once()
        now[0] += 2.0
    charts = sampler.charts()
    [series] = charts.series
    assert series.process == "w1" and series.page_url == "http://w1"
    assert [p.requests_per_second for p in series.points] == [10.0]
    assert sampler.latest["w2"][1] == "no answer within 2 s"
    await sampler.sample_once()
    assert set(sampler.histories) == {"w2"} and set(sampler.latest) == {"w2"}
    Charts.model_validate_json(sampler.charts().model_dump_json())
    with pytest.raises(InvalidArgument):
        Sampler(read, interval=0)


def test_request_totals_read_a_registry() -> None:
    metrics = WorkerMetrics("w")
    metrics.rpc_requests.labels(method="read_row", outcome="ok").inc(3)
    metrics.rpc_requests.labels(method="read_row", outcome="NotServing").inc(2)
    metrics.rpc_requests.labels(method="read_row", outcome="cancelled").inc(1)
    metrics.rpc_latency.labels(method="read_row").observe(0.003)
    t = request_totals(metrics.registry)
    assert (t.requests, t.errors) == (6, 2)
    assert t.latency_buckets[-1] == 1 and t.latency_sum_seconds == pytest.approx(0.003)
    assert len(t.latency_buckets) == len(LATENCY_BUCKETS) + 1


# ---------------------------------------------------------------------------- views and pages


async def test_the_cluster_view_and_page_of_an_embedded_database() -> None:
    db = await Database.open("memory://test-status-page")
    try:
        await db.create_table("web", ["f"], split_keys=[b"<i>m"])  # row keys are user data
        await db.table("web").mutate_row(b"k", [SetCell("f", b"q", b"v")])
        lease = await db.coordinator.grant_lease(30)
        await publish_page(db.coordinator, "worker", "embedded", "http://127.0.0.1:9", lease)
        await db.coordinator.election(paths.MASTER_ELECTION).campaign(b"inproc://master", lease)
        metrics = MasterMetrics("inproc://master")
        metrics.watch_leading(lambda: True)
        metrics.gc_round(deleted_objects=3, deleted_bytes=300, listed_objects=9)
        # A replica table's progress as its replicator saves it, read as the sampler does.
        progress = starting("etcd://src/ns", "web", [ChangePartition(b"", None)], 100.0)
        stalled = replace(progress, error="source unreachable: boom")
        await db.coordinator.put(paths.replication("web"), stalled.to_bytes())
        metrics.replication = await read_progress(db.coordinator)
        status = await worker_status(db.worker, db.metrics)

        async def read() -> Any:
            return {"embedded": ("http://127.0.0.1:9", status)}

        sampler = Sampler(read)
        await sampler.sample_once()
        view = await cluster_view(
            db.master, db.coordinator, metrics, sampler, address="inproc://master"
        )
    finally:
        await db.close()
    assert [m.address for m in view.masters] == ["inproc://master"] and view.masters[0].this_page
    [worker] = view.workers
    assert worker.page_url == "http://127.0.0.1:9" and worker.error is None
    [table] = view.tables
    assert [(t.start_row, t.end_row) for t in table.tablets] == [("", "<i>m"), ("<i>m", None)]
    assert all(t.worker == "embedded" for t in table.tablets)
    assert view.events[0].at >= view.events[-1].at  # newest first
    assert any(e.kind == "gc_round" and "of 9 listed" in e.detail for e in view.events)
    loads = [e for e in view.events if e.kind == "loaded"]
    assert loads and all("s after its assignment)" in e.detail for e in loads)
    ClusterView.model_validate_json(view.model_dump_json())

    [replica] = view.replication
    assert (replica.table, replica.state, replica.error) == (
        "web",
        "following",
        "source unreachable: boom",
    )
    assert replica.lag_seconds > 0

    html = render_master(view, sampler.charts())
    assert "[(first row), &lt;i&gt;m)" in html and "<i>" not in html
    assert "Replication" in html and "source unreachable: boom" in html
    assert 'href="http://127.0.0.1:9/"' in html and "deleted 3 objects" in html


def test_the_static_files_are_package_data() -> None:
    web = resources.files("tabletstore.ops").joinpath("web")
    for name in ("base.html", "master.html", "worker.html", "charts.html"):
        assert web.joinpath(name).is_file(), name
    js = static_file("status.js")
    assert js is not None and b"/api/charts" in js
    assert static_file("../status_pages.py") is None and static_file("nope.js") is None


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str, bytes]:
    async with session.get(url) as response:
        return response.status, response.headers["Content-Type"], await response.read()


async def test_a_worker_serves_its_page_and_the_json_behind_it() -> None:
    db = await Database.open("memory://test-worker-page")
    try:
        await db.create_table("t", ["f"])
        await db.table("t").mutate_row(b"k", [SetCell("f", b"q", b"v")])
        lease = await db.coordinator.grant_lease(30)
        await publish_page(db.coordinator, "master", "m:1", "http://127.0.0.1:8", lease)
        http = await serve_worker(
            db.worker, db.metrics, host="127.0.0.1", port=0, coordinator=db.coordinator,
            interval=0.05,
        )  # fmt: skip
        try:
            async with aiohttp.ClientSession() as session:
                code, kind, body = await get(session, f"{http.url}/")
                assert code == 200 and kind.startswith("text/html")
                assert b"worker embedded" in body and b'href="http://127.0.0.1:8/"' in body
                code, kind, body = await get(session, f"{http.url}/api/worker")
                view = WorkerView.model_validate_json(body)
                assert any(t.table_id != "!metadata" for t in view.status.tablets)
                assert view.master_pages == {"m:1": "http://127.0.0.1:8"}

                async def two_points() -> Charts | None:
                    _, _, body = await get(session, f"{http.url}/api/charts")
                    charts = Charts.model_validate_json(body)
                    return charts if charts.series and charts.series[0].points else None

                for _ in range(200):
                    if await two_points():
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("no chart point within 10 s")
                code, kind, body = await get(session, f"{http.url}/static/status.css")
                assert code == 200 and kind.startswith("text/css")
                assert (await get(session, f"{http.url}/static/x.js"))[0] == 404
                assert (await get(session, f"{http.url}/api/nope"))[0] == 404
        finally:
            await http.close()
    finally:
        await db.close()


async def test_the_master_page_answers_503_when_the_cluster_cannot_be_read() -> None:
    class Down:
        @property
        def catalog(self) -> Any:
            raise Unavailable("etcd at 127.0.0.1:1 is unreachable")

        async def live_workers(self) -> dict[str, str]:
            raise Unavailable("etcd at 127.0.0.1:1 is unreachable")

    db = await Database.open("memory://test-master-down")
    try:
        http = await serve_master(
            Down(), MasterMetrics("m"), address="m", host="127.0.0.1", port=0,
            coordinator=db.coordinator, interval=60,
        )  # fmt: skip
        try:
            async with aiohttp.ClientSession() as session:
                code, _, body = await get(session, f"{http.url}/")
                assert code == 503 and b"unreachable" in body
                code, _, body = await get(session, f"{http.url}/api/cluster")
                assert code == 503 and "unreachable" in json.loads(body)["error"]
        finally:
            await http.close()
    finally:
        await db.close()


async def test_page_urls_are_read_back_by_role() -> None:
    db = await Database.open("memory://test-page-urls")
    try:
        lease = await db.coordinator.grant_lease(30)
        await publish_page(db.coordinator, "worker", "w1", "http://h:1", lease)
        await publish_page(db.coordinator, "master", "h:2", "http://h:3", lease)
        assert await page_urls(db.coordinator, "worker") == {"w1": "http://h:1"}
        assert await page_urls(db.coordinator, "master") == {"h:2": "http://h:3"}
        with pytest.raises(InvalidArgument, match="http"):
            await publish_page(db.coordinator, "worker", "w1", "ftp://h", lease)
        await lease.revoke()
        assert await page_urls(db.coordinator, "worker") == {}
    finally:
        await db.close()


def test_status_server_is_importable_from_its_old_home() -> None:
    from tabletstore.ops import status_http

    for name in ("MasterStatus", "WorkerStatus", "parse_status", "master_status", "worker_status"):
        assert hasattr(status_http, name)
    assert StatusServer is status_http.StatusServer
