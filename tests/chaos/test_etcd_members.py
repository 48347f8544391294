"""etcd as three members in the chaos cluster: the member faults fire and etcd behaves as the
coordination layer assumes. A killed leader is replaced by an election and the coordinator
fails over to another member; with a majority down the remaining member serves nothing (no
write, no read, no lease), and the cluster answers again, with its data, once they are back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tabletstore.coordination import open_coordinator
from tabletstore.errors import TabletStoreError
from tabletstore.testing.chaos.chaos_cluster import ChaosCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def cluster(start_cluster: Callable[..., ChaosCluster]) -> ChaosCluster:
    return start_cluster(workers=0, masters=0, etcd_members=3)


async def _eventually_put(url: str, key: str, value: bytes, deadline: float = 60) -> None:
    coordinator = open_coordinator(url)
    end = time.monotonic() + deadline
    try:
        while True:
            try:
                async with asyncio.timeout(10):
                    await coordinator.put(key, value)
                    return
            except (TabletStoreError, TimeoutError):
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await coordinator.close()


def test_leader_kill_and_quorum_loss(cluster: ChaosCluster) -> None:
    asyncio.run(_members(cluster))


async def _members(cluster: ChaosCluster) -> None:
    assert len(cluster.members) == 3 and cluster.url.count(",") == 2
    await _eventually_put(cluster.url, "k", b"1")

    # The leader dies: another member is elected and a client of all three carries on.
    leader = await asyncio.to_thread(cluster.etcd_leader)
    await asyncio.to_thread(cluster.kill_members, [leader])
    end = time.monotonic() + 30
    while True:
        try:
            new = await asyncio.to_thread(cluster.etcd_leader)
            break
        except RuntimeError:
            assert time.monotonic() < end, "no new etcd leader within 30 s"
            await asyncio.sleep(0.5)
    assert new != leader
    await _eventually_put(cluster.url, "k", b"2")
    await asyncio.to_thread(cluster.restart_members, [leader])

    # A majority is down: the one member left serves nothing.
    lone = new
    down = [i for i in range(3) if i != lone]
    await asyncio.to_thread(cluster.kill_members, down)
    minority = open_coordinator(f"etcd://{cluster.members[lone].url.split('//')[1]}")
    try:
        with pytest.raises((TabletStoreError, TimeoutError)):
            async with asyncio.timeout(20):
                await minority.put("k", b"3")
        with pytest.raises((TabletStoreError, TimeoutError)):
            async with asyncio.timeout(20):
                await minority.get("k")
        with pytest.raises((TabletStoreError, TimeoutError)):
            async with asyncio.timeout(20):
                await minority.grant_lease(5.0)
    finally:
        await minority.close()

    # The majority is back: writes and reads again, nothing acknowledged lost. The put the
    # lone member could not commit was never acknowledged, but it is indeterminate, not
    # refused: a leader that lost its quorum keeps the proposal in its log, and if it is
    # still leader when the others return, Raft commits it. So "k" is the acknowledged 2 or
    # the indeterminate 3, and nothing else.
    await asyncio.to_thread(cluster.restart_members, down)
    await _eventually_put(cluster.url, "k2", b"4")
    coordinator = open_coordinator(cluster.url)
    try:
        kv = await coordinator.get("k")
        assert kv is not None and kv.value in (b"2", b"3")
        k2 = await coordinator.get("k2")
        assert k2 is not None and k2.value == b"4"
    finally:
        await coordinator.close()


def test_member_replacement(cluster: ChaosCluster) -> None:
    asyncio.run(_replace(cluster))


async def _replace(cluster: ChaosCluster) -> None:
    await _eventually_put(cluster.url, "before", b"1")
    old_roles = [r.role for r in cluster.members]
    await asyncio.to_thread(cluster.replace_member, 1)
    fresh = cluster.members[1]
    assert fresh.role not in old_roles and "--initial-cluster-state=existing" in fresh.argv
    # The cluster kept serving, and the fresh member is a voting member with the data: with
    # one of the two original members down, the fresh one makes the quorum.
    await _eventually_put(cluster.url, "after", b"2")
    await asyncio.to_thread(cluster.kill_members, [0])
    await _eventually_put(cluster.url, "with-fresh", b"3")
    direct = open_coordinator(fresh.url)
    try:
        async with asyncio.timeout(30):
            got = [await direct.get(k) for k in ("before", "after", "with-fresh")]
        assert [kv.value if kv else None for kv in got] == [b"1", b"2", b"3"]
    finally:
        await direct.close()
