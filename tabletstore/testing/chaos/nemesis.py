"""The chaos nemesis: a seeded schedule of faults, each applied, held, healed and recorded.

The schedule (when, and which kind) is drawn up front from ``random.Random(seed)``, so two runs
with one seed inject the same faults at the same offsets; the victim of a worker fault is drawn
from the same RNG among the live workers that serve tablets of the chaos table at that moment
(which depends on the run). Kinds (:data:`FAULTS`):

* ``kill_worker``: SIGKILL a worker serving chaos tablets; a replacement is started. Recorded
  as a :class:`~tabletstore.testing.chaos.checker.Kill` with the tablets it held, for the
  recovery measurement.
* ``kill_master``: SIGKILL the elected master; a new standby is started.
* ``restart_etcd``: SIGKILL etcd and start it again (same ports, same data directory).
* ``pause_worker``: SIGSTOP a worker serving chaos tablets for 2.5 lease periods, then
  SIGCONT it: a zombie that must acknowledge nothing for the tablets that moved meanwhile.
* ``pause_s3``: SIGSTOP the S3 server (moto or SeaweedFS) for a few seconds, then SIGCONT
  (moto keeps its data in memory, so S3 is "stopped" this way, never restarted).
* ``s3_faults``: for a few seconds the fault proxy answers some requests with 503 SlowDown,
  holds some past the client's read timeout, and answers some applied PUTs with 500.
* ``clock_jump``: step the wall clock of a worker serving chaos tablets :data:`CLOCK_STEP`
  seconds forward, a lease period later as far back of the true time, a lease period later
  to the true time again (``--clock-step-file``; the monotonic clock is never stepped, as on
  Linux). Leases read the monotonic clock, so the worker neither loses its lease early nor
  holds it late; the writes it stamps itself (the transactors' registers) must stay in
  order per cell, or the checker finds a later put hidden behind an earlier one.
* ``s3_503_storm``: for :data:`STORM` seconds (a minute; the Nemesis's ``storm``) the fault
  proxy answers half of all requests ``503 SlowDown``, as S3 does when a prefix is throttled: the retrying store backs
  off and retries; what still fails after its retries must fail the operation, never
  acknowledge it, and the cluster must serve normally once the storm passes.
* ``kill_sorter``: SIGKILL a worker serving chaos tablets (its log is then sorted, §6), and
  as soon as the master planned that sort, claim a task as a sorter that dies mid-task: the
  claim is attached to a lease nobody keeps alive, and the task writes its runs but dies
  before its manifest. The live workers must take the task over once that lease ends (and
  find the dead sorter's runs equal to theirs); the new owners meanwhile wait at most their
  ``sort_wait`` and read that task's segments themselves.
* ``sort_twice``: SIGKILL a worker serving chaos tablets and run every sort task of its log a
  second time, alongside the live workers' runs (a retried function, a slow duplicate).
  A duplicate that finds different bytes is Corruption, recorded as a nemesis error.

* ``partition_worker_etcd``: cut a worker serving chaos tablets off from etcd (its own link of
  the partitioning proxy) for 2.5 lease periods while it still reaches S3: the zombie the
  fencing exists for. Its lease ends, the master gives its tablets to others, and it must
  acknowledge nothing for them after its lease ended (its own clock stops it first; a write
  that slipped through would be refused by the fenced log, §5.2).
* ``partition_worker_s3``: cut a worker serving chaos tablets off from S3 for 6 s while its
  lease stays alive: its writes fail or time out, none may be acknowledged without being in
  its log, and it must serve again once S3 is back.
* ``partition_master_etcd``: cut the elected master off from etcd for 2.5 lease periods: it
  loses the master lock, a standby takes over, and the old one must stop acting as master.

* ``kill_etcd_leader`` (etcd as three members): SIGKILL the raft leader, start it again 5 s
  later with the same data: the others elect a new leader, leases and records survive.
* ``etcd_quorum_loss`` (etcd as three members): SIGKILL a majority of the members for 10 s,
  then start them again: the remaining member serves nothing (no read, no write, no lease
  renewal), so every lease ends; the cluster must come back without losing a write.
* ``replace_etcd_member`` (etcd as three members): crash a member, remove it through the
  member API, add a fresh one with a new data directory on the same client port: it catches
  up from the leader, and the cluster serves throughout (two members of three keep quorum).

After each fault is healed the cluster is topped up: workers and masters that died (killed, or
one run with ``--no-rejoin`` that lost its lease) are replaced, so the run keeps its size; one
whose lease ended joins again in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tabletstore.cli.localstack import ProcessRecord
from tabletstore.commitlog.runs import SortPlan
from tabletstore.commitlog.sorting import load_plan, run_sort_task, task_done
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator, Put, absent
from tabletstore.errors import Unavailable
from tabletstore.master.log_recovery import MIN_TABLETS_TO_SORT
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.layout import RECOVERY
from tabletstore.testing.chaos.chaos_cluster import ChaosCluster
from tabletstore.testing.chaos.checker import Kill
from tabletstore.testing.chaos.history import Fault, History

__all__ = [
    "CLOCK_FAULTS",
    "FAULTS",
    "MEMBER_FAULTS",
    "PARTITION_FAULTS",
    "PROCESS_FAULTS",
    "STORM_FAULTS",
    "Nemesis",
    "Scheduled",
    "faults_for",
    "schedule",
]

#: Crashes and pauses of processes, S3's errors, and the sort faults.
PROCESS_FAULTS = (
    "kill_worker",
    "kill_master",
    "restart_etcd",
    "pause_worker",
    "pause_s3",
    "s3_faults",
    "kill_sorter",
    "sort_twice",
)
#: A worker's wall clock stepped (its own group: the short run's schedule stays as it was).
CLOCK_FAULTS = ("clock_jump",)
#: The long S3 fault (a minute), apart so a short run can leave it out.
STORM_FAULTS = ("s3_503_storm",)
PARTITION_FAULTS = ("partition_worker_etcd", "partition_worker_s3", "partition_master_etcd")
#: The faults that need etcd as several members (``ChaosCluster(etcd_members=3)``).
MEMBER_FAULTS = ("kill_etcd_leader", "etcd_quorum_loss", "replace_etcd_member")
FAULTS = PROCESS_FAULTS + CLOCK_FAULTS + STORM_FAULTS + PARTITION_FAULTS + MEMBER_FAULTS
#: Seconds a majority of etcd's members stays down in ``etcd_quorum_loss``.
QUORUM_LOSS = 10.0
#: Seconds an ``s3_503_storm`` lasts, and the share of requests it answers 503 SlowDown.
STORM = 60.0
#: Seconds a ``clock_jump`` steps a worker's wall clock, forward and then back.
CLOCK_STEP = 30.0
STORM_SLOWDOWN = 0.5


def faults_for(etcd_members: int) -> tuple[str, ...]:
    """Every fault that applies to a cluster whose etcd has ``etcd_members`` members."""
    return tuple(f for f in FAULTS if etcd_members > 1 or f not in MEMBER_FAULTS)


#: Seconds the sort faults wait for the dead worker's sort to appear.
SORT_WAIT = 20.0


@dataclass(frozen=True)
class Scheduled:
    at: float  # seconds after the workload started
    kind: str


def schedule(
    seed: int,
    duration: float,
    kinds: Sequence[str],
    *,
    first: float = 5.0,
    gap: tuple[float, float] = (8.0, 14.0),
) -> list[Scheduled]:
    """Faults from ``first`` seconds on, ``gap`` seconds apart (uniform), kinds drawn so every
    kind comes once before any comes twice (a shuffled round-robin)."""
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds {unknown}; choose from {', '.join(FAULTS)}")
    rng = random.Random(seed)
    out: list[Scheduled] = []
    at = first
    bag: list[str] = []
    while at < duration:
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        out.append(Scheduled(round(at, 2), bag.pop()))
        at += rng.uniform(*gap)
    return out


class Nemesis:
    """Runs a schedule against a cluster. ``holders`` returns, when asked, worker address ->
    tablet indexes it serves (the location poller's latest view)."""

    def __init__(
        self,
        cluster: ChaosCluster,
        history: History,
        plan: Sequence[Scheduled],
        *,
        seed: int,
        holders: Callable[[], dict[str, set[int]]],
        worker_ids: Callable[[], dict[str, str]],
        master_address: Callable[[], Awaitable[str | None]],
        coordinator: Coordinator | None = None,
        storm: float = STORM,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.plan = list(plan)
        self.rng = random.Random(seed + 1)
        self.holders = holders
        self.worker_ids = worker_ids
        self.master_address = master_address
        #: For the sort faults (they act as a sorter: claims and published tasks).
        self.coordinator = coordinator
        #: Seconds an ``s3_503_storm`` lasts.
        self.storm = storm
        self.kills: list[Kill] = []
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []

    async def run(self, started: float) -> None:
        """Apply the plan; ``started`` is the history time the workload started at."""
        for item in self.plan:
            delay = started + item.at - self.history.now()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await getattr(self, item.kind)()
                self.counts[item.kind] = self.counts.get(item.kind, 0) + 1
            except Exception as exc:  # a fault that could not be applied is reported, not fatal
                self.errors.append(f"{item.kind} at {item.at}s: {type(exc).__name__}: {exc}")
            await self.top_up()

    async def top_up(self) -> None:
        """Replace dead processes (:meth:`ChaosCluster.top_up`); failed starts are errors."""
        self.errors.extend(await asyncio.to_thread(self.cluster.top_up))

    def _victim(self, *, sorted_log: bool = False) -> tuple[ProcessRecord, set[int]] | None:
        held = self.holders()
        candidates = [(r, held[r.url]) for r in self.cluster.live_workers() if held.get(r.url)]
        if sorted_log:
            # The master sorts only a log that MIN_TABLETS_TO_SORT tablets or more list (one
            # tablet's new owner reads it once either way): a sort fault on a worker with
            # one chaos tablet waited for a plan that never came ("no sort plan in 20 s").
            wide = [c for c in candidates if len(c[1]) >= MIN_TABLETS_TO_SORT]
            candidates = wide or candidates
        if not candidates:
            return None
        return self.rng.choice(sorted(candidates, key=lambda c: c[0].role))

    # ------------------------------------------------------------------ the faults

    async def kill_worker(self) -> None:
        fault, _ = await self._kill_a_worker("kill_worker")
        self.history.heal(fault)

    async def _kill_a_worker(self, kind: str) -> tuple[Fault, str]:
        victim = self._victim(sorted_log=kind in ("kill_sorter", "sort_twice"))
        if victim is None:
            raise RuntimeError("no live worker serves chaos tablets")
        record, tablets = victim
        worker_id = self.worker_ids().get(record.url, record.url)
        fault = self.history.fault(kind, record.role, tablets=sorted(tablets))
        await asyncio.to_thread(self.cluster.kill, record)
        self.kills.append(Kill(fault.start, worker_id, frozenset(tablets)))
        return fault, worker_id

    async def kill_sorter(self) -> None:
        coord = self.coordinator
        assert coord is not None, "the sort faults need the coordinator"
        fault, worker_id = await self._kill_a_worker("kill_sorter")
        store = open_store(self.cluster.direct_store_url)
        try:
            plan = await self._wait_for_plan(store, worker_id)
            for task in plan.tasks:
                # A lease nobody keeps alive: this sorter "dies" holding the claim, which the
                # live workers' sorters honour until the lease ends.
                lease = await coord.grant_lease(self.cluster.lease_ttl)
                claim = paths.sorter(plan.worker_id, plan.incarnation, task.first)
                won = await coord.txn(
                    [absent(claim)], [Put(claim, b"nemesis", lease_id=lease.id)], []
                )
                if not won.succeeded or await task_done(store, plan, task):
                    continue  # a live worker was quicker: try the next task
                with contextlib.suppress(_Died):
                    await run_sort_task(_DiesBeforeManifest(store), plan, task)
                self.history.heal(fault, sorter_died_on=f"{worker_id}@{task.first}")
                return
            # The new owner sorts the task reserved for it at once (owner affinity), so it may
            # well finish before this sorter can claim it: the fault is then a worker kill.
            self.history.heal(fault, sorter_died_on=None, sorted_first_by="a live worker")
        finally:
            await store.close()

    async def _wait_for_plan(self, store: ObjectStore, worker_id: str) -> SortPlan:
        """The sort plan of ``worker_id``'s current log, once the master made it."""
        assert self.coordinator is not None
        kv = await self.coordinator.get(paths.setting(f"incarnation.{worker_id}"))
        if kv is None:
            raise RuntimeError(f"no incarnation recorded for {worker_id}")
        incarnation = int(kv.value)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SORT_WAIT
        plan = await load_plan(store, worker_id, incarnation)
        while plan is None and loop.time() < deadline:
            await asyncio.sleep(0.01)
            plan = await load_plan(store, worker_id, incarnation)
        if plan is None:
            raise RuntimeError(f"no sort plan for {worker_id}/{incarnation} in {SORT_WAIT} s")
        return plan

    async def sort_twice(self) -> None:
        coord = self.coordinator
        assert coord is not None, "the sort faults need the coordinator"
        fault, worker_id = await self._kill_a_worker("sort_twice")
        store = open_store(self.cluster.direct_store_url)
        try:
            plan = await self._wait_for_plan(store, worker_id)
            await asyncio.gather(*(run_sort_task(store, plan, t) for t in plan.tasks))
            self.history.heal(fault, duplicated=len(plan.tasks))
        finally:
            await store.close()

    async def kill_master(self) -> None:
        address = await self.master_address()
        leader = next((r for r in self.cluster.live_masters() if r.url == address), None)
        if leader is None:
            raise RuntimeError(f"no live master process at the leader's address {address}")
        fault = self.history.fault("kill_master", leader.role)
        await asyncio.to_thread(self.cluster.kill, leader)
        self.history.heal(fault)

    async def restart_etcd(self) -> None:
        fault = self.history.fault("restart_etcd", "etcd")
        down = await asyncio.to_thread(self.cluster.restart_etcd)
        self.history.heal(fault, unreachable_seconds=round(down, 2))

    async def pause_worker(self) -> None:
        victim = self._victim()
        if victim is None:
            raise RuntimeError("no live worker serves chaos tablets")
        record, tablets = victim
        fault = self.history.fault("pause_worker", record.role, tablets=sorted(tablets))
        self.cluster.pause(record)
        try:
            await asyncio.sleep(self.cluster.lease_ttl * 2.5)
        finally:
            self.cluster.resume(record)
        self.history.heal(fault)

    async def partition_worker_etcd(self) -> None:
        await self._partition_worker("etcd", self.cluster.lease_ttl * 2.5)

    async def partition_worker_s3(self) -> None:
        await self._partition_worker("s3", 6.0)

    async def _partition_worker(self, server: str, seconds: float) -> None:
        victim = self._victim()
        if victim is None:
            raise RuntimeError("no live worker serves chaos tablets")
        record, tablets = victim
        kind = f"partition_worker_{server}"
        fault = self.history.fault(kind, record.role, tablets=sorted(tablets))
        await self._cut(record, server, seconds)
        self.history.heal(fault, still_running=self.cluster.running(record))

    async def partition_master_etcd(self) -> None:
        address = await self.master_address()
        leader = next((r for r in self.cluster.live_masters() if r.url == address), None)
        if leader is None:
            raise RuntimeError(f"no live master process at the leader's address {address}")
        fault = self.history.fault("partition_master_etcd", leader.role)
        await self._cut(leader, "etcd", self.cluster.lease_ttl * 2.5)
        new = await self.master_address()
        self.history.heal(fault, master_after=new, still_running=self.cluster.running(leader))

    async def _cut(self, record: ProcessRecord, server: str, seconds: float) -> None:
        await asyncio.to_thread(self.cluster.cut, record, server)
        try:
            await asyncio.sleep(seconds)
        finally:
            await asyncio.to_thread(self.cluster.cut, record, server, cut=False)

    async def kill_etcd_leader(self) -> None:
        c = self.cluster
        if c.etcd_members < 3:
            raise RuntimeError("kill_etcd_leader needs etcd as three members or more")
        leader = await asyncio.to_thread(c.etcd_leader)
        fault = self.history.fault("kill_etcd_leader", c.members[leader].role)
        await asyncio.to_thread(c.kill_members, [leader])
        try:
            await asyncio.sleep(5.0)
        finally:
            await asyncio.to_thread(c.restart_members, [leader])
        new = await asyncio.to_thread(c.etcd_leader)
        self.history.heal(fault, leader_after=c.members[new].role)

    async def etcd_quorum_loss(self) -> None:
        c = self.cluster
        if c.etcd_members < 3:
            raise RuntimeError("etcd_quorum_loss needs etcd as three members or more")
        down = sorted(self.rng.sample(range(c.etcd_members), c.etcd_members // 2 + 1))
        fault = self.history.fault(
            "etcd_quorum_loss", ",".join(c.members[i].role for i in down), seconds=QUORUM_LOSS
        )
        await asyncio.to_thread(c.kill_members, down)
        try:
            await asyncio.sleep(QUORUM_LOSS)
        finally:
            await asyncio.to_thread(c.restart_members, down)
        self.history.heal(fault)

    async def replace_etcd_member(self) -> None:
        c = self.cluster
        if c.etcd_members < 3:
            raise RuntimeError("replace_etcd_member needs etcd as three members or more")
        index = self.rng.randrange(c.etcd_members)
        fault = self.history.fault("replace_etcd_member", c.members[index].role)
        await asyncio.to_thread(c.replace_member, index)
        self.history.heal(fault, new_member=c.members[index].role)

    async def pause_s3(self) -> None:
        server = self.cluster.s3
        assert server is not None
        fault = self.history.fault("pause_s3", self.cluster.store)
        self.cluster.pause(server)
        try:
            await asyncio.sleep(6.0)
        finally:
            self.cluster.resume(server)
        self.history.heal(fault)

    async def s3_faults(self) -> None:
        rates = {"slowdown": 0.05, "timeout": 0.01, "put_error": 0.05, "hold": 6.0}
        fault = self.history.fault("s3_faults", "proxy", **rates)
        before = await asyncio.to_thread(self.cluster.s3_stats)
        await asyncio.to_thread(lambda: self.cluster.s3_faults(**rates))
        try:
            await asyncio.sleep(8.0)
        finally:
            await asyncio.to_thread(self.cluster.s3_faults)
        after = await asyncio.to_thread(self.cluster.s3_stats)
        injected = {
            k: after.get(k, 0) - before.get(k, 0) for k in ("slowdown", "timeout", "put_error")
        }
        self.history.heal(fault, injected=injected)

    async def clock_jump(self) -> None:
        victim = self._victim()
        if victim is None:
            raise RuntimeError("no live worker serves chaos tablets")
        record, tablets = victim
        fault = self.history.fault(
            "clock_jump", record.role, tablets=sorted(tablets), step=CLOCK_STEP
        )
        hold = self.cluster.lease_ttl * 2
        try:
            for offset in (CLOCK_STEP, -CLOCK_STEP):
                await asyncio.to_thread(self.cluster.step_clock, record, offset)
                await asyncio.sleep(hold)
        finally:
            await asyncio.to_thread(self.cluster.step_clock, record, 0.0)
        self.history.heal(fault, still_running=self.cluster.running(record))

    async def s3_503_storm(self) -> None:
        fault = self.history.fault(
            "s3_503_storm", "proxy", slowdown=STORM_SLOWDOWN, seconds=self.storm
        )
        before = await asyncio.to_thread(self.cluster.s3_stats)
        await asyncio.to_thread(lambda: self.cluster.s3_faults(slowdown=STORM_SLOWDOWN))
        try:
            await asyncio.sleep(self.storm)
        finally:
            await asyncio.to_thread(self.cluster.s3_faults)
        after = await asyncio.to_thread(self.cluster.s3_stats)
        self.history.heal(
            fault,
            requests=after.get("requests", 0) - before.get("requests", 0),
            slowdown=after.get("slowdown", 0) - before.get("slowdown", 0),
        )


class _Died(Unavailable):
    """The nemesis's sorter "dies" here."""


class _DiesBeforeManifest:
    """A store through which a sort task writes its runs and dies before its manifest."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner
        self.url = inner.url

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def create(self, key: str, data: bytes) -> None:
        if key.startswith(RECOVERY) and key.endswith("/done.json"):
            raise _Died("the sorter died before its manifest")
        await self._inner.create(key, data)
