"""The master's fast failure detection (master/failure_detector.py, §5.2): only refused
connections count, a timeout or a connect resets the count, and the revocation is by the lease
id read with the address."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.errors import InvalidArgument
from tabletstore.master.failure_detector import FailureDetector, Refusals, probe


def test_refusals_need_consecutive_refused_probes() -> None:
    r = Refusals(2)
    assert not r.observe("w1", 7, True)
    assert not r.observe("w1", 7, False)  # a connect (or a timeout) starts over
    assert not r.observe("w1", 7, True)
    assert r.observe("w1", 7, True)


def test_refusals_are_per_lease() -> None:
    r = Refusals(2)
    assert not r.observe("w1", 7, True)
    assert not r.observe("w1", 8, True)  # the same worker id under a new lease: counted anew
    r.retain({("w1", 8)})
    assert not r.observe("w1", 7, True)


def test_refusals_reject_zero() -> None:
    with pytest.raises(InvalidArgument):
        Refusals(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_probe_tells_refused_from_listening() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        assert not await probe(f"127.0.0.1:{port}", within=2.0)
    assert await probe(f"127.0.0.1:{_free_port()}", within=2.0)
    assert not await probe("not an address", within=2.0)


async def test_probe_of_a_full_backlog_is_not_refused() -> None:
    """A paused process keeps its listening socket: connects complete in the kernel (or time
    out once the backlog is full), they are never refused."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # nobody accepts: a SIGSTOPped worker's socket
    try:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        outcomes = [await probe(address, within=0.5) for _ in range(4)]
        assert outcomes == [False] * 4
    finally:
        listener.close()


async def test_detector_revokes_only_the_refusing_workers_lease() -> None:
    coord = MemoryCoordinator.open("detector")
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    try:
        alive, dead = await coord.grant_lease(30), await coord.grant_lease(30)
        port = server.sockets[0].getsockname()[1]
        await coord.put(paths.server("alive"), f"127.0.0.1:{port}".encode(), lease=alive)
        await coord.put(paths.server("dead"), f"127.0.0.1:{_free_port()}".encode(), lease=dead)
        await coord.put(paths.claim("t1", "a"), b"dead", lease=dead)
        woken: list[str] = []
        detector = FailureDetector(coord, interval=0.1, refusals=2, on_revoked=woken.append)
        assert await detector.round() == []
        assert await detector.round() == ["dead"]
        assert woken == ["dead"]
        assert dead.expired and not alive.expired
        assert await coord.get(paths.server("dead")) is None
        assert await coord.get(paths.claim("t1", "a")) is None
        assert await coord.get(paths.server("alive")) is not None
        assert await detector.round() == []
    finally:
        server.close()
        await server.wait_closed()
        await coord.close()


async def test_detector_leaves_a_draining_worker_alone() -> None:
    """A worker stopping on purpose closes its listener, then flushes and hands over its
    tablets: its draining key keeps the detector from treating it as crashed."""
    coord = MemoryCoordinator.open("draining")
    try:
        lease = await coord.grant_lease(30)
        await coord.put(paths.server("w"), f"127.0.0.1:{_free_port()}".encode(), lease=lease)
        await coord.put(paths.draining("w"), b"", lease=lease)
        detector = FailureDetector(coord, interval=0.1, refusals=1)
        assert await detector.round() == [] and not lease.expired
        await coord.delete(paths.draining("w"))
        assert await detector.round() == ["w"] and lease.expired
    finally:
        await coord.close()
