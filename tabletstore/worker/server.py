"""The tablet server: a stateless worker serving the tablets it holds claims for (§5.2, §5.3).

All durable state is in the bucket (SSTables, commit-log segments) and the coordinator
(schemas, tablet records, claims). A worker:

1. takes a lease and registers ``servers/<worker-id>`` under it (the Chubby servers
   directory, §5.2), and opens a fresh commit-log *incarnation* shared by all its tablets;
2. on ``load_tablet``, claims the tablet (a key attached to its lease; the claim's creation
   revision becomes the tablet's epoch), fences and replays the logs the tablet's record lists
   (DESIGN.md §6 rule 4, §7) and starts serving;
3. answers data requests for tablets it serves and ``NotServing`` for any other, so clients
   refresh their cached locations (§5.1);
   METADATA tablets are served like any other; the worker reaches the rows recording its own
   tablets through a ``LocationCache`` over the same transport (possibly calling itself: no
   lock a METADATA write needs is held across such a call);
4. stops acknowledging writes before its lease can have expired (fencing rule 1).

A TabletServer implements ``rpc.services.TabletService``: its request handlers are plain async
methods of that Protocol, served through ``TABLET.handlers(server)`` by the transport
(in-process or TCP).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import replace
from typing import Any

from tabletstore.batch.load_files import cells_for_tablet
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
from tabletstore.data.model import Row
from tabletstore.data.query import RowSet
from tabletstore.data.schema import TableSchema
from tabletstore.engine import split_key as splitting
from tabletstore.engine.pools import process_pool
from tabletstore.engine.scan_stats import ScanStats
from tabletstore.engine.tablet import SnapshotCut, Tablet
from tabletstore.errors import (
    InvalidArgument,
    NotFound,
    NotServing,
    PermissionDenied,
    TabletStoreError,
    Unavailable,
)
from tabletstore.keys import Cell
from tabletstore.metadata import rows as mt
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import (
    BulkLoadMark,
    LogRef,
    SSTableRef,
    TabletRecord,
    uncovered,
)
from tabletstore.options import TabletOptions, WorkerOptions
from tabletstore.rpc.auth import current_principal
from tabletstore.rpc.messages import (
    AdoptCompactionRequest,
    BulkLoadTabletRequest,
    BulkLoadTabletResponse,
    CheckAndMutateRequest,
    CheckAndMutateResponse,
    CompactTabletRequest,
    EntryError,
    LargeRow,
    LoadTabletRequest,
    MutateRowsRequest,
    MutateRowsResponse,
    MutateTabletsRequest,
    PointReadsRequest,
    PointReadsResponse,
    ReadModifyWriteRequest,
    ReadRowsRequest,
    RowBatch,
    RowPiece,
    SampleRowKeysRequest,
    SampleRowKeysResponse,
    ScanProgress,
    ServerStatusRequest,
    ServerStatusResponse,
    SnapshotHoldRequest,
    SnapshotTablet,
    SnapshotWriteRequest,
    SnapshotWriteResponse,
    TabletMutations,
    TabletStatus,
    UnloadTabletRequest,
    UpdateSchemaRequest,
)
from tabletstore.rpc.row_pieces import STREAM_ITEM_BYTES, UNARY_ROW_BYTES, row_bytes, split_row
from tabletstore.rpc.services import TABLET
from tabletstore.rpc.transport import Handlers, Method, Transport, call_handler, stream_handler
from tabletstore.security.principal import Principal
from tabletstore.sstable import SSTable
from tabletstore.sstable.block_cache import BlockCache, ScanCache
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["TabletServer", "next_incarnation"]

from tabletstore.worker.eager import gather_eager
from tabletstore.worker.log import WorkerLog, replay_logged
from tabletstore.worker.recovery import SharedLogReads, tablet_cells
from tabletstore.worker.switch_gate import SwitchGate

log = logging.getLogger(__name__)


def _progress(stats: ScanStats) -> ScanProgress:
    return ScanProgress(stats.last_scanned or b"", stats.rows_seen, stats.cells_seen)


#: Seconds a stopping worker's last record updates wait for METADATA (see stop()).
_STOP_METADATA_WAIT = 5.0

#: Rows per streamed item of a scan, and a byte bound on one item: a larger row goes alone,
#: in pieces of about that size (rpc.row_pieces).
_ROWS_PER_BATCH = 256
_BYTES_PER_BATCH = STREAM_ITEM_BYTES


class _SelfFirst:
    """The worker's transport to METADATA tablets: a call to its own address goes straight to
    its own handlers (no socket; and still possible while stopping, after the RPC server
    closed, when its last record updates may go to a METADATA tablet it serves itself)."""

    def __init__(self, server: TabletServer, remote: Transport) -> None:
        self._server = server
        self._local: Handlers = TABLET.handlers(server)
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
        # Records of this worker's tablets are METADATA rows, reached over ``transport``.
        self.locations = LocationCache(coordinator, _SelfFirst(self, transport))
        self._catalog = Catalog(coordinator, metadata=self.locations)
        self._clock = clock or SystemClock()
        self._options = options or WorkerOptions()
        self._tablet_options = tablet_options or TabletOptions()
        self._block_cache = BlockCache(self._options.block_cache_bytes)
        #: The §6 scan cache shared by every SSTable this worker opens (None: disabled).
        self._scan_cache = (
            ScanCache(self._options.scan_cache_rows) if self._options.scan_cache_rows > 0 else None
        )
        self._tablets: dict[tuple[str, str], Tablet] = {}
        self._loading: dict[tuple[str, str], asyncio.Lock] = {}
        #: Loads under way, by tablet: each runs as its own task, which the load_tablet calls
        #: for that tablet await (so a caller that goes away does not stop it).
        self._load_tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._requests: dict[tuple[str, str], int] = {}
        #: The claim's create revision (the tablet's epoch) of every tablet claimed here.
        self._epochs: dict[tuple[str, str], int] = {}
        # Merging and major compactions run in worker processes when configured (§5.4), so
        # serving never stalls on them. forkserver, never fork: this process runs threads.
        self._executor: concurrent.futures.Executor | None = None
        if self._options.compaction_processes > 0:
            self._executor = process_pool(self._options.compaction_processes)
        # The lease's keep-alive and the TaskGroup owning every background task (splits, the
        # post-split major compactions, a log switch, the tablets' background compactions):
        # entered by start(), exited by stop().
        self._stack = contextlib.AsyncExitStack()
        self._tasks: asyncio.TaskGroup | None = None
        # Splits (awaited by stop()) and post-split major compactions (cancelled by it).
        self._splits: set[asyncio.Task[None]] = set()
        #: Set by stop(): no new split starts (it would change the tablets being closed).
        self._stopping = False
        self._compactions: set[asyncio.Task[None]] = set()
        #: The loop keeping the tablets' log positions recent (_trim_logs); cancelled by stop().
        self._trimming: asyncio.Task[None] | None = None
        self._splitting: set[tuple[str, str]] = set()
        #: Monotonic time before which a tablet born of a split does not split again.
        self._split_after: dict[tuple[str, str], float] = {}
        self._lease: Lease | None = None
        self._writer: CommitLogWriter | None = None
        self._log: WorkerLog | None = None
        # Held alone while the log moves to a new incarnation, and shared while tablets are
        # opened and start serving (so every served tablet's record lists the log it writes
        # to; openings go side by side).
        self._log_switch = SwitchGate()
        self._switching: asyncio.Task[None] | None = None
        #: Dead logs read once for all the tablets this worker recovers from them.
        self._dead_logs = SharedLogReads(store, self._clock)
        #: The sort tasks this worker runs, shared by its loads and its sorter; those of a
        #: log it owns (every task reserved for it) run on its cores, in a pool made at the
        #: first one (§6; WorkerOptions.sort_processes).
        self._sort_pool: concurrent.futures.Executor | None = None
        processes = self._options.sort_processes
        if processes < 0:
            raise InvalidArgument(f"sort_processes must be >= 0, got {processes}")
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
        #: Snapshot cuts held here, by snapshot id, until snapshot_write (or until dropped
        #: by a timer: a master that died mid-snapshot must not pin memtables for ever).
        self._snapshot_cuts: dict[str, list[tuple[Tablet, SnapshotCut]]] = {}

    def _make_sort_pool(self) -> concurrent.futures.Executor:
        """The pool the sort tasks of logs this worker owns run in (once; stop() ends it)."""
        if self._sort_pool is None:
            self._sort_pool = process_pool(self._options.sort_processes)
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
            self._trimming = self._spawn(None, self._trim_logs(self._options.log_trim_interval))

    async def _trim_logs(self, interval: float) -> None:
        """Keep the tablets' log positions recent (``WorkerOptions.log_trim_interval``;
        ``Tablet.trim_logs``): after a crash the master sorts only the segments from the
        lowest position of the dead worker's tablets on (§5.3), so the log tail a recovery
        reads stays short even for tablets too idle to fill a memtable."""
        while True:
            await asyncio.sleep(interval)
            if self._log is None:
                continue
            ref, mark = self._log.log_ref, self._log.segment_mark()
            lag = self._options.log_trim_segments
            lagging = [
                (key, tablet)
                for key, tablet in list(self._tablets.items())
                if tablet.record.logs != (ref,) or mark - tablet.record.log_start(ref) >= lag
            ]
            # Side by side: one after the other, a round over a few busy tablets (a minor
            # compaction each) took seconds, and the log's tail grew meanwhile.
            await asyncio.gather(*(self._trim_one(key, tablet) for key, tablet in lagging))

    async def _trim_one(self, key: tuple[str, str], tablet: Tablet) -> None:
        try:
            await tablet.trim_logs()
            # A trim's minor compaction adds an SSTable like a full memtable's does: merged
            # the same way (without, a chaos run's tablets reached 30 SSTables each, and
            # every load and read opened them all).
            await tablet.merge_if_needed()
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
        loads = list(self._load_tasks.values())
        for task in loads:  # a load under way releases its claim as it is cancelled
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
        if self._switching is not None:
            # Its failure (or cancellation by the group) is not stop's to raise: the TaskGroup
            # reports a failure (stack.aclose below).
            await asyncio.gather(self._switching, return_exceptions=True)
        trimming = [] if self._trimming is None else [self._trimming]
        for task in [*self._compactions, *trimming]:  # optional work: redone after the next load
            task.cancel()
        await asyncio.gather(*self._splits, *self._compactions, *trimming, return_exceptions=True)
        # One at a time, deepest level first, re-reading the set each time: nothing may be
        # left unclosed, whatever changed it while a tablet was being closed.
        while self._tablets:
            key = max(self._tablets, key=lambda k: mt.level(*k))
            tablet = self._tablets.pop(key)
            try:
                await tablet.close(flush=flush)
            except TabletStoreError as exc:
                log.warning("closing tablet %s/%s: %s", key[0], key[1], exc)
            await self._release_claim(key)
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

    def _tablet(self, table_id: str, tablet_id: str) -> Tablet:
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

    async def load_tablet(self, req: LoadTabletRequest) -> None:
        """Claim a tablet and serve it: fence and replay its logs first (§5.2, §5.3).

        The load runs on if its caller goes away, and a load of the same tablet asked for
        meanwhile joins it: a master SIGKILLed while its loads replay a dead worker's logs
        drops their connections, which cancels these calls; the load keeps its claim and
        finishes, and the next master (which sees the claim held by a live worker, or asks
        again) does not pay for the replay a second time (issue 11: stalls after kill_master).
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

    async def _load_once(self, req: LoadTabletRequest) -> None:
        key = (req.table_id, req.tablet_id)
        lock = self._loading.setdefault(key, asyncio.Lock())
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
                await self._release_claim(key)
                raise

    async def _release_claim(self, key: tuple[str, str]) -> None:
        """Delete our claim on a tablet — only if it is still ours (same epoch): after a lost
        lease the key may already be a new owner's claim."""
        epoch = self._epochs.pop(key, None)
        if epoch is None:
            return
        claim_key = paths.claim(*key)
        await self._coord.txn([create_revision_is(claim_key, epoch)], [Delete(claim_key)], [])

    async def _load_claimed(self, req: LoadTabletRequest, epoch: int) -> None:
        assert self._log is not None
        try:
            schema = (await self._catalog.table_by_id(req.table_id)).schema
        except NotFound as exc:
            raise NotServing(str(exc)) from exc
        record = await self._catalog.get_tablet(req.table_id, req.tablet_id)
        # Take the epoch first: from here on a previous owner's record updates are rejected.
        owned = replace(record, epoch=epoch, location=self.address).with_event(
            self._clock.time(), "assigned", self.worker_id
        )
        owned = await self._catalog.update(record, owned)
        started = self._clock.monotonic()
        # The replay (the slow part: GETs of runs or segments) runs outside the log-switch
        # gate; opening and serving, which records this worker's log in the record, shares
        # it with the other openings and keeps a log switch out.
        replayed = [cell async for cell in self._replay(owned)]
        async with self._log_switch.shared():
            tablet = await self._open_tablet(owned, schema, replayed)
            self._serve(tablet)
        log.info(
            "serving %s/%s: opened with %d commit log(s) to replay in %.2f s (%d cells in memory)",
            req.table_id,
            req.tablet_id,
            len(owned.logs),
            self._clock.monotonic() - started,
            len(tablet.state.memtable),
        )

    def _serve(self, tablet: Tablet) -> None:
        tablet.on_compacted = self._compacted
        self._tablets[(tablet.record.table_id, tablet.record.tablet_id)] = tablet
        self._compacted(tablet)  # a tablet loaded past the split size splits now

    async def _open_tablet(
        self, record: TabletRecord, schema: TableSchema, replayed: Sequence[Cell] | None = None
    ) -> Tablet:
        """Load a claimed tablet with this worker's log, caches and compaction pool; with the
        cells ``replayed`` from its logs already (None: replay them now)."""
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
        )

    # ------------------------------------------------------------------ a failed commit log

    def _log_failed(self) -> None:
        """The commit log failed (a segment PUT failed for good, or recovery fenced it) while
        this worker may still hold its lease: go on under a new incarnation (DESIGN.md §6)
        rather than refuse every write for ever. Every tablet refuses writes at once."""
        if self._stopping or (self._switching is not None and not self._switching.done()):
            return
        switching = self._spawn(None, self._switch_log())
        if switching is None:
            return  # not started, or stopping: stop() closes the tablets anyway
        for tablet in self._tablets.values():
            tablet.hold_writes()
        self._switching = switching

    async def _switch_log(self) -> None:
        """Open the next incarnation and record it in every served tablet's record before the
        tablet takes writes again: the root first (its record is in the coordinator), then
        METADATA tablets, then user tablets (each one's record is a row served by the level
        above). A tablet whose record cannot take the new log (Fenced: another worker owns it
        now; or METADATA unreachable) is dropped without a flush; its logs stay listed and its
        next owner recovers it from them."""
        assert self._log is not None and self._lease is not None
        async with self._log_switch.exclusive():
            old = self._log.writer
            with contextlib.suppress(TabletStoreError):
                await old.close()  # let the PUTs already sent settle
            if self._lease.expired:
                return  # run_worker stops this worker: its tablets are being recovered
            try:
                incarnation = await next_incarnation(self._coord, self.worker_id)
            except TabletStoreError as exc:
                log.error("cannot open a new commit-log incarnation: %s", exc)
                await self._drop_all("no new commit log")
                return
            writer = CommitLogWriter(self._store, self.worker_id, incarnation, clock=self._clock)
            writer.start()
            self._writer = writer
            self._log.switch(writer, LogRef(self.worker_id, incarnation))
            log.warning(
                "commit log %s/%s failed (%s); continuing under incarnation %s",
                self.worker_id,
                old.incarnation,
                old.failed,
                incarnation,
            )
            for key in sorted(self._tablets, key=lambda k: mt.level(*k)):
                tablet = self._tablets.get(key)
                if tablet is None:
                    continue
                try:
                    await tablet.add_log(self._log.log_ref)
                except TabletStoreError as exc:
                    log.warning("tablet %s/%s dropped after the log failed: %s", *key, exc)
                    await self._drop(key)

    async def _drop(self, key: tuple[str, str]) -> None:
        """Stop serving a tablet without a flush and release its claim (if still ours)."""
        tablet = self._tablets.pop(key, None)
        if tablet is not None:
            with contextlib.suppress(TabletStoreError):
                await tablet.close(flush=False)
        with contextlib.suppress(TabletStoreError):
            await self._release_claim(key)

    async def _drop_all(self, why: str) -> None:
        for key in sorted(self._tablets, key=lambda k: -mt.level(*k)):
            log.warning("tablet %s/%s dropped: %s", *key, why)
            await self._drop(key)

    async def _replay(self, record: TabletRecord) -> AsyncIterator[Cell]:
        """The tablet's cells past its redo point from every log its record lists (§5.3).
        Another worker's log is read from its sorted runs when the master sorted it (§6),
        else fenced first (DESIGN.md §6 rule 4: its writer may be alive) and read whole; this
        worker's current log is read up to its durable prefix (it served the tablet before in
        this incarnation, and fencing it would stop its own writes)."""
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

    async def unload_tablet(self, req: UnloadTabletRequest) -> None:
        """Stop serving a tablet; minor-compact it first so the next owner replays nothing.
        Waits for a split of it under way (then there is nothing left to unload)."""
        key = (req.table_id, req.tablet_id)
        async with self._loading.setdefault(key, asyncio.Lock()):
            tablet = self._tablets.pop(key, None)
            if tablet is None:
                return
            try:
                await tablet.close(flush=req.flush)
            finally:
                await self._release_claim(key)

    # ------------------------------------------------------------------ splits (§5.2)

    def _spawn(
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

    def _compacted(self, tablet: Tablet) -> None:
        """After each compaction of a tablet: split it in the background if it has grown
        past the split size. METADATA tablets are split only when created (Master's
        ``metadata_splits``), never here."""
        rec = tablet.record
        key = (rec.table_id, rec.tablet_id)
        if (
            self._stopping
            or mt.level(*key) != 3
            or key in self._splitting
            or self._tablets.get(key) is not tablet
            or self._clock.monotonic() < self._split_after.get(key, 0.0)
            or not splitting.should_split(rec, self._tablet_options.split_bytes)
        ):
            return
        if self._spawn(self._splits, self._split(key)) is not None:
            self._splitting.add(key)

    async def _split(self, key: tuple[str, str]) -> None:
        try:
            async with self._loading.setdefault(key, asyncio.Lock()):
                await self._split_locked(key)
        except TabletStoreError as exc:
            log.warning("split of tablet %s/%s failed: %s", key[0], key[1], exc)
        finally:
            self._splitting.discard(key)

    # REQUIRES: self._loading[key] held.
    async def _split_locked(self, key: tuple[str, str]) -> None:
        """Split a served tablet in two (§5.2): stop its writes and flush it, claim the two
        children, commit them in place of the parent through the catalog (one atomic step),
        then serve them here. The master needs no notice: the children are claimed and
        located; its next round sees them in METADATA like any other tablet."""
        tablet = self._tablets.get(key)
        if tablet is None:
            return
        split_key = await tablet.split_key()
        if split_key is None:
            return
        ids = (f"t{uuid.uuid4().hex[:12]}", f"t{uuid.uuid4().hex[:12]}")
        outcome = "failed"
        try:
            # Leaving this block normally closes the parent; raising resumes its writes.
            async with tablet.splitting() as parent:
                epochs = [await self._claim((key[0], i)) for i in ids]
                children = splitting.split_records(
                    parent,
                    split_key,
                    left_id=ids[0],
                    right_id=ids[1],
                    left_epoch=epochs[0],
                    right_epoch=epochs[1],
                    location=self.address,
                    at=self._clock.time(),
                )
                try:
                    await self._catalog.replace_tablets([parent], list(children))
                    outcome = "committed"
                except TabletStoreError:
                    outcome = await self._split_outcome(children[1])
                    if outcome == "failed":
                        raise
        except BaseException:
            for i in ids:
                await self._release_claim((key[0], i))
            raise
        self._tablets.pop(key, None)
        await self._release_claim(key)
        if outcome == "unknown":
            # Parent or children: whichever METADATA holds, the master assigns it. Neither
            # needs a log (the parent was flushed), so nothing is lost either way.
            log.error("split of tablet %s/%s may or may not have committed", *key)
            for i in ids:
                await self._release_claim((key[0], i))
            return
        log.info("split tablet %s/%s at %r into %s, %s", *key, split_key, *ids)
        for child in children:
            await self._serve_child(child)

    async def _split_outcome(self, child: TabletRecord) -> str:
        """After a split commit raised: "committed" if it was applied anyway (an ambiguous
        failure), "failed" if not, "unknown" if METADATA cannot tell now."""
        try:
            stored = await self._catalog.get_tablet(child.table_id, child.tablet_id)
        except NotFound:
            return "failed"
        except TabletStoreError:
            return "unknown"
        return "committed" if stored.epoch == child.epoch else "failed"

    async def _claim(self, key: tuple[str, str]) -> int:
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

    async def _serve_child(self, record: TabletRecord) -> None:
        """Serve a child of a split this worker committed, then major-compact it in the
        background so it stops sharing its parent's SSTables (its size becomes its own)."""
        key = (record.table_id, record.tablet_id)
        assert self._log is not None
        try:
            schema = (await self._catalog.table_by_id(record.table_id)).schema
            async with self._log_switch.shared():
                tablet = await self._open_tablet(record, schema)
                self._split_after[key] = self._clock.monotonic() + self._options.split_cooldown
                self._serve(tablet)
        except TabletStoreError as exc:
            # Committed but not served: let the master assign it (it recovers from the logs).
            log.warning("serving split child %s failed: %s", record.tablet_id, exc)
            await self._release_claim(key)
            return
        self._spawn(self._compactions, self._compact_child(tablet))

    async def _compact_child(self, tablet: Tablet) -> None:
        try:
            await tablet.major_compact()
        except TabletStoreError as exc:
            log.info("major compaction after split of %s: %s", tablet.record.tablet_id, exc)
            return
        # Still too big? Split again once the cool-down is over (no compaction may come).
        key = (tablet.record.table_id, tablet.record.tablet_id)
        wait = self._split_after.get(key, 0.0) - self._clock.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._split_after.pop(key, None)
        self._compacted(tablet)

    async def compact_tablet(self, req: CompactTabletRequest) -> None:
        tablet = self._tablet(req.table_id, req.tablet_id)
        if req.major:
            await tablet.major_compact()
        else:
            await tablet.minor_compact()
            await tablet.merge_if_needed()

    async def adopt_compaction(self, req: AdoptCompactionRequest) -> None:
        """Commit a major compaction run elsewhere (``Tablet.adopt_major``), or refuse it."""
        tablet = self._tablet(req.table_id, req.tablet_id)
        await tablet.adopt_major(
            epoch=req.epoch, schema=req.schema(), read=req.read(), outputs=req.outputs()
        )

    # ------------------------------------------------------------------ snapshots, bulk load

    async def snapshot_hold(self, req: SnapshotHoldRequest) -> None:
        """Hold writes to the tablets and take their cuts (``Tablet.hold_for_snapshot``)."""
        if req.snapshot_id in self._snapshot_cuts:
            raise InvalidArgument(f"snapshot {req.snapshot_id} is already held here")
        tablets = [self._tablet(req.table_id, t) for t in req.tablet_ids]
        results = await asyncio.gather(
            *(t.hold_for_snapshot(req.hold_seconds) for t in tablets), return_exceptions=True
        )
        cuts = [(t, r) for t, r in zip(tablets, results, strict=True) if isinstance(r, SnapshotCut)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            for t, cut in cuts:
                t.release_snapshot_hold(cut)
            raise failed[0]
        self._snapshot_cuts[req.snapshot_id] = cuts
        asyncio.get_running_loop().call_later(
            2 * req.hold_seconds + 60.0, self._snapshot_cuts.pop, req.snapshot_id, None
        )

    async def snapshot_write(self, req: SnapshotWriteRequest) -> SnapshotWriteResponse:
        """End the hold first (writes go on at once), then write the memtables' part of each
        cut (``Tablet.write_snapshot``) unless ``abort``."""
        cuts = self._snapshot_cuts.pop(req.snapshot_id, None)
        if cuts is None:
            return SnapshotWriteResponse(False, ())
        held = all([t.release_snapshot_hold(cut) for t, cut in cuts])
        if req.abort or not held:
            return SnapshotWriteResponse(held, ())
        out = []
        for tablet, cut in cuts:
            sstables = await tablet.write_snapshot(cut)
            record = replace(cut.record, sstables=sstables)
            out.append(SnapshotTablet(record.tablet_id, record.to_bytes(), cut.mark))
        return SnapshotWriteResponse(True, tuple(out))

    async def bulk_load_tablet(self, req: BulkLoadTabletRequest) -> BulkLoadTabletResponse:
        """Add the bulk-load files' cells in the tablet's range (``Tablet.bulk_load``),
        but not in rows its record marks as loaded by ``req.load_id`` already."""
        tablet = self._tablet(req.table_id, req.tablet_id)
        rec = tablet.record
        start = max(rec.start_row, req.start_row)
        ends = [e for e in (rec.end_row, req.end_row) if e is not None]
        end = min(ends) if ends else None
        if end is not None and start >= end:
            return BulkLoadTabletResponse(0)
        ranges = uncovered(rec.bulk_loads, req.load_id, start, end) if req.load_id else []
        if req.load_id and not ranges:
            return BulkLoadTabletResponse(0)  # this load is in the tablet already
        pieces = ranges or [(start, end)]
        adopt = await self._staged_sstables(rec, req.adopt, pieces)
        groups = (
            await cells_for_tablet(self._load_source(req), req.keys, pieces, tablet.schema)
            if req.keys
            else {}
        )
        marks = tuple(BulkLoadMark(req.load_id, a, b) for a, b in ranges)
        return BulkLoadTabletResponse(await tablet.bulk_load(groups, marks, adopt))

    def _load_source(self, req: BulkLoadTabletRequest) -> ObjectStore:
        """The store to read a load's files from: this worker's own, and only its staging
        keys (batch/load_files.py); InvalidArgument for another store or key."""
        if req.source_url != self._store.url:
            raise InvalidArgument(
                f"bulk-load files are read only from the database's bucket {self._store.url}, "
                f"not {req.source_url}"
            )
        for key in req.keys:
            if not key.startswith(layout.STAGING):
                raise InvalidArgument(f"bulk-load file {key!r} is not in a staging area")
        return self._store

    async def _staged_sstables(
        self,
        rec: TabletRecord,
        keys: Sequence[str],
        pieces: Sequence[tuple[bytes, bytes | None]],
    ) -> list[tuple[str, SSTableRef]]:
        """(locality group, reference with no seq base yet) of each SSTable the master
        staged for this tablet to adopt (batch/load_files.py step 2): one of this table's
        objects, lying inside rows still to load (NotServing otherwise: the master's view
        was stale, it looks again)."""
        out = []
        for key in keys:
            parsed = layout.parse_sstable_key(key)
            if parsed.table_id != rec.table_id:
                raise InvalidArgument(f"bulk-load SSTable {key} is not one of this table's")
            table = await SSTable.open(self._store, key)
            inside = any(
                a <= table.first_row and (b is None or table.last_row < b) for a, b in pieces
            )
            if not inside:
                raise NotServing(
                    f"tablet {rec.tablet_id}: bulk-load SSTable {key} reaches past the rows it "
                    "still has to load"
                )
            ref = SSTableRef.of(key, table.size, table)
            out.append((parsed.locality_group, ref))
        return out

    async def update_schema(self, req: UpdateSchemaRequest) -> None:
        info = await self._catalog.get_table(req.table_name)
        for (table_id, _), tablet in self._tablets.items():
            if table_id == info.table_id:
                tablet.set_schema(info.schema)

    # ------------------------------------------------------------------ data

    async def mutate_rows(self, req: MutateRowsRequest) -> MutateRowsResponse:
        """Apply each row mutation atomically; report failures per entry (§3 batches)."""
        tablet = self._tablet(req.table_id, req.tablet_id)

        async def one(i: int) -> EntryError | None:
            entry = req.entries[i]
            try:
                await tablet.apply(entry.row, entry.mutations, identity=req.identity)
            except TabletStoreError as exc:
                return EntryError.of(i, exc)
            return None

        if len(req.entries) == 1:
            error = await one(0)
            return MutateRowsResponse(() if error is None else (error,))
        # One commit-log append for the whole batch (its records share segments).
        try:
            errors = await tablet.apply_many(
                [(e.row, e.mutations) for e in req.entries], identity=req.identity
            )
        except TabletStoreError as exc:  # nothing was applied
            errors = [exc] * len(req.entries)
        return MutateRowsResponse(
            tuple(EntryError.of(i, e) for i, e in enumerate(errors) if e is not None)
        )

    async def mutate_tablets(self, req: MutateTabletsRequest) -> MutateRowsResponse:
        """The single-row mutations of several tablets (a cluster client's concurrent
        ``mutate_row`` calls to this worker's tablets, client/coalesce.py) in one request: each
        part applied as ``mutate_rows`` would, all parts concurrently, so their records share
        the worker's commit-log segments (§5.3 group commit); each row is acknowledged only once
        durable. A part refused as a whole (its tablet not served here: moved, split) fails
        only its own entries, which its callers retry. Entry indexes count the parts' entries
        one after another."""
        applies = [self._apply_part(part, req.identity) for part in req.parts]
        found = [await applies[0]] if len(applies) == 1 else await gather_eager(applies)
        errors: list[EntryError] = []
        base = 0
        for part, got in zip(req.parts, found, strict=True):
            if isinstance(got, BaseException):
                # Not a refusal of the part (those are answered in it): the request fails, as
                # mutate_rows' would; the client treats every entry as maybe applied.
                raise got
            for i, error in enumerate(got):
                if error is not None:
                    errors.append(EntryError.of(base + i, error))
            base += len(part.entries)
        return MutateRowsResponse(tuple(errors))

    async def _apply_part(
        self, part: TabletMutations, identity: str | None
    ) -> Sequence[TabletStoreError | None]:
        """One part of ``mutate_tablets``: per entry, None once applied and durable, or its
        error; a tablet not served here (or refusing writes as a whole) fails every entry."""
        try:
            tablet = self._tablet(part.table_id, part.tablet_id)
            if len(part.entries) == 1:
                entry = part.entries[0]
                await tablet.apply(entry.row, entry.mutations, identity=identity)
                return (None,)
            return await tablet.apply_many(
                [(e.row, e.mutations) for e in part.entries], identity=identity
            )
        except TabletStoreError as exc:  # nothing of the part was applied
            return [exc] * len(part.entries)

    async def read_rows(
        self, req: ReadRowsRequest
    ) -> AsyncIterator[RowBatch | RowPiece | ScanProgress]:
        """Stream the requested rows of one tablet in key order (descending when
        ``req.reverse``), in items of bounded size:
        whole rows in batches, a row larger than one item alone in pieces (rpc.row_pieces)."""
        tablet = self._tablet(req.table_id, req.tablet_id)
        families = set(req.families) if req.families is not None else None
        remaining = req.limit
        batch: list[Row] = []
        size = 0
        stats = ScanStats() if req.stats else None
        async for row in self._rows(tablet, req, families, stats):
            if type(row) is ScanStats:
                # Rows before the report go first: progress never overtakes a row.
                if batch:
                    yield RowBatch(tuple(batch))
                    batch, size = [], 0
                yield _progress(row)
                continue
            assert isinstance(row, Row)
            if remaining is not None:
                remaining -= 1
            row_size = row_bytes(row)
            if row_size > _BYTES_PER_BATCH:
                if batch:
                    yield RowBatch(tuple(batch))
                    batch, size = [], 0
                for piece in split_row(row, _BYTES_PER_BATCH):
                    yield piece
            else:
                batch.append(row)
                size += row_size
                if len(batch) >= _ROWS_PER_BATCH or size >= _BYTES_PER_BATCH:
                    yield RowBatch(tuple(batch))
                    batch, size = [], 0
            if remaining is not None and remaining <= 0:
                break
        if batch:
            yield RowBatch(tuple(batch))
        if stats is not None:
            yield _progress(stats)

    async def _rows(
        self,
        tablet: Tablet,
        req: ReadRowsRequest,
        families: set[str] | None,
        stats: ScanStats | None = None,
    ) -> AsyncIterator[Row | ScanStats]:
        """The request's keys and ranges, visited in key order (RowSet's normal form), or in
        descending order when ``req.reverse``."""
        pieces = RowSet(req.keys, req.ranges).pieces()
        for piece in reversed(list(pieces)) if req.reverse else pieces:
            if isinstance(piece, bytes):
                if not tablet.contains(piece):
                    continue
                row = await tablet.read_row(
                    piece, filter=req.filter, families=families, identity=req.identity, stats=stats
                )
                if row is not None:
                    yield row
            elif stats is None:
                async for row in tablet.scan(
                    piece,
                    filter=req.filter,
                    families=families,
                    identity=req.identity,
                    reverse=req.reverse,
                ):
                    yield row
            else:
                async for item in tablet.scan_with_progress(
                    piece,
                    stats,
                    filter=req.filter,
                    families=families,
                    identity=req.identity,
                    reverse=req.reverse,
                ):
                    yield item

    async def read_row(self, req: ReadRowsRequest) -> RowBatch | LargeRow:
        """Point reads (``req.keys``: one, or the concurrent reads of a cluster client,
        client/coalesce.py) answered in one reply: no stream to set up. Each row is read
        atomically on its own; the reply holds those that have (matching) cells, in the order
        of ``req.keys``. Rows too large together for one reply are answered ``LargeRow``:
        the client reads each alone, streaming one that is still too large."""
        rows = await self._point_rows(req)
        size = sum(row_bytes(row) for row in rows)
        return RowBatch(rows) if size <= UNARY_ROW_BYTES else LargeRow(rows[0].key, size)

    async def read_points(self, req: PointReadsRequest) -> PointReadsResponse:
        """The plain point reads of several tablets (a cluster client's concurrent reads of
        this worker's tablets, client/coalesce.py) in one reply: each part answered as
        ``read_row`` would, all parts concurrently, or with its own error (a tablet not
        served here any more fails its own callers only). Parts past ``UNARY_ROW_BYTES`` in
        all are answered ``LargeRow``, so the reply stays as bounded as ``read_row``'s."""
        reads = [
            self._point_rows(
                ReadRowsRequest(
                    part.table_id, part.tablet_id, keys=part.keys, identity=req.identity
                )
            )
            for part in req.parts
        ]
        found: list[tuple[Row, ...] | BaseException]
        if len(reads) == 1:  # one tablet: no concurrency to add around it
            try:
                found = [await reads[0]]
            except TabletStoreError as exc:
                found = [exc]
        else:
            found = await gather_eager(reads)
        answers: list[RowBatch | LargeRow | EntryError] = []
        budget = UNARY_ROW_BYTES
        for i, got in enumerate(found):
            if isinstance(got, TabletStoreError):
                answers.append(EntryError.of(i, got))
                continue
            if isinstance(got, BaseException):
                raise got  # not a refusal of the part: the request fails, as read_row's would
            size = sum(row_bytes(row) for row in got)
            if size <= budget:
                budget -= size
                answers.append(RowBatch(got))
            else:
                answers.append(LargeRow(got[0].key, size))
        return PointReadsResponse(tuple(answers))

    async def _point_rows(self, req: ReadRowsRequest) -> tuple[Row, ...]:
        """``read_row``'s rows: each key read atomically on its own, concurrently (a read
        from the store must not wait for the others' reads, and one from memory runs inline,
        with no task: worker/eager.py). One that fails (a key outside the tablet after a
        split) fails the request: each caller's client retries its own read."""
        tablet = self._tablet(req.table_id, req.tablet_id)
        if not req.keys or req.ranges:
            raise InvalidArgument("read_row takes one or more row keys and no ranges")
        families = set(req.families) if req.families is not None else None
        if len(req.keys) == 1:
            row = await tablet.read_row(
                req.keys[0], filter=req.filter, families=families, identity=req.identity
            )
            return () if row is None else (row,)
        found = await gather_eager(
            [
                tablet.read_row(key, filter=req.filter, families=families, identity=req.identity)
                for key in req.keys
            ]
        )
        for got in found:
            if isinstance(got, BaseException):
                raise got
        return tuple(row for row in found if isinstance(row, Row))

    async def check_and_mutate(self, req: CheckAndMutateRequest) -> CheckAndMutateResponse:
        tablet = self._tablet(req.table_id, req.tablet_id)
        matched = await tablet.check_and_mutate(
            req.row,
            req.predicate,
            req.true_mutations,
            req.false_mutations,
            identity=req.identity,
        )
        return CheckAndMutateResponse(matched)

    async def read_modify_write(self, req: ReadModifyWriteRequest) -> Row:
        tablet = self._tablet(req.table_id, req.tablet_id)
        return await tablet.read_modify_write(req.row, req.rules, identity=req.identity)

    async def sample_row_keys(self, req: SampleRowKeysRequest) -> SampleRowKeysResponse:
        """Keys that split the tablet into parts of roughly equal size (SSTable boundaries).
        Row keys are data: a caller that may read none of the table's families is refused
        (PermissionDenied)."""
        tablet = self._tablet(req.table_id, req.tablet_id)
        principal = current_principal()
        if not _may_see(principal, tablet):
            assert principal is not None
            raise PermissionDenied(
                f"{principal.name} may not sample the row keys of table {tablet.schema.name!r}: "
                "it may read none of its families (permission: read)"
            )
        record = tablet.record
        keys: list[bytes] = []
        offsets: list[int] = []
        offset = 0
        refs = sorted(
            (ref for refs in record.sstables.values() for ref in refs), key=lambda r: r.last_row
        )
        for ref in refs:
            offset += ref.size
            keys.append(ref.last_row)
            offsets.append(offset)
        if record.end_row is not None:
            keys.append(record.end_row)
        else:
            keys.append(b"")
        offsets.append(offset + tablet.state.memtable.approximate_size)
        return SampleRowKeysResponse(tuple(keys), tuple(offsets))

    async def server_status(self, req: ServerStatusRequest) -> ServerStatusResponse:
        """What this worker serves. A caller sees only the tablets of tables it may read some
        family of (their boundaries are row keys); the cluster's own identities see all."""
        principal = current_principal()
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
            if _may_see(principal, t)
        )
        return ServerStatusResponse(self.worker_id, self.address, tablets)


def _may_see(principal: Principal | None, tablet: Tablet) -> bool:
    """Whether ``principal`` may see ``tablet``'s row keys: no auth, a cluster identity, or
    one that may read some family of its table."""
    return principal is None or principal.is_cluster or tablet.may_read_some(principal.name)


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
