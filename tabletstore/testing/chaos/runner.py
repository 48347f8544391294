"""One chaos run, start to verdict: cluster up, workload and nemesis, heal, final read, check.

:func:`run_chaos` starts a :class:`~tabletstore.testing.chaos.chaos_cluster.ChaosCluster`, creates
the chaos table (six tablets, never split; the master may merge small neighbours, after which
one tablet serves two of the six row ranges), runs the workload for ``seconds`` while the
nemesis applies its schedule and a poller records every second where each row range is served,
then stops the workload, heals everything (S3 faults off, paused processes resumed, dead ones
replaced), waits until every tablet is served again, reads every row once more (the final read), and
hands the history to the checker together with the evidence for double-serving
(:func:`attribute_values`: which worker's commit log holds each value). The report carries the
verdict and prints the summary ``bench/chaos.py`` shows; the full history is saved as JSON.
With ``changes`` the table keeps a change retention and a follower reads its change stream
through the run, checked against the history at the end (:mod:`.change_follower`); with
``replicate`` also a replica cluster follows the table through the replicator, checked against
the source's stream and cells at the end (:mod:`.replica`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tabletstore.client.change_plan import Change
from tabletstore.client.client import AsyncClient
from tabletstore.client.table import AsyncTable
from tabletstore.clock import SystemClock
from tabletstore.commitlog.format import decode_segment
from tabletstore.coordination import open_coordinator, paths
from tabletstore.coordination.base import Coordinator
from tabletstore.embedded import connect_async
from tabletstore.errors import AlreadyExists, Corruption, TabletStoreError, Unavailable
from tabletstore.master.verify import verify
from tabletstore.master.verify_plan import VerifyReport
from tabletstore.metadata.catalog import Catalog
from tabletstore.storage_s3 import layout, open_store
from tabletstore.testing.chaos.change_follower import (
    RETENTION,
    ChangeFollower,
    ChangeVerdict,
    check_changes,
)
from tabletstore.testing.chaos.chaos_cluster import ENV, GC_GRACE, ChaosCluster
from tabletstore.testing.chaos.checker import Verdict, check
from tabletstore.testing.chaos.collection_log import CollectionSeen
from tabletstore.testing.chaos.collection_log import read as read_collection
from tabletstore.testing.chaos.history import History, Outcome
from tabletstore.testing.chaos.nemesis import FAULTS, PARTITION_FAULTS, STORM, Nemesis, schedule
from tabletstore.testing.chaos.replica import (
    ReplicaCluster,
    ReplicaVerdict,
    check_replica,
    scan_cells,
)
from tabletstore.testing.chaos.workload import (
    FAMILY,
    QUALIFIER,
    SPLIT_KEYS,
    TXN_CELLS,
    TXN_ROWS,
    Workload,
    tablet_of,
)

__all__ = [
    "ChaosConfig",
    "ChaosReport",
    "attribute_values",
    "linearizability_line",
    "run_chaos",
    "violation_lines",
]

TABLE = "chaos"
#: The change-stream poll of a ``replicate`` run's readers (the source's follower, the
#: replicator, the replica's follower): each lists the bucket once per partition per poll,
#: and three readers of six partitions at 0.5 s overload one moto server on a loaded machine.
REPLICATE_POLL = 2.0
#: Seconds the healed cluster gets to serve every tablet again before the final read.
HEAL_DEADLINE = 120.0


@dataclass(frozen=True)
class ChaosConfig:
    seconds: float
    seed: int
    directory: Path
    faults: tuple[str, ...] = FAULTS
    workers: int = 3
    masters: int = 2
    lease_ttl: float = 3.0
    #: The cluster over mutual TLS with etcd's own users (ChaosCluster's ``tls``).
    tls: bool = False
    writers: int = 8
    readers: int = 3
    #: The S3 server: "moto" or "seaweedfs" (chaos_cluster.STORES).
    store: str = "moto"
    #: etcd's members: 1, or 3 (or 5) for the member faults (nemesis.MEMBER_FAULTS).
    etcd_members: int = 1
    #: Clients of the shared rows' single-row transactions (workload.py).
    transactors: int = 4
    first_fault: float = 5.0
    gap: tuple[float, float] = (8.0, 14.0)
    #: Seconds an ``s3_503_storm`` lasts (nemesis.STORM: a minute).
    storm: float = STORM
    #: The masters' garbage-collection grace (chaos_cluster.GC_GRACE: five minutes).
    gc_grace: float = GC_GRACE
    #: The chaos table keeps changes and a follower reads its change stream through the run
    #: (change_follower.py).
    changes: bool = False
    #: A replica cluster follows the chaos table through the replicator (replica.py); the
    #: table keeps changes and the change-stream follower runs too.
    replicate: bool = False


@dataclass
class ChaosReport:
    config: ChaosConfig
    verdict: Verdict
    faults: dict[str, int]
    s3_injected: dict[str, int]
    nemesis_errors: list[str]
    history_path: Path
    setup_errors: list[str] = field(default_factory=list)
    unreadable_segments: int = 0
    #: ``tabletstore verify`` of the healed cluster's bucket (None: it could not run).
    verify: VerifyReport | None = None
    #: The change-stream check of a ``changes`` run (None: not one).
    changes: ChangeVerdict | None = None
    #: The replica's check of a ``replicate`` run (None: not one).
    replica: ReplicaVerdict | None = None
    #: What the masters' garbage collection deleted (their logs).
    collection: CollectionSeen | None = None

    @property
    def ok(self) -> bool:
        """No lost write, wrong read, double-serving or linearizability violation, and no
        damage the bucket verifier found."""
        return (
            self.verdict.ok
            and (self.verify is None or not self.verify.findings)
            and (self.changes is None or self.changes.ok)
            and (self.replica is None or self.replica.ok)
        )

    def summary(self) -> str:
        v = self.verdict
        ops = v.operations
        lines = [
            f"chaos: {self.config.seconds:.0f} s, seed {self.config.seed}, "
            f"S3 {self.config.store}, etcd members {self.config.etcd_members}, faults {','.join(self.config.faults)}",
            "operations: "
            + ", ".join(f"{k} {n}" for k, n in sorted(ops.items()))
            + f" (total {sum(ops.values())})",
            "faults: "
            + (", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())) or "none")
            + "; S3 faults injected: "
            + (", ".join(f"{k} {n}" for k, n in sorted(self.s3_injected.items())) or "none"),
            f"lost: {len(v.lost)}"
            + (f" (and {len(v.unread)} rows never read after healing)" if v.unread else ""),
            f"wrong reads: {len(v.wrong_reads)}",
            f"double-serving: {len(v.double_serving)} "
            f"(acknowledged writes attributed to one worker's log: {v.attributed})",
        ]
        lines.append(linearizability_line(v))
        lines.append(
            f"verify: {len(self.verify.findings)} findings, {len(self.verify.orphans)} orphans"
            if self.verify is not None
            else "verify: could not run"
        )
        if self.collection is not None:
            lines.append(self.collection.line())
        if self.changes is not None:
            lines.extend(self.changes.lines())
        if self.replica is not None:
            lines.extend(self.replica.lines())
        median, worst, never = v.recovery_summary()
        if v.recovery:
            lines.append(
                f"recovery per worker kill: median {_s(median)}, max {_s(worst)} "
                f"({len(v.recovery)} kills, {never} never recovered): "
                + ", ".join(_s(r) for r in v.recovery)
            )
        else:
            lines.append("recovery per worker kill: no worker was killed")
        if v.unaffected_gaps:
            lines.append(
                "longest write gap of the tablets not on the killed worker, per kill: "
                + ", ".join(_s(g) for g in v.unaffected_gaps)
            )
        lines.append(
            "longest write gap per tablet: "
            + ", ".join(f"t{t} {_s(g)} at {a:.0f}s" for t, (g, a) in sorted(v.write_gaps.items()))
        )
        for title, anomalies in (
            ("LOST", v.lost),
            ("WRONG READ", v.wrong_reads),
            ("DOUBLE-SERVING", v.double_serving),
        ):
            for a in anomalies[:15]:
                lines.append(
                    f"  {title} {a.row} at {a.at:.1f}s: {a.detail} (after {a.after_fault})"
                )
            if len(anomalies) > 15:
                lines.append(f"  ... and {len(anomalies) - 15} more {title.lower()}")
        if v.unread:
            lines.append(f"  UNREAD after healing: {', '.join(v.unread[:15])}")
        lines.extend(violation_lines(v))
        for finding in () if self.verify is None else self.verify.findings[:15]:
            lines.append(f"  VERIFY {finding.line()}")
        for err in self.nemesis_errors + self.setup_errors:
            lines.append(f"  nemesis/harness: {err}")
        if self.unreadable_segments:
            lines.append(
                f"  commit-log segments the attribution could not decode: "
                f"{self.unreadable_segments}"
            )
        lines.append(f"history: {self.history_path}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        v = self.verdict
        median, worst, never = v.recovery_summary()
        return {
            "seconds": self.config.seconds,
            "seed": self.config.seed,
            "store": self.config.store,
            "faults_enabled": list(self.config.faults),
            "operations": v.operations,
            "faults": self.faults,
            "s3_injected": self.s3_injected,
            "lost": len(v.lost),
            "wrong_reads": len(v.wrong_reads),
            "double_serving": len(v.double_serving),
            "verify_findings": None if self.verify is None else len(self.verify.findings),
            "recovery": v.recovery,
            "recovery_median": median,
            "recovery_max": worst,
            "never_recovered": never,
            "unaffected_gaps": v.unaffected_gaps,
            "write_gaps": {str(t): g for t, g in v.write_gaps.items()},
            "anomalies": [vars(a) for a in (*v.lost, *v.wrong_reads, *v.double_serving)],
            "linearizability_violations": [vars(x) for x in v.linearizability.violations],
            "linearizability_undecided": v.linearizability.undecided,
            "nemesis_errors": self.nemesis_errors + self.setup_errors,
            "history": str(self.history_path),
            "changes": None if self.changes is None else self.changes.to_json(),
            "replica": None if self.replica is None else self.replica.to_json(),
            "collection": None if self.collection is None else asdict(self.collection),
        }


def linearizability_line(v: Verdict) -> str:
    lin = v.linearizability
    return (
        f"linearizability violations: {len(lin.violations)} ({lin.cells} cells, "
        f"{lin.operations} operations; {len(lin.undecided)} cells undecided)"
    )


def violation_lines(v: Verdict, limit: int = 5) -> list[str]:
    """Each violation (the first ``limit``) with the cell's operations around it."""
    out: list[str] = []
    for x in v.linearizability.violations[:limit]:
        out.append(f"  NOT LINEARIZABLE {x.cell} at {x.at:.1f}s: {x.detail}")
        out.extend(f"    {line}" for line in x.history)
    if len(v.linearizability.violations) > limit:
        out.append(f"  ... and {len(v.linearizability.violations) - limit} more cells")
    if v.linearizability.undecided:
        out.append(f"  undecided (search budget spent): {', '.join(v.linearizability.undecided)}")
    return out


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f}s"


def _kept_segments(kept: Path | None) -> dict[str, Path]:
    """The log segments the S3 fault proxy kept a copy of (s3proxy ``--keep-logs``), by key."""
    if kept is None or not kept.is_dir():
        return {}
    return {
        layout.LOGS + path.relative_to(kept).as_posix(): path
        for path in kept.rglob("*.log")
        if not path.name.startswith(".")
    }


async def attribute_values(
    store_url: str, kept: Path | None = None
) -> tuple[dict[bytes, frozenset[str]], int]:
    """value of ``f:c`` -> the worker ids whose commit logs hold it, from every segment in the
    bucket and every copy the S3 fault proxy kept in ``kept`` (garbage collection deletes
    trimmed and recovered logs during a run; a segment is never rewritten, so a copy is the
    segment); and how many segments could not be decoded."""
    store = open_store(store_url)
    found: dict[bytes, set[str]] = {}
    bad = 0
    copies = _kept_segments(kept)
    try:
        keys = sorted({info.key async for info in store.list(layout.LOGS)} | set(copies))
        sem = asyncio.Semaphore(16)

        async def one(key: str) -> None:
            nonlocal bad
            try:
                where = layout.parse_log_segment_key(key)
            except TabletStoreError:
                return
            async with sem:
                copy = copies.get(key)
                data = (
                    await asyncio.to_thread(copy.read_bytes)
                    if copy is not None
                    else await store.get(key)
                )
            if not data:
                return  # a fence, or deleted since the listing
            try:
                contents = decode_segment(data, where=key)
            except Corruption:
                bad += 1
                return
            for record in contents.records:
                for cell in record.cells:
                    if cell.family == FAMILY and cell.qualifier == QUALIFIER and cell.value:
                        found.setdefault(cell.value, set()).add(where.worker_id)

        await asyncio.gather(*(one(k) for k in keys))
    finally:
        await store.close()
    return {v: frozenset(w) for v, w in found.items()}, bad


_LOADED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO tabletstore\.master\.master: "
    r"loaded (\S+) on (\S+) in "
)


def _covered(start: bytes, end: bytes | None) -> tuple[int, ...]:
    """The indexes (:func:`tablet_of`) of the chaos table's row ranges that a tablet
    ``[start, end)`` serves. The workers never split a chaos tablet, but the master merges two
    small neighbours once they stayed small for its ``merge_after``: the merged tablet serves
    both ranges, and each is observed where it is served, as before the merge."""
    last = len(SPLIT_KEYS) if end is None else tablet_of(end) - (end in SPLIT_KEYS)
    return tuple(range(tablet_of(start), last + 1))


class _Poller:
    """Every ``interval`` seconds: where each tablet is served, and the live workers.
    :attr:`locations` names the workers by id (a worker that rejoined after losing its lease
    is a new worker on the same address); :attr:`current`, by address; :attr:`holder`, the
    worker id holding each tablet's claim.

    A tablet counts as served (:meth:`all_served`) only when a live worker holds its claim
    and its METADATA location is that worker's address. A location alone says only where the
    last owner to take the tablet's epoch listens: a load that failed after that (its claim
    released), or a lost lease whose worker rejoined on the same address, leaves the location
    naming a live address that serves nothing."""

    def __init__(
        self,
        client: AsyncClient,
        table_id: str,
        history: History,
        *,
        claims: Coordinator | None = None,
    ) -> None:
        """``claims``: the coordinator to read the tablets' claims from (default the
        client's: one whose etcd user may not read them passes the cluster's)."""
        self.client = client
        self._claims = claims or client.catalog.coordinator
        self.table_id = table_id
        self.history = history
        self.locations: dict[int, list[tuple[float, str]]] = {}
        self.current: dict[int, str | None] = {}
        self.ids_by_address: dict[str, str] = {}
        self.live: dict[str, str] = {}
        #: Tablet index -> the worker id holding its tablet's claim (None: unclaimed).
        self.holder: dict[int, str | None] = {}
        #: Tablet id (``t00003``) -> the indexes (:func:`tablet_of`) of the row ranges it
        #: serves: one, or several once the master merged neighbours (:func:`_covered`).
        self.index_by_id: dict[str, tuple[int, ...]] = {}

    async def poll(self) -> None:
        records = await self.client.locations.tablets(self.table_id, refresh=True)
        live = await self.client.catalog.live_workers()
        claim_kvs = await self._claims.get_prefix(paths.claims_prefix(self.table_id))
        claims = {paths.parse_claim(kv.key)[1]: kv.value.decode() for kv in claim_kvs}
        now = self.history.now()
        self.live = live
        for worker_id, address in live.items():
            self.ids_by_address[address] = worker_id
        for rec in records:
            covered = _covered(rec.start_row, rec.end_row)
            self.index_by_id[rec.tablet_id] = covered
            worker = self.ids_by_address.get(rec.location or "", rec.location)
            for tablet in covered:
                self.current[tablet] = rec.location
                self.holder[tablet] = claims.get(rec.tablet_id)
                if worker is not None:
                    self.locations.setdefault(tablet, []).append((now, worker))

    async def run(self, interval: float = 1.0) -> None:
        while True:
            # The poller is an observer: a failed poll (etcd restarting, METADATA moving)
            # is simply a missing observation.
            with contextlib.suppress(TabletStoreError, OSError, TimeoutError):
                async with asyncio.timeout(5.0):
                    await self.poll()
            await asyncio.sleep(interval)

    def add_loads(self, directory: Path, t0_wall: float) -> int:
        """Add to :attr:`locations` every load the masters' logs in ``directory`` record
        (``loaded t00003 on w-… in 0.2 s``, written once the worker serves it), placed on the
        history's timeline: a tablet held for less than the poll interval (recovered onto a
        worker, then balanced away within a second) is otherwise never observed, and the
        checker would call that worker's acknowledgements double-serving. Returns how many."""
        added = 0
        for path in directory.glob("master-*.log"):
            for text in path.read_text(errors="replace").splitlines():
                m = _LOADED.match(text)
                if m is None:
                    continue
                covered = self.index_by_id.get(m.group(2), ())
                if not covered:
                    continue
                stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
                at = stamp.astimezone().timestamp() - t0_wall  # logging writes local time
                for tablet in covered:
                    self.locations.setdefault(tablet, []).append((at, m.group(3)))
                added += 1
        for seen in self.locations.values():
            seen.sort()
        return added

    def holders(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for tablet, address in self.current.items():
            if address is not None:
                out.setdefault(address, set()).add(tablet)
        return out

    def _served(self, tablet: int) -> bool:
        """Whether a live worker holds the tablet's claim at the tablet's location."""
        holder = self.holder.get(tablet)
        location = self.current.get(tablet)
        return holder is not None and location is not None and self.live.get(holder) == location

    def unserved(self) -> str:
        """What :meth:`all_served` is missing, for an error message."""
        missing = {
            t: (self.current.get(t), self.holder.get(t))
            for t in range(len(SPLIT_KEYS) + 1)
            if not self._served(t)
        }
        return (
            f"unserved tablets (index: (last location, claim holder)) {missing}, "
            f"live workers {sorted(self.live.items())}"
        )

    def all_served(self) -> bool:
        return all(self._served(t) for t in range(len(SPLIT_KEYS) + 1))


async def _verify(
    store_url: str, client: AsyncClient, errors: list[str], *, operator_url: str | None = None
) -> VerifyReport | None:
    """``tabletstore verify`` of the healed cluster's bucket, read directly (no S3 faults).
    ``operator_url``: the coordinator to read the schemas from, as an operator's verify does
    (with etcd's users on, the harness client's read-only user may not read them)."""
    coordinator = getattr(client, "coordinator", None)
    if coordinator is None:
        errors.append("verify: the harness client has no coordinator")
        return None
    operator = open_coordinator(operator_url) if operator_url is not None else None
    catalog = (
        Catalog(operator, metadata=client.locations) if operator is not None else client.catalog
    )
    store = open_store(store_url)
    try:
        return await verify(store, catalog, operator or coordinator, clock=SystemClock())
    except (TabletStoreError, OSError) as exc:
        errors.append(f"verify could not run: {exc}")
        return None
    finally:
        await store.close()
        if operator is not None:
            await operator.close()


async def _wait(check: object, deadline: float, what: str) -> None:
    end = time.monotonic() + deadline
    while True:
        assert callable(check)
        with contextlib.suppress(TabletStoreError, OSError, TimeoutError):
            if await check():
                return
        if time.monotonic() > end:
            raise TimeoutError(f"not within {deadline}s: {what}")
        await asyncio.sleep(0.5)


async def _create_table(
    client: AsyncClient, cluster: ChaosCluster, *, changes: float | None = None
) -> AsyncTable:
    """The chaos table, once the young cluster serves METADATA (on a loaded machine the first
    assignment may take longer than one request's deadline, and a worker stalled past its
    lease before the workload started gives up: it is replaced meanwhile)."""
    end = time.monotonic() + HEAL_DEADLINE
    while True:
        try:
            with contextlib.suppress(AlreadyExists):  # an earlier attempt went through
                await client.create_table(TABLE, [FAMILY], split_keys=SPLIT_KEYS, changes=changes)
            return client.table(TABLE)
        except Unavailable:
            if time.monotonic() > end:
                raise
            await asyncio.to_thread(cluster.top_up)
            await asyncio.sleep(1.0)


class _Replica:
    """A ``replicate`` run's replica (replica.py): its cluster, the replicator and its
    supervisor, a client of the replica cluster and a follower of the replica table's own
    change stream (the writes the replicator applied)."""

    def __init__(self, config: ChaosConfig, cluster: ChaosCluster) -> None:
        self.cluster = ReplicaCluster(
            config.directory / "replica", cluster.process_url, TABLE, env=ENV, poll=REPLICATE_POLL
        )
        self.client: AsyncClient | None = None
        self.follower: ChangeFollower | None = None
        self.supervisor: asyncio.Task[None] | None = None
        self.verdict = ReplicaVerdict(incomplete="the run ended before the replica was checked")

    async def start(self) -> None:
        await asyncio.to_thread(self.cluster.start)
        began = time.time()
        await asyncio.to_thread(self.cluster.start_replicator)
        self.supervisor = asyncio.create_task(self.cluster.supervise())
        self.client = await connect_async(self.cluster.url)
        await self.cluster.wait_table(self.client, HEAL_DEADLINE)
        # The replica table is made before the replicator's first write: reading its stream
        # from before that instant sees every write the replicator applied.
        self.follower = ChangeFollower(self.client.table(TABLE), began, poll=REPLICATE_POLL)
        await self.follower.start()

    async def finish(
        self, source: AsyncClient, source_changes: Sequence[Change], until: float
    ) -> ReplicaVerdict:
        """Once the replica applied every source write before ``until``: compare."""
        assert self.client is not None and self.follower is not None
        incomplete = []
        if not await self.cluster.caught_up(self.client, until, HEAL_DEADLINE):
            incomplete.append(f"the replica's progress not past the final instant within "
                              f"{HEAL_DEADLINE:.0f} s")  # fmt: skip
        # The replica's own stream past ``until``'s writes: its writes were logged after them.
        if not await self.follower.wait_complete(time.time(), HEAL_DEADLINE):
            incomplete.append("the replica's change stream not read to its end in time")
        verdict = check_replica(
            source_changes,
            self.follower.changes,
            await scan_cells(source, TABLE),
            await scan_cells(self.client, TABLE),
        )
        verdict.incomplete = "; ".join(incomplete) or None
        verdict.replicators_started = self.cluster.replicators_started
        return verdict

    async def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.supervisor
        if self.follower is not None:
            await self.follower.stop()
        if self.client is not None:
            await self.client.close()
        await asyncio.to_thread(self.cluster.close)


async def run_chaos(config: ChaosConfig) -> ChaosReport:
    """One run (module docstring). Processes are stopped whatever happens."""
    plan = schedule(
        config.seed, config.seconds, config.faults, first=config.first_fault, gap=config.gap
    )
    cluster = ChaosCluster(
        config.directory,
        workers=config.workers,
        masters=config.masters,
        lease_ttl=config.lease_ttl,
        seed=config.seed,
        tls=config.tls,
        etcd_members=config.etcd_members,
        partitionable=bool(set(config.faults) & set(PARTITION_FAULTS)),
        store=config.store,
        steppable_clocks="clock_jump" in config.faults,
        gc_grace=config.gc_grace,
    )
    # The harness's own S3 client (the attribution's reads from the S3 server) uses moto's dummy
    # credentials, as the processes do; the caller's environment is restored afterwards.
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        return await _run_cluster(config, plan, cluster)
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


async def _run_cluster(
    config: ChaosConfig, plan: Sequence[object], cluster: ChaosCluster
) -> ChaosReport:
    await asyncio.to_thread(cluster.start)
    history = History()
    setup_errors: list[str] = []
    try:
        client = await connect_async(cluster.client_url, tls=cluster.client_tls)
        try:
            return await _run(config, plan, cluster, client, history, setup_errors)
        finally:
            await client.close()
    finally:
        await asyncio.to_thread(cluster.close)


async def _run(
    config: ChaosConfig,
    plan: Sequence[object],
    cluster: ChaosCluster,
    client: AsyncClient,
    history: History,
    setup_errors: list[str],
) -> ChaosReport:
    follows = config.changes or config.replicate
    table = await _create_table(client, cluster, changes=RETENTION if follows else None)
    table_id = (await client._info(TABLE)).table_id
    # The nemesis's dying sorter claims a sort task as a worker would, and the poller reads the
    # tablets' claims; with etcd's users on (--tls) the harness client's read-only user may do
    # neither, so they get the cluster's.
    processes = open_coordinator(cluster.process_url) if cluster.tls else None
    poller = _Poller(client, table_id, history, claims=processes)

    async def served() -> bool:
        await poller.poll()
        return poller.all_served()

    replica = _Replica(config, cluster) if config.replicate else None
    try:
        await _wait(served, HEAL_DEADLINE, "every chaos tablet served")
        if replica is not None:
            try:
                await replica.start()
            except BaseException:
                await replica.close()
                raise
    except BaseException:
        if processes is not None:
            await processes.close()
        raise
    poll_task = asyncio.create_task(poller.run())
    poll = REPLICATE_POLL if config.replicate else 0.5
    follower = ChangeFollower(table, time.time(), poll=poll) if follows else None
    complete = False
    if follower is not None:
        await follower.start()
    workload = Workload(
        table,
        history,
        seed=config.seed,
        writers=config.writers,
        readers=config.readers,
        transactors=config.transactors,
    )
    nemesis = Nemesis(
        cluster,
        history,
        plan,  # type: ignore[arg-type]
        seed=config.seed,
        holders=poller.holders,
        worker_ids=lambda: dict(poller.ids_by_address),
        master_address=client.catalog.master_address,
        coordinator=processes or getattr(client, "coordinator", None),
        storm=config.storm,
    )
    try:
        workload.start()
        started = history.now()
        await nemesis.run(started)
        remaining = started + config.seconds - history.now()
        if remaining > 0:
            await asyncio.sleep(remaining)
        await workload.stop()
        stopped_wall = time.time()
        # Heal: no S3 faults, no partitions, nothing paused, every process replaced, every
        # tablet served.
        await asyncio.to_thread(cluster.s3_faults)
        await asyncio.to_thread(cluster.heal_partitions)
        for record in cluster.records:
            cluster.resume(record)
        await nemesis.top_up()
        try:
            await _wait(served, HEAL_DEADLINE, "every chaos tablet served after healing")
        except TimeoutError as exc:
            setup_errors.append(f"{exc}; {poller.unserved()}")
        final_after = history.now()
        # The final reads share one deadline: a cluster that did not heal fails the run with
        # its rows unread (the checker's ``unread``) instead of retrying every row in turn.
        final_end = time.monotonic() + HEAL_DEADLINE
        for row in workload.all_rows:
            while time.monotonic() < final_end:
                op = await workload.read("final", row)
                if op.outcome is Outcome.OK:
                    break
                await asyncio.sleep(1.0)
        await workload.scan("final", b"", b"{")
        for row in TXN_ROWS:
            for cell in TXN_CELLS:
                await workload.read_cell("final", row, cell)
        if follower is not None:
            # Every write was acknowledged (or abandoned) before ``stopped_wall``; with a
            # replica, the source's stream is read up to the replica's final instant too (an
            # abandoned write may have been logged after the workload stopped).
            until = time.time() if replica is not None else stopped_wall
            complete = await follower.wait_complete(until, HEAL_DEADLINE)
        if replica is not None:
            assert follower is not None
            replica.verdict = await replica.finish(client, follower.changes, until)
    finally:
        poll_task.cancel()
        if follower is not None:
            await follower.stop()
        if replica is not None:
            await replica.close()
        with contextlib.suppress(asyncio.CancelledError):
            await poll_task
        if processes is not None:
            await processes.close()
    history.close()
    poller.add_loads(config.directory, history.t0_wall)
    value_workers, bad = await attribute_values(cluster.direct_store_url, cluster.kept_logs)
    verified = await _verify(
        cluster.direct_store_url,
        client,
        setup_errors,
        operator_url=cluster.process_url if cluster.tls else None,
    )
    verdict = check(
        history.ops,
        final_after=final_after,
        faults=history.faults,
        tablet_of=tablet_of,
        value_workers=value_workers,
        locations=poller.locations,
        kills=nemesis.kills,
    )
    changes = None
    if follower is not None and config.changes:
        changes = check_changes(history.ops, follower.changes)
        changes.partitions_ended, changes.resumed = follower.ended, follower.resumed
        changes.clock_stepped = "clock_jump" in config.faults
        if not complete:
            changes.incomplete = (
                f"not every partition's watermark past the workload's end within "
                f"{HEAL_DEADLINE:.0f} s: {sorted(follower.watermarks.values())}"
            )
    stats = await asyncio.to_thread(cluster.s3_stats)
    path = config.directory / "history.json"
    history.save(path)
    report = ChaosReport(
        config=config,
        verdict=verdict,
        faults=nemesis.counts,
        s3_injected={k: n for k, n in stats.items() if k != "requests"},
        nemesis_errors=nemesis.errors,
        history_path=path,
        setup_errors=setup_errors,
        unreadable_segments=bad,
        verify=verified,
        changes=changes,
        replica=None if replica is None else replica.verdict,
        collection=read_collection(config.directory),
    )
    if replica is not None and follower is not None and not complete:
        replica.verdict.incomplete = replica.verdict.incomplete or (
            "the source's change stream was not read past the final instant within "
            f"{HEAL_DEADLINE:.0f} s"
        )
    (config.directory / "report.json").write_text(json.dumps(report.to_json(), default=str))
    return report
