"""What the request-cost and access tests of this suite share: real server processes on
loopback (``python -m tabletstore.cli.main``, started by the local stack's helpers against the
session's etcd and moto), stopped by pid, and waiting for a cluster to serve."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.client import AsyncClient
from tabletstore.errors import Unavailable

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "PYTHONUNBUFFERED": "1",
}
#: Seconds a fresh cluster may take to serve METADATA on a loaded machine.
READY_DEADLINE = 150.0


@pytest.fixture
def processes() -> Iterator[list[ProcessRecord]]:
    """Processes a test started; stopped by pid (only while they run our command)."""
    started: list[ProcessRecord] = []
    yield started
    for record in reversed(started):
        localstack.stop(record)


async def start_cluster(
    directory: Path,
    etcd_url: str,
    s3_url: str,
    processes: list[ProcessRecord],
    *,
    lease: float = 3.0,
    metrics: bool = False,
    master_args: tuple[str, ...] = (),
) -> tuple[ProcessRecord, ProcessRecord]:
    """A master and a worker process (lease ``lease`` seconds); (master, worker)."""
    ttl = ("--lease-ttl", str(lease))
    master = await asyncio.to_thread(
        localstack.start_master,
        directory,
        etcd_url,
        s3_url,
        env=ENV,
        extra_args=(*ttl, *master_args),
        metrics=metrics,
    )
    processes.append(master)
    worker = await asyncio.to_thread(
        localstack.start_worker, directory, etcd_url, 0, env=ENV, extra_args=ttl, metrics=metrics
    )
    processes.append(worker)
    return master, worker


async def create_when_ready(client: AsyncClient, name: str, **kw: Any) -> Any:
    """Create table ``name`` with family ``cf`` once the cluster serves METADATA."""
    end = time.monotonic() + READY_DEADLINE
    while True:
        try:
            return await client.create_table(name, ["cf"], **kw)
        except Unavailable:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.5)


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
