"""The in-process coordinator's own rules: URLs, shared state, leases on a ManualClock."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tabletstore.clock import ManualClock
from tabletstore.coordination import memory, open_coordinator
from tabletstore.coordination.etcd import parse_etcd_url, translate
from tabletstore.coordination.local import LocalCoordinator
from tabletstore.errors import Closed, Fenced, InvalidArgument, NotFound, Unavailable


@pytest.mark.parametrize(
    "url",
    [
        "",
        "s3://bucket",
        "etcd://",
        "etcd://host",
        "etcd://h:notaport/x",
        "etcd://h:70000",
        "memory://a/b",
    ],
)
def test_bad_urls_are_invalid_argument(url: str) -> None:
    with pytest.raises(InvalidArgument):
        open_coordinator(url)


def test_etcd_url_parsing() -> None:
    assert parse_etcd_url("etcd://127.0.0.1:2379/prod") == ([("127.0.0.1", 2379)], "prod")
    assert parse_etcd_url("etcd://a:1,b:2") == ([("a", 1), ("b", 2)], "tabletstore")
    assert parse_etcd_url("etcd://[::1]:2379/x/y/") == ([("::1", 2379)], "x/y")


def test_error_translation() -> None:
    import aetcd

    assert isinstance(translate(aetcd.ConnectionFailedError("refused"), "h:1"), Unavailable)
    assert "etcd unreachable at h:1" in str(translate(aetcd.ConnectionTimeoutError("t"), "h:1"))
    assert isinstance(
        translate(aetcd.ClientError("etcdserver: requested lease not found"), "h:1"), Fenced
    )
    assert isinstance(translate(aetcd.InvalidArgumentError("dup"), "h:1"), InvalidArgument)
    assert isinstance(translate(aetcd.RevisionCompactedError(5), "h:1"), NotFound)


async def test_same_name_shares_state_and_clock_must_match() -> None:
    clock = ManualClock()
    name = f"memory://shared-{uuid.uuid4().hex}"
    a, b = open_coordinator(name, clock=clock), open_coordinator(name)
    try:
        await a.put("k", b"v")
        kv = await b.get("k")
        assert kv is not None and kv.value == b"v"
        with pytest.raises(InvalidArgument, match="different clock"):
            open_coordinator(name, clock=ManualClock())
        private = open_coordinator("memory://")
        assert await private.get("k") is None
        await private.close()
    finally:
        await a.close()
        await b.close()


async def test_lease_fencing_deadline_follows_the_clock() -> None:
    clock = ManualClock()
    coordinator = open_coordinator("memory://", clock=clock)
    lease = await coordinator.grant_lease(10, safety_margin=2)
    assert lease.last_renewed == clock.monotonic()
    assert lease.safe_until() == lease.last_renewed + 8
    clock.advance(5)
    await lease.refresh()
    assert lease.last_renewed == clock.monotonic() and lease.safe_until() == clock.monotonic() + 8
    clock.advance(9.9)
    assert not lease.expired
    clock.advance(0.1)
    assert lease.expired
    with pytest.raises(Fenced):
        await lease.refresh()
    await coordinator.close()


async def test_each_lease_ends_at_its_own_deadline_whatever_the_order_granted() -> None:
    """Leases end (their keys deleted) when their deadline passes, for a lease granted or
    refreshed after a longer one (the lessor skips its scan before the earliest deadline)."""
    clock = ManualClock()
    coordinator = open_coordinator("memory://", clock=clock)
    long = await coordinator.grant_lease(100)
    await coordinator.put("/long", b"1", lease=long)
    clock.advance(1)
    assert await coordinator.get("/long") is not None  # a scan: the earliest is long's
    short = await coordinator.grant_lease(5)
    await coordinator.put("/short", b"1", lease=short)
    clock.advance(4.9)
    assert await coordinator.get("/short") is not None
    clock.advance(0.1)
    assert await coordinator.get("/short") is None
    renewed = await coordinator.grant_lease(5)
    await coordinator.put("/renewed", b"1", lease=renewed)
    clock.advance(4)
    await renewed.refresh()
    clock.advance(4.9)
    assert await coordinator.get("/renewed") is not None
    clock.advance(0.1)
    assert await coordinator.get("/renewed") is None
    assert await coordinator.get("/long") is not None
    clock.advance(100)
    assert await coordinator.get("/long") is None
    await coordinator.close()


async def test_keep_alive_stops_when_the_lease_is_gone() -> None:
    clock = ManualClock()
    coordinator = open_coordinator("memory://", clock=clock)
    lease = await coordinator.grant_lease(3)
    async with lease.keep_alive(interval=1):
        await lease.revoke()
        for _ in range(5):
            clock.advance(1)
            await asyncio.sleep(0)
        assert lease.expired
    await coordinator.close()


async def test_bad_lease_arguments() -> None:
    coordinator = open_coordinator("memory://")
    with pytest.raises(InvalidArgument):
        await coordinator.grant_lease(0)
    with pytest.raises(InvalidArgument):
        await coordinator.grant_lease(5, safety_margin=5)
    lease = await coordinator.grant_lease(5)
    with pytest.raises(InvalidArgument):
        lease.keep_alive(interval=5)
    await coordinator.close()


async def test_watch_from_a_compacted_revision_is_not_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "HISTORY_LIMIT", 3)
    coordinator = open_coordinator("memory://")
    first = await coordinator.put("k", b"0")
    for i in range(5):
        await coordinator.put("k", str(i).encode())
    with pytest.raises(NotFound, match="compacted"):
        async with coordinator.watch_prefix("", start_revision=first):
            pass
    await coordinator.close()


async def test_closed_coordinator_and_its_watches() -> None:
    coordinator = open_coordinator("memory://")
    async with coordinator.watch_prefix("") as watch:
        waiter = asyncio.create_task(anext(aiter(watch)))
        await asyncio.sleep(0)
        await coordinator.close()
        with pytest.raises(Closed):
            await waiter
    with pytest.raises(Closed):
        await coordinator.get("k")


async def test_a_process_bound_lease_outlives_a_late_keep_alive(tmp_path: Path) -> None:
    """The embedded database's leases (``leases_bound_to_process``): no keep-alive for many
    TTLs — a stalled event loop — neither expires them at the holder nor at the coordinator
    (their keys stay), while a plain lease of the same shared state still expires; a revoke
    still ends them."""
    clock = ManualClock()
    name = f"bound-{uuid.uuid4().hex}"
    bound_side = memory.MemoryCoordinator.open(name, clock=clock, leases_bound_to_process=True)
    plain_side = memory.MemoryCoordinator.open(name, clock=clock)
    bound = await bound_side.grant_lease(1, safety_margin=0.25)
    plain = await plain_side.grant_lease(1, safety_margin=0.25)
    await bound_side.put("servers/embedded", b"x", lease=bound)
    await plain_side.put("servers/other", b"y", lease=plain)
    waiter = asyncio.create_task(bound.wait_expired())
    clock.advance(100)
    await asyncio.sleep(0)
    assert plain.expired and not bound.expired and not waiter.done()
    assert clock.monotonic() < bound.safe_until()
    assert await plain_side.get("servers/other") is None
    assert await bound_side.get("servers/embedded") is not None
    await bound.refresh()  # a keep-alive 100 TTLs late still renews
    await bound_side.revoke_lease(bound.id)
    await asyncio.wait_for(waiter, 5)
    assert bound.expired and await bound_side.get("servers/embedded") is None
    with pytest.raises(Fenced):
        await bound.refresh()
    # A durable local coordinator's leases keep the TTL rules unless asked.
    local = LocalCoordinator(tmp_path, clock=clock)
    ttl_lease = await local.grant_lease(1)
    clock.advance(2)
    assert ttl_lease.expired
    await local.close()
    await bound_side.close()
    await plain_side.close()
