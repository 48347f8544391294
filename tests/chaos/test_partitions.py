"""Partitions of the chaos cluster fire, and the product holds under them: a worker cut off from
etcd while it still reaches S3 (the zombie) acknowledges no write once its lease is over, and
its tablets are served elsewhere; a worker cut off from S3 keeps its lease and serves again
once S3 is back.

Writes are sent straight to the partitioned worker's RPC address, as a client with a stale
location cache would, so that a write the zombie accepted could not hide behind the client's
retry at the new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.client import AsyncClient
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.embedded import connect_async
from tabletstore.errors import AlreadyExists, TabletStoreError
from tabletstore.rpc.messages import MutateRowsRequest
from tabletstore.testing.chaos.chaos_cluster import ChaosCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE_TTL = 3.0
ROW = b"a-row"


@dataclass
class Attempt:
    start: float
    end: float
    ok: bool
    error: str = ""
    running: bool = True


@pytest.fixture
def cluster(start_cluster: Callable[..., ChaosCluster]) -> ChaosCluster:
    return start_cluster(workers=2, masters=1, lease_ttl=LEASE_TTL)


async def _create(client: AsyncClient, name: str) -> str:
    """Create table ``name`` (two tablets) once METADATA is served; its id."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with contextlib.suppress(AlreadyExists):  # an earlier attempt went through
                await client.create_table(name, ["f"], split_keys=(b"m",))
            return (await client._info(name)).table_id
        except TabletStoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


async def _holder(client: AsyncClient, table_id: str) -> tuple[str, str]:
    """(address, tablet id) of the first tablet once it is served."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(TabletStoreError):
            [rec, *_] = await client.locations.tablets(table_id, refresh=True)
            if rec.location is not None:
                return rec.location, rec.tablet_id
        await asyncio.sleep(0.2)
    raise TimeoutError("the table's first tablet was not served in 60 s")


async def _victim(
    cluster: ChaosCluster, client: AsyncClient, name: str
) -> tuple[str, str, str, ProcessRecord, str]:
    """A new table's id, and its first tablet's holder: address, tablet id, process, id."""
    table_id = await _create(client, name)
    address, tablet_id = await _holder(client, table_id)
    victim = next(r for r in cluster.workers if r.url == address)
    worker_id = {a: w for w, a in (await client.catalog.live_workers()).items()}[address]
    return table_id, address, tablet_id, victim, worker_id


async def _direct_write(
    client: AsyncClient, address: str, table_id: str, tablet_id: str, value: bytes
) -> tuple[bool, str]:
    req = MutateRowsRequest(
        table_id, tablet_id, (RowMutation(ROW, (SetCell("f", b"c", value),)),), client.identity
    )
    try:
        async with asyncio.timeout(10):
            resp = await client._worker(address).mutate_rows(req)
    except (TabletStoreError, OSError, TimeoutError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if resp.errors:
        return False, f"{resp.errors[0].exception()!r}"
    return True, ""


def test_a_worker_cut_off_from_etcd_acknowledges_nothing_after_its_lease(
    cluster: ChaosCluster,
) -> None:
    asyncio.run(_zombie(cluster))


async def _zombie(cluster: ChaosCluster) -> None:
    client = await connect_async(cluster.client_url)
    try:
        table_id, address, tablet_id, victim, worker_id = await _victim(cluster, client, "z")
        ok, error = await _direct_write(client, address, table_id, tablet_id, b"before")
        assert ok, f"the direct write path does not work: {error}"

        cluster.cut(victim, "etcd")
        cut_at = time.monotonic()
        attempts: list[Attempt] = []
        lease_gone_at = moved_at = None
        n = 0
        while time.monotonic() < cut_at + 60:
            n += 1
            start = time.monotonic()
            ok, error = await _direct_write(
                client, address, table_id, tablet_id, f"zombie-{n}".encode()
            )
            attempts.append(Attempt(start, time.monotonic(), ok, error, cluster.running(victim)))
            with contextlib.suppress(TabletStoreError):
                if lease_gone_at is None and worker_id not in await client.catalog.live_workers():
                    lease_gone_at = time.monotonic()
                [rec, *_] = await client.locations.tablets(table_id, refresh=True)
                if moved_at is None and rec.location not in (None, address):
                    moved_at = time.monotonic()
            if (
                moved_at is not None
                and lease_gone_at is not None
                and time.monotonic() > (max(moved_at, lease_gone_at) + 2)
            ):
                break
            await asyncio.sleep(0.1)
        cluster.cut(victim, "etcd", cut=False)
        print(
            f"lease gone {lease_gone_at and lease_gone_at - cut_at:.1f}s, moved "
            f"{moved_at and moved_at - cut_at:.1f}s after the cut; "
            + "; ".join(
                f"{a.start - cut_at:.1f}s {'ok' if a.ok else a.error[:80]}"
                f"{'' if a.running else ' (exited)'}"
                for a in attempts[:: max(1, len(attempts) // 12)]
            )
        )

        # The nemesis fired: the master saw the lease end and moved the tablet away, although
        # the worker's process was alive when it was cut off (it was not killed).
        assert lease_gone_at is not None, "the partitioned worker's lease never ended"
        assert moved_at is not None, "the tablet never moved off the partitioned worker"
        assert attempts and attempts[0].running
        # Once the lease is over by the worker's own clock (its last keep-alive was before the
        # cut), nothing it answers is an acknowledgement.
        over = cut_at + LEASE_TTL
        late = [a for a in attempts if a.start >= over]
        assert late, "no write was tried after the lease ended"
        acked = [a for a in late if a.ok]
        assert not acked, f"the zombie acknowledged {len(acked)} writes after its lease ended"
        # The running worker refused writes itself, by its own clock, before it stopped
        # (an answer, not a dead process's closed port).
        assert any("NotServing" in a.error and a.running for a in attempts), [
            a.error for a in attempts
        ]

        # The new owner serves the tablet; the zombie's refused writes are not there.
        table = client.table("z")
        await table.mutate_row(ROW, [SetCell("f", b"c", b"after")])
        row = await table.read_row(ROW)
        assert row is not None and row.cells[0].value == b"after"
    finally:
        await client.close()


def test_a_worker_cut_off_from_s3_keeps_its_lease_and_serves_again(
    cluster: ChaosCluster,
) -> None:
    asyncio.run(_s3_cut(cluster))


async def _s3_cut(cluster: ChaosCluster) -> None:
    client = await connect_async(cluster.client_url)
    try:
        table_id, address, tablet_id, victim, worker_id = await _victim(cluster, client, "s")
        cluster.cut(victim, "s3")
        try:
            ok, error = await _direct_write(client, address, table_id, tablet_id, b"cut")
            # The write cannot reach the log: it is not acknowledged (it may land later).
            assert not ok, "a write was acknowledged while its worker could not reach S3"
            assert worker_id in await client.catalog.live_workers(), "the lease was lost"
        finally:
            cluster.cut(victim, "s3", cut=False)
        deadline = time.monotonic() + 60
        while True:
            ok, error = await _direct_write(client, address, table_id, tablet_id, b"healed")
            if ok:
                break
            assert time.monotonic() < deadline, f"not served again after the heal: {error}"
            await asyncio.sleep(0.5)
    finally:
        await client.close()


def test_a_master_cut_off_from_etcd_gives_way_to_the_standby(
    start_cluster: Callable[..., ChaosCluster],
) -> None:
    asyncio.run(_master_cut(start_cluster(workers=1, masters=2, lease_ttl=LEASE_TTL)))


async def _master_cut(cluster: ChaosCluster) -> None:
    client = await connect_async(cluster.client_url)
    try:
        await _create(client, "before")
        leader_address = await client.catalog.master_address()
        leader = next(r for r in cluster.masters if r.url == leader_address)
        cluster.cut(leader, "etcd")
        deadline = time.monotonic() + 60
        while (address := await client.catalog.master_address()) in (leader_address, None):
            assert time.monotonic() < deadline, "the standby never took the master lock"
            await asyncio.sleep(0.2)
        # The cut master gives up (its lease expired by its own clock) and the standby leads;
        # the cut master stops leading and, in the same process, waits to end the lost lease
        # before campaigning again (``run_master``'s rejoin).
        log = Path(leader.log)

        async def logged() -> str:
            return await asyncio.to_thread(log.read_text, errors="replace")

        while "rejoining as a standby" not in await logged():
            assert time.monotonic() < deadline, "the cut master never gave up its lease"
            await asyncio.sleep(0.2)
        assert cluster.running(leader)
        cluster.cut(leader, "etcd", cut=False)
        assert address in {r.url for r in cluster.masters if r is not leader}
        await _create(client, "after")
        # Healed, it serves again as a standby on the same address; the new master leads on.
        while (await logged()).count("master listening on") < 2:
            assert time.monotonic() < deadline + 60, "the cut master never served again"
            await asyncio.sleep(0.2)
        assert await client.catalog.master_address() == address
    finally:
        await client.close()
