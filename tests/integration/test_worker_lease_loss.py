"""A worker process whose lease ends while it runs exits (§5.2): it must not stay up
answering NotServing for ever. The master's failure detector revokes a lease it believes dead,
and a worker paused past its TTL finds its lease gone when it resumes; either way the process
raises ``Fenced`` so its supervisor starts a fresh one under a new lease and incarnation, or,
with ``rejoin``, stops and joins again in the same process as a new worker (a master likewise
campaigns again).

And the converse: a worker's start-up work that holds its event loop (the process warm-up)
runs before the lease is taken, so a stall at start costs no lease."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tabletstore.clock import ManualClock
from tabletstore.commitlog.reader import list_segments
from tabletstore.coordination import open_coordinator, paths
from tabletstore.coordination.base import Compare, KeyValue, Lease, Op, TxnResult
from tabletstore.coordination.lease import LeaseBase
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.model import Cell
from tabletstore.errors import Closed, Fenced, NotServing, Unavailable
from tabletstore.master.master import Master
from tabletstore.master.master_process import run_master
from tabletstore.metadata import rows as mt
from tabletstore.options import LeaseOptions, MasterOptions, WorkerOptions
from tabletstore.rpc.tcp import TcpTransport
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.layout import log_segment_key
from tabletstore.worker.tablet_server import TabletServer
from tabletstore.worker.worker_process import run_worker


async def test_a_worker_whose_lease_is_revoked_says_so_and_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose lease is revoked stops and raises Fenced. Stopping a worker that lost its lease may wait long for its commit log's PUTs in flight
    to settle (an outcome is never abandoned) on a store that answers slowly: the loss is
    logged when the worker finds it, as it stops serving, not only once the stop is over (a
    worker paused past its lease in the seed-34 chaos run logged it six minutes late, which
    read as a worker that had not noticed)."""
    coordinator = open_coordinator(f"memory://lease-found-{uuid.uuid4().hex[:8]}")
    (tmp_path / "objects").mkdir()
    servers: list[TabletServer] = []
    stopping = asyncio.Event()
    release = asyncio.Event()
    real_stop = TabletServer.stop

    async def held_stop(self: TabletServer, *, flush: bool = True) -> None:
        stopping.set()
        await release.wait()
        await real_stop(self, flush=flush)

    monkeypatch.setattr(TabletServer, "stop", held_stop)
    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(
            coordinator,
            worker_id="w-found",
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
            caplog.set_level("WARNING", logger="tabletstore.worker.worker_process")
            await coordinator.revoke_lease(lease.id)
            await stopping.wait()
            assert any(
                "w-found" in r.getMessage() and "lost its lease" in r.getMessage()
                for r in caplog.records
            ), [r.getMessage() for r in caplog.records]
            release.set()
            with pytest.raises(Fenced, match="lost its lease"):
                await worker
    finally:
        release.set()
        stop.set()
        if not worker.done():
            worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await coordinator.close()


#: A worker process whose start-up work holds its event loop for twice its lease's TTL, as a
#: second of CPU (``warm_up_process``: pyarrow's import of pandas, a full collection) does on a
#: machine at load 20. argv: ``-c`` this, then the CLI's arguments.
_SLOW_START_UP = """
import time
import tabletstore.ops.process_warmup as warmup
real = warmup.warm_up_process
def slow():
    time.sleep(2 * {ttl})
    real()
warmup.warm_up_process = slow
from tabletstore.cli.main import main
main()
"""


async def test_start_up_work_that_holds_the_loop_past_the_ttl_costs_no_lease(
    etcd_url: str, tmp_path: Path
) -> None:
    """The worker command's one-time start-up work (``ops/process_warmup.py``) runs before it
    takes its lease: run after, a stall of the loop longer than the TTL left the keep-alive
    unsent, and a fresh worker lost its lease and exited before serving (on a loaded machine,
    every worker of a new cluster, whose root tablet then stayed unassigned)."""
    ttl = 3.0
    (tmp_path / "objects").mkdir()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _SLOW_START_UP.format(ttl=ttl),
        "--url",
        etcd_url,
        "worker",
        "--store",
        f"file://{tmp_path / 'objects'}",
        "--lease-ttl",
        str(ttl),
        "--metrics-port",
        "0",
        "--compaction-processes",
        "0",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert child.stderr is not None
    said: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not any("listening on" in line for line in said):
                line = (await child.stderr.readline()).decode()
                assert line, f"the worker exited before serving: {''.join(said)}"
                said.append(line)
            urls = [m.group(1) for s in said if (m := re.search(r"metrics on (\S+/metrics)", s))]
            # Serving, under a live lease: it was taken after the stall, and kept alive since.
            try:
                remaining = await asyncio.to_thread(_lease_remaining, urls[0])
            except OSError as exc:  # its status endpoint is gone: the process ended
                said.append((await child.stderr.read()).decode())
                pytest.fail(f"the worker stopped right after starting ({exc}): {''.join(said)}")
            assert remaining > 0, f"lease ended at start-up: {''.join(said)}"
    finally:
        if child.returncode is None:
            child.terminate()
        rest = (await child.stderr.read()).decode()
        await child.wait()
    assert child.returncode == 0, "".join(said) + rest
    assert "lost its lease" not in rest, rest


def _lease_remaining(metrics_url: str) -> float:
    """The worker's ``lease_remaining_seconds`` gauge, from its /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=30) as reply:
        text = reply.read().decode()
    found = re.search(r"^tabletstore_lease_remaining_seconds (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


class _Recording(MemoryCoordinator):
    """A coordinator that keeps every lease it grants (so a test can lose their keep-alives'
    answers) and that can be made unreachable (``down``: as etcd without a quorum, every
    call fails Unavailable)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.granted: list[Lease] = []
        self.down = False
        self.refused: list[str] = []

    def _reach(self, call: str) -> None:
        if self.down:
            self.refused.append(call)
            raise Unavailable(f"etcd has no quorum ({call})")

    async def grant_lease(self, ttl: float, *, safety_margin: float | None = None) -> Lease:
        self._reach("grant_lease")
        lease = await super().grant_lease(ttl, safety_margin=safety_margin)
        self.granted.append(lease)
        return lease

    async def revoke_lease(self, lease_id: int) -> None:
        self._reach("revoke_lease")
        await super().revoke_lease(lease_id)

    async def get(self, key: str) -> KeyValue | None:
        self._reach("get")
        return await super().get(key)

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        self._reach("put")
        return await super().put(key, value, lease=lease)

    async def txn(
        self, compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op] = ()
    ) -> TxnResult:
        self._reach("txn")
        return await super().txn(compares, on_success, on_failure)


def _lose_answers(lease: Lease) -> None:
    """The lease's keep-alives still reach the coordinator and renew the lease there, but
    their answers are lost: the holder gives the lease up by its own clock while the
    coordinator still holds it, as when etcd lost its quorum (it extends every lease when a
    new leader is elected)."""
    assert isinstance(lease, LeaseBase)
    send = lease._send_keep_alive

    async def lost() -> bool:
        await send()
        raise Unavailable("the keep-alive's answer was lost")

    lease._send_keep_alive = lost  # type: ignore[method-assign]


async def _outlive(clock: ManualClock, lease: Lease) -> None:
    """Move the clock a second at a time past ``lease``'s TTL, letting its keep-alives run
    (and renew it at the coordinator) on the way."""
    start = clock.monotonic()
    while clock.monotonic() < start + lease.ttl + 0.5:
        clock.advance(1.0)
        for _ in range(5):
            await asyncio.sleep(0.01)
    assert lease.expired


async def _until(check: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not check():
        assert loop.time() < end, f"not within {seconds} s: {what}"
        await asyncio.sleep(0.02)


async def test_a_worker_that_gave_up_its_lease_rejoins_as_a_new_worker(tmp_path: Path) -> None:
    """With ``rejoin``, a worker whose lease ended by its own clock while etcd had no quorum
    stops serving as before (every tablet dropped, its listener closed; nothing asked of the
    unreachable coordinator, whose claims go with the lease) and then, in the same process,
    waits for the coordinator, ends the old lease there and joins as a new worker on the same
    address: new id, new lease. The old lease's keys (its servers entry, its tablets' claims)
    are gone at once, not when the coordinator would have ended the lease itself (the clock
    stands still here, so only the revocation can end it), and the master gives the tablets to
    the new worker, which recovers them from the old worker's log as from a dead worker's.

    Fencing: the old identity serves nothing once the new one does, its log takes no append
    (the lease check refuses it, and under it the writer is closed), and that log ends in
    recovery's fence, so a zombie write to it could not become durable. Each worker's warm-up
    runs before its lease is granted, the rejoined one's too."""
    clock = ManualClock()
    coordinator = _Recording(clock)
    (tmp_path / "objects").mkdir()
    servers: list[TabletServer] = []
    when_ready: list[tuple[int, bool]] = []  # the previous worker, as each one starts serving
    warm_ups: list[int] = []  # leases granted so far, at each warm-up

    def ready(server: TabletServer) -> None:
        if servers:
            when_ready.append((len(servers[-1].tablets), servers[-1].stopping))
        servers.append(server)

    def granted_at(lease: Lease | None) -> int:
        assert lease is not None
        return [g.id for g in coordinator.granted].index(lease.id)

    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(
            coordinator,
            options=WorkerOptions(lease=LeaseOptions(ttl=10.0), compaction_processes=0),
            store_url=f"file://{tmp_path / 'objects'}",
            stop=stop,
            ready=ready,
            warm_up=lambda: warm_ups.append(len(coordinator.granted)),
            clock=clock,
            rejoin=True,
        )
    )
    transport = TcpTransport(timeout=30.0)
    master = Master(coordinator=coordinator, transport=transport, options=MasterOptions())
    try:
        await _until(lambda: bool(servers) or worker.done(), "the worker serves")
        assert not worker.done(), worker
        first = servers[0]
        lease = first.lease
        assert lease is not None
        await master.assign()
        assert {t for _, t in first.tablets} >= {mt.ROOT_TABLET_ID}
        root = await coordinator.get(paths.claim(mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID))
        assert root is not None and root.lease_id == lease.id
        old_log = first._log
        assert old_log is not None

        _lose_answers(lease)
        coordinator.down = True
        await _outlive(clock, lease)
        await _until(lambda: first.stopping and not first.tablets, "the worker stops")
        await _until(lambda: "revoke_lease" in coordinator.refused, "it waits for etcd")
        assert len(servers) == 1 and not worker.done()
        coordinator.down = False
        await _until(lambda: len(servers) == 2 or worker.done(), "a new worker serves")
        assert not worker.done(), worker
        second = servers[1]
        assert second.worker_id != first.worker_id
        assert second.address == first.address
        # Fencing: the old worker served nothing any more when the new one started.
        assert when_ready == [(0, True)]
        # Its lease was revoked, not waited out: the coordinator had renewed it meanwhile.
        assert await coordinator.get(paths.server(first.worker_id)) is None
        assert await coordinator.get(paths.server(second.worker_id)) is not None
        assert await coordinator.get(paths.claim(mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID)) is None

        await master.assign()
        assert {t for _, t in second.tablets} >= {mt.ROOT_TABLET_ID}
        root = await coordinator.get(paths.claim(mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID))
        assert second.lease is not None
        assert root is not None and root.lease_id == second.lease.id
        assert not first.tablets
        # Each warm-up ran before its worker's lease was granted.
        assert len(warm_ups) == 2
        assert warm_ups[0] <= granted_at(first.lease) < warm_ups[1] <= granted_at(second.lease)

        # The old identity is fenced for good.
        with pytest.raises(NotServing):
            first.tablet(mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID)
        zombie = [Cell("f", b"c", 1, b"zombie")]
        with pytest.raises(Unavailable, match="lease"):
            await old_log.append(mt.METADATA_TABLE_ID, b"zombie", zombie)
        with pytest.raises(Closed):
            await old_log.writer.append(mt.METADATA_TABLE_ID, b"zombie", zombie)
        # The root tablet's new owner recovered it from the old log as from a dead worker's:
        # the log ends in recovery's fence (an empty segment), past which nothing is durable.
        store = open_store(f"file://{tmp_path / 'objects'}")
        try:
            ref = old_log.log_ref
            numbers = await list_segments(store, ref.worker_id, ref.incarnation)
            assert numbers, "the old worker logged nothing: nothing to recover"
            fence = await store.get(log_segment_key(ref.worker_id, ref.incarnation, numbers[-1]))
            assert fence == b""
        finally:
            await store.close()
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 60)
        await master.close()
        await transport.close()
        await coordinator.close()


async def test_a_master_that_gave_up_its_lease_rejoins_and_leads_again(tmp_path: Path) -> None:
    """With ``rejoin``, a master whose lease ended by its own clock while etcd had no quorum
    stops leading (its resignation fails: etcd is unreachable) and, in the same process, waits
    for etcd, ends the old lease there (its election key goes with it at once: the clock
    stands still, so the coordinator would not have ended it, and a candidate behind that key
    would wait for ever) and campaigns again under a new one, on the same address: alone, it
    leads again."""
    clock = ManualClock()
    coordinator = _Recording(clock)
    (tmp_path / "objects").mkdir()
    addresses: list[str] = []
    stop = asyncio.Event()
    master = asyncio.create_task(
        run_master(
            coordinator,
            MasterOptions(lease=LeaseOptions(ttl=10.0), probe_interval=None),
            store_url=f"file://{tmp_path / 'objects'}",
            stop=stop,
            ready=addresses.append,
            rejoin=True,
        )
    )
    election = coordinator.election(paths.MASTER_ELECTION)

    async def leader_lease(not_: int | None = None) -> int:
        """The leader's lease id, once there is a leader whose lease is not ``not_``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while (kv := await election.leader()) is None or kv.lease_id == not_:
            assert loop.time() < end, "no new leader within 60 s"
            await asyncio.sleep(0.02)
        return kv.lease_id

    try:
        await _until(lambda: bool(addresses) or master.done(), "the master serves")
        assert not master.done(), master
        first = await leader_lease()
        [lease] = [g for g in coordinator.granted if g.id == first]
        _lose_answers(lease)
        coordinator.down = True
        await _outlive(clock, lease)
        await _until(lambda: "revoke_lease" in coordinator.refused, "it waits for etcd")
        assert len(addresses) == 1 and not master.done()
        coordinator.down = False
        await _until(lambda: len(addresses) == 2 or master.done(), "the master serves again")
        assert not master.done(), master
        assert addresses[1] == addresses[0]
        assert await leader_lease(not_=first) == coordinator.granted[-1].id
        assert first not in {kv.lease_id for kv in await coordinator.get_prefix("")}
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(master, return_exceptions=True), 60)
        await coordinator.close()
