"""A secured cluster in this process on loopback, for the tests that attack one: a master and a
worker with mutual TLS and authorization (certificates from a fresh cluster CA: master, worker,
and the client principals alice and bob), sharing one in-memory coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from tabletstore.client.cluster import ClusterClient
from tabletstore.client.table import AsyncTable
from tabletstore.coordination import open_coordinator
from tabletstore.coordination.base import Coordinator
from tabletstore.data.model import SetCell
from tabletstore.data.schema import Acl, ColumnFamily
from tabletstore.errors import TabletStoreError
from tabletstore.master.master_process import run_master
from tabletstore.options import LeaseOptions, MasterOptions, WorkerOptions
from tabletstore.security import TlsConfig, ca
from tabletstore.worker.worker_process import run_worker

__all__ = [
    "DEADLINE",
    "SECRET",
    "STATUS_TOKEN",
    "SecureCluster",
    "alices_vault",
    "secure_cluster",
    "true_when",
    "wait_for",
]

DEADLINE = 60.0
STATUS_TOKEN = "scraper-secret"
#: The row key at which alice's vault has a tablet boundary: what nobody else may learn.
SECRET = b"patient-0042-hiv-positive"


@dataclass
class SecureCluster:
    url: str
    coordinator: Coordinator
    certs: Path
    worker_address: str
    status_url: str
    #: The master's status endpoint (its cluster page).
    master_status_url: str

    def tls(self, name: str) -> TlsConfig:
        return TlsConfig(
            str(self.certs / "ca.pem"),
            str(self.certs / f"{name}.pem"),
            str(self.certs / f"{name}.key"),
        )

    def ca_only(self) -> TlsConfig:
        return TlsConfig(str(self.certs / "ca.pem"))

    async def client(self, name: str) -> ClusterClient:
        return await ClusterClient.open(self.url, tls=self.tls(name))


async def wait_for(predicate, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while not await predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def secure_cluster(tmp_path: Path) -> AsyncIterator[SecureCluster]:
    """A master and a worker with mutual TLS, serving until the block ends."""
    certs = tmp_path / "certs"
    ca.init_ca(certs)
    for name, role in [
        ("master", "master"),
        ("worker", "worker"),
        ("alice", "client"),
        ("bob", "client"),
    ]:
        ca.issue(certs, name, role=role)
    url = f"memory://security-{uuid.uuid4().hex[:8]}"
    coordinator = open_coordinator(url)
    store = f"file://{tmp_path / 'objects'}"
    (tmp_path / "objects").mkdir()

    def tls(name: str) -> TlsConfig:
        return TlsConfig(
            str(certs / "ca.pem"), str(certs / f"{name}.pem"), str(certs / f"{name}.key")
        )

    stop = asyncio.Event()
    addresses: list[str] = []
    status_urls: list[str] = []
    master_urls: list[str] = []
    lease = LeaseOptions(ttl=5.0)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(
            run_master(
                coordinator,
                MasterOptions(lease=lease, interval=0.2),
                store_url=store,
                stop=stop,
                tls=tls("master"),
                metrics_port=0,
                metrics_ready=master_urls.append,
                status_token=STATUS_TOKEN,
            )
        )
        await wait_for(lambda: _settings_saved(coordinator), "the master to record the store")
        tg.create_task(
            run_worker(
                coordinator,
                options=WorkerOptions(lease=lease, compaction_processes=0),
                stop=stop,
                ready=lambda s: addresses.append(s.address),
                tls=tls("worker"),
                metrics_port=0,
                metrics_ready=status_urls.append,
                status_token=STATUS_TOKEN,
            )
        )
        try:
            await wait_for(true_when(lambda: bool(addresses)), "the worker to serve")
            yield SecureCluster(
                url, coordinator, certs, addresses[0], status_urls[0], master_urls[0]
            )
        finally:
            stop.set()
    await coordinator.close()


async def alices_vault(alice: ClusterClient) -> AsyncTable:
    """alice's table ``vault``: one family only she may read and write, a tablet boundary at
    :data:`SECRET`, served and written on both sides of it."""
    table = await alice.create_table(
        "vault",
        [ColumnFamily(name="p", acl=Acl(readers=["alice"], writers=["alice"]))],
        split_keys=[SECRET],
    )

    async def writable() -> bool:
        try:
            await table.mutate_row(SECRET + b"/x", [SetCell("p", b"q", b"v")])
            await table.mutate_row(b"a", [SetCell("p", b"q", b"v")])
        except TabletStoreError:
            return False
        return True

    await wait_for(writable, "alice's table to be served")
    return table


def true_when(fn):
    async def check() -> bool:
        return fn()

    return check


async def _settings_saved(coordinator: Coordinator) -> bool:
    from tabletstore.metadata.catalog import ClusterSettings

    try:
        await ClusterSettings.load(coordinator)
    except TabletStoreError:
        return False
    return True
