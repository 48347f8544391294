"""A rolling upgrade across a protocol change, performed on a real cluster (docs/operations/upgrades.md).

The cluster starts as the previous release: two masters and three workers as processes, each
capped at protocol N−1 (``--max-protocol-version``, the rehearsal flag). Two clients write and
read rows the whole time, one of the previous release (N−1) and one of this one. Then, as
ECS rolls a service (a new task healthy before an old one stops), each worker is replaced by a
process of this release, one by one, then the standby master and the leading master. The
versions the processes speak are checked at each step: an old process answers at N−1, a new
one at N, and a client of the previous release keeps being served at N−1 by the new ones. At
the end every acknowledged row reads back with its value, through a client of this release.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tabletstore import connect_async
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.client import AsyncClient
from tabletstore.client.cluster import CALL_TIMEOUT, ClusterClient
from tabletstore.client.table import AsyncTable
from tabletstore.coordination import open_coordinator
from tabletstore.data.filters import CellsPerColumnLimit
from tabletstore.data.model import SetCell
from tabletstore.errors import TabletStoreError
from tabletstore.rpc.connection import parse_address
from tabletstore.rpc.tcp import RpcClient, TcpTransport
from tabletstore.rpc.versions import PROTOCOL_VERSION, Versions, spoken
from tests.integration.cluster_harness import (
    Cluster,
    WriteHistory,
    eventually,
    placement,
    table_id_of,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

N = PROTOCOL_VERSION
PREVIOUS = spoken(N - 1)
#: How the previous release's processes are started.
OLD = ("--max-protocol-version", str(N - 1))
#: The default lease: a loaded machine must not expire the leases of processes that run on.
LEASE = 5.0
SPLITS = [b"g", b"n", b"u"]  # 4 tablets
LETTERS = "abcdefghijklmnopqrstuvwxyz"
#: Writes each client must have acknowledged after each step, across every tablet.
PROGRESS = 26
#: Seconds a step may take on a loaded 2-core machine (a replacement: a process start, a
#: drain and the tablets' reloads; a master failover: a lease and a round).
STEP = 120.0


@pytest.fixture
def cluster(etcd_server: str, s3_server: str, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster.on(etcd_server, s3_server, tmp_path, "upgrade", lease_ttl=LEASE)
    try:
        made.start_master(extra_args=OLD)
        made.start_master(extra_args=OLD)
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda _: made.start_worker(extra_args=OLD), range(3)))
        yield made
    finally:
        made.close()


async def _version(address: str, versions: Versions | None = None) -> int:
    """The protocol version a connection to ``address`` uses, from a client speaking
    ``versions`` (default this release's)."""
    host, port = parse_address(address)
    async with RpcClient(host, port, versions=versions or spoken(), connect_timeout=30) as client:
        return (await client.connection()).version


@dataclass
class _Writer:
    """One client writing distinct rows over every tablet, and reading back what it wrote."""

    name: str
    table: AsyncTable
    history: WriteHistory
    acked: list[bytes] = field(default_factory=list)
    misreads: list[str] = field(default_factory=list)
    read_errors: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            row = f"{LETTERS[i % len(LETTERS)]}-{self.name}-{i:06d}".encode()
            value = f"{self.name}:{i}".encode()
            self.history.begin(row, value)
            try:
                await self.table.mutate_row(row, [SetCell("f", b"c", value)])
            except TabletStoreError as exc:
                self.history.fail(row, exc)
            else:
                self.history.ack(row)
                self.acked.append(row)
            if i % 4 == 3 and len(self.acked) > 8:
                await self._read_back(self.acked[-8])
            i += 1
            await asyncio.sleep(0.02)  # pacing (not a wait): the servers need the cores

    async def _read_back(self, row: bytes) -> None:
        try:
            got = await self.table.read_row(row, filter=CellsPerColumnLimit(1))
        except TabletStoreError:
            self.read_errors += 1  # a move outlasted the client's retries: not a lost write
            return
        value = got.cells[0].value if got is not None and got.cells else None
        if value != self.history.values[row]:
            self.misreads.append(f"{self.name} read {row!r} as {value!r}")


async def _progress(writers: list[_Writer], what: str) -> None:
    """Every writer acknowledges PROGRESS more writes (one per letter, so every tablet)."""
    marks = [len(w.acked) for w in writers]

    async def moved() -> bool:
        return all(len(w.acked) >= m + PROGRESS for w, m in zip(writers, marks, strict=True))

    await eventually(moved, deadline=STEP, what=f"both clients write after {what}")
    for w in writers:
        assert not w.misreads, w.misreads


async def _served_without(client: AsyncClient, table_id: str, gone: str, tablets: int) -> None:
    """Every tablet served again, none by the process at address ``gone``."""

    async def served() -> bool:
        status = await client.status()
        where = placement(status, table_id)
        at_gone = [
            wid for wid, ws in status.workers.items() if getattr(ws, "address", None) == gone
        ]
        return not at_gone and sum(len(t) for t in where.values()) == tablets

    await eventually(served, deadline=STEP, what=f"every tablet served without {gone}")


@pytest.mark.slow
async def test_rolling_upgrade_from_the_previous_protocol_version(cluster: Cluster) -> None:
    masters = [r for r in cluster.records if r.role.startswith("master")]
    workers = [r for r in cluster.records if r.role.startswith("worker")]
    # The previous release: every process speaks N-1 at most, even to a client of this one.
    for record in cluster.records:
        assert await _version(record.url) == N - 1, record.role

    client = await connect_async(cluster.url)
    old_client = ClusterClient(
        cluster.url,
        open_coordinator(cluster.url),
        TcpTransport(timeout=CALL_TIMEOUT, versions=PREVIOUS),
    )
    stop = asyncio.Event()
    history = WriteHistory()
    try:
        await client.create_table("up", ["f"], split_keys=SPLITS)
        table_id = await table_id_of(client, "up")
        tablets = len(SPLITS) + 1

        async def all_served() -> bool:
            where = placement(await client.status(), table_id)
            return sum(len(t) for t in where.values()) == tablets

        await eventually(all_served, deadline=STEP, what="every tablet served")
        writers = [
            _Writer("old", old_client.table("up"), history),
            _Writer("new", client.table("up"), history),
        ]
        async with asyncio.TaskGroup() as tasks:
            for writer in writers:
                tasks.create_task(writer.run(stop))
            try:
                await _progress(writers, "the cluster started")

                # Workers first, one by one: the new one serves before the old one drains.
                for old in workers:
                    new = await asyncio.to_thread(cluster.start_worker)
                    assert await _version(new.url) == N
                    assert await _version(new.url, PREVIOUS) == N - 1
                    await asyncio.to_thread(cluster.terminate, old)
                    await _served_without(client, table_id, old.url, tablets)
                    await _progress(writers, f"{old.role} was replaced by {new.role}")

                # Then the masters: the standby, then the leader (one failover).
                leader_url = (await client.status()).master
                standby = next(m for m in masters if m.url != leader_url)
                leader = next(m for m in masters if m.url == leader_url)
                new_masters: list[ProcessRecord] = []
                for old in (standby, leader):
                    new = await asyncio.to_thread(cluster.start_master)
                    new_masters.append(new)
                    assert await _version(new.url) == N
                    await asyncio.to_thread(cluster.terminate, old)

                    async def led_by_a_live_master(old: ProcessRecord = old) -> bool:
                        master = (await client.status()).master
                        return master != old.url and master in {m.url for m in cluster.alive()}

                    await eventually(
                        led_by_a_live_master, deadline=STEP, what=f"a master leads after {old.role}"
                    )
                    await _progress(writers, f"{old.role} was replaced by {new.role}")
                assert (await client.status()).master in {m.url for m in new_masters}

                # This release everywhere: N between its processes and its clients, while a
                # client of the previous release is still served at N-1.
                for record in cluster.alive():
                    assert await _version(record.url) == N, record.role
                    assert await _version(record.url, PREVIOUS) == N - 1, record.role
            finally:
                stop.set()

        # Every acknowledged row reads back, through a client of this release.
        seen: dict[bytes, bytes] = {}
        async for row in client.table("up").read_rows(filter=CellsPerColumnLimit(1)):
            for cell in row.cells:
                seen[row.key] = cell.value
        problems = history.check(seen)
        assert not problems, "\n".join(problems[:20])
        assert len(history.acked) >= 2 * PROGRESS * 6, history.errors
        for writer in writers:
            assert not writer.misreads, writer.misreads
    finally:
        stop.set()
        await old_client.close()
        await client.close()
