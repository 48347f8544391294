"""The asyncio client: tables, mutations, reads, single-row transactions (§3).

Users construct a client through :func:`tabletstore.connect` (or ``tabletstore.aio.connect``)
and get tables from it (happybase's shape: factories, not constructors). Every data request is
routed to the worker serving the row's tablet, found through the location cache (§5.1); a
``NotServing`` or unreachable worker makes the client refresh the location and retry,
transparently, within a deadline. Administrative requests go to the master.

Retries: a split, a move or a recovery is never the caller's problem within the retry deadline
(§5.2: a tablet being split, moved or recovered is unavailable only briefly). A read is always
safe to retry, and a scan resumes after the last row it delivered. A row mutation is retried
only when it is idempotent (every SetCell has an explicit timestamp; deletes are idempotent) or
when the error says it was not applied: the call was refused or never sent (any
``Unavailable``: ``NotServing``, ``Unreachable``...; or ``Fenced``), or one entry of a MutateRows
response was refused (any ``Unavailable``, ``Fenced`` or ``Closed`` answered for that entry: see
``mutate_rows._refused``), in which case only the refused entries are sent again. A mutation
that may have been applied is reported as ``Indeterminate``, never blindly sent again unless
idempotent; read-modify-write and check-and-mutate never are. Which is which is the
transport's to say, not this module's (``rpc/transport.py``): a request sent with no answer
(a timeout, a lost connection) is ``Indeterminate``, one never sent is ``Unreachable``.

The client is laid out as python-bigtable's data client is: this module holds the
:class:`AsyncClient` (the connection: routing to the tablet's worker and the retry loop
``_with_retry``, the coalescers, the requests that go to every tablet or worker); its
administrative requests are ``client/table_admin.py``'s
(:class:`~tabletstore.client.table_admin.TableAdmin`, a base of AsyncClient), a table's data
API ``client/table.py``'s, and the two operations behind it ``client/mutate_rows.py`` (row
mutations across retries, partial failures) and ``client/read_rows.py`` (point reads and
resumable scans).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from tabletstore.client.backoff import retry_pause
from tabletstore.client.change_stream import SegmentCache
from tabletstore.client.coalesce import Coalescer
from tabletstore.client.location import LocationCache
from tabletstore.client.mutate_rows import (
    MutationError,
    MutationsFailed,
    PointWrite,
    PointWriteErrors,
    PointWriteKey,
    mutate_tablets,
)
from tabletstore.client.read_rows import PointRead, PointReadKey, read_points
from tabletstore.client.table import AsyncTable
from tabletstore.client.table_admin import Admin, TableAdmin
from tabletstore.data.model import Row
from tabletstore.data.validation import mutation_bytes
from tabletstore.errors import Fenced, Indeterminate, TabletStoreError, Unavailable
from tabletstore.limits import BATCH_REQUEST_BYTES
from tabletstore.metadata.catalog import Catalog, ClusterSettings, TableInfo
from tabletstore.metadata.record import TabletRecord
from tabletstore.rpc.auth import ACTING_FOR
from tabletstore.rpc.messages import (
    CompactTabletRequest,
    LargeRow,
    ListTablesRequest,
    ServerStatusRequest,
    ServerStatusResponse,
)
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Transport
from tabletstore.storage_s3 import layout, open_store
from tabletstore.storage_s3.base import ObjectStore

# MutationError, MutationsFailed, AsyncTable and Admin have their homes in the modules above;
# they are named here too because this module was where they were imported from.
__all__ = [
    "ACTING_FOR",
    "Admin",
    "AsyncClient",
    "AsyncTable",
    "ClusterStatus",
    "CompactionProgress",
    "MutationError",
    "MutationsFailed",
]

T = TypeVar("T")

#: At most this many single-row mutations share one request (coalesce.py).
_COALESCE_ITEMS = 128
#: At most this many point reads share one request: a round of many concurrent readers leaves
#: as several requests, so the worker reads the next request's keys while this process hands
#: out the rows of the one answered before it, rather than the two processes taking turns.
_READ_ITEMS = 16


@dataclass(frozen=True, slots=True)
class CompactionProgress:
    """How far :meth:`AsyncClient.compact_tablets` is: tablets compacted of those listed at the
    start, and their SSTable bytes as their records said before (a split meanwhile can make
    the done counts pass the totals)."""

    tablets_done: int
    tablets_total: int
    bytes_done: int
    bytes_total: int


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """What ``tabletstore status`` prints: the master, every worker and its tablets, and the
    most recent tablet events."""

    master: str | None
    workers: dict[str, ServerStatusResponse | str]
    events: list[tuple[float, str, str, str]]


class AsyncClient(TableAdmin):
    """A connection to a tabletstore database (embedded or cluster)."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        transport: Transport,
        admin: Admin,
        identity: str | None = None,
        retry_deadline: float = 30.0,
        locations: LocationCache | None = None,
        coalesce: bool = False,
    ) -> None:
        super().__init__(
            admin=admin, locations=locations or LocationCache(catalog.coordinator, transport)
        )
        self._catalog = catalog
        self._transport = transport
        self._identity = identity
        self.retry_deadline = retry_deadline
        self._stubs: dict[str, TabletService] = {}
        #: The commit-log segments this client's change streams read (client/change_stream.py).
        self.change_segments = SegmentCache()
        #: With ``coalesce`` (a cluster client: each request crosses a socket), concurrent
        #: single-row reads and mutations to one worker share a request (client/coalesce.py).
        self._point_reads: Coalescer[PointReadKey, PointRead, Row | LargeRow | None] | None = None
        self._point_writes: Coalescer[PointWriteKey, PointWrite, PointWriteErrors] | None = None
        if coalesce:
            self._point_reads = Coalescer(
                functools.partial(read_points, self), max_items=_READ_ITEMS
            )
            self._point_writes = Coalescer(
                functools.partial(mutate_tablets, self),
                max_items=_COALESCE_ITEMS,
                max_bytes=BATCH_REQUEST_BYTES,
                size=lambda w: mutation_bytes(w[2].row, w[2].mutations),
            )

    @property
    def catalog(self) -> Catalog:
        """Schemas and tablet records (what garbage collection marks from)."""
        return self._catalog

    async def compact_tablets(
        self,
        table: str,
        *,
        major: bool,
        progress: Callable[[CompactionProgress], object] | None = None,
    ) -> CompactionProgress:
        """Minor (``major=False``, :meth:`flush`) or major compaction (:meth:`compact`) of every
        tablet of ``table``, one tablet at a time from this client, telling ``progress`` after
        each. The row space is walked from its start, each tablet located as a write would be
        (and waited for while it moves), so a tablet that splits or moves meanwhile is still
        covered exactly once; the totals are the tablets METADATA listed at the start."""
        info = await self._info(table)
        listed = await self.locations.tablets(info.table_id, refresh=True)
        done = CompactionProgress(0, len(listed), 0, sum(r.size for r in listed))
        if progress is not None:
            progress(done)
        #: The tablet each attempt was sent to (the last one answered).
        seen: list[TabletRecord] = []

        def request(info: TableInfo, record: TabletRecord) -> CompactTabletRequest:
            seen.append(record)
            return CompactTabletRequest(info.table_id, record.tablet_id, major)

        row = b""
        while True:
            await self._with_retry(
                table,
                row,
                "compaction",
                lambda w, i, r: w.compact_tablet(request(i, r)),
                safe=True,
            )
            record = seen[-1]
            done = replace(
                done,
                tablets_done=done.tablets_done + 1,
                bytes_done=done.bytes_done + record.size,
            )
            if progress is not None:
                progress(done)
            if record.end_row is None:
                return done
            row = record.end_row

    def table(self, name: str) -> AsyncTable:
        """A handle on a table (no request is made until it is used)."""
        return AsyncTable(self, name)

    @property
    def identity(self) -> str | None:
        """Who the requests are made as (checked against ACLs): the request's ``ACTING_FOR``,
        else the client's own."""
        return ACTING_FOR.get() or self._identity

    @identity.setter
    def identity(self, value: str | None) -> None:
        self._identity = value

    async def staging_url(self, load_name: str) -> str:
        """Where a job writes the files of load ``load_name`` (``tabletstore.batch.
        write_sstables(data, url)``, with the job's own rights to the bucket): this caller's
        staging area of the database's bucket, the only place :meth:`bulk_load` reads."""
        settings = await ClusterSettings.load(self._catalog.coordinator)
        return layout.staging_url(settings.store_url, self._staging_principal(), load_name)

    def _staging_principal(self) -> str:
        """The principal the master runs this client's requests as (no auth: anonymous)."""
        return "anonymous"

    async def store_url(self) -> str:
        """The URL of the database's bucket (where its objects and backups live)."""
        return (await ClusterSettings.load(self._catalog.coordinator)).store_url

    @contextlib.asynccontextmanager
    async def _database_store(self) -> AsyncIterator[ObjectStore]:
        """The database's bucket (``ClusterSettings.store_url``), opened with this client's
        credentials for copies of backups in and out of it (client/backup_admin.py)."""
        settings = await ClusterSettings.load(self._catalog.coordinator)
        store = open_store(settings.store_url)
        try:
            yield store
        finally:
            await store.close()

    async def close(self) -> None:
        """Nothing to release on the client side; the database owns the transport."""

    def _worker(self, address: str) -> TabletService:
        """A stub of the tablet server at ``address``, cached (one per worker)."""
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = TABLET.client(self._transport, address)
        return stub

    async def status(self, *, events: int = 20) -> ClusterStatus:
        """The master, each live worker's tablets (or why it did not answer), recent events."""

        async def ask(address: str) -> ServerStatusResponse | str:
            # A paused or dying worker must not stall the whole report.
            try:
                stub = TABLET.client(self._transport, address, timeout=2.0)
                return await stub.server_status(ServerStatusRequest())
            except TabletStoreError as exc:
                return f"{address}: {type(exc).__name__}: {exc}"

        live = sorted((await self._catalog.live_workers()).items())
        answers = await asyncio.gather(*(ask(address) for _, address in live))
        workers = {worker_id: a for (worker_id, _), a in zip(live, answers, strict=True)}
        recent: list[tuple[float, str, str, str]] = []
        # The tables the master lists to this client (those it may know of), not the
        # coordinator's schemas: a client's etcd user may not read those.
        for info in (await self._admin.list_tables(ListTablesRequest())).infos():
            for rec in await self._catalog.list_tablets(info.table_id):
                for e in rec.events:
                    recent.append((e.at, f"{info.schema.name}/{rec.tablet_id}", e.kind, e.detail))
        recent.sort()
        return ClusterStatus(await self._catalog.master_address(), workers, recent[-events:])

    async def _locate(
        self, table_id: str, row: bytes, *, refresh: bool, deadline: float
    ) -> TabletRecord:
        """The tablet holding ``row``, retried with back-off while its location cannot be read
        (a METADATA tablet moving, §5.1) until ``deadline``; nothing is sent meanwhile."""
        loop = asyncio.get_running_loop()
        for attempt in itertools.count():
            try:
                return await self.locations.locate(table_id, row, refresh=refresh or attempt > 0)
            except Unavailable:  # NotServing included
                if loop.time() >= deadline:
                    raise
            await asyncio.sleep(retry_pause(attempt))
        raise AssertionError("unreachable")

    async def _with_retry(
        self,
        table: str,
        row: bytes,
        what: str,
        send: Callable[[TabletService, TableInfo, TabletRecord], Awaitable[T]],
        *,
        safe: bool,
    ) -> T:
        """``send(worker, info, record)`` to the worker serving the tablet holding ``row``,
        retrying moves; ``safe``: the request may be sent again after it got no answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_deadline
        refresh = False
        # Set once an attempt may have reached the worker without an answer coming back: from
        # then on a failure must be reported as Indeterminate, never as "not applied".
        ambiguous: TabletStoreError | None = None
        for attempt in itertools.count():
            info = await self._info(table, refresh=refresh)
            try:
                record = await self._locate(info.table_id, row, refresh=refresh, deadline=deadline)
            except Unavailable as exc:
                if ambiguous is not None:
                    raise Indeterminate(
                        f"{what} of row {row[:64]!r} may have been applied: {ambiguous}"
                    ) from exc
                raise
            try:
                assert record.location is not None
                return await send(self._worker(record.location), info, record)
            except Indeterminate as exc:
                # Sent, no answer: the owner may be dead or moved (forget where this tablet
                # was; the table's other tablets may well be served where they were), and the
                # request may have been applied.
                self.locations.invalidate(info.table_id, row)
                if not safe:
                    raise Indeterminate(
                        f"{what} of row {row[:64]!r} may have been applied: {exc}"
                    ) from exc
                ambiguous = exc
            except (Unavailable, Fenced):  # mutate_rows._refused_call
                # Refused or never sent (Fenced: the worker's log was fenced by the tablet's
                # recovery, the write is not durable): nothing was applied, retry anywhere.
                pass
            if loop.time() >= deadline:
                if ambiguous is not None:
                    raise Indeterminate(
                        f"{what} of row {row[:64]!r} may have been applied: {ambiguous}"
                    )
                raise Unavailable(
                    f"{what} of row {row[:64]!r}: tablet not served within the deadline"
                )
            refresh = True
            await asyncio.sleep(retry_pause(attempt))
        raise AssertionError("unreachable")
