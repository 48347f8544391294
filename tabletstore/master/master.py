"""The master: table administration and tablet assignment (§5, §5.2).

The master creates and deletes tables, changes schemas, and keeps every tablet served: it
lists live workers (the servers directory), finds tablets without a claim and asks a worker
to load them (:mod:`tabletstore.master.assignment` decides which) — the root tablet first, then the
METADATA tablets it lists, then the user tablets they list (§5.2). The loads of one level go
out concurrently (at most ``MasterOptions.max_loads_per_worker`` in flight to one worker): after
a worker dies, its tablets are loaded side by side on the survivors, each replaying its logs,
instead of one after another. A round waits for a level's loads at most
``MasterOptions.load_wait`` seconds before going on; a load still running then (a long replay,
or a hung worker) stays in flight in the background and is counted as placed, so one slow load
holds back neither the others nor the next rounds. A load that fails leaves the tablet
unclaimed, and the next round assigns it again, to whichever worker the planner picks; one the
master gave up waiting for (or whose master died) runs on at its worker, claim held, and a
second ``load_tablet`` of it joins that load instead of replaying again. On first start it creates
the METADATA table (``Catalog.bootstrap_root``, then the METADATA tablets' rows in the root).
Clients never send data through the master; they locate tablets through METADATA and talk to
workers directly (§5.1).

Table administration is written once, here: :class:`Master` implements
``rpc.services.MasterService``, whose requests and responses are the wire messages. The embedded
database's client calls it directly; the cluster's master process serves the same methods
(``MASTER.handlers(master)``), and only while it leads (:attr:`Master.leading`). The master
reaches workers through ``TabletService`` stubs.

The embedded default runs one master in-process; the cluster elects one through the
coordinator and runs it as its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from tabletstore.client.location import LocationCache
from tabletstore.clock import Clock, SystemClock
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.data.schema import ReplicaOf, TableSchema
from tabletstore.errors import (
    Indeterminate,
    InvalidArgument,
    NotFound,
    NotServing,
    TabletStoreError,
    Unavailable,
    Unimplemented,
    Unreachable,
)
from tabletstore.master import assignment, snapshots
from tabletstore.master.assignment_watch import AssignmentWatch
from tabletstore.master.backup_service import BackupAdmin
from tabletstore.master.balancer import Balancer
from tabletstore.master.bulk_load import ANONYMOUS
from tabletstore.master.bulk_load import bulk_load as load_files
from tabletstore.master.checkpoints import (
    Checkpointer,
    set_changes,
    set_history,
    set_history_default,
    window_of,
)
from tabletstore.master.compaction_cycle import MajorCompactionCycle, WorkerCompactionExecutor
from tabletstore.master.log_recovery import LogRecovery
from tabletstore.metadata import rows as mt
from tabletstore.metadata.catalog import Catalog, ClusterSettings, TableInfo
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.metadata.snapshot import SnapshotManifest, delete_manifest, list_manifests
from tabletstore.options import MasterOptions
from tabletstore.rpc.auth import current_principal
from tabletstore.rpc.messages import (
    BulkLoadRequest,
    BulkLoadResponse,
    CompactTableRequest,
    CompactTabletRequest,
    CreateSnapshotRequest,
    CreateTableRequest,
    DeleteSnapshotRequest,
    HistoryDefaultMessage,
    HistoryDefaultRequest,
    ListSnapshotsRequest,
    ListSnapshotsResponse,
    ListTablesRequest,
    ListTablesResponse,
    LoadTabletAtRequest,
    LoadTabletRequest,
    ModifyFamiliesRequest,
    SetAdminsRequest,
    SetChangesRequest,
    SetHistoryRequest,
    SetReplicaRequest,
    SnapshotInfoMessage,
    TableInfoMessage,
    TableNameRequest,
    UnloadTabletRequest,
    UpdateSchemaRequest,
)
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Transport
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["Master"]

log = logging.getLogger(__name__)

#: Seconds an assignment round retries a METADATA read or write that finds its tablet not
#: served (or its worker gone) before ending the round; the next round goes on from there.
ROUND_METADATA_WAIT = 1.5


@dataclass(frozen=True, slots=True)
class _Load:
    """A load_tablet request in flight: to which worker, and the task awaiting its answer
    (True once the worker serves the tablet)."""

    worker: str
    task: asyncio.Task[bool]

    @property
    def failed(self) -> bool:
        return _failed(self.task)


def _failed(task: asyncio.Task[bool]) -> bool:
    """A load finished without the tablet being served (failed, timed out or cancelled)."""
    return task.done() and (task.cancelled() or task.exception() is not None or not task.result())


class Master(BackupAdmin):
    """Table administration (``rpc.services.MasterService``; backups, restores and clones in
    master/backup_service.py) and assignment over a catalog and a transport to workers."""

    def __init__(
        self,
        *,
        coordinator: Coordinator,
        transport: Transport,
        clock: Clock | None = None,
        metadata_splits: Sequence[bytes] = (),
        options: MasterOptions | None = None,
        store: ObjectStore | None = None,
        recovery: LogRecovery | None = None,
    ) -> None:
        """``metadata_splits``: METADATA row keys at which METADATA is pre-split when this
        master creates it (none: one METADATA tablet after the root). ``options``: how
        :attr:`balancer` moves and merges tablets. ``recovery``: sorts dead workers' logs
        before their tablets are loaded (§6; None: every new owner reads the whole log)."""
        self._coord = coordinator
        # Where snapshot manifests go; a cluster's master opens it from ClusterSettings
        # (and then closes it in close()).
        self._store = store
        self._own_store = False
        # A short deadline: a METADATA tablet that is not served ends an assignment round
        # (the next one goes on) instead of stalling it.
        self.locations = LocationCache(coordinator, transport)
        self._catalog = Catalog(coordinator, metadata=self.locations, retry_deadline=5.0)
        # An assignment round's own reads give up sooner: a METADATA tablet whose worker just
        # died (the failure detector revoked it mid-round) is served again only by the next
        # round, so retrying it longer only delays that round (§5.2).
        self._round_catalog = Catalog(
            coordinator, metadata=self.locations, retry_deadline=ROUND_METADATA_WAIT
        )
        self._transport = transport
        self._clock = clock or SystemClock()
        self._metadata_splits = tuple(metadata_splits)
        self._metadata_splits_checked = False
        mt.initial_metadata_records(self._metadata_splits, 0.0)  # InvalidArgument early
        self._options = options or MasterOptions()
        _check_load_options(self._options)
        self.recovery = recovery
        #: Every tablet record listed by the last round that got that far: the ranges a sort
        #: planned before this round's listing partitions by.
        self._records_seen: list[TabletRecord] = []
        #: Owner affinity (§6): dead log -> the one worker every unclaimed tablet listing it
        #: is loaded on, so its records are read once there (the worker's shared read of the
        #: log for the root and METADATA tablets, its own sort of the log's one task for the
        #: user tablets, whose runs it then reads from memory). Logs sorted in several tasks
        #: spread their tablets instead. Entries go with their worker.
        self._affinity: dict[LogRef, str] = {}
        #: §5.4's cycle through all tablets; run_master runs a round after each assignment.
        self.compaction_cycle = MajorCompactionCycle(
            period=self._options.major_compaction_period,
            records=self._every_record,
            executor=WorkerCompactionExecutor(self._major_compact),
            now=self._clock.time,
        )
        #: Whether this master answers admin requests. Only the elected master does: a standby
        #: (or a deposed master) answers ``NotServing`` so clients look the master up again.
        #: True for the embedded database's only master; the master process sets it.
        self.leading = True
        #: Loads sent, by tablet (table id, tablet id); finished ones are dropped at the start
        #: of the next round, after which the claims read then show their outcome.
        self._loads: dict[tuple[str, str], _Load] = {}
        #: Worker id -> monotonic time until which no load goes to it (a load could not even
        #: connect to it: it is dead, and its servers entry lingers until its lease runs out).
        self._unreachable: dict[str, float] = {}
        #: True after an assignment round that found every tablet served by a live worker
        #: and no load in flight: balancing and merging move tablets only then (moving while
        #: a dead worker's tablets are recovered only adds failovers to a failover).
        self.settled = False
        self._assign_lock = asyncio.Lock()
        #: Whether a periodic round has work (``assign(if_changed=True)``).
        self.changes = AssignmentWatch(
            coordinator,
            full_interval=self._options.full_round_interval,
            now=self._clock.monotonic,
        )
        #: Bounds the loads in flight to each worker (by worker id).
        self._load_slots: dict[str, asyncio.Semaphore] = {}
        # The TaskGroup owning the loads in flight: entered by the first round or load (in the
        # leader's task), exited by close().
        self._stack = contextlib.AsyncExitStack()
        self._tasks: asyncio.TaskGroup | None = None
        #: Balancing moves and merges of small tablets; the leader runs a round after each
        #: assignment round (run_master).
        self.balancer = Balancer(
            coordinator=coordinator,
            catalog=self._catalog,
            transport=transport,
            clock=self._clock,
            assign=self.assign,
            load=self.load_tablet,
            options=options,
            settled=lambda: self.settled,
        )

        #: Checkpoints of the tables that keep history (master/checkpoints.py); the leader
        #: runs a round in its own loop (run_master).
        self.checkpointer = Checkpointer(
            self._catalog, self._the_store, self._checkpoint, clock=self._clock
        )

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @property
    def clock(self) -> Clock:
        return self._clock

    def _worker(self, address: str, *, timeout: float | None = None) -> TabletService:
        """A stub of the worker at ``address`` (calls bounded by ``timeout``, None: the
        transport's default)."""
        return TABLET.client(self._transport, address, timeout=timeout)

    # ------------------------------------------------------------------ workers

    async def live_workers(self) -> dict[str, str]:
        """worker id -> address, from the servers directory."""
        kvs = await self._coord.get_prefix(paths.SERVERS)
        return {paths.parse_server(kv.key): kv.value.decode() for kv in kvs}

    async def _claims(self) -> dict[tuple[str, str], str]:
        kvs = await self._coord.get_prefix(paths.claims_prefix())
        return {paths.parse_claim(kv.key): kv.value.decode() for kv in kvs}

    async def assign(self, *, if_changed: bool = False) -> int:
        """Load every unclaimed tablet on a live worker, level by level (§5.2): the root tablet
        (its record is in the coordinator), then the METADATA tablets (rows of the root), then
        user tablets (rows of METADATA). A level that is not served yet ends the round early;
        the next round goes on from there. Returns how many tablets were assigned. Rounds
        never overlap (the assignment loop and the balancer both start them).

        With ``if_changed`` (the leader's periodic rounds), a round after one that found
        every tablet served runs only if a claim, a server or a schema changed since
        (:attr:`changes`), or every ``full_round_interval`` seconds: a steady round costs
        O(1), not O(N)."""
        async with self._assign_lock:
            if if_changed:
                await self.changes.start()
                if not self.changes.take() and self.settled:
                    return 0
            return await self._assign_round()

    async def _assign_round(self) -> int:
        await self._start()
        self.settled = False
        # Claims before the servers directory: a worker registers before it claims, so every
        # claim read here whose worker is alive has that worker in the listing below. (Read
        # the other way round, a worker that started and claimed in between looks like a
        # stranger holding an orphaned tablet, which is then sent to another worker.)
        claims = await self._claims()
        workers = await self.live_workers()
        now = self._clock.monotonic()
        self._unreachable = {w: t for w, t in self._unreachable.items() if t > now}
        if len(self._unreachable) < len(workers):  # never exclude every worker
            workers = {w: a for w, a in workers.items() if w not in self._unreachable}
        # A load to a worker that left the servers directory will never serve: give it up now
        # (the worker, if it is only paused, is told to cancel it) so the tablet is reassigned.
        self._reap_loads(set(workers))
        if not workers:
            return 0
        # Locations at workers no longer in the servers directory are stale: forget them rather
        # than wait for a paused worker to time out.
        self.locations.retain(set(workers.values()))
        self._affinity = {r: w for r, w in self._affinity.items() if w in workers}
        if await self._round_catalog.bootstrap_root(self._clock.time()):
            log.info("created the METADATA table")
        known: dict[tuple[str, str], assignment.TabletLoad] = {}
        root = await self._round_catalog.get_tablet(mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID)
        # Plan the sort of dead logs before anything is loaded (§6): the root and METADATA
        # tablets a dead worker held then replay from the sorted runs too, instead of each
        # reading its whole log before the user tablets can even be listed. The ranges are
        # those of the tablets seen last round (records of others go to catch-all runs, read
        # by every tablet of their table: so a master that has not listed the tablets yet, a
        # new one, leaves it to the plan below, made once they are listed).
        if self._records_seen:
            seen = {(r.table_id, r.tablet_id): r for r in self._records_seen}
            seen[(root.table_id, root.tablet_id)] = root
            await self._start_recovery(list(seen.values()), claims, workers, early=True)
        done = await self._assign_level(workers, claims, known, [root])
        try:
            initial = mt.initial_metadata_records(self._metadata_splits, self._clock.time())
            try:
                await self._round_catalog.ensure_metadata_tablets(initial)
            except InvalidArgument as exc:
                log.error("METADATA not created: %s", exc)
                self.settled = False
                return done
            metadata = await self._round_catalog.list_tablets(mt.METADATA_TABLE_ID)
            self._check_metadata_splits(metadata)
            done += await self._assign_level(workers, claims, known, metadata)
            moved = await self._round_catalog.migrate_coordinator_records()
            if moved:
                log.info("moved %d tablet records from the coordinator into METADATA", moved)
            tables = [
                await self._round_catalog.list_tablets(info.table_id)
                for info in await self._round_catalog.list_tables()
            ]
            # Before the user tablets' loads go out: their new owners find the sort plans of
            # the dead logs they list (§6). Every record, so each plan sees every tablet
            # listing its log.
            everything = [root, *metadata, *(r for tablets in tables for r in tablets)]
            self._records_seen = everything
            listed = {ref for rec in everything for ref in rec.logs}
            self._affinity = {r: w for r, w in self._affinity.items() if r in listed}
            await self._start_recovery(everything, claims, workers)
            # Every user table is one level: one plan over all tablets and one wait for the
            # loads (a plan per table re-weighed every tablet known so far: O(tables x tablets)).
            users = [r for tablets in tables for r in tablets]
            done += await self._assign_level(workers, claims, known, users)
        except (Unavailable, Indeterminate) as exc:
            # A METADATA tablet not served yet (NotServing) or not answering: the writes above
            # are idempotent, and the next round goes on from here.
            log.info("assignment round stopped early: %s", exc)
            self.settled = False
            return done
        # A load that failed leaves its tablet unclaimed, maybe without a claim ever written
        # (no change the assignment watch sees): not settled, so the next round runs.
        unfinished = any(not load.task.done() or load.failed for load in self._loads.values())
        self.settled = not unfinished and all(t.worker in workers for t in known.values())
        return done

    def _check_metadata_splits(self, metadata: Sequence[TabletRecord]) -> None:
        """Warn once when METADATA, made earlier, is not split where this master was told to
        split it: the splits apply only when METADATA is created."""
        if self._metadata_splits_checked:
            return
        self._metadata_splits_checked = True
        have = sorted(
            r.end_row
            for r in metadata
            if r.end_row is not None and r.tablet_id != mt.ROOT_TABLET_ID
        )
        if self._metadata_splits and have != sorted(set(self._metadata_splits)):
            log.warning(
                "METADATA exists with split keys %s; the METADATA splits given to this master "
                "(%s) apply only when it is created",
                have,
                sorted(set(self._metadata_splits)),
            )

    async def _start_recovery(
        self,
        records: Sequence[TabletRecord],
        claims: dict[tuple[str, str], str],
        workers: dict[str, str],
        *,
        early: bool = False,
    ) -> None:
        if self.recovery is None:
            return
        owners = self._owners(records, claims, workers)
        try:
            await self.recovery.start(records, claims, workers, early=early, owners=owners)
        except TabletStoreError as exc:
            # The loads replay the logs directly instead: slower, never wrong.
            log.warning("starting the sort of dead commit logs failed: %s", exc)

    def _owners(
        self,
        records: Sequence[TabletRecord],
        claims: dict[tuple[str, str], str],
        workers: dict[str, str],
    ) -> dict[LogRef, str]:
        """The affinity worker of every dead log an unclaimed tablet of ``records`` lists,
        chosen now (the worker holding the fewest claims) for the logs that have none yet or
        whose chosen worker is gone itself (its lease ended: its tasks are re-reserved for
        the new one at once, rather than left to the sorters' grace)."""
        held: dict[str, int] = dict.fromkeys(workers, 0)
        for holder in claims.values():
            if holder in held:
                held[holder] += 1
        # The unclaimed tablets listing each dead log: what its owner will take on.
        orphans: Counter[LogRef] = Counter()
        for rec in records:
            if claims.get((rec.table_id, rec.tablet_id)) not in workers:
                orphans.update(ref for ref in rec.logs if ref.worker_id not in workers)
        # A heap of (tablets held or promised, worker): each new owner counts the tablets of
        # the logs given it before, so the dead logs of a rack spread over the survivors
        # instead of all going to the one that held the fewest claims.
        heap = [(n, w) for w, n in held.items()]
        heapq.heapify(heap)
        for ref in sorted(orphans, key=lambda r: (r.worker_id, r.incarnation)):
            if self._affinity.get(ref) in workers or not heap:
                continue
            n, chosen = heap[0]
            heapq.heapreplace(heap, (n + orphans[ref], chosen))
            self._affinity[ref] = chosen
        return dict(self._affinity)

    def _affine(self, rec: TabletRecord, planned: str, workers: dict[str, str]) -> str:
        """Where to load the unclaimed tablet ``rec``: the affinity worker of the first dead
        log it lists (set to ``planned`` if that log has none yet), unless that log is sorted
        in several tasks; else ``planned``."""
        for ref in rec.logs:
            if ref.worker_id in workers:
                continue  # its writer lives (a moved tablet's old owner): not a dead log
            if self.recovery is not None and self.recovery.sorted_wide(ref):
                continue
            owner = self._affinity.get(ref)
            if owner not in workers:
                self._affinity[ref] = owner = planned
            return owner
        return planned

    async def _assign_level(
        self,
        workers: dict[str, str],
        claims: dict[tuple[str, str], str],
        known: dict[tuple[str, str], assignment.TabletLoad],
        records: Sequence[TabletRecord],
    ) -> int:
        """Assign the unclaimed ones of ``records``, balancing against every tablet ``known``
        so far this round (to which they are added): send their loads concurrently, then wait
        for this level's loads in flight (at most ``load_wait`` seconds). Returns how many of
        the loads sent here finished with the tablet served."""
        wanted = set()
        level: list[asyncio.Task[bool]] = []
        by_key = {(rec.table_id, rec.tablet_id): rec for rec in records}
        for rec in records:
            key = (rec.table_id, rec.tablet_id)
            holder = claims.get(key)
            sent_before = self._loads.get(key)
            if holder not in workers and sent_before is not None and not sent_before.failed:
                # In flight, or served since the claims were read: not assigned twice.
                holder = sent_before.worker
                level.append(sent_before.task)
            known[key] = assignment.TabletLoad(*key, holder, size=rec.size)
            if holder not in workers:
                wanted.add(key)
        if wanted:
            # The claims were read at the start of the round, the records since: a tablet
            # born of a split in between (its splitter claimed it first) looks unclaimed.
            # Read the claims again rather than send its load to another worker.
            fresh = await self._claims()
            for key in list(wanted):
                holder = fresh.get(key)
                if holder in workers:
                    claims[key] = holder
                    known[key] = replace(known[key], worker=holder)
                    wanted.discard(key)
        sent: list[tuple[assignment.Assignment, asyncio.Task[bool]]] = []
        for a in assignment.plan(list(workers), list(known.values())):
            key = (a.table_id, a.tablet_id)
            if key not in wanted:
                continue
            a = replace(a, worker=self._affine(by_key[key], a.worker, workers))
            task = self._start_load(a.worker, workers[a.worker], key, by_key[key].end_row)
            sent.append((a, task))
            level.append(task)
            known[key] = assignment.TabletLoad(*key, a.worker, size=known[key].size)
        if level:
            await asyncio.wait(level, timeout=self._options.load_wait)
        done = 0
        for a, task in sent:
            if task.done() and not _failed(task):
                claims[(a.table_id, a.tablet_id)] = a.worker
                done += 1
        return done

    async def load_tablet(
        self, worker: str, address: str, key: tuple[str, str], end_row: bytes | None
    ) -> bool:
        """Load ``key``, whose end row is ``end_row``, on ``worker`` (balancing moves): True
        once it is served there; False if the load failed, or is still running after
        ``load_wait`` seconds (it then goes on in the background like a round's load)."""
        await self._start()
        task = self._start_load(worker, address, key, end_row)
        await asyncio.wait([task], timeout=self._options.load_wait)
        return task.done() and not _failed(task)

    async def _start(self) -> None:
        """Open the TaskGroup of the loads, once."""
        if self._tasks is None:
            self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())

    def _start_load(
        self, worker: str, address: str, key: tuple[str, str], end_row: bytes | None
    ) -> asyncio.Task[bool]:
        """Send the load of ``key`` (whose end row is ``end_row``) to ``worker`` in the
        background.

        REQUIRES: :meth:`_start` called."""
        assert self._tasks is not None
        task = self._tasks.create_task(
            self._load(worker, address, key, end_row), name=f"load {key[1]} on {worker}"
        )
        self._loads[key] = _Load(worker, task)
        return task

    async def _load(
        self, worker: str, address: str, key: tuple[str, str], end_row: bytes | None
    ) -> bool:
        """One load, within the worker's bound of loads in flight and ``load_timeout``. False
        (logged) if it failed: the tablet stays unclaimed and the next round assigns it."""
        slots = self._load_slots.get(worker)
        if slots is None:
            slots = self._load_slots[worker] = asyncio.Semaphore(self._options.max_loads_per_worker)
        async with slots:
            started = self._clock.monotonic()
            # A replay may legitimately take minutes: the load's own bound, not the transport's.
            stub = self._worker(address, timeout=self._options.load_timeout)
            try:
                async with asyncio.timeout(self._options.load_timeout):
                    await _send_load(stub, key, end_row)
            except TimeoutError:
                log.warning(
                    "loading %s on %s took over %s s; given up",
                    key[1],
                    worker,
                    self._options.load_timeout,
                )
                return False
            except Unreachable as exc:
                # Dead or partitioned, though still in the servers directory until its lease
                # runs out: give the next rounds' loads to the other workers meanwhile.
                self._unreachable[worker] = self._clock.monotonic() + self._options.lease.ttl
                log.warning("assigning %s to %s failed: %s", key[1], worker, exc)
                return False
            except TabletStoreError as exc:  # Indeterminate after load_timeout: given up
                log.warning("assigning %s to %s failed: %s", key[1], worker, exc)
                return False
            except Exception:
                # Not fatal to the master: the tablet stays unclaimed and the next round
                # assigns it again, as after any failed load; the other loads go on.
                log.exception("loading %s on %s raised", key[1], worker)
                return False
        log.info("loaded %s on %s in %.2f s", key[1], worker, self._clock.monotonic() - started)
        return True

    def worker_gone(self, worker: str) -> None:
        """The failure detector revoked ``worker``'s lease (it is dead): give up the loads in
        flight to it now, so a round waiting for them goes on, and send it no more."""
        self._unreachable[worker] = self._clock.monotonic() + self._options.lease.ttl
        self.changes.touch()
        for load in self._loads.values():
            if load.worker == worker and not load.task.done():
                load.task.cancel()

    def _reap_loads(self, live: set[str]) -> None:
        """Drop the finished loads (the claims, read next, show what they did) and cancel the
        ones in flight to workers not in ``live``."""
        for key, load in list(self._loads.items()):
            if load.task.done():
                del self._loads[key]
            elif load.worker not in live:
                load.task.cancel()

    async def close(self) -> None:
        """Give up the loads in flight (a master that stops leading leaves them to the next)."""
        for load in self._loads.values():
            load.task.cancel()
        await self._stack.aclose()
        self._tasks = None
        await self.changes.close()
        await self.compaction_cycle.close()
        if self.recovery is not None:
            await self.recovery.close()
        if self._own_store and self._store is not None:
            await self._store.close()
            self._store, self._own_store = None, False

    # ------------------------------------------------------------------ major compaction cycle

    async def _every_record(self) -> list[TabletRecord]:
        """The records of every METADATA and user tablet (the root's lives in the coordinator
        and holds a handful of rows: it is left to the compactions its writes trigger)."""
        records = list(await self._catalog.list_tablets(mt.METADATA_TABLE_ID))
        for info in await self._catalog.list_tables():
            records.extend(await self._catalog.list_tablets(info.table_id))
        return [r for r in records if mt.level(r.table_id, r.tablet_id) != 1]

    async def _major_compact(self, rec: TabletRecord) -> None:
        """Ask the worker serving ``rec``'s tablet for a major compaction; NotServing if none
        does now (the cycle tries again next round)."""
        holder = (await self._claims()).get((rec.table_id, rec.tablet_id))
        address = (await self.live_workers()).get(holder) if holder is not None else None
        if address is None:
            raise NotServing(f"tablet {rec.tablet_id} is not served right now")
        await self._worker(address).compact_tablet(
            CompactTabletRequest(rec.table_id, rec.tablet_id, major=True)
        )

    # ------------------------------------------------------------------ tables (MasterService)

    def _check_leading(self) -> None:
        if not self.leading:
            raise NotServing("this process is not the elected master")

    async def create_table(self, req: CreateTableRequest) -> TableInfoMessage:
        """Create a table, pre-split at the request's split keys, and assign its tablets."""
        self._check_leading()
        schema = req.schema()
        splits = sorted(set(req.split_keys))
        if any(not k for k in splits):
            raise InvalidArgument("split keys must be non-empty")
        limit = self._options.max_split_keys
        if limit and len(splits) > limit:
            raise InvalidArgument(
                f"create_table {schema.name!r}: {len(splits)} split keys, over the limit of "
                f"max_split_keys={limit} (the master's --max-split-keys); the table splits "
                "itself as it grows"
            )
        await self._check_table_quota(schema.name)
        table_id = Catalog.new_table_id(schema.name)
        bounds: list[bytes | None] = [*splits, None]
        records = []
        start = b""
        for i, end in enumerate(bounds):
            records.append(
                TabletRecord(
                    table_id=table_id, tablet_id=f"t{i:05d}", start_row=start, end_row=end
                ).with_event(self._clock.time(), "created")
            )
            start = end or b""
        info = await self._catalog.create_table(schema, records)
        await self.assign()
        return TableInfoMessage.of(info)

    async def _check_table_quota(self, name: str) -> None:
        """InvalidArgument if the caller administers ``max_tables_per_principal`` tables
        already (only with auth, and not for the cluster's own identities)."""
        limit = self._options.max_tables_per_principal
        principal = current_principal()
        if not limit or principal is None or principal.is_cluster:
            return
        owned = sum(
            1
            for info in await self._catalog.list_tables()
            if info.schema.admins is not None and principal.name in info.schema.admins
        )
        if owned >= limit:
            raise InvalidArgument(
                f"create_table {name!r}: {principal.name} administers {owned} tables, the "
                f"limit of max_tables_per_principal={limit} (the master's "
                "--max-tables-per-principal)"
            )

    async def delete_table(self, req: TableNameRequest) -> None:
        """Unload a table's tablets and delete its records; its objects become garbage."""
        self._check_leading()
        if req.name == mt.METADATA_TABLE:
            raise InvalidArgument(f"table {req.name!r} is the system table; it cannot be deleted")
        info = await self._catalog.get_table(req.name)
        await self._for_each_tablet(
            info,
            lambda w, rec: w.unload_tablet(
                UnloadTabletRequest(rec.table_id, rec.tablet_id, flush=False)
            ),
        )
        await self._catalog.delete_table(req.name)
        await self._coord.delete_prefix(paths.bulk_loads_prefix(info.table_id))

    async def list_tables(self, req: ListTablesRequest) -> ListTablesResponse:
        self._check_leading()
        infos = await self._catalog.list_tables()
        return ListTablesResponse(tuple(TableInfoMessage.of(i) for i in infos))

    async def get_table(self, req: TableNameRequest) -> TableInfoMessage:
        self._check_leading()
        return TableInfoMessage.of(await self._catalog.get_table(req.name))

    async def modify_families(self, req: ModifyFamiliesRequest) -> TableInfoMessage:
        """Add, change or drop column families (and add locality groups) in one schema change.

        Dropped families' cells stop being visible at once and are left out of the next
        compaction of every tablet."""
        self._check_leading()
        name, create, update = req.name, req.families_created(), req.families_updated()
        info = await self._catalog.get_table(name)
        families = dict(info.schema.families)
        groups = dict(info.schema.locality_groups)
        for g in req.groups_added():
            groups[g.name] = g
        for fam in create:
            if fam.name in families:
                raise InvalidArgument(f"table {name!r} already has column family {fam.name!r}")
            families[fam.name] = fam
        for fam in update:
            if fam.name not in families:
                raise NotFound(f"table {name!r} has no column family {fam.name!r}")
            if fam.value_type != families[fam.name].value_type:
                raise InvalidArgument(
                    f"column family {name}:{fam.name} has value type "
                    f"{families[fam.name].value_type or 'none (plain bytes)'}; a family's value "
                    f"type cannot change (asked: {fam.value_type or 'none'})"
                )
            families[fam.name] = fam
        for fam_name in req.drop:
            if fam_name not in families:
                raise NotFound(f"table {name!r} has no column family {fam_name!r}")
            del families[fam_name]
        try:
            schema = info.schema.model_copy(
                update={"families": families, "locality_groups": groups}
            )
            schema = TableSchema.model_validate(schema.model_dump())
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc
        new = await self._catalog.update_schema(info, schema)
        await self._push_schema(name)
        moved = [
            f.name
            for f in update
            if f.name in info.schema.families
            and info.schema.families[f.name].locality_group != f.locality_group
        ]
        if req.drop or moved:
            # Rewrite every tablet by the new schema before answering: a dropped family's
            # cells are gone (re-creating the name brings nothing back) and a moved family's
            # cells live in its new locality group (reads of it look only there).
            await self.compact_table(CompactTableRequest(name, major=True))
        return TableInfoMessage.of(new)

    async def set_admins(self, req: SetAdminsRequest) -> TableInfoMessage:
        """Replace a table's admins (who may change or delete it:
        master/master_service_guard.py)."""
        self._check_leading()
        if req.name == mt.METADATA_TABLE:
            raise InvalidArgument(f"table {req.name!r} is the system table; it has no admins")
        info = await self._catalog.get_table(req.name)
        schema = info.schema.model_copy(update={"admins": sorted(set(req.admins))})
        return TableInfoMessage.of(await self._catalog.update_schema(info, schema))

    async def set_history(self, req: SetHistoryRequest) -> TableInfoMessage:
        """Set (None: end) a table's own history window (master/checkpoints.py). When the
        table then keeps history, its first checkpoint is taken before this returns (if its
        tablets are served; else the next round takes it), so instants from now on can be
        restored."""
        self._check_leading()
        if req.name == mt.METADATA_TABLE:
            raise InvalidArgument(f"table {req.name!r} is the system table; it keeps no history")
        info = await set_history(self._catalog, req.name, req.seconds)
        window = window_of(info.schema.history, await self._catalog.history_default())
        if window is not None:
            await self.checkpointer.first_checkpoint(info, window)
        return TableInfoMessage.of(info)

    async def history_default(self, req: HistoryDefaultRequest) -> HistoryDefaultMessage:
        """The database's default history window, set first when ``req.change``; the next
        checkpoint round runs at once."""
        self._check_leading()
        if not req.change:
            return HistoryDefaultMessage(await self._catalog.history_default())
        seconds = await set_history_default(self._catalog, req.seconds)
        self.checkpointer.wake()
        return HistoryDefaultMessage(seconds)

    async def set_changes(self, req: SetChangesRequest) -> TableInfoMessage:
        """Set (None: end) a table's change retention: garbage collection keeps its commit
        log that long (rule 7), so its change stream can be read that far back."""
        self._check_leading()
        if req.name == mt.METADATA_TABLE:
            raise InvalidArgument(f"table {req.name!r} is the system table; it has no changes")
        return TableInfoMessage.of(await set_changes(self._catalog, req.name, req.seconds))

    async def set_replica(self, req: SetReplicaRequest) -> TableInfoMessage:
        """Make a table a replica of another cluster's table (only the replicator writes it),
        or with no source a primary again (client/replicator.py). Every live worker has the
        new schema before this answers, so the write policy holds from then on; a worker
        that loads a tablet later reads it from the catalog."""
        self._check_leading()
        if req.name == mt.METADATA_TABLE:
            raise InvalidArgument(f"table {req.name!r} is the system table; it is no replica")
        info = await self._catalog.get_table(req.name)
        replica = (
            None
            if req.source is None
            else ReplicaOf(source=req.source, table=req.table, promoting=req.promoting)
        )
        new = await self._catalog.update_schema(
            info, info.schema.model_copy(update={"replica_of": replica})
        )
        await self._push_schema(req.name)
        return TableInfoMessage.of(new)

    async def _push_schema(self, name: str) -> None:
        """Every live worker applies table ``name``'s schema as the catalog has it now."""
        workers = await self.live_workers()
        for address in set(workers.values()):
            await self._worker(address).update_schema(UpdateSchemaRequest(name))

    async def compact_table(self, req: CompactTableRequest) -> None:
        """Minor (``flush``) or major (``compact``) compaction of every tablet of a table."""
        self._check_leading()
        info = await self._catalog.get_table(req.name)
        await self._for_each_tablet(
            info,
            lambda w, rec: w.compact_tablet(
                CompactTabletRequest(rec.table_id, rec.tablet_id, major=req.major)
            ),
        )

    async def _for_each_tablet(
        self,
        info: TableInfo,
        send: Callable[[TabletService, TabletRecord], Awaitable[None]],
    ) -> None:
        """``send`` to the worker holding each claimed tablet of the table. A tablet that
        splits or moves meanwhile (NotServing) is looked up again, as a client's call would be,
        within the catalog's retry deadline: its children or new owner get the call."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._catalog.retry_deadline
        done: set[str] = set()
        while True:
            claims = await self._claims()
            workers = await self.live_workers()
            refused: list[NotServing] = []
            for rec in await self._catalog.list_tablets(info.table_id):
                holder = claims.get((rec.table_id, rec.tablet_id))
                address = workers.get(holder) if holder is not None else None
                if address is None or rec.tablet_id in done:
                    continue
                try:
                    await send(self._worker(address), rec)
                except NotServing as exc:
                    refused.append(exc)
                    continue
                done.add(rec.tablet_id)
            if not refused:
                return
            if loop.time() >= deadline:
                raise refused[0]
            await asyncio.sleep(0.2)

    # ------------------------------------------------------------------ snapshots, bulk load

    async def _the_store(self) -> ObjectStore:
        if self._store is None:
            settings = await ClusterSettings.load(self._coord)
            self._store = open_store(settings.store_url)
            self._own_store = True
        return self._store

    async def _locate(self, records: list[TabletRecord]) -> dict[str, str]:
        """tablet id -> address of its worker; NotServing if one is not served now."""
        claims = await self._claims()
        workers = await self.live_workers()
        out: dict[str, str] = {}
        for rec in records:
            holder = claims.get((rec.table_id, rec.tablet_id))
            address = workers.get(holder) if holder is not None else None
            if address is None:
                raise NotServing(f"tablet {rec.tablet_id} of {rec.table_id} is not served now")
            out[rec.tablet_id] = address
        return out

    async def create_snapshot(self, req: CreateSnapshotRequest) -> SnapshotInfoMessage:
        """Take a consistent snapshot of a table for batch jobs (master/snapshots.py)."""
        self._check_leading()
        if req.table == mt.METADATA_TABLE:
            raise InvalidArgument(f"table {req.table!r} is the system table; it has no snapshots")
        manifest = await snapshots.take_snapshot(
            info=await self._catalog.get_table(req.table),
            catalog=self._catalog,
            worker=self._worker,
            store=await self._the_store(),
            clock=self._clock,
            locate=self._locate,
            ttl=req.ttl_seconds,
        )
        return SnapshotInfoMessage(manifest.to_bytes())

    async def _checkpoint(self, info: TableInfo, ttl: float) -> SnapshotManifest:
        """A checkpoint of a table with history: a snapshot with a TTL (master/checkpoints.py)."""
        return await snapshots.take_snapshot(
            info=info,
            catalog=self._catalog,
            worker=self._worker,
            store=await self._the_store(),
            clock=self._clock,
            locate=self._locate,
            ttl=ttl,
        )

    async def list_snapshots(self, req: ListSnapshotsRequest) -> ListSnapshotsResponse:
        """Snapshots of one table (or of all), oldest first."""
        self._check_leading()
        name = req.table
        table_id = None if name is None else (await self._catalog.get_table(name)).table_id
        manifests = await list_manifests(await self._the_store(), table_id)
        return ListSnapshotsResponse(tuple(SnapshotInfoMessage(m.to_bytes()) for m in manifests))

    async def delete_snapshot(self, req: DeleteSnapshotRequest) -> None:
        """Delete a snapshot's manifest; GC then frees what only it kept."""
        self._check_leading()
        await delete_manifest(await self._the_store(), req.snapshot_id)

    async def bulk_load(self, req: BulkLoadRequest) -> BulkLoadResponse:
        """Load the SSTables under ``url`` into a table, once (master/bulk_load.py)."""
        self._check_leading()
        if req.table == mt.METADATA_TABLE:
            raise InvalidArgument(f"table {req.table!r} is the system table; it takes no loads")
        done = await load_files(
            info=await self._catalog.get_table(req.table),
            url=req.url,
            load_id=req.load_id or None,
            catalog=self._catalog,
            coordinator=self._coord,
            worker=self._worker,
            locate=self._locate,
            clock=self._clock,
            store=await self._the_store(),
            principal=_caller(),
        )
        return BulkLoadResponse(done.tablets, done.cells, done.load_id)


async def _send_load(stub: TabletService, key: tuple[str, str], end_row: bytes | None) -> None:
    """``load_tablet_at`` (the worker reads the tablet's one METADATA row), or to a worker of
    the previous protocol version, which refuses it before anything is sent (a rolling
    upgrade), ``load_tablet`` (it reads every row of the tablet's table)."""
    try:
        await stub.load_tablet_at(LoadTabletAtRequest(*key, end_row))
    except Unimplemented:
        await stub.load_tablet(LoadTabletRequest(*key))


def _caller() -> str:
    """The name of the principal this request runs as (``anonymous`` without auth)."""
    principal = current_principal()
    return principal.name if principal is not None else ANONYMOUS


def _check_load_options(options: MasterOptions) -> None:
    for name in ("max_split_keys", "max_tables_per_principal"):
        if getattr(options, name) < 0:
            raise InvalidArgument(
                f"{name} must be >= 0 (0: no bound), got {getattr(options, name)}"
            )
    if options.max_loads_per_worker < 1:
        raise InvalidArgument(
            f"max_loads_per_worker must be at least 1, got {options.max_loads_per_worker}"
        )
    if options.max_moves_per_worker < 1:
        raise InvalidArgument(
            f"max_moves_per_worker must be at least 1, got {options.max_moves_per_worker}"
        )
    if not 0 <= options.move_fraction <= 1:
        raise InvalidArgument(f"move_fraction must be in [0, 1], got {options.move_fraction}")
    if options.balance_interval < 0:
        raise InvalidArgument(
            f"balance_interval must be >= 0 seconds, got {options.balance_interval}"
        )
    if options.full_round_interval <= 0:
        raise InvalidArgument(
            f"full_round_interval must be > 0 seconds, got {options.full_round_interval}"
        )
    if options.load_wait < 0:
        raise InvalidArgument(f"load_wait must be >= 0 seconds, got {options.load_wait}")
    if options.load_timeout <= 0:
        raise InvalidArgument(f"load_timeout must be > 0 seconds, got {options.load_timeout}")
