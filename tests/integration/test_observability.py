"""``--metrics-port``: a real master and worker process serve /metrics and /status over HTTP.

A master and a worker (``python -m tabletstore.cli.main``) run against the session's etcd and a
bucket on moto's S3 server; after some traffic through a cluster client the test scrapes both
processes and checks that the counters moved (requests by method, S3 PUTs, commit-log appends,
compactions) and that each /status body validates as its pydantic model. The processes are
stopped by pid.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.cluster import ClusterClient
from tabletstore.data.model import SetCell
from tabletstore.ops.status_http import MasterStatus, WorkerStatus, parse_status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: moto accepts any credentials; the processes must never look for real ones.
ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "PYTHONUNBUFFERED": "1",
}
ROWS = 30
T = TypeVar("T")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        body: bytes = response.read()
        return body


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = get(f"{url}/metrics").decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    want = set(labels.items())
    matches = [v for (n, ls), v in found.items() if n == name and want <= ls]
    assert matches, f"{name}{labels} is not exported"
    return sum(matches)


def eventually(check: Callable[[], T | None], *, deadline: float = 20.0) -> T:
    """``check()``'s first truthy result, polling until ``deadline`` seconds have passed."""
    end = time.monotonic() + deadline
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {deadline}s")
        time.sleep(0.1)


def metrics_url(record: ProcessRecord) -> str | None:
    """The URL the process printed at startup (``metrics on http://H:P/metrics, ...``)."""
    for line in Path(record.log).read_text().splitlines():
        if line.startswith("metrics on "):
            return line.split()[2].removesuffix("/metrics,")
    return None


@pytest.fixture
def processes() -> Iterator[list[ProcessRecord]]:
    started: list[ProcessRecord] = []
    yield started
    for record in reversed(started):  # by pid, and only while it still runs our command
        localstack.stop(record)


async def test_master_and_worker_serve_metrics_and_status(
    etcd_url: str, s3_url: str, tmp_path: Path, processes: list[ProcessRecord]
) -> None:
    args = ("--lease-ttl", "3", "--metrics-port", "0")
    master = await asyncio.to_thread(
        localstack.start_master, tmp_path, etcd_url, s3_url, env=ENV, extra_args=args
    )
    processes.append(master)
    worker = await asyncio.to_thread(
        localstack.start_worker, tmp_path, etcd_url, 0, env=ENV, extra_args=args
    )
    processes.append(worker)
    master_url = eventually(lambda: metrics_url(master))
    worker_url = eventually(lambda: metrics_url(worker))

    client = await ClusterClient.open(etcd_url)
    try:
        table = await client.create_table("obs", ["f"])
        for i in range(ROWS):
            await table.mutate_row(b"row%03d" % i, [SetCell("f", b"q", b"value %d" % i)])
        assert len([r async for r in table.read_rows()]) == ROWS
        await client.flush("obs")
    finally:
        await client.close()

    w = await asyncio.to_thread(samples, worker_url)
    requests = "tabletstore_rpc_requests_total"
    # Single-row writes leave as mutate_tablets (coalesced per worker; one each here, awaited
    # one after another).
    assert value(w, requests, method="mutate_tablets", outcome="ok") >= ROWS
    assert value(w, requests, method="read_rows", outcome="ok") >= 1
    # The master loads through load_tablet_at (one METADATA row) and load_tablet only to an
    # older worker: either counts as the load.
    loads = value(w, requests, method="load_tablet_at", outcome="ok")
    assert loads + value(w, requests, method="load_tablet", outcome="ok") >= 1
    assert value(w, "tabletstore_rpc_latency_seconds_count", method="mutate_tablets") >= ROWS
    assert value(w, "tabletstore_object_store_requests_total", op="PUT") >= 2  # log + SSTable
    assert value(w, "tabletstore_object_store_bytes_total", op="PUT") > 0
    assert value(w, "tabletstore_commit_log_appends_total") >= ROWS
    assert value(w, "tabletstore_compactions_total", kind="minor") >= 1
    assert value(w, "tabletstore_tablets_served") >= 1
    assert value(w, "tabletstore_lease_remaining_seconds") > 0

    ws = parse_status(await asyncio.to_thread(get, f"{worker_url}/status"))
    assert isinstance(ws, WorkerStatus)
    assert ws.metrics_url == worker_url and ws.address == worker.url
    mine = [t for t in ws.tablets if t.requests >= ROWS]
    assert mine and mine[0].sstables >= 1 and mine[0].sstable_bytes > 0

    m = await asyncio.to_thread(samples, master_url)
    assert value(m, "tabletstore_master_leading") == 1
    assert value(m, requests, method="create_table", outcome="ok") == 1
    assert value(m, requests, method="compact_table", outcome="ok") == 1
    assert value(m, "tabletstore_master_assignment_rounds_total", outcome="ok") >= 1
    assert value(m, "tabletstore_master_tablets_assigned_total") >= 1

    ms = parse_status(await asyncio.to_thread(get, f"{master_url}/status"))
    assert isinstance(ms, MasterStatus)
    assert ms.leading and ms.address == master.url
    assert ws.id in ms.live_workers and ms.live_workers[ws.id] == worker.url
    assert ms.last_assignment is not None and ms.last_assignment.error is None
    assert any(e.kind == "minor_compaction" for e in ms.recent_events)
