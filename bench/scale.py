"""Scale benchmark: the cluster's control paths at the paper's sizes, by simulation (§5, §7).

The paper's Figure 6 runs up to 500 tablet servers. This benchmark runs the control paths of a
cluster that size in one process: the real master (``master.master.Master``: assignment rounds,
``master.balancer``, ``master.log_recovery``'s sort planning), the real catalog and METADATA
code (``metadata.catalog``), the real location cache (``client.location``) and the memory
coordinator (``coordination.memory``, standing in for etcd), with **simulated workers**: each
takes a lease, registers in the servers directory, and claims, loads, unloads and recovers
tablets through the same coordinator transactions and METADATA updates a worker makes
(``worker.tablet_server``: claim, epoch, ``assigned`` event, log recorded in the record; an
unload with flush clears the logs). Their data path is thin: a user tablet holds no data
(a load replays nothing), and the METADATA tablets' rows live in one in-memory sorted map
(the durable store) that the worker serving a METADATA tablet reads and writes with the real
filters (``data.filters.apply_filter``) — so every METADATA read and write of the master, the
workers and the clients is a real request to whichever simulated worker serves that row.

Measured, for each size (workers x tablets):

* **initial assignment**: rounds, wall time and master CPU until every tablet is served;
* **steady round**: one assignment round with nothing to do (what the master pays every
  ``MasterOptions.interval``): wall, master CPU, coordinator requests and keys read;
* **dead worker**: one worker's lease revoked (what the failure detector does, §5.2): wall
  time, rounds and master CPU until each of its tablets is served again, and the most
  tablets one survivor took;
* **rack failure**: 10 % of the workers at once, likewise;
* **balancing**: 10 % new workers added: moves until the balancer's plan is empty (the
  planner run without its per-round cap), hence rounds at ``max_moves`` and the time at
  ``balance_cooldown``; and a few real balancing rounds' wall time and master CPU;
* **clients**: METADATA reads of a new client's first lookup, and per location miss of a
  client locating random rows (§5.1's prefetch);
* **coordinator at steady state**: keys (by kind), watches, and requests per second per worker
  (lease keep-alives included) and of the master, over a window of assignment rounds.

Master CPU: everything runs on one thread, so the simulated workers' handlers and the
coordinator's calls are timed as they run (nested calls charged once, to the innermost) and
the master's share is the process's CPU in the phase minus theirs.

    python -m bench.scale [--quick] [--sizes 10x10000,500x100000] [--json bench-scale.json]
        [--png bench-scale.png] [--markdown bench-scale.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from sortedcontainers import SortedDict

from tabletstore.client.location import LocationCache
from tabletstore.coordination import paths
from tabletstore.coordination.base import (
    Compare,
    Delete,
    KeyValue,
    Lease,
    Op,
    Put,
    TxnResult,
    absent,
    create_revision_is,
)
from tabletstore.coordination.election import Election
from tabletstore.coordination.memory import MemoryCoordinator, MemoryWatch
from tabletstore.data.filters import apply_filter
from tabletstore.data.model import Cell, DeleteCells, DeleteFamily, DeleteRow, Mutation, Row
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.errors import NotFound, NotServing, Unavailable
from tabletstore.master import assignment
from tabletstore.master.log_recovery import InProcessSortExecutor, LogRecovery
from tabletstore.master.master import Master
from tabletstore.metadata import rows as mt
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import LogRef, TabletRecord, metadata_row_key
from tabletstore.options import LeaseOptions, MasterOptions
from tabletstore.rpc.inprocess import InProcessTransport
from tabletstore.rpc.messages import (
    CheckAndMutateRequest,
    CheckAndMutateResponse,
    CompactTabletRequest,
    EntryError,
    LoadTabletAtRequest,
    LoadTabletRequest,
    MutateRowsRequest,
    MutateRowsResponse,
    ReadRowsRequest,
    RowBatch,
    ServerStatusRequest,
    ServerStatusResponse,
    TabletStatus,
    UnloadTabletRequest,
    UpdateSchemaRequest,
)
from tabletstore.storage_s3.memory import MemoryObjectStore

T = TypeVar("T")

#: Tablets per table: the master lists METADATA table by table.
TABLETS_PER_TABLE = 100
#: Tables per METADATA tablet (METADATA is pre-split at table boundaries).
TABLES_PER_METADATA_TABLET = 100
#: Loads the simulated workers run at once, all together: they share this process's one event
#: loop (and core), where 500 real workers have 500 machines; past this the loads queue, so
#: that no request waits behind thousands of others long enough to time out.
LOAD_CONCURRENCY = 64
#: The simulated workers' METADATA request bound (``LocationCache.rpc_timeout``), long for
#: the same reason.
SIM_RPC_TIMEOUT = 60.0
#: Rows per RowBatch a simulated worker streams.
BATCH_ROWS = 256
#: The simulated leases' TTL: an hour, so that the one event loop's stalls (the master's
#: rounds run on it too, a process of their own in a cluster) never expire a lease; deaths are
#: revoked leases. Keep-alives per second are reported for the default TTL.
SIM_TTL = 3600.0
QUICK_SIZES = ((10, 500), (100, 1_000))
FULL_SIZES = ((10, 10_000), (100, 10_000), (500, 100_000))


# --------------------------------------------------------------------------- CPU accounting


class CpuLedger:
    """CPU time of the awaitables run through :meth:`timed`, by kind. Each step of a timed
    awaitable is charged its thread CPU minus what timed awaitables nested in it were charged,
    so a worker handler calling the coordinator charges the coordinator's part to ``etcd``."""

    def __init__(self) -> None:
        self.by_kind: defaultdict[str, float] = defaultdict(float)
        self.total = 0.0

    def timed(self, kind: str, awaitable: Awaitable[T]) -> Awaitable[T]:
        return _Timed(self, kind, awaitable)

    def charge(self, kind: str, started: float, before: float) -> None:
        own = (time.thread_time() - started) - (self.total - before)
        self.total += own
        self.by_kind[kind] += own

    async def timed_stream(self, kind: str, stream: AsyncIterator[T]) -> AsyncIterator[T]:
        while True:
            try:
                item = await self.timed(kind, stream.__anext__())
            except StopAsyncIteration:
                return
            yield item


class _Timed:
    __slots__ = ("_awaitable", "_kind", "_ledger")

    def __init__(self, ledger: CpuLedger, kind: str, awaitable: Awaitable[Any]) -> None:
        self._ledger, self._kind, self._awaitable = ledger, kind, awaitable

    def __await__(self) -> Generator[Any, Any, Any]:
        ledger, kind = self._ledger, self._kind
        inner = self._awaitable.__await__()
        value: Any = None
        error: BaseException | None = None
        while True:
            before, started = ledger.total, time.thread_time()
            try:
                step = inner.throw(error) if error is not None else inner.send(value)
            except StopIteration as stop:
                ledger.charge(kind, started, before)
                return stop.value
            except BaseException:
                ledger.charge(kind, started, before)
                raise
            ledger.charge(kind, started, before)
            try:
                value, error = (yield step), None
            except GeneratorExit:
                inner.close()
                raise
            except BaseException as exc:  # cancellation goes into the inner awaitable
                value, error = None, exc


# --------------------------------------------------------------------------- the coordinator


class MeteredCoordinator:
    """A client handle on the shared memory coordinator that counts its requests (and the
    keys its range reads return) and charges their CPU to ``etcd``."""

    def __init__(self, inner: MemoryCoordinator, ledger: CpuLedger, counts: Counter[str]) -> None:
        self._inner = inner
        self._ledger = ledger
        self.counts = counts
        self.url = inner.url

    def _run(self, what: str, coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
        self.counts[what] += 1
        self.counts["requests"] += 1
        return self._ledger.timed("etcd", coro)

    async def check(self) -> None:
        await self._run("check", self._inner.check())

    async def grant_lease(self, ttl: float, *, safety_margin: float | None = None) -> Lease:
        return await self._run("grant", self._inner.grant_lease(ttl, safety_margin=safety_margin))

    async def revoke_lease(self, lease_id: int) -> None:
        await self._run("revoke", self._inner.revoke_lease(lease_id))

    async def get(self, key: str) -> KeyValue | None:
        return await self._run("get", self._inner.get(key))

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        kvs = await self._run("range", self._inner.get_prefix(prefix))
        self.counts["keys read"] += len(kvs)
        return kvs

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        return await self._run("put", self._inner.put(key, value, lease=lease))

    async def delete(self, key: str) -> bool:
        return await self._run("delete", self._inner.delete(key))

    async def delete_prefix(self, prefix: str) -> int:
        return await self._run("delete", self._inner.delete_prefix(prefix))

    async def txn(
        self, compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op] = ()
    ) -> TxnResult:
        return await self._run("txn", self._inner.txn(compares, on_success, on_failure))

    def watch_prefix(self, prefix: str, *, start_revision: int | None = None) -> MemoryWatch:
        self.counts["watches"] += 1
        return self._inner.watch_prefix(prefix, start_revision=start_revision)

    def election(self, name: str) -> Election:
        return Election(self, name)  # type: ignore[arg-type]

    async def close(self) -> None:
        """The shared coordinator is closed by the cluster."""


# --------------------------------------------------------------------------- METADATA's rows


def _apply(cells: list[Cell], mutations: Sequence[Mutation]) -> list[Cell] | None:
    """``cells`` after ``mutations`` (METADATA's: one version per column); None: row deleted."""
    by_column = {(c.family, c.qualifier): c for c in cells}
    for m in mutations:
        if isinstance(m, DeleteRow):
            by_column.clear()
        elif isinstance(m, DeleteFamily):
            by_column = {k: c for k, c in by_column.items() if k[0] != m.family}
        elif isinstance(m, DeleteCells):
            by_column.pop((m.family, m.qualifier), None)
        else:
            value = getattr(m, "value", b"")
            assert isinstance(value, bytes), f"METADATA takes no aggregate mutations: {m!r}"
            stamp = getattr(m, "timestamp", None) or 0
            by_column[(m.family, m.qualifier)] = Cell(m.family, m.qualifier, stamp, value)
    if not by_column:
        return None
    return [by_column[k] for k in sorted(by_column)]


@dataclass
class MetadataStore:
    """Every METADATA row, durable across the workers serving its tablets (the stand-in for
    their SSTables and commit logs in the object store)."""

    rows: SortedDict = field(default_factory=SortedDict)
    rows_read: int = 0
    reads: int = 0
    writes: int = 0
    #: Rows the simulated workers' own METADATA reads returned (their loads' and unloads').
    worker_rows_read: int = 0
    #: Tablets the simulated workers loaded.
    loads: int = 0


class MeteredRows:
    """A worker's METADATA rows (its location cache), counting the rows its reads return."""

    def __init__(self, inner: LocationCache, store: MetadataStore) -> None:
        self._inner = inner
        self._store = store

    async def read_rows(
        self,
        start: bytes,
        end: bytes,
        *,
        start_inclusive: bool = True,
        end_inclusive: bool = True,
        limit: int | None = None,
    ) -> list[Row]:
        rows = await self._inner.read_rows(
            start, end, start_inclusive=start_inclusive, end_inclusive=end_inclusive, limit=limit
        )
        self._store.worker_rows_read += len(rows)
        return rows

    async def check_and_mutate(
        self,
        key: bytes,
        predicate: Any,
        true_mutations: Sequence[Mutation],
        false_mutations: Sequence[Mutation],
    ) -> bool:
        return await self._inner.check_and_mutate(key, predicate, true_mutations, false_mutations)

    async def mutate_row(self, key: bytes, mutations: Sequence[Mutation]) -> None:
        await self._inner.mutate_row(key, mutations)


@dataclass
class InFlight:
    """Requests of one kind in flight across the simulated workers, and the most at once."""

    now: int = 0
    peak: int = 0


# --------------------------------------------------------------------------- a worker


class SimWorker:
    """A worker's control paths (module docstring) with a thin data path."""

    def __init__(
        self,
        worker_id: str,
        coordinator: MeteredCoordinator,
        transport: InProcessTransport,
        metadata: MetadataStore,
        ledger: CpuLedger,
        gate: asyncio.Semaphore,
        *,
        ttl: float,
        polls: InFlight | None = None,
    ) -> None:
        self.worker_id = worker_id
        self._polls = polls if polls is not None else InFlight()
        self.address = f"sim:{worker_id}"
        self._coord = coordinator
        self._transport = transport
        self._md = metadata
        self._ledger = ledger
        self._ttl = ttl
        self._gate = gate
        self.locations = LocationCache(
            coordinator,  # type: ignore[arg-type]
            transport,
            rpc_timeout=SIM_RPC_TIMEOUT,
        )
        self._catalog = Catalog(
            coordinator,  # type: ignore[arg-type]
            metadata=MeteredRows(self.locations, metadata),
        )
        self.lease: Lease | None = None
        self.log = LogRef(worker_id, 0)
        #: tablet -> (epoch, range) of each tablet served here.
        self.served: dict[tuple[str, str], tuple[int, bytes, bytes | None]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._keep_alive: asyncio.Task[None] | None = None
        self.keep_alives = 0
        self.logs_replayed = 0

    async def start(self) -> None:
        from tabletstore.worker.tablet_server import next_incarnation

        self.lease = await self._coord.grant_lease(self._ttl)
        await self._coord.put(paths.server(self.worker_id), self.address.encode(), lease=self.lease)
        self.log = LogRef(self.worker_id, await next_incarnation(self._coord, self.worker_id))  # type: ignore[arg-type]
        timed = self._ledger.timed
        handlers: dict[str, Callable[[Any], Any]] = {
            "load_tablet": lambda r: timed("worker", self.load_tablet(r)),
            "load_tablet_at": lambda r: timed("worker", self.load_tablet(r)),
            "unload_tablet": lambda r: timed("worker", self.unload_tablet(r)),
            "server_status": lambda r: timed("worker", self.server_status(r)),
            "check_and_mutate": lambda r: timed("worker", self.check_and_mutate(r)),
            "mutate_rows": lambda r: timed("worker", self.mutate_rows(r)),
            "update_schema": lambda r: timed("worker", self.nothing(r)),
            "compact_tablet": lambda r: timed("worker", self.nothing(r)),
            "read_rows": lambda r: self._ledger.timed_stream("worker", self.read_rows(r)),
        }
        self._transport.register(self.address, handlers)  # type: ignore[arg-type]
        self._keep_alive = asyncio.create_task(self._keep_alive_loop())

    async def _keep_alive_loop(self) -> None:
        """What ``Lease.keep_alive`` does (every third of the TTL), counted."""
        assert self.lease is not None
        while True:
            await asyncio.sleep(self._ttl / 3)
            self.keep_alives += 1
            with contextlib.suppress(Exception):
                await self._ledger.timed("etcd", self.lease.refresh())

    async def crash(self) -> None:
        """Die: stop answering and keeping the lease alive (the lease outlives it)."""
        self._transport.unregister(self.address)
        await self.stop_keep_alive()
        self.served.clear()

    async def stop_keep_alive(self) -> None:
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keep_alive
            self._keep_alive = None

    # -- control paths (the worker's TabletServer.load / unload, thin)

    async def load_tablet(self, req: LoadTabletRequest | LoadTabletAtRequest) -> None:
        key = (req.table_id, req.tablet_id)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock, self._gate:
            if key in self.served:
                return
            assert self.lease is not None
            claim_key = paths.claim(*key)
            mine = self.worker_id.encode()
            result = await self._coord.txn(
                [absent(claim_key)], [Put(claim_key, mine, lease_id=self.lease.id)], []
            )
            if not result.succeeded:
                holder = await self._coord.get(claim_key)
                if holder is None or holder.value != mine:
                    raise Unavailable(f"tablet {req.tablet_id} is still claimed by another worker")
            claim = await self._coord.get(claim_key)
            assert claim is not None
            epoch = claim.create_revision
            try:
                try:
                    await self._catalog.table_by_id(req.table_id)
                except NotFound as exc:
                    raise NotServing(str(exc)) from exc
                row_key = None
                if isinstance(req, LoadTabletAtRequest):
                    row_key = metadata_row_key(req.table_id, req.end_row)
                record = await self._catalog.get_tablet(*key, row_key=row_key)
                owned = replace(record, epoch=epoch, location=self.address).with_event(
                    time.time(), "assigned", self.worker_id
                )
                owned = await self._catalog.update(record, owned)
                # The replay: thin (counted). Opening records this worker's log (§5.3).
                self.logs_replayed += len(owned.logs)
                serving = replace(owned, logs=(self.log,), log_starts={})
                await self._catalog.update(owned, serving)
            except BaseException:
                await self._release(key, epoch)
                raise
            self.served[key] = (epoch, record.start_row, record.end_row)
            self._md.loads += 1

    async def _release(self, key: tuple[str, str], epoch: int) -> None:
        claim_key = paths.claim(*key)
        await self._coord.txn([create_revision_is(claim_key, epoch)], [Delete(claim_key)], [])

    async def unload_tablet(self, req: UnloadTabletRequest) -> None:
        key = (req.table_id, req.tablet_id)
        async with self._locks.setdefault(key, asyncio.Lock()):
            served = self.served.pop(key, None)
            if served is None:
                return
            try:
                if req.flush:  # a minor compaction: nothing left to replay
                    # The worker holds its record; its one row stands for it here.
                    row_key = metadata_row_key(req.table_id, served[2])
                    record = await self._catalog.get_tablet(*key, row_key=row_key)
                    await self._catalog.update(record, replace(record, logs=(), log_starts={}))
            finally:
                await self._release(key, served[0])

    async def server_status(self, req: ServerStatusRequest) -> ServerStatusResponse:
        """Equal sizes and no request load: balancing by count (see the docs' limits). The
        answer waits one turn of the event loop, as a network round trip would: how many
        the balancer has in flight at once is counted."""
        self._polls.now += 1
        self._polls.peak = max(self._polls.peak, self._polls.now)
        try:
            await asyncio.sleep(0)
        finally:
            self._polls.now -= 1
        tablets = tuple(
            TabletStatus(t, tid, start, end, 1, 64 << 20, 0, 0)
            for (t, tid), (_, start, end) in self.served.items()
        )
        return ServerStatusResponse(self.worker_id, self.address, tablets)

    async def nothing(self, req: UpdateSchemaRequest | CompactTabletRequest) -> None:
        """Schema changes and compactions touch no control path measured here."""

    # -- METADATA's data path (thin)

    def _range_of(self, table_id: str, tablet_id: str) -> tuple[bytes, bytes | None]:
        served = self.served.get((table_id, tablet_id))
        if served is None or table_id != mt.METADATA_TABLE_ID:
            raise NotServing(f"tablet {tablet_id} of {table_id} is not served by {self.worker_id}")
        return served[1], served[2]

    def _check_row(self, table_id: str, tablet_id: str, key: bytes) -> None:
        start, end = self._range_of(table_id, tablet_id)
        if key < start or (end is not None and key >= end):
            raise NotServing(f"row {key!r} is not in tablet {tablet_id}")

    async def read_rows(self, req: ReadRowsRequest) -> AsyncIterator[RowBatch]:
        start, end = self._range_of(req.table_id, req.tablet_id)
        self._md.reads += 1
        rows: list[Row] = []
        limit = req.limit if req.limit is not None else math.inf
        store = self._md.rows
        for rr in req.ranges:
            lo = max(rr.start or b"", start)
            lo_incl = rr.start_inclusive or (rr.start or b"") < start
            keys = store.irange(lo, rr.end, inclusive=(lo_incl, rr.end_inclusive))
            for key in keys:
                if len(rows) >= limit or (end is not None and key >= end):
                    break
                rows.append(Row(key, list(store[key])))
        self._md.rows_read += len(rows)
        for i in range(0, len(rows), BATCH_ROWS):
            yield RowBatch(tuple(rows[i : i + BATCH_ROWS]))

    async def check_and_mutate(self, req: CheckAndMutateRequest) -> CheckAndMutateResponse:
        self._check_row(req.table_id, req.tablet_id, req.row)
        self._md.writes += 1
        cells = self._md.rows.get(req.row, [])
        matched = bool(apply_filter(req.predicate, req.row, cells)) if cells else False
        self._write(req.row, cells, req.true_mutations if matched else req.false_mutations)
        return CheckAndMutateResponse(matched)

    async def mutate_rows(self, req: MutateRowsRequest) -> MutateRowsResponse:
        errors = []
        for i, entry in enumerate(req.entries):
            try:
                self._check_row(req.table_id, req.tablet_id, entry.row)
            except NotServing as exc:
                errors.append(EntryError.of(i, exc))
                continue
            self._md.writes += 1
            self._write(entry.row, self._md.rows.get(entry.row, []), entry.mutations)
        return MutateRowsResponse(tuple(errors))

    def _write(self, key: bytes, cells: list[Cell], mutations: Sequence[Mutation]) -> None:
        if not mutations:
            return
        after = _apply(cells, mutations)
        if after is None:
            self._md.rows.pop(key, None)
        else:
            self._md.rows[key] = after


# --------------------------------------------------------------------------- the cluster


@dataclass
class Phase:
    """What one phase cost: wall seconds, master CPU seconds, requests."""

    wall: float = 0.0
    master_cpu: float = 0.0
    worker_cpu: float = 0.0
    etcd_cpu: float = 0.0
    master_requests: int = 0
    master_keys_read: int = 0
    worker_requests: int = 0
    metadata_reads: int = 0
    metadata_rows_read: int = 0
    metadata_writes: int = 0
    worker_metadata_rows_read: int = 0
    loads: int = 0
    rounds: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class SimCluster:
    """A master, ``workers`` simulated workers and the shared coordinator, in this process."""

    def __init__(
        self,
        workers: int,
        tablets: int,
        *,
        ttl: float = SIM_TTL,
        load_concurrency: int = LOAD_CONCURRENCY,
    ) -> None:
        self.n_workers = workers
        self.n_tablets = tablets
        self.ttl = ttl
        self.ledger = CpuLedger()
        self.shared = MemoryCoordinator()
        self.transport = InProcessTransport()
        self.metadata = MetadataStore()
        self.master_counts: Counter[str] = Counter()
        self.worker_counts: Counter[str] = Counter()
        self.client_counts: Counter[str] = Counter()
        self.options = MasterOptions(balance_cooldown=0.0, merge_after=None)
        self.n_tables = max(1, math.ceil(tablets / TABLETS_PER_TABLE))
        splits = [
            f"t{i:05d}".encode()
            for i in range(TABLES_PER_METADATA_TABLET, self.n_tables, TABLES_PER_METADATA_TABLET)
        ]
        master_coord = MeteredCoordinator(self.shared, self.ledger, self.master_counts)
        self.store = MemoryObjectStore()
        recovery = LogRecovery(
            self.store,
            InProcessSortExecutor(self.store),
            master_coord,  # type: ignore[arg-type]
            task_bytes=self.options.sort_task_bytes,
        )
        self.master_coord = master_coord
        self.metadata_tablets = len(splits) + 1
        self.master = Master(
            coordinator=master_coord,  # type: ignore[arg-type]
            transport=self.transport,
            metadata_splits=[mt.table_range(s.decode())[0] for s in splits],
            options=self.options,
            recovery=recovery,
        )
        self.workers: dict[str, SimWorker] = {}
        self._next = 0
        self.load_gate = asyncio.Semaphore(load_concurrency)
        #: The balancer's server_status requests in flight.
        self.polls = InFlight()

    def _worker_coord(self) -> MeteredCoordinator:
        return MeteredCoordinator(self.shared, self.ledger, self.worker_counts)

    async def add_workers(self, n: int) -> list[SimWorker]:
        added = []
        for _ in range(n):
            wid = f"w{self._next:04d}"
            self._next += 1
            w = SimWorker(
                wid,
                self._worker_coord(),
                self.transport,
                self.metadata,
                self.ledger,
                self.load_gate,
                ttl=self.ttl,
                polls=self.polls,
            )
            await w.start()
            self.workers[wid] = w
            added.append(w)
        return added

    async def create_tables(self) -> None:
        """The user tables, ``TABLETS_PER_TABLE`` tablets each, written into METADATA through
        the catalog (rows first, then the schema: ``Catalog.create_table``)."""
        catalog = self.master.catalog
        schema_families = {"f": ColumnFamily(name="f")}
        left = self.n_tablets
        for t in range(self.n_tables):
            n = min(TABLETS_PER_TABLE, left)
            left -= n
            name = f"t{t:05d}"
            table_id = f"{name}-{t:012x}"
            bounds: list[bytes | None] = [_row(i) for i in range(1, n)] + [None]
            records, start = [], b""
            for i, end in enumerate(bounds):
                records.append(TabletRecord(table_id, f"t{i:05d}", start, end))
                start = end or b""
            await catalog.create_table(TableSchema(name=name, families=schema_families), records)

    def served(self) -> int:
        """Tablets whose claim is held by a live (registered) worker."""
        state = self.shared.state
        live = {paths.parse_server(kv.key) for kv in state.range(paths.SERVERS)}
        return sum(1 for kv in state.range(paths.claims_prefix()) if kv.value.decode() in live)

    @property
    def total_tablets(self) -> int:
        """User tablets, the METADATA tablets and the root."""
        return self.n_tablets + self.metadata_tablets + 1

    async def assign_until_served(self, *, limit: int = 1000) -> int:
        """Assignment rounds until every tablet is served by a live worker; returns rounds."""
        for rounds in range(1, limit + 1):
            await self.master.assign()
            if self.master.settled and self.served() == self.total_tablets:
                return rounds
        raise RuntimeError(f"not every tablet served after {limit} rounds")

    async def measure(self, step: Callable[[], Awaitable[int | None]]) -> Phase:
        """Run ``step`` and account for it."""
        ledger, md = self.ledger, self.metadata
        kinds = dict(ledger.by_kind)
        before = (
            time.thread_time(),
            time.perf_counter(),
            self.master_counts["requests"],
            self.master_counts["keys read"],
            self.worker_counts["requests"],
            md.reads,
            md.rows_read,
            md.writes,
            md.worker_rows_read,
            md.loads,
        )
        rounds = await step()
        cpu = time.thread_time() - before[0]
        wall = time.perf_counter() - before[1]
        worker = ledger.by_kind["worker"] - kinds.get("worker", 0.0)
        etcd = ledger.by_kind["etcd"] - kinds.get("etcd", 0.0)
        client = ledger.by_kind["client"] - kinds.get("client", 0.0)
        return Phase(
            wall=wall,
            master_cpu=max(0.0, cpu - worker - etcd - client),
            worker_cpu=worker,
            etcd_cpu=etcd,
            master_requests=self.master_counts["requests"] - before[2],
            master_keys_read=self.master_counts["keys read"] - before[3],
            worker_requests=self.worker_counts["requests"] - before[4],
            metadata_reads=md.reads - before[5],
            metadata_rows_read=md.rows_read - before[6],
            metadata_writes=md.writes - before[7],
            worker_metadata_rows_read=md.worker_rows_read - before[8],
            loads=md.loads - before[9],
            rounds=rounds or 0,
        )

    def placement(self) -> Counter[str]:
        return Counter(kv.value.decode() for kv in self.shared.state.range(paths.claims_prefix()))

    async def kill(self, victims: Sequence[SimWorker]) -> None:
        """Crash ``victims``; the failure detector finds them refusing connections and revokes
        their leases (``FailureDetector.round``, whose probes need real sockets)."""
        for w in victims:
            await w.crash()
        for w in victims:
            assert w.lease is not None
            await self.master_coord.revoke_lease(w.lease.id)
            self.master.worker_gone(w.worker_id)
            del self.workers[w.worker_id]

    async def close(self) -> None:
        for w in self.workers.values():
            await w.stop_keep_alive()
        await self.master.close()
        await self.shared.close()


def _row(i: int) -> bytes:
    return b"row%08d" % (i * 1000)


# --------------------------------------------------------------------------- the scenarios


async def run_size(
    workers: int,
    tablets: int,
    *,
    steady_seconds: float,
    seed: int = 7,
    load_concurrency: int = LOAD_CONCURRENCY,
) -> dict[str, Any]:
    rng = random.Random(seed)
    cluster = SimCluster(workers, tablets, load_concurrency=load_concurrency)
    out: dict[str, Any] = {"workers": workers, "tablets": tablets, "tables": cluster.n_tables}
    try:
        await cluster.add_workers(workers)

        async def bootstrap() -> int:
            await cluster.master.assign()  # the root and METADATA tablets
            await cluster.create_tables()
            return 1

        out["create"] = _dump(await cluster.measure(bootstrap))
        _progress("create", out)
        initial = await cluster.measure(cluster.assign_until_served)
        out["initial"] = _dump(initial)
        _progress("initial", out)

        async def full_round() -> int:
            await cluster.master.assign()
            return 1

        async def periodic_round() -> int:
            await cluster.master.assign(if_changed=True)
            return 1

        # A full round: what a round costs after a change (a claim deleted, a worker or a
        # table come or gone) and every full_round_interval regardless.
        out["full_round"] = _dump(await cluster.measure(full_round))
        _progress("full_round", out)
        # The leader's periodic round with nothing changed (the first one opens the watches
        # and runs in full).
        await cluster.master.assign(if_changed=True)
        out["steady_round"] = _dump(await cluster.measure(periodic_round))
        _progress("steady_round", out)

        # Coordinator at steady state: keys, watches, requests per second.
        out["coordinator"] = await _steady(cluster, steady_seconds)
        _progress("coordinator", out)

        # Clients (§5.1).
        out["clients"] = await _clients(cluster, rng)
        _progress("clients", out)

        # One dead worker, then a rack (10 %).
        out["dead_worker"] = await _failure(cluster, 1, rng)
        _progress("dead_worker", out)
        out["rack_failure"] = await _failure(cluster, max(1, workers // 10), rng)
        _progress("rack_failure", out)

        # Balancing after adding 10 % new workers.
        out["balancing"] = await _balancing(cluster, max(1, workers // 10))
        _progress("balancing", out)
    finally:
        await cluster.close()
    return out


async def _steady(cluster: SimCluster, seconds: float) -> dict[str, Any]:
    state = cluster.shared.state
    kinds: Counter[str] = Counter()
    for kv in state.range(""):
        kinds[kv.key.split("/", 1)[0]] += 1
    before_workers = cluster.worker_counts["requests"]
    before_master = cluster.master_counts["requests"]
    before_keys = cluster.master_counts["keys read"]
    before_alive = sum(w.keep_alives for w in cluster.workers.values())
    started = time.perf_counter()
    interval = cluster.options.interval
    while time.perf_counter() - started < seconds:
        await cluster.master.assign(if_changed=True)
        await asyncio.sleep(interval)
    elapsed = time.perf_counter() - started
    n = len(cluster.workers)
    alive = sum(w.keep_alives for w in cluster.workers.values()) - before_alive
    worker_requests = cluster.worker_counts["requests"] - before_workers + alive
    return {
        "keys": sum(kinds.values()),
        "keys_by_kind": dict(kinds),
        "watches": cluster.worker_counts["watches"] + cluster.master_counts["watches"],
        "worker_watches": cluster.worker_counts["watches"],
        "master_watches": cluster.master_counts["watches"],
        "seconds": elapsed,
        "worker_requests_per_s": worker_requests / elapsed / n,
        "master_requests_per_s": (cluster.master_counts["requests"] - before_master) / elapsed,
        "master_keys_read_per_s": (cluster.master_counts["keys read"] - before_keys) / elapsed,
        "lease_ttl": cluster.ttl,
        # Keep-alives at the default TTL (one per third of it) in place of the simulation's.
        "worker_requests_per_s_default_ttl": (worker_requests - alive) / elapsed / n
        + 3 / LeaseOptions().ttl,
    }


async def _clients(cluster: SimCluster, rng: random.Random) -> dict[str, Any]:
    """A new client's first lookup, and a client locating random rows of random tables."""
    table_ids = [t.table_id for t in await cluster.master.catalog.list_tables()]

    def client() -> LocationCache:
        coord = MeteredCoordinator(cluster.shared, cluster.ledger, cluster.client_counts)
        return LocationCache(coord, cluster.transport)  # type: ignore[arg-type]

    first = client()
    await cluster.ledger.timed("client", first.locate(table_ids[0], _row(rng.randrange(1000))))
    new = {
        "coordinator_reads": first.stats.reads[1],
        "metadata_reads": first.stats.reads[2] + first.stats.reads[3],
    }
    warm = client()
    lookups = 2000
    for _ in range(lookups):
        table = rng.choice(table_ids)
        row = _row(rng.randrange(TABLETS_PER_TABLE))
        await cluster.ledger.timed("client", warm.locate(table, row))
    reads = warm.stats.reads[2] + warm.stats.reads[3]
    misses = warm.stats.reads[3]  # lookups of a user tablet that had to read METADATA
    # A client walking one table in order (a scan): prefetch answers 15 of every 16 tablets.
    scanner = client()
    for i in range(TABLETS_PER_TABLE):
        await cluster.ledger.timed("client", scanner.locate(table_ids[0], _row(i)))
    return {
        "new_client": new,
        "random_lookups": lookups,
        "random_misses": misses,
        "metadata_reads_per_miss": reads / max(1, misses),
        "metadata_reads_per_random_lookup": reads / lookups,
        "sequential_lookups": TABLETS_PER_TABLE,
        "metadata_reads_per_sequential_lookup": (scanner.stats.reads[2] + scanner.stats.reads[3])
        / TABLETS_PER_TABLE,
    }


async def _failure(cluster: SimCluster, n: int, rng: random.Random) -> dict[str, Any]:
    """Kill ``n`` workers (none serving the root or a METADATA tablet, which a rack failure
    may of course hit: that recovery is the same rounds plus the METADATA level first) and
    recover their tablets."""
    placement = cluster.placement()
    system = {
        kv.value.decode()
        for kv in cluster.shared.state.range(paths.claims_prefix(mt.METADATA_TABLE_ID))
    }
    candidates = sorted(w for w in cluster.workers if w not in system)
    victims = [cluster.workers[w] for w in rng.sample(candidates, n)]
    lost = sum(placement[w.worker_id] for w in victims)
    before = placement

    async def recover() -> int:
        await cluster.kill(victims)
        return await cluster.assign_until_served()

    phase = await cluster.measure(recover)
    after = cluster.placement()
    gained = [after[w] - before[w] for w in cluster.workers]
    phase.extra = {
        "workers_killed": n,
        "tablets_recovered": lost,
        "most_taken_by_one_worker": max(gained),
        "workers_taking_tablets": sum(1 for g in gained if g > 0),
    }
    return _dump(phase)


def converge(
    workers: Sequence[str],
    loads: Sequence[assignment.TabletLoad],
    *,
    options: MasterOptions,
    max_rounds: int = 100_000,
) -> tuple[int, int]:
    """Balancing rounds of the real planner, each capped as ``Balancer.balance`` caps them
    (``Balancer.moves_per_round``, ``max_moves_per_worker``; a moved tablet sits out
    ``move_cooldown``, taken as that many ``balance_cooldown`` rounds), applied until a plan
    is empty: (moves, rounds)."""
    per_round = max(options.max_moves, math.ceil(options.move_fraction * len(workers)))
    sit_out = max(1, math.ceil(options.move_cooldown / max(options.balance_cooldown, 1e-9)))
    where = {(t.table_id, t.tablet_id): t for t in loads}
    moved_in: dict[tuple[str, str], int] = {}
    moves = 0
    for rounds in range(max_rounds):
        current = [
            replace(t, movable=rounds - moved_in.get(k, -sit_out) >= sit_out)
            for k, t in where.items()
        ]
        plan = assignment.plan(
            list(workers),
            current,
            balance=True,
            max_moves=per_round,
            ratio=options.balance_ratio,
            max_moves_per_worker=options.max_moves_per_worker,
        )
        made = [m for m in plan if m.source is not None]
        if not made:
            return moves, rounds
        for m in made:
            key = (m.table_id, m.tablet_id)
            where[key] = replace(where[key], worker=m.worker)
            moved_in[key] = rounds
        moves += len(made)
    raise RuntimeError(f"balancing did not converge in {max_rounds} rounds")


async def _balancing(cluster: SimCluster, n: int) -> dict[str, Any]:
    """Add ``n`` workers; the rounds of the real planner until its plan is empty, and real
    rounds of the balancer."""
    await cluster.add_workers(n)
    options = replace(cluster.options, balance_cooldown=MasterOptions().balance_cooldown)
    workers = {w: x.address for w, x in cluster.workers.items()}
    loads = [
        assignment.TabletLoad(t, tid, w, size=64 << 20, movable=t != mt.METADATA_TABLE_ID)
        for w, x in cluster.workers.items()
        for (t, tid) in x.served
    ]
    started = time.perf_counter()
    needed, rounds = converge(list(workers), loads, options=options)
    converge_seconds = time.perf_counter() - started
    real_rounds = 3
    cluster.polls.peak = 0

    async def balance() -> int:
        moved = 0
        for _ in range(real_rounds):
            moved += await cluster.master.balancer.balance()
        return moved

    phase = await cluster.measure(balance)
    moved = phase.rounds
    phase.rounds = real_rounds
    phase.extra = {
        "workers_added": n,
        "moves_to_converge": needed,
        "max_moves": options.max_moves,
        "moves_per_round": cluster.master.balancer.moves_per_round(len(workers)),
        "max_moves_per_worker": options.max_moves_per_worker,
        "rounds_to_converge": rounds,
        "hours_at_cooldown": rounds * (options.balance_cooldown + phase.wall / real_rounds) / 3600,
        "moved_in_real_rounds": moved,
        "status_polls_in_flight_max": cluster.polls.peak,
        "converge_simulation_seconds": converge_seconds,
    }
    return _dump(phase)


#: Where each finished phase's results go at once (a long run cut short keeps them).
PARTIAL: Path | None = None


def _progress(phase: str, out: dict[str, Any]) -> None:
    print(f"  {phase} done", flush=True)
    if PARTIAL is not None:
        PARTIAL.write_text(json.dumps(out, indent=1))


def _dump(p: Phase) -> dict[str, Any]:
    d = {k: v for k, v in p.__dict__.items() if k != "extra"}
    d.update(p.extra)
    return d


# --------------------------------------------------------------------------- output


def table(results: Sequence[dict[str, Any]]) -> str:
    """The Markdown table of a run (the docs' performance/scale.md carries one)."""
    head = (
        "| workers | tablets | initial assignment: s, master CPU s, METADATA rows read per "
        "load | steady round: ms, master CPU ms, etcd keys read | full round: ms, master CPU "
        "ms, etcd keys read | dead worker: tablets, s, master CPU s, most to one "
        "| rack (10 %): tablets, s, master CPU s, most to one | balancing +10 %: moves, "
        "moves per round, rounds, minutes | new client: METADATA reads | METADATA reads per "
        "random miss | etcd keys | requests/s per worker | master requests/s |"
    )
    lines = [head, "|" + "---:|" * 13]
    for r in results:
        i, s, f, d, k, b = (
            r["initial"],
            r["steady_round"],
            r["full_round"],
            r["dead_worker"],
            r["rack_failure"],
            r["balancing"],
        )
        c, co = r["clients"], r["coordinator"]
        lines.append(
            f"| {r['workers']} | {r['tablets']:,} "
            f"| {i['wall']:.1f}, {i['master_cpu']:.1f}, {rows_per_load(r):.1f} "
            f"| {s['wall'] * 1e3:.1f}, {s['master_cpu'] * 1e3:.1f}, {s['master_keys_read']:,} "
            f"| {f['wall'] * 1e3:.0f}, {f['master_cpu'] * 1e3:.0f}, {f['master_keys_read']:,} "
            f"| {d['tablets_recovered']}, {d['wall']:.2f}, {d['master_cpu']:.2f}, "
            f"{d['most_taken_by_one_worker']} "
            f"| {k['tablets_recovered']}, {k['wall']:.2f}, {k['master_cpu']:.2f}, "
            f"{k['most_taken_by_one_worker']} "
            f"| {b['moves_to_converge']:,}, {b['moves_per_round']}, {b['rounds_to_converge']:,}, "
            f"{b['hours_at_cooldown'] * 60:.1f} "
            f"| {c['new_client']['metadata_reads']} + {c['new_client']['coordinator_reads']} etcd "
            f"| {c['metadata_reads_per_miss']:.2f} "
            f"| {co['keys']:,} | {co['worker_requests_per_s_default_ttl']:.2f} "
            f"| {co['master_requests_per_s']:.1f} |"
        )
    return "\n".join(lines)


def rows_per_load(r: dict[str, Any]) -> float:
    """METADATA rows the workers read per tablet they loaded in the initial assignment."""
    i = r["initial"]
    return float(i["worker_metadata_rows_read"]) / max(1, i["loads"])


def chart(results: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['workers']}w/{r['tablets'] // 1000}k" for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))
    ax = axes[0]
    for key, name in (("full_round", "full round"), ("steady_round", "steady round")):
        ax.plot(labels, [r[key]["master_cpu"] * 1e3 for r in results], "o-", label=f"{name}: CPU")
        ax.plot(labels, [r[key]["wall"] * 1e3 for r in results], "s--", label=f"{name}: wall")
    ax.set_title("assignment round (master)")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.legend()
    ax = axes[1]
    for key, name in (("dead_worker", "one worker"), ("rack_failure", "10 % of workers")):
        ax.plot(labels, [r[key]["wall"] for r in results], "o-", label=f"{name}: wall")
        ax.plot(labels, [r[key]["master_cpu"] for r in results], "s--", label=f"{name}: CPU")
    ax.set_title("recovery until every tablet is served")
    ax.set_ylabel("s")
    ax.legend(fontsize=8)
    ax = axes[2]
    ax.plot(
        labels,
        [r["coordinator"]["worker_requests_per_s_default_ttl"] for r in results],
        "o-",
        label="per worker",
    )
    ax.plot(
        labels,
        [r["coordinator"]["master_requests_per_s"] for r in results],
        "s--",
        label="master",
    )
    ax.set_title("coordinator requests/s at steady state")
    ax.set_yscale("log")
    ax.legend()
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        w, _, t = part.partition("x")
        try:
            out.append((int(w), int(t)))
        except ValueError:
            raise SystemExit(f"--sizes: {part!r} is not WORKERSxTABLETS (e.g. 100x10000)") from None
        if out[-1][0] < 10 or out[-1][1] < 1:
            raise SystemExit(f"--sizes: {part!r}: at least 10 workers and 1 tablet")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10 and 100 workers only")
    parser.add_argument("--sizes", help="WORKERSxTABLETS,... (overrides --quick)")
    parser.add_argument("--steady-seconds", type=float, default=None)
    parser.add_argument(
        "--load-concurrency",
        type=int,
        default=LOAD_CONCURRENCY,
        help="loads the simulated workers run at once, all together (this machine's bound)",
    )
    parser.add_argument("--log", action="store_true", help="show the master's warnings")
    parser.add_argument("--json", type=Path, default=Path("bench-scale.json"))
    parser.add_argument("--png", type=Path, default=None, help="chart of the run")
    parser.add_argument("--markdown", type=Path, default=None, help="the table, as Markdown")
    args = parser.parse_args(argv)
    sizes = _sizes(args.sizes) if args.sizes else list(QUICK_SIZES if args.quick else FULL_SIZES)
    steady = (
        args.steady_seconds if args.steady_seconds is not None else (2.0 if args.quick else 8.0)
    )
    if args.load_concurrency < 1:
        raise SystemExit(f"--load-concurrency must be >= 1, got {args.load_concurrency}")
    if args.log:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
        return _run(args, sizes, steady)
    # Quiet for the run only: main() also runs inside a test process, whose later tests read
    # the package's warnings.
    quiet = logging.getLogger("tabletstore")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _run(args, sizes, steady)
    finally:
        quiet.setLevel(level)


def _run(args: argparse.Namespace, sizes: list[tuple[int, int]], steady: float) -> int:
    global PARTIAL
    PARTIAL = args.json.with_suffix(".partial.json")
    results = []
    for workers, tablets in sizes:
        started = time.perf_counter()
        print(f"{workers} workers x {tablets} tablets ...", flush=True)
        results.append(
            asyncio.run(
                run_size(
                    workers, tablets, steady_seconds=steady, load_concurrency=args.load_concurrency
                )
            )
        )
        print(
            f"{workers} workers x {tablets} tablets: {time.perf_counter() - started:.0f} s",
            flush=True,
        )
    text = table(results)
    print(text)
    args.json.write_text(json.dumps({"results": results}, indent=1))
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    if args.png is not None:
        chart(results, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
