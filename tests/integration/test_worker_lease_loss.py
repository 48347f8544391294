"""A worker process whose lease ends while it runs exits (§5.2): it must not stay up
answering NotServing for ever. The master's failure detector revokes a lease it believes dead,
and a worker paused past its TTL finds its lease gone when it resumes; either way the process
raises ``Fenced`` so its supervisor starts a fresh one under a new lease and incarnation.

And the converse: a worker's start-up work that holds its event loop (the process warm-up)
runs before the lease is taken, so a stall at start costs no lease."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from tabletstore.coordination import open_coordinator
from tabletstore.errors import Fenced
from tabletstore.options import LeaseOptions, WorkerOptions
from tabletstore.worker.tablet_server import TabletServer
from tabletstore.worker.worker_process import run_worker


async def test_a_worker_whose_lease_is_revoked_exits(tmp_path: Path) -> None:
    coordinator = open_coordinator(f"memory://lease-loss-{uuid.uuid4().hex[:8]}")
    (tmp_path / "objects").mkdir()
    servers: list[TabletServer] = []
    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(
            coordinator,
            options=WorkerOptions(lease=LeaseOptions(ttl=3.0), compaction_processes=0),
            store_url=f"file://{tmp_path / 'objects'}",
            stop=stop,
            ready=servers.append,
        )
    )
    try:
        async with asyncio.timeout(60):
            while not servers:
                assert not worker.done(), worker
                await asyncio.sleep(0.05)
            lease = servers[0].lease
            assert lease is not None
            await coordinator.revoke_lease(lease.id)
            with pytest.raises(Fenced, match="lost its lease"):
                await worker
    finally:
        stop.set()
        if not worker.done():
            worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await coordinator.close()


#: A worker process whose start-up work holds its event loop for twice its lease's TTL, as a
#: second of CPU (``warm_up_process``: pyarrow's import of pandas, a full collection) does on a
#: machine at load 20. argv: ``-c`` this, then the CLI's arguments.
_SLOW_START_UP = """
import time
import tabletstore.ops.process_warmup as warmup
real = warmup.warm_up_process
def slow():
    time.sleep(2 * {ttl})
    real()
warmup.warm_up_process = slow
from tabletstore.cli.main import main
main()
"""


async def test_start_up_work_that_holds_the_loop_past_the_ttl_costs_no_lease(
    etcd_url: str, tmp_path: Path
) -> None:
    """The worker command's one-time start-up work (``ops/process_warmup.py``) runs before it
    takes its lease: run after, a stall of the loop longer than the TTL left the keep-alive
    unsent, and a fresh worker lost its lease and exited before serving (on a loaded machine,
    every worker of a new cluster, whose root tablet then stayed unassigned)."""
    ttl = 3.0
    (tmp_path / "objects").mkdir()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _SLOW_START_UP.format(ttl=ttl),
        "--url",
        etcd_url,
        "worker",
        "--store",
        f"file://{tmp_path / 'objects'}",
        "--lease-ttl",
        str(ttl),
        "--metrics-port",
        "0",
        "--compaction-processes",
        "0",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert child.stderr is not None
    said: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not any("listening on" in line for line in said):
                line = (await child.stderr.readline()).decode()
                assert line, f"the worker exited before serving: {''.join(said)}"
                said.append(line)
            urls = [m.group(1) for s in said if (m := re.search(r"metrics on (\S+/metrics)", s))]
            # Serving, under a live lease: it was taken after the stall, and kept alive since.
            try:
                remaining = await asyncio.to_thread(_lease_remaining, urls[0])
            except OSError as exc:  # its status endpoint is gone: the process ended
                said.append((await child.stderr.read()).decode())
                pytest.fail(f"the worker stopped right after starting ({exc}): {''.join(said)}")
            assert remaining > 0, f"lease ended at start-up: {''.join(said)}"
    finally:
        if child.returncode is None:
            child.terminate()
        rest = (await child.stderr.read()).decode()
        await child.wait()
    assert child.returncode == 0, "".join(said) + rest
    assert "lost its lease" not in rest, rest


def _lease_remaining(metrics_url: str) -> float:
    """The worker's ``lease_remaining_seconds`` gauge, from its /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=30) as reply:
        text = reply.read().decode()
    found = re.search(r"^tabletstore_lease_remaining_seconds (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))
