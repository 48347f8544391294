"""The tablet server: a stateless worker serving the tablets it holds claims for (§5.2, §5.3).

All durable state is in the bucket (SSTables, commit-log segments) and the coordinator
(schemas, tablet records, claims). A worker:

1. takes a lease and registers ``servers/<worker-id>`` under it (the Chubby servers
   directory, §5.2), and opens a fresh commit-log *incarnation* shared by all its tablets;
2. on ``load_tablet`` (``TabletServer.load``), claims the tablet (a key attached to its lease;
   the claim's creation revision becomes the tablet's epoch), fences and replays the logs the
   tablet's record lists (docs/architecture/design.md §6 rule 4, §7) and starts serving;
3. answers data requests for tablets it serves and ``NotServing`` for any other, so clients
   refresh their cached locations (§5.1);
   METADATA tablets are served like any other; the worker reaches the rows recording its own
   tablets through a ``LocationCache`` over the same transport (possibly calling itself: no
   lock a METADATA write needs is held across such a call);
4. stops acknowledging writes before its lease can have expired (fencing rule 1).

This module owns the server's lifecycle, as HBase's ``HRegionServer`` does: the lease, the
commit log and its switch to a new incarnation when it fails, the claims, loading (replay) and
unloading of tablets, and stopping. The request handlers stand beside it, as ``RSRpcServices``
does: ``server.services`` (``worker/rpc_services.py``: the data service, ``data_service.py``,
and the admin service, ``admin_service.py``) implements ``rpc.services.TabletService`` and is
served through ``TABLET.handlers(server.services)`` by the transport (in-process or TCP).
Splitting tablets that grew is ``worker/splits.py``'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any

from tabletstore.client.location import LocationCache
from tabletstore.clock import Clock, SystemClock
from tabletstore.commitlog import CommitLogStats, CommitLogWriter
from tabletstore.commitlog.runs import SortPlan
from tabletstore.commitlog.sorting import SharedSorts
from tabletstore.commitlog.spill import RunSpill, SpillStats
from tabletstore.coordination import paths
from tabletstore.coordination.base import (
    Coordinator,
    Delete,
    Lease,
    Put,
    absent,
    create_revision_is,
    mod_revision_is,
)
from tabletstore.data.schema import TableSchema
from tabletstore.engine.compaction_budget import CompactionBudget
from tabletstore.engine.log_replay import yielding
from tabletstore.engine.tablet import Tablet
from tabletstore.errors import (
    Fenced,
    InvalidArgument,
    NotFound,
    NotServing,
    TabletStoreError,
    Unavailable,
)
from tabletstore.keys import Cell
from tabletstore.metadata import rows as mt
from tabletstore.metadata.catalog import Catalog, TableInfo
from tabletstore.metadata.record import LogRef, TabletRecord, metadata_row_key
from tabletstore.options import TabletOptions, WorkerOptions
from tabletstore.process_pool import ProcessPool
from tabletstore.rpc.messages import (
    LoadTabletAtRequest,
    LoadTabletRequest,
    ServerStatusResponse,
    TabletStatus,
    UnloadTabletRequest,
)
from tabletstore.rpc.services import TABLET
from tabletstore.rpc.transport import Handlers, Method, Transport, call_handler, stream_handler
from tabletstore.security.principal import Principal
from tabletstore.sstable.block_cache import BlockCache, ScanCache
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.worker.heap_trim import HeapTrimmer
from tabletstore.worker.log import WorkerLog, replay_logged
from tabletstore.worker.log_switch_gate import SwitchGate
from tabletstore.worker.log_trim import LogTail, TrimShares, lags
from tabletstore.worker.rpc_services import TabletRpcServices
from tabletstore.worker.shared_log_reads import SharedLogReads, tablet_cells
from tabletstore.worker.splits import TabletSplits
from tabletstore.worker.tablet_service_guard import may_see_keys

__all__ = ["TabletServer", "next_incarnation"]

#: What a root or METADATA tablet's replay takes in place of a slot: nothing.
_NO_LIMIT = contextlib.nullcontext()

log = logging.getLogger(__name__)


#: Seconds a stopping worker's last record updates wait for METADATA (see stop()).
_STOP_METADATA_WAIT = 5.0
#: Seconds before a log switch tries again to record the new log in the tablets whose record
#: could not take it, doubling up to the second (``TabletServer._switch_log``).
_SWITCH_RETRY = 0.5
_SWITCH_RETRY_MAX = 5.0
#: Seconds a switch retries a refused record update before it leaves that tablet waiting for
#: its next pass: a refusal that outlasts it (the new log failed too, the METADATA tablet is
#: itself waiting) is not helped by retrying the same log, and the tablets after it wait.
_SWITCH_RECORD_WAIT = 2.0


class _SelfFirst:
    """The worker's transport to METADATA tablets: a call to its own address goes straight to
    its own handlers (no socket; and still possible while stopping, after the RPC server
    closed, when its last record updates may go to a METADATA tablet it serves itself)."""

    def __init__(self, server: TabletServer, remote: Transport) -> None:
        self._server = server
        self._local: Handlers = TABLET.handlers(server.services)
        self._remote = remote

    def call(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> Coroutine[Any, Any, Any]:
        if address == self._server.address:
            return call_handler(self._local, address, method, request, timeout)
        return self._remote.call(address, method, request, timeout=timeout)

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        if address == self._server.address:
            return stream_handler(self._local, address, method, request, timeout)
        return self._remote.stream(address, method, request, timeout=timeout)

    async def close(self) -> None:
        await self._remote.close()


class TabletServer:
    """One worker process's tablet server."""

    def __init__(
        self,
        worker_id: str,
        address: str,
        *,
        store: ObjectStore,
        coordinator: Coordinator,
        transport: Transport,
        clock: Clock | None = None,
        options: WorkerOptions | None = None,
        tablet_options: TabletOptions | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.address = address
        self._store = store
        self._coord = coordinator
        self._clock = clock or SystemClock()
        self._options = options or WorkerOptions()
        self._tablet_options = tablet_options or TabletOptions()
        check_options(self._options, self._tablet_options)
        #: The request handlers (``TABLET.handlers(server.services)`` serves them).
        self.services = TabletRpcServices(self)
        #: Splits of the tablets served here, started after their compactions.
        self.splits = TabletSplits(
            self,
            clock=self._clock,
            split_bytes=self._tablet_options.split_bytes,
            cooldown=self._options.split_cooldown,
            concurrency=self._options.concurrent_splits,
        )
        # Records of this worker's tablets are METADATA rows, reached over ``transport``.
        self.locations = LocationCache(coordinator, _SelfFirst(self, transport))
        self._catalog = Catalog(coordinator, metadata=self.locations)
        #: Slots for user tablets' replays (``WorkerOptions.load_concurrency``).
        self._replays = asyncio.Semaphore(self._options.load_concurrency)
        self._block_cache = BlockCache(self._options.block_cache_bytes)
        #: Bounds the memory of the merging and major compactions running at once.
        self._compaction_budget = CompactionBudget(self._options.compaction_memory_bytes)
        #: The §6 scan cache shared by every SSTable this worker opens (None: disabled).
        self._scan_cache = (
            ScanCache(self._options.scan_cache_rows) if self._options.scan_cache_rows > 0 else None
        )
        self._tablets: dict[tuple[str, str], Tablet] = {}
        #: The newest schema of each table this worker read from the catalog (by the
        #: record's revision, :meth:`newest_schema`): a tablet starts serving with it, so a
        #: schema pushed while the tablet was being opened with an older one is not missed.
        self._schemas: dict[str, TableInfo] = {}
        self._loading: dict[tuple[str, str], asyncio.Lock] = {}
        #: Loads under way, by tablet: each runs as its own task, which the load calls for
        #: that tablet await (so a caller that goes away does not stop it).
        self._load_tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        #: The tablet stop() is closing now (``unflushed``).
        self._closing: tuple[str, str] | None = None
        #: Reloads of failed tablets under way (:meth:`_reload`); cancelled by stop().
        self._reloads: set[asyncio.Task[None]] = set()
        self._requests: dict[tuple[str, str], int] = {}
        #: The claim's create revision (the tablet's epoch) of every tablet claimed here.
        self._epochs: dict[tuple[str, str], int] = {}
        # Merging and major compactions run in worker processes when configured (§5.4), so
        # serving never stalls on them. forkserver, never fork: this process runs threads.
        self._executor: concurrent.futures.Executor | None = None
        if self._options.compaction_processes > 0:
            # Replaced when one of its processes dies (the OOM killer): ProcessPool.
            self._executor = ProcessPool(
                self._options.compaction_processes,
                name="compaction",
                nice=self._options.compaction_nice,
            )
        # The lease's keep-alive and the TaskGroup owning every background task (splits, the
        # post-split major compactions, a log switch, the tablets' background compactions):
        # entered by start(), exited by stop().
        self._stack = contextlib.AsyncExitStack()
        self._tasks: asyncio.TaskGroup | None = None
        #: Set by stop(): no new split starts (it would change the tablets being closed).
        self._stopping = False
        #: The loop keeping the tablets' log positions recent (_trim_logs); cancelled by stop().
        self._trimming: asyncio.Task[None] | None = None
        #: Its samples of the log's bytes per segment (``worker/log_trim.py``).
        self._log_tail = LogTail()
        self._trim_shares = TrimShares(self._clock.random())
        self._heap_trimming: asyncio.Task[None] | None = None
        #: Gives the C heap's free pages back to the system (``WorkerOptions.heap_trim_*``).
        self.heap_trimmer: HeapTrimmer | None = None
        self._lease: Lease | None = None
        self._writer: CommitLogWriter | None = None
        self._log: WorkerLog | None = None
        # Held alone while the log moves to a new incarnation, and shared while tablets are
        # opened and start serving (so every served tablet's record lists the log it writes
        # to; openings go side by side).
        self._log_switch = SwitchGate()
        self._switching: asyncio.Task[None] | None = None
        #: Set by stop(): wakes a log switch waiting to try again.
        self._switch_wake = asyncio.Event()
        #: Dead logs read once for all the tablets this worker recovers from them.
        self._dead_logs = SharedLogReads(store, self._clock)
        #: The sort tasks this worker runs, shared by its loads and its sorter; those of a
        #: log it owns (every task reserved for it) run on its cores, in a pool made at the
        #: first one (§6; WorkerOptions.sort_processes).
        self._sort_pool: concurrent.futures.Executor | None = None
        processes = self._options.sort_processes
        #: The runs it sorts wait for its tablets' replay in memory, then on local disk.
        self.sort_spill = RunSpill(
            memory_bytes=self._options.sort_memory_bytes,
            disk_bytes=self._options.sort_spill_bytes,
            directory=self._options.sort_spill_dir,
            clock=self._clock,
        )
        self.sorts = SharedSorts(
            cpu=self._make_sort_pool if processes > 0 else None,
            parallel=processes + 1,
            spill=self.sort_spill,
        )

    def _make_sort_pool(self) -> concurrent.futures.Executor:
        """The pool the sort tasks of logs this worker owns run in (once; stop() ends it)."""
        if self._sort_pool is None:
            self._sort_pool = ProcessPool(self._options.sort_processes, name="sort")
        return self._sort_pool

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Take a lease, register in the servers directory, open a new log incarnation."""
        lease = self._options.lease
        self._lease = await self._coord.grant_lease(lease.ttl, safety_margin=lease.margin)
        await self._stack.enter_async_context(self._lease.keep_alive())
        # A background task that fails with anything but the errors it handles is a bug: the
        # group cancels the task that started this server (run_worker's), and stop() raises it.
        self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())
        await self._coord.put(
            paths.server(self.worker_id), self.address.encode(), lease=self._lease
        )
        incarnation = await next_incarnation(self._coord, self.worker_id)
        self._writer = CommitLogWriter(self._store, self.worker_id, incarnation, clock=self._clock)
        self._writer.start()
        self._log = WorkerLog(
            self._writer, LogRef(self.worker_id, incarnation), self._lease, self._clock
        )
        self._log.on_failure = self._log_failed
        if self._options.log_trim_interval is not None:
            self._trimming = self.spawn(None, self._trim_logs(self._options.log_trim_interval))
        if self._options.heap_trim_interval is not None:
            self.heap_trimmer = HeapTrimmer(
                self._options.heap_trim_interval, self._options.heap_trim_free_bytes
            )
            self._heap_trimming = self.spawn(None, self.heap_trimmer.run())

    async def _trim_logs(self, interval: float) -> None:
        """Keep the tablets' log positions recent (``WorkerOptions.log_trim_interval``;
        ``Tablet.trim_logs``; which tablets: ``worker/log_trim.py``): after a crash the
        master sorts only the segments from the lowest position of the dead worker's tablets
        on (§5.3), so the log tail a recovery reads stays short even for tablets too idle to
        fill a memtable."""
        opts = self._options
        tail = self._log_tail
        while True:
            await asyncio.sleep(interval)
            if self._log is None:
                continue
            ref, mark = self._log.log_ref, self._log.segment_mark()
            written = self._log.writer.stats.bytes
            tail.sample(ref, mark, written)
            tablets = list(self._tablets.items())
            shares = self._trim_shares
            shares.keep(self._tablets)
            # A tablet whose background flush is failing is left to its retries, which back
            # off (a trim would try the same PUTs every interval); a failed one to its reload.
            lagging = [
                (key, tablet)
                for key, tablet in tablets
                if (
                    tablet.record.logs != (ref,)
                    or lags(
                        tablet.record.log_start(ref),
                        mark,
                        tail,
                        written,
                        max_segments=max(1, round(opts.log_trim_segments * shares.of(key))),
                        max_bytes=round(opts.log_trim_bytes * shares.of(key)),
                    )
                )
                and tablet.flush_failure is None
                and tablet.must_reload is None
            ]
            tail.forget_before(
                min(
                    (t.record.log_start(ref) for _, t in tablets if ref in t.record.logs),
                    default=mark,
                )
            )
            # Side by side: one after the other, a round over a few busy tablets (a minor
            # compaction each) took seconds, and the log's tail grew meanwhile.
            await asyncio.gather(*(self._trim_one(key, tablet) for key, tablet in lagging))

    async def _trim_one(self, key: tuple[str, str], tablet: Tablet) -> None:
        try:
            await tablet.trim_logs()
            self._trim_shares.trimmed(key)
            # A trim's minor compaction adds an SSTable like a full memtable's does: merged
            # the same way (without, a chaos run's tablets reached 30 SSTables each, and
            # every load and read opened them all), in the background: awaited here, the
            # round waited for every tablet's merge, and a merge waits for the tablet's
            # rewrite under way (after a split, its major compaction: a minute), so no
            # tablet's log position moved meanwhile.
            tablet.spawn_merges()
        except TabletStoreError as exc:  # optional work: the next round tries again
            log.info("moving the log position of %s/%s: %s", *key, exc)

    async def stop(self, *, flush: bool = True) -> None:
        """Stop serving: minor-compact every tablet (so nothing needs replay), release claims.

        User tablets go first, then METADATA tablets, the root last: each one's final record
        update is a write to the level above, which must still be served. That update waits
        only briefly for a METADATA tablet that is not served (its worker stopping too, say):
        a tablet whose flush fails keeps its logs listed and is recovered from them."""
        self._catalog.retry_deadline = min(self._catalog.retry_deadline, _STOP_METADATA_WAIT)
        self._stopping = True
        self._switch_wake.set()
        loads = [*self._load_tasks.values(), *self._reloads]
        for task in loads:  # a load under way releases its claim as it is cancelled
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
        if self._switching is not None:
            # Its failure (or cancellation by the group) is not stop's to raise: the TaskGroup
            # reports a failure (stack.aclose below).
            await asyncio.gather(self._switching, return_exceptions=True)
        trimming = [t for t in (self._trimming, self._heap_trimming) if t is not None]
        compactions = self.splits.compactions
        for task in [*compactions, *trimming]:  # optional work: redone after the next load
            task.cancel()
        await asyncio.gather(*self.splits.running, *compactions, *trimming, return_exceptions=True)
        # One at a time, deepest level first, re-reading the set each time: nothing may be
        # left unclosed, whatever changed it while a tablet was being closed.
        while self._tablets:
            key = max(self._tablets, key=lambda k: mt.level(*k))
            tablet = self._tablets.pop(key)
            self._closing = key
            try:
                await tablet.close(flush=flush)
            except TabletStoreError as exc:
                log.warning("closing tablet %s/%s: %s", key[0], key[1], exc)
            finally:
                self._closing = None
            await self.release_claim(key)
        if self._writer is not None:
            with contextlib.suppress(TabletStoreError):
                await self._writer.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        if self._sort_pool is not None:
            self._sort_pool.shutdown(wait=True, cancel_futures=True)
        self.sort_spill.close()
        # Every task is done or cancelled by now (the tablets are closed); then the keep-alive.
        try:
            await self._stack.aclose()  # raises what a background task failed with, if any
        finally:
            self._tasks = None
            if self._lease is not None:
                # A lease that already ended cannot be revoked; that is the state we want.
                with contextlib.suppress(TabletStoreError):
                    await self._lease.revoke()

    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def unflushed(self) -> list[tuple[str, str]]:
        """The tablets a stop under way has not closed yet (the one it is closing first):
        what a drain cut short abandons (``run_worker``'s drain deadline)."""
        closing = [] if self._closing is None else [self._closing]
        return closing + sorted(k for k in self._tablets if k != self._closing)

    @property
    def tablets(self) -> dict[tuple[str, str], Tablet]:
        return self._tablets

    # Read by the metrics collectors (tabletstore.ops.metrics) at scrape time.
    @property
    def block_cache(self) -> BlockCache:
        return self._block_cache

    @property
    def commit_log_stats(self) -> CommitLogStats | None:
        return self._writer.stats if self._writer is not None else None

    @property
    def sort_spill_stats(self) -> SpillStats:
        return self.sort_spill.stats

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @property
    def store(self) -> ObjectStore:
        return self._store

    @property
    def stopping(self) -> bool:
        return self._stopping

    def tablet_lock(self, key: tuple[str, str]) -> asyncio.Lock:
        """The lock held while a tablet is loaded, unloaded or split (one at a time)."""
        return self._loading.setdefault(key, asyncio.Lock())

    def status(self, principal: Principal | None = None) -> ServerStatusResponse:
        """The tablets served here, their sizes and the requests each has had: those whose row
        keys ``principal`` may see (``may_see_keys``; all without one)."""
        tablets = tuple(
            TabletStatus(
                table_id=t.record.table_id,
                tablet_id=t.record.tablet_id,
                start_row=t.record.start_row,
                end_row=t.record.end_row,
                sstables=sum(len(v) for v in t.record.sstables.values()),
                sstable_bytes=t.record.size,
                memtable_bytes=t.state.memtable.approximate_size,
                requests=self._requests.get(key, 0),
            )
            for key, t in self._tablets.items()
            if may_see_keys(principal, t)
        )
        return ServerStatusResponse(self.worker_id, self.address, tablets)

    def tablet(self, table_id: str, tablet_id: str) -> Tablet:
        """The served tablet a request names (and one more request counted for it), or
        NotServing: not served here, or this worker's lease may have expired."""
        lease = self._lease
        if lease is not None and (lease.expired or self._clock.monotonic() >= lease.safe_until()):
            # Fencing rule 1 for reads too: a worker paused past its lease (SIGSTOP, a long
            # GC pause) must not answer from a memtable whose tablet may have a new owner.
            raise NotServing(
                f"worker {self.worker_id}'s lease may have expired; its tablets may have moved"
            )
        tablet = self._tablets.get((table_id, tablet_id))
        if tablet is None:
            raise NotServing(f"worker {self.worker_id} does not serve tablet {tablet_id}")
        self._requests[(table_id, tablet_id)] = self._requests.get((table_id, tablet_id), 0) + 1
        return tablet

    # ------------------------------------------------------------------ tablet assignment

    async def load(self, req: LoadTabletRequest | LoadTabletAtRequest) -> None:
        """Claim a tablet and serve it: fence and replay its logs first (§5.2, §5.3).

        The load runs on if its caller goes away, and a load of the same tablet asked for
        meanwhile joins it: a master SIGKILLed while its loads replay a dead worker's logs
        drops their connections, which cancels these calls; the load keeps its claim and
        finishes, and the next master (which sees the claim held by a live worker, or asks
        again) does not pay for the replay a second time.
        """
        key = (req.table_id, req.tablet_id)
        task = self._load_tasks.get(key)
        if task is None:
            if self._stopping:
                raise NotServing(f"worker {self.worker_id} is stopping")
            task = asyncio.get_running_loop().create_task(
                self._load_once(req), name=f"load {req.table_id}/{req.tablet_id}"
            )
            self._load_tasks[key] = task
            task.add_done_callback(lambda t: self._load_finished(key, t))
        await asyncio.shield(task)

    def _load_finished(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._load_tasks.get(key) is task:
            del self._load_tasks[key]
        if not task.cancelled() and task.exception() is not None:
            # Its callers got it; one whose caller left only leaves the tablet unclaimed.
            log.info("load of %s/%s failed: %s", key[0], key[1], task.exception())

    async def _load_once(self, req: LoadTabletRequest | LoadTabletAtRequest) -> None:
        key = (req.table_id, req.tablet_id)
        lock = self.tablet_lock(key)
        async with lock:
            if key in self._tablets:
                return
            assert self._lease is not None and self._log is not None
            claim_key = paths.claim(req.table_id, req.tablet_id)
            result = await self._coord.txn(
                [absent(claim_key)],
                [Put(claim_key, self.worker_id.encode(), lease_id=self._lease.id)],
                [],
            )
            if not result.succeeded:
                holder = await self._coord.get(claim_key)
                if holder is None or holder.value != self.worker_id.encode():
                    raise Unavailable(f"tablet {req.tablet_id} is still claimed by another worker")
            claim = await self._coord.get(claim_key)
            assert claim is not None
            self._epochs[key] = claim.create_revision
            try:
                await self._load_claimed(req, claim.create_revision)
            except BaseException:
                await self.release_claim(key)
                raise

    async def claim_new(self, key: tuple[str, str]) -> int:
        """Claim a tablet nobody has claimed (a split's new child); returns the epoch."""
        assert self._lease is not None
        claim_key = paths.claim(*key)
        result = await self._coord.txn(
            [absent(claim_key)],
            [Put(claim_key, self.worker_id.encode(), lease_id=self._lease.id)],
            [],
        )
        if not result.succeeded:
            raise Unavailable(f"tablet {key[1]} is already claimed")
        claim = await self._coord.get(claim_key)
        assert claim is not None
        self._epochs[key] = claim.create_revision
        return claim.create_revision

    async def release_claim(self, key: tuple[str, str]) -> None:
        """Delete our claim on a tablet — only if it is still ours (same epoch): after a lost
        lease the key may already be a new owner's claim."""
        epoch = self._epochs.pop(key, None)
        if epoch is None:
            return
        if self._lease is not None and self._lease.expired:
            # The claim is a key of the lease this worker gave up: it went with the lease, or
            # goes when the lease is revoked or ends at the coordinator, which may well be
            # unreachable now (a release would wait out its retries, tablet after tablet).
            return
        claim_key = paths.claim(*key)
        await self._coord.txn([create_revision_is(claim_key, epoch)], [Delete(claim_key)], [])

    async def _load_claimed(self, req: LoadTabletRequest | LoadTabletAtRequest, epoch: int) -> None:
        assert self._log is not None
        try:
            schema = self.newest_schema(await self._catalog.table_by_id(req.table_id))
        except NotFound as exc:
            raise NotServing(str(exc)) from exc
        # A request naming the end row reads the tablet's one METADATA row; an older master's
        # reads every row of its table.
        row_key = None
        if isinstance(req, LoadTabletAtRequest):
            row_key = metadata_row_key(req.table_id, req.end_row)
        record = await self._catalog.get_tablet(req.table_id, req.tablet_id, row_key=row_key)
        owned = replace(record, epoch=epoch, location=self.address).with_event(
            self._clock.time(), "assigned", self.worker_id
        )
        started = self._clock.monotonic()
        if record.epoch == 0 and not record.logs:
            # Never loaded (a new, restored or cloned table's tablet) and no log to replay:
            # the epoch is taken in the one update that lists this worker's log
            # (engine/log_replay.py), one METADATA write instead of two. Taking it first
            # keeps a previous owner's updates off the record the replay reads; here there
            # is no previous owner and nothing to replay. The update is still conditional on
            # epoch 0 (rule 2): a loader that claimed the tablet before this one (its claim
            # gone since) takes it with that same condition, so of the two updates one is
            # Fenced, and no record is written from a stale read.
            tablet = await self.open_and_serve(record, schema, (), claimed=owned)
        else:
            # Take the epoch first: from here on a previous owner's record updates are
            # rejected.
            owned = await self._catalog.update(record, owned)
            # The replay (the slow part: GETs of runs or segments) runs outside the
            # log-switch gate; opening and serving, which records this worker's log in the
            # record, shares it with the other openings and keeps a log switch out.
            # User tablets replay a few at a time, and every replay gives the event loop a
            # turn every thousand cells or so: loading a dead worker's tablets must never
            # hold the loop past this worker's own lease keep-alive.
            level = mt.level(req.table_id, req.tablet_id)
            async with self._replays if level == 3 else _NO_LIMIT:
                replayed = [cell async for cell in yielding(self._replay(owned))]
            tablet = await self.open_and_serve(owned, schema, replayed)
        log.info(
            "serving %s/%s: opened with %d commit log(s) to replay in %.2f s (%d cells in memory)",
            req.table_id,
            req.tablet_id,
            len(record.logs),
            self._clock.monotonic() - started,
            len(tablet.state.memtable),
        )

    async def open_and_serve(
        self,
        record: TabletRecord,
        schema: TableSchema,
        replayed: Sequence[Cell] | None = None,
        *,
        before_serving: Callable[[Tablet], None] | None = None,
        claimed: TabletRecord | None = None,
    ) -> Tablet:
        """Open a claimed tablet (``_open_tablet``) and serve it, inside the log-switch gate:
        opening records this worker's log in the tablet's record, so no log switch may come
        between (openings go side by side). ``before_serving`` sees the tablet opened, not yet
        served. ``claimed``: ``record`` as this load takes it (epoch, location), stored by the
        update that records the log (``recover_state``)."""
        async with self._log_switch.shared():
            tablet = await self._open_tablet(record, schema, replayed, claimed)
            if before_serving is not None:
                before_serving(tablet)
            tablet.on_compacted = self.splits.after_compaction
            tablet.on_failed = self._tablet_failed
            newest = self._schemas.get(tablet.record.table_id)
            if newest is not None and newest.schema is not tablet.schema:
                tablet.set_schema(newest.schema)  # pushed while it was opened (no await since)
            self._tablets[(tablet.record.table_id, tablet.record.tablet_id)] = tablet
            self.splits.after_load(tablet)  # a split's child: compacted to own its SSTables
            self.splits.after_compaction(tablet)  # a tablet loaded past the split size splits now
        return tablet

    def newest_schema(self, info: TableInfo) -> TableSchema:
        """Note a table's schema as read from the catalog and return the newest this worker
        has read (a push and a load may read it in either order)."""
        known = self._schemas.get(info.table_id)
        if known is None or info.revision >= known.revision:
            self._schemas[info.table_id] = known = info
        return known.schema

    async def log_barrier(self) -> None:
        """Wait until every write appended to this worker's commit log so far is durable or
        failed (``WorkerLog.barrier``)."""
        if self._log is not None:
            await self._log.barrier()

    async def _open_tablet(
        self,
        record: TabletRecord,
        schema: TableSchema,
        replayed: Sequence[Cell] | None = None,
        claimed: TabletRecord | None = None,
    ) -> Tablet:
        """Load a claimed tablet with this worker's log, caches and compaction pool; with the
        cells ``replayed`` from its logs already (None: replay them now); ``claimed``:
        :meth:`open_and_serve`."""
        assert self._log is not None

        async def given(_: TabletRecord) -> AsyncIterator[Cell]:
            for cell in replayed or ():
                yield cell

        return await Tablet.load(
            record,
            schema,
            store=self._store,
            log_sink=self._log,
            catalog=self._catalog,
            replay=self._replay if replayed is None else given,
            clock=self._clock,
            options=self._tablet_options,
            block_cache=self._block_cache,
            executor=self._executor,
            scan_cache=self._scan_cache,
            tasks=self._tasks,
            claimed=claimed,
            compaction_budget=self._compaction_budget,
        )

    # ------------------------------------------------------------------ a failed commit log

    def _log_failed(self) -> None:
        """The commit log failed (a segment PUT failed for good, or recovery fenced it) while
        this worker may still hold its lease: go on under a new incarnation
        (docs/architecture/design.md §6) rather than refuse every write for ever. Every tablet
        refuses writes at once, naming the failure; a switch already under way (whose new log
        failed too) starts over at its next pass."""
        if self._stopping or self._log is None:
            return
        failure = self._log.writer.failed
        for tablet in self._tablets.values():
            tablet.hold_writes(failure)
        if self._switching is None or self._switching.done():
            self._switching = self.spawn(None, self._switch_log())

    async def _switch_log(self) -> None:
        """Move to a new incarnation and record it in every served tablet's record before the
        tablet takes writes again (:meth:`_switch_pass`). A tablet whose record cannot take it
        for now (the METADATA tablet holding the record refuses: it waits for its own record,
        its worker is away, or the new log failed too, as on a full disk) stays served for
        reads with its writes held, and is tried again, backing off, until its record takes
        the log or the worker stops: writes come back by themselves once the cause is gone."""
        assert self._log is not None and self._lease is not None
        delay = _SWITCH_RETRY
        while not self._stopping and not self._lease.expired:
            waiting = await self._switch_pass()
            if not waiting and self._log.writer.failed is None:
                return
            log.info(
                "%d tablet(s) wait to record commit log %s/%s%s; trying again in %.1f s",
                len(waiting),
                self._log.log_ref.worker_id,
                self._log.log_ref.incarnation,
                "" if self._log.writer.failed is None else ", which failed too",
                delay,
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._switch_wake.wait()  # set by stop()
            delay = min(delay * 2, _SWITCH_RETRY_MAX)

    async def _switch_pass(self) -> list[tuple[str, str]]:
        """One attempt of the switch. If the current log failed, open the next incarnation
        (every tablet holds its writes again). Then record the log in each held tablet's
        record: the root first (its record is in the coordinator), then METADATA tablets, then
        user tablets (each one's record is a row served by the level above). A tablet that
        must be reloaded (a write whose record may or may not be in the old log, a failed
        compaction) is reloaded by this worker (:meth:`_reload`: closed without a flush, its
        logs replayed, the old one fenced); one whose record another worker owns now (Fenced)
        is dropped without a flush: its logs stay listed, and its next load replays them.
        Returns the tablets still held (their record could not take the log now)."""
        assert self._log is not None and self._lease is not None
        async with self._log_switch.exclusive():
            old = self._log.writer
            if old.failed is not None:
                failure = old.failed
                with contextlib.suppress(TabletStoreError):
                    await old.close()  # let the PUTs already sent settle
                if self._lease.expired:
                    return []  # run_worker stops this worker: its tablets are being recovered
                try:
                    incarnation = await next_incarnation(self._coord, self.worker_id)
                except TabletStoreError as exc:
                    log.error("cannot open a new commit-log incarnation: %s", exc)
                    return list(self._tablets)
                writer = CommitLogWriter(
                    self._store, self.worker_id, incarnation, clock=self._clock
                )
                writer.start()
                self._writer = writer
                self._log.switch(writer, LogRef(self.worker_id, incarnation))
                for tablet in self._tablets.values():
                    tablet.hold_writes(failure)
                log.warning(
                    "commit log %s/%s failed (%s); continuing under incarnation %s",
                    self.worker_id,
                    old.incarnation,
                    failure,
                    incarnation,
                )
            waiting: list[tuple[str, str]] = []
            keys = sorted(self._tablets, key=lambda k: mt.level(*k))
            for i, key in enumerate(keys):
                if self._log.writer.failed is not None or (
                    waiting and mt.level(*waiting[-1]) < mt.level(*key)
                ):
                    # The new log failed too (every record update would now be refused in
                    # turn), or a level above waits (these records may be its rows): the rest
                    # wait for the next pass rather than each wait out its refusals.
                    waiting += [k for k in keys[i:] if self._held(k)]
                    break
                held = self._tablets.get(key)
                if held is None or not held.log_pending:
                    continue
                if held.must_reload is None:
                    try:
                        await held.add_log(self._log.log_ref, wait=_SWITCH_RECORD_WAIT)
                        if held.must_reload is None:
                            continue
                        # (failed meanwhile: a write of the old log answered Indeterminate)
                    except Fenced as exc:
                        if self._tablets.get(key) is held:
                            log.warning("tablet %s/%s dropped after the log failed: %s", *key, exc)
                            await self._drop(key)
                        continue
                    except TabletStoreError as exc:
                        if held.must_reload is None:
                            log.info("tablet %s/%s waits to record the new log: %s", *key, exc)
                            waiting.append(key)
                            continue
                # The old log is settled now (its writer closed, its PUTs landed or failed):
                # the reload reads it fenced, so it sees exactly what it holds.
                self._reload_soon(key, held)
            return waiting

    def _held(self, key: tuple[str, str]) -> bool:
        tablet = self._tablets.get(key)
        return tablet is not None and tablet.log_pending

    def _tablet_failed(self, tablet: Tablet) -> None:
        """A served tablet failed (``Tablet.must_reload``: a write whose record may or may not
        be in the log, a compaction failure retrying cannot mend): reload it without an
        operator (:meth:`_reload`). While the log it wrote to has failed, or the worker is
        moving to a new one, the log switch starts the reload once that log is settled
        (:meth:`_switch_pass`): read before, it could gain a record afterwards. A worker that
        is stopping, or whose lease ended, reloads nothing (its tablets are recovered from
        their logs wherever they are loaded next)."""
        if self._stopping or self._log is None or self._lease is None or self._lease.expired:
            return
        if self._log.writer.failed is not None or tablet.log_pending:
            return
        self._reload_soon((tablet.record.table_id, tablet.record.tablet_id), tablet)

    def _reload_soon(self, key: tuple[str, str], tablet: Tablet) -> None:
        self.spawn(self._reloads, self._reload(key, tablet))

    async def _reload(self, key: tuple[str, str], tablet: Tablet) -> None:
        """Close a failed tablet without a flush and load it again under the same claim, as a
        load from the master would (its record, then a replay of the logs it lists, fenced
        unless it is this worker's live log): every acknowledged write is in those logs, and
        a write answered Indeterminate ends up in the table exactly if its record is in the
        log. Reads are served by the failed tablet until it closes. If the load fails, the
        claim is released and the master assigns the tablet again (possibly here)."""
        async with self.tablet_lock(key):
            if self._tablets.get(key) is not tablet or self._stopping:
                return  # unloaded, dropped, split or reloaded meanwhile
            log.warning(
                "tablet %s/%s failed (%s); reloading it from its record and commit logs",
                *key,
                tablet.must_reload,
            )
            del self._tablets[key]
            with contextlib.suppress(TabletStoreError):
                await tablet.close(flush=False)
            epoch = self._epochs.get(key)
            if epoch is None:
                return
            try:
                await self._load_claimed(LoadTabletRequest(*key), epoch)
            except (TabletStoreError, asyncio.CancelledError) as exc:
                log.warning(
                    "reloading tablet %s/%s failed (%r); releasing it for the master to assign",
                    *key,
                    exc,
                )
                with contextlib.suppress(TabletStoreError):
                    await self.release_claim(key)
                if isinstance(exc, asyncio.CancelledError):
                    raise

    async def _drop(self, key: tuple[str, str]) -> None:
        """Stop serving a tablet without a flush and release its claim (if still ours)."""
        tablet = self._tablets.pop(key, None)
        if tablet is not None:
            with contextlib.suppress(TabletStoreError):
                await tablet.close(flush=False)
        with contextlib.suppress(TabletStoreError):
            await self.release_claim(key)

    async def _replay(self, record: TabletRecord) -> AsyncIterator[Cell]:
        """The tablet's cells past its redo point from every log its record lists (§5.3).
        Another worker's log is read from its sorted runs when the master sorted it (§6),
        else fenced first (docs/architecture/design.md §6 rule 4: its writer may be alive) and read
        whole; this worker's current log is read up to its durable prefix (it served the tablet
        before in this incarnation, and fencing it would stop its own writes)."""
        assert self._log is not None
        for ref in record.logs:
            if ref == self._log.log_ref:
                cells = self._log.replay_own(record)
            elif self._dead_logs.holds(ref):
                # Fenced and read here already (for the root or METADATA tablet recovered
                # first): the same records the sorted runs would give, without waiting.
                cells = self._direct_replay(ref, record)
            else:
                cells = replay_logged(
                    self._store,
                    ref,
                    record,
                    wait=self._options.sort_wait,
                    direct=self._direct_replay,
                    reserved=self._reserved_sorts,
                    shared=self.sorts,
                )
            async for cell in cells:
                yield cell

    async def _reserved_sorts(self, plan: SortPlan) -> set[int]:
        """The tasks of ``plan`` the master published reserved for this worker (owner
        affinity: it is given every tablet of the log): the load sorts them itself at once,
        sharing one run with this worker's sorter (``run_sort_task``), instead of waiting
        for the sorter's next poll and the runs' listing, or for a dead sorter's claim to
        end."""
        mine: set[int] = set()
        for task in plan.tasks:
            kv = await self._coord.get(paths.sort(plan.worker_id, plan.incarnation, task.first))
            try:
                published = None if kv is None else json.loads(kv.value)
            except ValueError:
                continue  # not a task this version understands: the sorters leave it too
            if isinstance(published, dict) and published.get("owner") == self.worker_id:
                mine.add(task.first)
        return mine

    async def _direct_replay(self, ref: LogRef, record: TabletRecord) -> AsyncIterator[Cell]:
        """A log nobody sorted, read whole once for every tablet recovered from it here."""
        records = await self._dead_logs.records(ref, record.log_start(ref))
        for cell in tablet_cells(records, record):
            yield cell

    async def unload(self, req: UnloadTabletRequest) -> None:
        """Stop serving a tablet; minor-compact it first so the next owner replays nothing
        (§5.4: once while it still serves, then what arrived meanwhile once it serves no
        more). Waits for a split of it under way (then there is nothing left to unload)."""
        key = (req.table_id, req.tablet_id)
        async with self.tablet_lock(key):
            tablet = self._tablets.get(key)
            if tablet is None:
                return
            if req.flush:
                try:
                    await tablet.flush_ahead("being unloaded")
                except TabletStoreError as exc:  # the close below flushes (or fails) again
                    log.info("flushing %s/%s before unloading it: %s", *key, exc)
                except BaseException:
                    # Cancelled (the master's call gave up): unloaded all the same, its logs
                    # listed for the next owner to replay, as when cancelled in the close.
                    if self._tablets.get(key) is tablet:
                        del self._tablets[key]
                        await self.release_claim(key)
                    raise
            if self._tablets.get(key) is not tablet:
                return  # dropped meanwhile, or the worker stopping: its claim went with it
            self._tablets.pop(key)
            try:
                await tablet.close(flush=req.flush)
            finally:
                await self.release_claim(key)

    # ------------------------------------------------------------------ background work

    def spawn(
        self, tasks: set[asyncio.Task[None]] | None, coro: Coroutine[object, object, None]
    ) -> asyncio.Task[None] | None:
        """Run ``coro`` in this server's TaskGroup (tracked in ``tasks`` while it runs); None,
        with ``coro`` closed, when the server is not started or is stopping: background work
        is optional then (stop() closes every tablet, flushing it)."""
        if self._tasks is None or self._stopping:
            coro.close()
            return None
        try:
            task = self._tasks.create_task(coro)
        except RuntimeError:
            # The group is shutting down: a task of it failed, and its error is on its way to
            # run_worker (the group cancelled it) and out of stop(). Nothing new starts.
            coro.close()
            return None
        if tasks is not None:
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        return task


def check_options(options: WorkerOptions, tablet_options: TabletOptions) -> None:
    """InvalidArgument naming the first setting of ``options`` or ``tablet_options`` that
    cannot work (a negative size or count, a timeout that is not positive, bounds that
    contradict each other), before anything is started with it."""
    _bounded(
        "WorkerOptions",
        options,
        at_least_0=(
            "block_cache_bytes",
            "scan_cache_rows",
            "compaction_processes",
            "split_cooldown",
            "sort_wait",
            "sort_processes",
            "sort_memory_bytes",
            "sort_spill_bytes",
            "heap_trim_free_bytes",
        ),
        at_least_1=(
            "compaction_memory_bytes",
            "load_concurrency",
            "log_trim_segments",
            "concurrent_splits",
        ),
        above_0=("log_trim_bytes", "drain_deadline"),
        none_or_above_0=("log_trim_interval", "heap_trim_interval", "report_stalls"),
    )
    lease = options.lease
    _bounded("LeaseOptions", lease, above_0=("ttl",), none_or_at_least_0=("safety_margin",))
    if lease.margin >= lease.ttl:
        raise InvalidArgument(
            f"LeaseOptions.safety_margin must be below ttl ({lease.ttl} s), got {lease.margin}"
        )
    _bounded(
        "TabletOptions",
        tablet_options,
        at_least_1=(
            "memtable_flush_bytes",
            "max_sstables_per_group",
            "max_row_mutations",
            "split_bytes",
        ),
        none_or_above_0=("memtable_limit_bytes",),
    )
    if tablet_options.max_disjoint_sstables_per_group < tablet_options.max_sstables_per_group:
        raise InvalidArgument(
            "TabletOptions.max_disjoint_sstables_per_group must be at least "
            f"max_sstables_per_group ({tablet_options.max_sstables_per_group}), got "
            f"{tablet_options.max_disjoint_sstables_per_group}"
        )


def _bounded(
    owner: str,
    options: object,
    *,
    at_least_0: tuple[str, ...] = (),
    at_least_1: tuple[str, ...] = (),
    above_0: tuple[str, ...] = (),
    none_or_above_0: tuple[str, ...] = (),
    none_or_at_least_0: tuple[str, ...] = (),
) -> None:
    """InvalidArgument ``owner.name must be ...`` for the first field out of its bounds (a
    value that is not a number, NaN included, is out of every bound)."""
    rules: list[tuple[tuple[str, ...], str, Callable[[float], bool], bool]] = [
        (at_least_0, ">= 0", lambda v: v >= 0, False),
        (at_least_1, ">= 1", lambda v: v >= 1, False),
        (above_0, "> 0", lambda v: v > 0, False),
        (none_or_above_0, "> 0 or None", lambda v: v > 0, True),
        (none_or_at_least_0, ">= 0 or None", lambda v: v >= 0, True),
    ]
    for names, bound, ok, optional in rules:
        for name in names:
            value = getattr(options, name)
            if optional and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
                raise InvalidArgument(f"{owner}.{name} must be {bound}, got {value!r}")


async def next_incarnation(coordinator: Coordinator, worker_id: str) -> int:
    """A fresh incarnation number for ``worker_id``: a counter in the coordinator, bumped by
    compare-and-swap, so no two incarnations of a worker ever share a commit log."""
    key = paths.setting(f"incarnation.{worker_id}")
    while True:
        kv = await coordinator.get(key)
        current = int(kv.value) if kv is not None else -1
        compare = mod_revision_is(key, kv.mod_revision) if kv is not None else absent(key)
        result = await coordinator.txn([compare], [Put(key, str(current + 1).encode())], [])
        if result.succeeded:
            return current + 1
