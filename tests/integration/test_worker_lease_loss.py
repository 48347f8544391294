"""A worker process whose lease ends while it runs exits (§5.2): it must not stay up
answering NotServing for ever. The master's failure detector revokes a lease it believes dead,
and a worker paused past its TTL finds its lease gone when it resumes; either way the process
raises ``Fenced`` so its supervisor starts a fresh one under a new lease and incarnation."""

from __future__ import annotations

import asyncio
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
