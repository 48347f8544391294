"""A worker told to stop (SIGTERM) while its etcd and object store are unreachable, as a real
process against a real cluster: its drain (flushing its tablets, releasing their claims) cannot
finish, so it gives up at ``--drain-deadline``, logs the tablets it did not flush and exits
non-zero, instead of hanging until SIGKILL; and nothing acknowledged is lost (a new worker
recovers those tablets from the abandoned worker's commit log).

The worker reaches etcd and S3 through a partitioning proxy
(:mod:`tabletstore.testing.chaos.netproxy`, run here on a thread of its own) that the test
cuts: requests go unanswered, as on a lost network. The master and the test's client reach
both directly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from tabletstore import connect_async
from tabletstore.cli import localstack
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.testing.chaos.netproxy import NetProxy
from tabletstore.testing.processes import gone
from tests.integration.cluster_harness import (
    PROCESS_ENV,
    START_DEADLINE,
    Cluster,
    eventually,
    placement,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LEASE = 10.0
#: The worker's drain deadline, and how much later than it the process must be gone: an
#: interpreter's exit (the event loop's teardown, the compaction process pool) on a loaded
#: 2-core machine.
DRAIN = 5.0
MARGIN = 25.0
ROWS = [b"row%03d" % i for i in range(40)]


def _wait_gone(pid: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not gone(pid) and time.monotonic() < end:
        time.sleep(0.1)


class ProxyThread:
    """A :class:`NetProxy` on an event loop of its own thread: the test's blocking calls (a
    worker process starting) must not stop it forwarding that worker's bytes."""

    def __init__(self) -> None:
        self.proxy = NetProxy()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def open(self, name: str, upstream: str) -> int:
        future = asyncio.run_coroutine_threadsafe(self.proxy.open(name, upstream), self.loop)
        return future.result(timeout=30).port

    def cut(self, name: str) -> None:
        done: Future[None] = Future()

        def cut_it() -> None:
            self.proxy.set_cut(name, True)
            done.set_result(None)

        self.loop.call_soon_threadsafe(cut_it)
        done.result(timeout=30)

    def close(self) -> None:
        async def shut() -> None:
            for link in self.proxy.links.values():
                if link.server is not None:
                    link.server.close()
                for conn in list(link.conns):
                    conn.close()

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@pytest.fixture
def proxy() -> Iterator[ProxyThread]:
    made = ProxyThread()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def cluster(etcd_server: str, s3_server: str, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster.on(etcd_server, s3_server, tmp_path, "drain", lease_ttl=LEASE)
    try:
        made.start_master()
        yield made
    finally:
        made.close()
        assert not made.alive(), f"left running: {made.alive()}"


async def test_a_worker_cut_off_from_etcd_and_s3_stops_within_its_drain_deadline(
    cluster: Cluster, proxy: ProxyThread, etcd_server: str, s3_server: str
) -> None:
    etcd_port = proxy.open("etcd", etcd_server)
    s3_host_port = s3_server.removeprefix("http://")
    s3_port = proxy.open("s3", s3_host_port)
    namespace = cluster.url.rsplit("/", 1)[1]
    bucket = cluster.store_url.removeprefix("s3://").split("/", 1)[0]
    worker = await asyncio.to_thread(
        localstack.start_worker,
        cluster.directory,
        f"etcd://127.0.0.1:{etcd_port}/{namespace}",
        0,
        env=PROCESS_ENV,
        extra_args=(
            "--lease-ttl", str(LEASE),
            "--drain-deadline", str(DRAIN),
            "--store",
            f"s3://{bucket}/data?endpoint_url=http://127.0.0.1:{s3_port}&region=us-east-1",
        ),
        deadline=START_DEADLINE,
    )  # fmt: skip
    cluster.records.append(worker)
    client = await connect_async(cluster.url)
    try:
        table = await eventually(
            lambda: client.create_table("t", ["cf"], split_keys=[b"row020"]),
            deadline=120,
            what="the table created",
        )

        async def served() -> bool:
            return sum(len(t) for t in placement(await client.status()).values()) >= 2

        await eventually(served, deadline=120, what="the worker serving the table")
        # Acknowledged, in the memtables and the commit log only: the drain would flush them.
        await table.mutate_rows([RowMutation(k, [SetCell("cf", b"q", k, 1000)]) for k in ROWS])

        proxy.cut("etcd")
        proxy.cut("s3")
        os.kill(worker.pid, signal.SIGTERM)  # the process this test started
        started = time.monotonic()
        await asyncio.to_thread(_wait_gone, worker.pid, DRAIN + MARGIN)
        took = time.monotonic() - started
        log = await asyncio.to_thread(Path(worker.log).read_text, errors="replace")
        assert gone(worker.pid), f"still draining {took:.0f} s after SIGTERM:\n{log[-3000:]}"
        status = await asyncio.to_thread(os.waitpid, worker.pid, 0)
        assert os.waitstatus_to_exitcode(status[1]) != 0, log[-3000:]
        assert "did not drain within" in log and "abandoning" in log, log[-3000:]

        # Nothing acknowledged is lost: a new worker recovers the abandoned tablets from the
        # stopped worker's log once its lease is gone.
        await asyncio.to_thread(cluster.start_worker)

        async def all_rows() -> bool:
            rows = [row async for row in client.table("t").read_rows()]
            assert [row.key for row in rows] == ROWS
            return True

        await eventually(all_rows, deadline=180, what="every row recovered")
    finally:
        await client.close()
