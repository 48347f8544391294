"""A master failover in the middle of a worker's recovery.

The chaos run showed recoveries of 90 to 140 s when the nemesis SIGKILLed the master while a
dead worker's tablets were being recovered. Here, with real processes: a worker is SIGKILLed,
and as soon as the leading master has started that recovery (it revoked the worker's lease),
the master is SIGKILLed too. The standby must take over and have every tablet served and every
acknowledged row readable again well within the old stall.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tabletstore import connect_async
from tabletstore.client.table import AsyncTable
from tabletstore.data.filters import CellsPerColumnLimit
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.errors import TabletStoreError
from tests.integration.cluster_harness import Cluster, eventually, placement, table_id_of

pytestmark = pytest.mark.timeout(240)

LEASE = 3.0
#: Kill to every row readable again. The stall this guards against was 90 to 140 s; a
#: failover costs the master's lease (LEASE) plus one recovery, a few seconds each here.
RECOVERY_BOUND = 45.0
SPLITS = [b"c", b"f", b"i", b"l", b"o", b"r", b"u"]  # 8 tablets


@pytest.fixture
def cluster(etcd_server: str, s3_server: str, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster.on(etcd_server, s3_server, tmp_path, "failover", lease_ttl=LEASE)
    try:
        made.start_master()
        made.start_master()
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda _: made.start_worker(), range(3)))
        yield made
    finally:
        made.close()


async def _read_all(table: AsyncTable) -> dict[bytes, bytes]:
    out = {}
    async for row in table.read_rows(filter=CellsPerColumnLimit(1)):
        for cell in row.cells:
            out[row.key] = cell.value
    return out


def _log_has(path: str, text: str) -> bool:
    try:
        return text in Path(path).read_text(errors="replace")
    except OSError:
        return False


@pytest.mark.slow
async def test_master_killed_mid_recovery_standby_recovers_within_bound(
    cluster: Cluster,
) -> None:
    leader, standby = (r for r in cluster.records if r.role.startswith("master"))
    client = await connect_async(cluster.url)
    try:
        table = await client.create_table("fo", ["f"], split_keys=SPLITS)
        table_id = await table_id_of(client, "fo")

        async def all_served() -> bool:
            where = placement(await client.status(), table_id)
            return sum(len(t) for t in where.values()) == len(SPLITS) + 1

        await eventually(all_served, deadline=60, what="every tablet served")
        # Many small writes: each a log segment, so a replay takes a while.
        rows = {f"{chr(ord('a') + i % 26)}{i:05d}".encode(): f"v{i}".encode() for i in range(600)}
        items = list(rows.items())
        for start in range(0, len(items), 10):
            await table.mutate_rows(
                [RowMutation(k, (SetCell("f", b"c", v),)) for k, v in items[start : start + 10]]
            )
        status = await client.status()
        where = placement(status, table_id)
        victim_id = max(where, key=lambda w: len(where[w]))
        victim_address = getattr(status.workers[victim_id], "address", None)
        victim = next(r for r in cluster.records if r.url == victim_address)

        killed = time.monotonic()
        await asyncio.to_thread(cluster.kill, victim)
        # The leader noticed (revoked the dead worker's lease) and started the recovery: the
        # sort of the dead log is planned and the loads that replay from it are going out.
        await eventually(
            lambda: asyncio.to_thread(_log_has, leader.log, "revoking its lease"),
            deadline=30,
            what="the leading master revoked the dead worker's lease",
            interval=0.05,
        )
        await eventually(
            lambda: asyncio.to_thread(_log_has, leader.log, "sorting commit log"),
            deadline=30,
            what="the leading master planned the sort of the dead worker's log",
            interval=0.05,
        )
        await asyncio.to_thread(cluster.kill, leader)

        async def readable() -> bool:
            try:
                return await _read_all(table) == rows
            except TabletStoreError:
                return False

        await eventually(
            readable,
            deadline=120,
            what="every acknowledged row readable after the double failover",
            interval=0.2,
        )
        took = time.monotonic() - killed
        assert (await client.status()).master == standby.url
        assert took < RECOVERY_BOUND, (
            f"recovery across a master failover took {took:.1f} s\n{cluster.logs(40)}"
        )
    finally:
        await client.close()
