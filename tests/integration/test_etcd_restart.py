"""Riding out an etcd restart (docs/architecture/design.md §9: an acknowledged
write survives a restart of etcd).

etcd 3.4 keeps keys, revisions and leases across a restart, and when the restarted member
becomes leader it gives every lease its full TTL again (checked below). So a restart shorter
than a lease must cost nothing: leases kept alive, watches resumed from the next revision
(nothing missed, nothing twice), elections keeping their leader and standby, and no error
escaping to the processes that use the coordinator. The last test does it to a cluster of
processes (master, standby master, two workers) while writes run.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from tabletstore.coordination import Coordinator, EventType, WatchEvent, open_coordinator, paths
from tabletstore.coordination.base import Watch
from tests.integration.cluster_harness import Cluster, WriteHistory, eventually
from tests.integration.test_cluster import (
    Writers,
    _at_least,
    _start,
    check_history,
    client_of,
    wait_served,
)
from tests.plugins.etcd_server import RestartableEtcd
from tests.plugins.s3_server import boto3_client

#: Seconds etcd stays down: well under the leases' TTL below.
OUTAGE = 3.0
TTL = 10.0
DEADLINE = 30.0


async def _next_event(watch: Watch) -> WatchEvent:
    async with asyncio.timeout(DEADLINE):
        return await anext(aiter(watch))


async def _equal(actual: int, expected: int) -> bool:
    return actual == expected


async def _restart(etcd: RestartableEtcd) -> None:
    """Stop etcd, keep it down for OUTAGE seconds (the fault's length, not a wait for a
    condition), start it again on the same ports and data."""
    await asyncio.to_thread(etcd.stop)
    await asyncio.sleep(OUTAGE)
    await asyncio.to_thread(etcd.start)


async def test_lease_watch_and_election_ride_out_an_etcd_restart(
    restartable_etcd: RestartableEtcd,
) -> None:
    url = restartable_etcd.url(f"restart-{uuid.uuid4().hex}")
    # One coordinator per role, as in separate processes.
    leader_c, standby_c, watcher_c, writer_c = (open_coordinator(url) for _ in range(4))
    coordinators: list[Coordinator] = [leader_c, standby_c, watcher_c, writer_c]
    try:
        async with asyncio.timeout(4 * DEADLINE):
            leader_lease = await leader_c.grant_lease(TTL)
            standby_lease = await standby_c.grant_lease(TTL)
            async with (
                leader_lease.keep_alive(),
                standby_lease.keep_alive(),
                watcher_c.watch_prefix("w/") as watch,
                watcher_c.election("m").observe() as leaders,
            ):
                leader_election = leader_c.election("m")
                leading = await leader_election.campaign(b"leader", leader_lease)
                standby_election = standby_c.election("m")
                standby = asyncio.create_task(standby_election.campaign(b"standby", standby_lease))
                observed = aiter(leaders)
                first = await anext(observed)
                assert first is not None and first.value == b"leader"
                await writer_c.put("w/before", b"1")
                assert (await _next_event(watch)).kv.key == "w/before"
                # Every watch is established at etcd before it goes down: this watch, the
                # observer's and the standby's campaign (the leader's ended when it won).
                await eventually(
                    lambda: _equal(restartable_etcd.watchers(), 3),
                    deadline=DEADLINE,
                    what="etcd serving the three watches",
                )

                restarted_at = time.monotonic()
                await _restart(restartable_etcd)
                # Written before the watcher can have reconnected: resuming from the next
                # revision must deliver them, in order, once each.
                await writer_c.put("w/after-1", b"2")
                await writer_c.delete("w/before")
                await writer_c.put("w/after-2", b"3")
                events = [await _next_event(watch) for _ in range(3)]
                assert [(e.type, e.kv.key) for e in events] == [
                    (EventType.PUT, "w/after-1"),
                    (EventType.DELETE, "w/before"),
                    (EventType.PUT, "w/after-2"),
                ]

                # Keep-alives resumed: a renewal sent after the restart succeeded.
                async def renewed_after_restart() -> None:
                    while not (
                        leader_lease.last_renewed > restarted_at + OUTAGE
                        and standby_lease.last_renewed > restarted_at + OUTAGE
                    ):
                        assert not leader_lease.expired and not standby_lease.expired
                        await asyncio.sleep(0.1)

                async with asyncio.timeout(DEADLINE):
                    await renewed_after_restart()
                assert not leader_lease.expired and not standby_lease.expired
                assert await writer_c.get("w/after-2") is not None

                # The leader still leads; the standby still waits, without an error.
                current = await writer_c.election("m").leader()
                assert current is not None
                assert current.create_revision == leading.create_revision
                assert not standby.done(), standby
                # The standby's campaign (its watch re-established) takes over on resignation,
                # and the observer (its watch re-established too) sees the change.
                await leader_election.resign()
                async with asyncio.timeout(DEADLINE):
                    took_over = await standby
                assert took_over.value == b"standby"
                async with asyncio.timeout(DEADLINE):
                    changed = await anext(observed)
                assert changed is not None and changed.value == b"standby"
                await standby_election.resign()
    finally:
        for coordinator in coordinators:
            await coordinator.close()


async def test_etcd_restores_leases_with_their_full_ttl(
    restartable_etcd: RestartableEtcd,
) -> None:
    """What the holder-side rules rely on: a lease is not lost at etcd by a restart (etcd
    3.4 without lease checkpoints renews every lease to its full TTL when the restarted member
    becomes leader), so a holder whose keep-alives resume in time keeps it."""
    url = restartable_etcd.url(f"restart-{uuid.uuid4().hex}")
    coordinator = open_coordinator(url)
    try:
        lease = await coordinator.grant_lease(TTL)
        await coordinator.put("attached", b"x", lease=lease)
        await _restart(restartable_etcd)
        async with asyncio.timeout(DEADLINE):
            await lease.refresh()
        kv = await coordinator.get("attached")
        assert kv is not None and kv.lease_id == lease.id
    finally:
        await coordinator.close()


async def test_a_restart_longer_than_the_lease_ends_it(
    restartable_etcd: RestartableEtcd,
) -> None:
    """The holder gives the lease up once ``last_renewed + ttl`` passes without a successful
    keep-alive, even though etcd itself would have renewed it: a worker must stop before its
    lease may have expired, and an outage longer than that is not ridden out."""
    url = restartable_etcd.url(f"restart-{uuid.uuid4().hex}")
    coordinator = open_coordinator(url)
    try:
        lease = await coordinator.grant_lease(2)
        async with lease.keep_alive():
            await asyncio.to_thread(restartable_etcd.stop)
            async with asyncio.timeout(DEADLINE):
                await lease.wait_expired()
            await asyncio.to_thread(restartable_etcd.start)
            assert lease.expired
            assert time.monotonic() >= lease.last_renewed + lease.ttl
    finally:
        await coordinator.close()


# ------------------------------------------------------------------------------ a cluster

#: The cluster's leases: longer than the restart (OUTAGE plus etcd's start-up) with room for
#: a loaded machine, as a production lease would be.
CLUSTER_LEASE = 8.0


async def _server_leases(url: str) -> dict[str, int]:
    """servers/<worker-id> -> the lease it is attached to."""
    coordinator = open_coordinator(url)
    try:
        return {kv.key: kv.lease_id for kv in await coordinator.get_prefix(paths.SERVERS)}
    finally:
        await coordinator.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_cluster_rides_out_an_etcd_restart_during_writes(
    restartable_etcd: RestartableEtcd, s3_server: str, tmp_path: Path
) -> None:
    """Master, standby master and two workers as processes, writers running: an etcd restart
    shorter than the lease kills no process, moves no tablet, and loses no acknowledged write."""
    name = f"cluster-{uuid.uuid4().hex[:12]}"
    boto3_client(s3_server).create_bucket(Bucket=name)
    cluster = Cluster(
        url=restartable_etcd.url(name),
        store_url=f"s3://{name}/data?endpoint_url={s3_server}&region=us-east-1",
        directory=tmp_path / "cluster",
        lease_ttl=CLUSTER_LEASE,
    )
    try:
        _start(cluster, masters=2, workers=2)
        leader = cluster.records[0]
        async with client_of(cluster) as client:
            table = await client.create_table("restart", ["f", "g"], split_keys=[b"k"])
            await wait_served(client, "restart", 2)
            assert (await client.status()).master == leader.url
            leases_before = await _server_leases(cluster.url)
            assert len(leases_before) == 2
            writers = Writers(table, WriteHistory())
            tasks = writers.run(singles=4, batches=1)
            try:
                await eventually(
                    lambda: _at_least(len(writers.history.acked), 50), deadline=60, what="50 acks"
                )
                await _restart(restartable_etcd)
                restarted = len(writers.history.acked)
                await eventually(
                    lambda: _at_least(len(writers.history.acked), restarted + 50),
                    deadline=60,
                    what="50 acks after the restart",
                )
            finally:
                writers.stop.set()
                await asyncio.gather(*tasks)
            assert cluster.alive() == cluster.records, cluster.logs()
            # No worker lost its lease: each is still registered under the lease it had (a
            # worker that loses its lease exits; the balancer may still move a tablet).
            assert await _server_leases(cluster.url) == leases_before, cluster.logs()
            await wait_served(client, "restart", 2)
            assert (await client.status()).master == leader.url
            await check_history(table, writers, cluster)
        assert cluster.alive() == cluster.records, cluster.logs()
    finally:
        cluster.close()
