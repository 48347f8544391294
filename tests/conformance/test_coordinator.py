"""The coordinator conformance suite against the in-process coordinator and a real etcd."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tabletstore.cli.localstack import free_port
from tabletstore.clock import ManualClock, SystemClock
from tabletstore.coordination import Coordinator, Lease, check, open_coordinator
from tabletstore.coordination.etcd import EtcdCoordinator
from tabletstore.errors import Unavailable
from tabletstore.testing.coordinator_conformance import DEADLINE, CoordinatorConformance


class MemoryHarness:
    """Time is a ManualClock: expiring a lease is one ``advance``, no sleeping."""

    ttl = 10.0

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.url = f"memory://test-{uuid.uuid4().hex}"

    def open(self) -> Coordinator:
        return open_coordinator(self.url, clock=self.clock)

    async def _settle(self) -> None:
        for _ in range(10):
            await asyncio.sleep(0)

    async def let_time_pass(self, seconds: float) -> None:
        steps = max(1, round(seconds / (self.ttl / 10)))
        for _ in range(steps):
            self.clock.advance(seconds / steps)
            await self._settle()

    async def let_lease_expire(self, lease: Lease) -> None:
        self.clock.advance(lease.ttl + 0.001)
        await self._settle()


class EtcdHarness:
    """Real time against a real etcd whose raft timings allow 1-second leases."""

    ttl = 1.0

    def __init__(self, url: str) -> None:
        self.clock = SystemClock()
        self.url = url

    def open(self) -> Coordinator:
        return open_coordinator(self.url, clock=self.clock)

    async def let_time_pass(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def let_lease_expire(self, lease: Lease) -> None:
        async with asyncio.timeout(DEADLINE):
            await lease.wait_expired()


class TestMemoryCoordinator(CoordinatorConformance):
    @pytest.fixture
    def harness(self) -> MemoryHarness:
        return MemoryHarness()


class TestEtcdCoordinator(CoordinatorConformance):
    @pytest.fixture
    def harness(self, etcd_url: str) -> EtcdHarness:
        return EtcdHarness(etcd_url)


async def test_namespaces_are_isolated(etcd_server: str) -> None:
    a = open_coordinator(f"etcd://{etcd_server}/ns-a-{uuid.uuid4().hex}")
    b = open_coordinator(f"etcd://{etcd_server}/ns-b-{uuid.uuid4().hex}")
    try:
        await a.put("k", b"a")
        assert await b.get("k") is None
        assert [kv.key for kv in await a.get_prefix("")] == ["k"]
    finally:
        await a.close()
        await b.close()


async def test_unreachable_etcd_is_unavailable_naming_the_address() -> None:
    """``check`` fails at once; other calls retry for the coordinator's retry deadline (an
    etcd restart is ridden out: tests/integration/test_etcd_restart.py), then fail."""
    port = free_port()  # nothing listens there
    url = f"etcd://127.0.0.1:{port}/x"
    coordinator = EtcdCoordinator(url, retry_deadline=1.0)
    try:
        async with asyncio.timeout(15):
            with pytest.raises(Unavailable, match=f"etcd unreachable at 127.0.0.1:{port}"):
                await coordinator.check()
            with pytest.raises(Unavailable, match=f"127.0.0.1:{port}"):
                await coordinator.put("k", b"v")
            with pytest.raises(Unavailable, match=f"127.0.0.1:{port}"):
                await coordinator.grant_lease(5)
            with pytest.raises(Unavailable, match=f"127.0.0.1:{port}"):
                await check(url)
    finally:
        await coordinator.close()


async def test_second_endpoint_is_used_when_first_is_down(etcd_server: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    coordinator = open_coordinator(f"etcd://{dead},{etcd_server}/failover-{uuid.uuid4().hex}")
    try:
        async with asyncio.timeout(15):
            await coordinator.put("k", b"v")
            kv = await coordinator.get("k")
        assert kv is not None and kv.value == b"v"
    finally:
        await coordinator.close()
