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
:func:`_refused`), in which case only the refused entries are sent again. A mutation that may
have been applied is reported as ``Indeterminate``, never blindly sent again unless
idempotent; read-modify-write and check-and-mutate never are. Which is which is the
transport's to say, not this module's (``rpc/transport.py``): a request sent with no answer
(a timeout, a lost connection) is ``Indeterminate``, one never sent is ``Unreachable``.

Administrative requests are ``rpc.services.MasterService`` calls: to the embedded database's
Master itself, or through a stub to a cluster's elected master (``client/cluster.py``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TypeVar, cast

from tabletstore.client.coalesce import Coalescer
from tabletstore.client.location import LocationCache
from tabletstore.data.filters import RowFilter
from tabletstore.data.model import (
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    Mutation,
    ReadModifyWriteRule,
    Row,
    RowMutation,
    SetCell,
)
from tabletstore.data.query import RowRange, RowSet
from tabletstore.data.schema import ColumnFamily, GcRule, LocalityGroup, TableSchema
from tabletstore.data.validation import check_row_key, mutation_bytes, validate_row_mutation
from tabletstore.errors import (
    Closed,
    Fenced,
    Indeterminate,
    InvalidArgument,
    NotServing,
    TabletStoreError,
    Unavailable,
)
from tabletstore.limits import BATCH_REQUEST_BYTES
from tabletstore.metadata.catalog import Catalog, ClusterSettings, TableInfo
from tabletstore.metadata.record import TabletRecord
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.metadata.snapshot import SnapshotManifest
from tabletstore.rpc.messages import (
    BulkLoadRequest,
    CheckAndMutateRequest,
    CompactTableRequest,
    CompactTabletRequest,
    CreateSnapshotRequest,
    CreateTableRequest,
    DeleteSnapshotRequest,
    EntryError,
    LargeRow,
    ListSnapshotsRequest,
    ListTablesRequest,
    ModifyFamiliesRequest,
    MutateRowsRequest,
    MutateTabletsRequest,
    PointReadsRequest,
    ReadModifyWriteRequest,
    ReadRowsRequest,
    RowBatch,
    SampleRowKeysRequest,
    ScanProgress,
    ServerStatusRequest,
    ServerStatusResponse,
    SetAdminsRequest,
    TableNameRequest,
    TabletKeys,
    TabletMutations,
)
from tabletstore.rpc.row_pieces import RowAssembler
from tabletstore.rpc.services import TABLET, MasterService, TabletService
from tabletstore.rpc.transport import Transport
from tabletstore.storage_s3 import layout

__all__ = [
    "Admin",
    "AsyncClient",
    "AsyncTable",
    "ClusterStatus",
    "CompactionProgress",
    "MutationError",
    "MutationsFailed",
]

T = TypeVar("T")

#: Row-mutation bytes (``mutations.mutation_bytes``) per MutateRows request: a batch is sent
#: in requests of about this size; one row mutation (at most ``MAX_MUTATION_BYTES``) always
#: fits a frame on its own.
_REQUEST_BYTES = BATCH_REQUEST_BYTES
#: At most this many single-row mutations share one request (coalesce.py).
_COALESCE_ITEMS = 128
#: At most this many point reads share one request: a round of many concurrent readers leaves
#: as several requests, so the worker reads the next request's keys while this process hands
#: out the rows of the one answered before it (two requests of 16 instead of one of 32: 1.5x
#: the in-memory read rate, 1.7x the sequential one, at the same CPU per read; issue 18).
_READ_ITEMS = 16
#: The worker coalesced mutations go to, who sends them, and whether they write METADATA
#: (a request of its own, so that a principal refused METADATA writes fails those alone):
#: (worker address, identity, metadata).
_WriterKey = tuple[str, str | None, bool]
#: One coalesced mutation: (table id, tablet id, row mutation).
_PointWrite = tuple[str, str, RowMutation]
#: The worker coalesced point reads go to and who sends them: (worker address, identity).
_WorkerKey = tuple[str, str | None]
#: One coalesced point read: (table id, tablet id, row key).
_PointRead = tuple[str, str, bytes]
#: A coalesced mutation's outcome: its entry's error, or () if it was applied.
_Errors = tuple[TabletStoreError, ...]


#: What the client asks of the master: the master's service (the embedded database's Master
#: itself, or a stub to a cluster's elected master).
Admin = MasterService


@dataclass(frozen=True, slots=True)
class MutationError:
    """One failed entry of a batch: its index in the batch, its row and the error."""

    index: int
    row: bytes
    error: TabletStoreError


@dataclass(frozen=True, slots=True)
class CompactionProgress:
    """How far :meth:`AsyncClient.compact_tablets` is: tablets compacted of those listed at the
    start, and their SSTable bytes as their records said before (a split meanwhile can make
    the done counts pass the totals)."""

    tablets_done: int
    tablets_total: int
    bytes_done: int
    bytes_total: int


class MutationsFailed(TabletStoreError):
    """Some entries of a batch failed; the others were applied. ``.failures`` lists them."""

    def __init__(self, failures: list[MutationError], total: int) -> None:
        self.failures = failures
        first = failures[0]
        super().__init__(
            f"{len(failures)} of {total} row mutations failed; first: row "
            f"{first.row[:64]!r}: {type(first.error).__name__}: {first.error}"
        )
        self.may_have_applied = any(f.error.may_have_applied for f in failures)


def _refused_call(error: TabletStoreError) -> bool:
    """Whether an error a whole call failed with says nothing of it was applied and the tablet
    will be served again: a refusal or a request never sent (any Unavailable: the Transport
    contract), or a log fenced by the tablet's recovery (Fenced: the write is not durable).
    Retried after looking the tablet up again, whatever the mutation."""
    return isinstance(error, Unavailable | Fenced)


def _refused(error: type[TabletStoreError]) -> bool:
    """Whether an error a worker answered for one entry (or one call) says the mutation was
    certainly not applied *and* that the tablet will be served again, here or elsewhere: a
    split or an unload refusing writes (NotServing), a log that stopped or a lease about to
    end (Unavailable), a log fenced by the tablet's recovery (Fenced: the writes in the fenced
    segment were not made durable, commitlog/writer.py), a log closing as its worker stops
    (Closed). Retried after looking the tablet up again, whatever the mutation."""
    return issubclass(error, Unavailable | Fenced | Closed)


def _idempotent(mutations: Iterable[Mutation]) -> bool:
    # AddToCell and MergeToCell are not: applied twice, a sum counts twice.
    return all(
        isinstance(m, DeleteCells | DeleteFamily | DeleteRow)
        or (isinstance(m, SetCell) and m.timestamp is not None)
        for m in mutations
    )


#: The identity a front door acts for while it serves one caller's request (the Cloud
#: Bigtable API's bearer token, bigtable_api/server.py); None: the client's own identity.
ACTING_FOR: ContextVar[str | None] = ContextVar("tabletstore_acting_for", default=None)


class AsyncClient:
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
        self._catalog = catalog
        self._transport = transport
        self._admin = admin
        self._identity = identity
        self.retry_deadline = retry_deadline
        #: Where tablets are served: the three-level lookup with its cache (§5.1).
        self.locations = locations or LocationCache(catalog.coordinator, transport)
        self._tables: dict[str, TableInfo] = {}
        self._stubs: dict[str, TabletService] = {}
        #: With ``coalesce`` (a cluster client: each request crosses a socket), concurrent
        #: single-row reads and mutations to one worker share a request (client/coalesce.py).
        self._point_reads: Coalescer[_WorkerKey, _PointRead, Row | LargeRow | None] | None = None
        self._point_writes: Coalescer[_WriterKey, _PointWrite, _Errors] | None = None
        if coalesce:
            self._point_reads = Coalescer(self._read_group, max_items=_READ_ITEMS)
            self._point_writes = Coalescer(
                self._write_group,
                max_items=_COALESCE_ITEMS,
                max_bytes=_REQUEST_BYTES,
                size=lambda w: mutation_bytes(w[2].row, w[2].mutations),
            )

    @property
    def catalog(self) -> Catalog:
        """Schemas and tablet records (what garbage collection marks from)."""
        return self._catalog

    # ------------------------------------------------------------------ admin

    async def create_table(
        self,
        name: str,
        families: Iterable[str | ColumnFamily] = (),
        *,
        split_keys: Sequence[bytes] = (),
        locality_groups: Iterable[LocalityGroup] = (),
    ) -> AsyncTable:
        """Create a table with column families (names or ColumnFamily values)."""
        try:
            fams = {}
            for f in families:
                fam = ColumnFamily(name=f) if isinstance(f, str) else f
                fams[fam.name] = fam
            groups = {"default": LocalityGroup(name="default")}
            groups.update({g.name: g for g in locality_groups})
            schema = TableSchema(name=name, families=fams, locality_groups=groups)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise InvalidArgument(_schema_error(exc)) from exc
        msg = await self._admin.create_table(CreateTableRequest.of(schema, split_keys))
        self._tables[name] = msg.info()
        return AsyncTable(self, name)

    async def delete_table(self, name: str) -> None:
        await self._admin.delete_table(TableNameRequest(name))
        info = self._tables.pop(name, None)
        if info is not None:
            self.locations.invalidate(info.table_id)

    async def set_admins(self, name: str, admins: Sequence[str]) -> None:
        """Replace who administers table ``name`` (on a cluster with auth on, only they may
        delete it or change its families and ACLs; master/guard.py)."""
        req = SetAdminsRequest(name, tuple(admins))
        self._tables[name] = (await self._admin.set_admins(req)).info()

    async def list_tables(self) -> list[str]:
        listed = await self._admin.list_tables(ListTablesRequest())
        return sorted(t.schema.name for t in listed.infos())

    async def describe_table(self, name: str) -> TableSchema:
        info = self._tables[name] = (await self._admin.get_table(TableNameRequest(name))).info()
        return info.schema

    async def create_family(
        self,
        table: str,
        family: str | ColumnFamily,
        *,
        gc_rule: GcRule | None = None,
        value_type: str | None = None,
    ) -> None:
        """Add a column family; ``value_type`` (``sum``, ``min``, ``max``, ``hll``) makes it an
        aggregate family (``data.aggregates``), fixed for the family's life."""
        try:
            fam = (
                ColumnFamily.model_validate(
                    {"name": family, "gc_rule": gc_rule, "value_type": value_type}
                )
                if isinstance(family, str)
                else family
            )
        except ValueError as exc:
            raise InvalidArgument(_schema_error(exc)) from exc
        await self._modify_families(ModifyFamiliesRequest.of(table, create=[fam]))

    async def update_family(self, table: str, family: ColumnFamily) -> None:
        await self._modify_families(ModifyFamiliesRequest.of(table, update=[family]))

    async def _modify_families(self, req: ModifyFamiliesRequest) -> None:
        self._tables[req.name] = (await self._admin.modify_families(req)).info()

    async def set_gc_rule(self, table: str, family: str, gc_rule: GcRule | None) -> None:
        schema = await self.describe_table(table)
        if family not in schema.families:
            raise InvalidArgument(f"table {table!r} has no column family {family!r}")
        fam = schema.families[family].model_copy(update={"gc_rule": gc_rule})
        await self.update_family(table, fam)

    async def delete_family(self, table: str, family: str) -> None:
        await self._modify_families(ModifyFamiliesRequest.of(table, drop=[family]))

    async def add_locality_group(self, table: str, group: LocalityGroup) -> None:
        await self._modify_families(ModifyFamiliesRequest.of(table, locality_groups=[group]))

    async def flush(self, table: str) -> None:
        """Minor-compact every tablet of the table (HBase shell's ``flush``)."""
        await self._admin.compact_table(CompactTableRequest(table, major=False))

    async def compact(self, table: str) -> None:
        """Major-compact every tablet of the table (HBase shell's ``major_compact``)."""
        await self._admin.compact_table(CompactTableRequest(table, major=True))

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

    # ------------------------------------------------------------------ batch jobs (§8)

    async def snapshot(self, table: str, *, ttl: float | None = None) -> SnapshotManifest:
        """Take a consistent snapshot of ``table`` for batch jobs (``tabletstore.batch``):
        every write acknowledged before the call is in it, none started after it returns.
        ``ttl`` seconds: GC may delete it after that (None: kept until deleted)."""
        msg = await self._admin.create_snapshot(CreateSnapshotRequest(table, ttl))
        return SnapshotManifest.from_bytes(msg.manifest_json)

    async def list_snapshots(self, table: str | None = None) -> list[SnapshotManifest]:
        """The snapshots of ``table`` (or of every table), oldest first."""
        resp = await self._admin.list_snapshots(ListSnapshotsRequest(table))
        return [SnapshotManifest.from_bytes(m.manifest_json) for m in resp.snapshots]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot; GC then frees the SSTables only it kept."""
        await self._admin.delete_snapshot(DeleteSnapshotRequest(snapshot_id))

    async def staging_url(self, load_name: str) -> str:
        """Where a job writes the files of load ``load_name`` (``tabletstore.batch.
        write_sstables(data, url)``, with the job's own rights to the bucket): this caller's
        staging area of the database's bucket, the only place :meth:`bulk_load` reads."""
        settings = await ClusterSettings.load(self._catalog.coordinator)
        return layout.staging_url(settings.store_url, self._staging_principal(), load_name)

    def _staging_principal(self) -> str:
        """The principal the master runs this client's requests as (no auth: anonymous)."""
        return "anonymous"

    async def bulk_load(
        self, table: str, url: str, *, load_id: str | None = None
    ) -> tuple[int, int]:
        """Load the SSTables a job wrote to its staging area (``url``: the load's name, or
        the URL :meth:`staging_url` gave for it) into ``table``, atomically per tablet; all
        are checked first and bad input loads nothing. Any other location is
        PermissionDenied: the cluster never fetches a location its caller names. Returns
        (tablets loaded, cells loaded) by this call.

        Safe to repeat: ``load_id`` (default: a hash of the files' contents) names the load;
        once it is done, running it again loads nothing and returns (0, 0), and a load that
        was interrupted (a crash, a failover) loads only what it had not loaded yet."""
        resp = await self._admin.bulk_load(BulkLoadRequest(table, url, load_id or ""))
        return resp.tablets, resp.cells

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
        for info in await self._catalog.list_tables():
            for rec in await self._catalog.list_tablets(info.table_id):
                for e in rec.events:
                    recent.append((e.at, f"{info.schema.name}/{rec.tablet_id}", e.kind, e.detail))
        recent.sort()
        return ClusterStatus(await self._catalog.master_address(), workers, recent[-events:])

    # ------------------------------------------------------------------ coalescing

    async def _read_group(
        self, key: _WorkerKey, reads: list[_PointRead]
    ) -> list[Row | LargeRow | BaseException | None]:
        """One ``read_points`` request for the point reads of one worker (``_point_reads``),
        whatever their tablets: each caller's row, or None; its tablet's own error (a tablet
        no longer served there), raised to that tablet's callers only; or a ``LargeRow``
        answer (its tablet's rows are too large for one reply), which sends each of those
        callers to read its row alone."""
        location, identity = key
        parts: dict[tuple[str, str], dict[bytes, None]] = {}
        for table_id, tablet_id, row in reads:
            parts.setdefault((table_id, tablet_id), {})[row] = None  # one row read once
        reply = await self._worker(location).read_points(
            PointReadsRequest(
                tuple(TabletKeys(t, tablet, tuple(rows)) for (t, tablet), rows in parts.items()),
                identity,
            )
        )
        if len(reply.answers) != len(parts):
            raise Indeterminate(
                f"{location} answered {len(reply.answers)} parts to {len(parts)} of read_points"
            )
        found: dict[tuple[str, str], dict[bytes, Row] | LargeRow | EntryError] = {}
        for part, answer in zip(parts, reply.answers, strict=True):
            if isinstance(answer, RowBatch):
                found[part] = {r.key: r for r in answer.rows}
            else:
                found[part] = answer
        out: list[Row | LargeRow | BaseException | None] = []
        for table_id, tablet_id, row in reads:
            got = found[table_id, tablet_id]
            if type(got) is dict:
                out.append(got.get(row))
            elif type(got) is EntryError:
                out.append(got.exception())  # each caller its own exception
            else:
                out.append(cast(LargeRow, got))
        return out

    async def _write_group(self, key: _WriterKey, writes: list[_PointWrite]) -> list[_Errors]:
        """One ``mutate_tablets`` request for the single-row mutations of one worker
        (``_point_writes``), whatever their tablets: for each caller, its entry's error
        (``(error,)``: a tablet that moved fails its own callers only) or ``()`` if it was
        applied. An error of the whole call is raised (to every caller)."""
        location, identity, _ = key
        parts: dict[tuple[str, str], list[int]] = {}
        for i, (table_id, tablet_id, _) in enumerate(writes):
            parts.setdefault((table_id, tablet_id), []).append(i)
        resp = await self._worker(location).mutate_tablets(
            MutateTabletsRequest(
                tuple(
                    TabletMutations(table_id, tablet_id, tuple(writes[i][2] for i in idx))
                    for (table_id, tablet_id), idx in parts.items()
                ),
                identity,
            )
        )
        order = [i for idx in parts.values() for i in idx]  # the wire's entry index -> writes'
        outcome: list[_Errors] = [()] * len(writes)
        for e in resp.errors:
            if not 0 <= e.index < len(order):
                raise Indeterminate(
                    f"{location} answered an error for entry {e.index} of {len(order)} "
                    "of mutate_tablets"
                )
            outcome[order[e.index]] = (e.exception(),)
        return outcome

    # ------------------------------------------------------------------ routing

    async def _info(self, name: str, *, refresh: bool = False) -> TableInfo:
        info = self._tables.get(name)
        if info is None or refresh:
            info = self._tables[name] = (await self._admin.get_table(TableNameRequest(name))).info()
        return info

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
            await asyncio.sleep(min(0.5, 0.01 * 2**attempt))
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
            except (Unavailable, Fenced):  # _refused_call
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
            await asyncio.sleep(min(0.5, 0.01 * 2**attempt))
        raise AssertionError("unreachable")


class _Batch:
    """The outcome of each entry of a MutateRows batch across attempts (``_send_batches``)."""

    def __init__(self, entries: Sequence[RowMutation]) -> None:
        self.entries = entries
        self.failures: list[MutationError] = []
        #: Entries an attempt may have applied (sent, no answer; or Indeterminate): if they
        #: end up failing, they fail as Indeterminate.
        self._ambiguous: dict[int, TabletStoreError] = {}
        #: Entries to send again.
        self._retry: set[int] = set()
        #: Why each entry sent again failed its latest attempt.
        self._last: dict[int, TabletStoreError] = {}

    def refused(self, indexes: list[int], error: TabletStoreError) -> None:
        """Certainly not applied by this attempt: send again."""
        for i in indexes:
            self._retry.add(i)
            self._last[i] = error

    def maybe_applied(self, indexes: list[int], error: TabletStoreError) -> None:
        """May have been applied: send again only if idempotent, else fail as Indeterminate."""
        for i in indexes:
            self._ambiguous[i] = error
            if _idempotent(self.entries[i].mutations):
                self._retry.add(i)
                self._last[i] = error
            else:
                self.failures.append(self._failure(i, error))

    def fail(self, indexes: list[int], error: TabletStoreError) -> None:
        """Not applied by this attempt, and sending it again would not help."""
        for i in indexes:
            self.failures.append(self._failure(i, error))

    def take_retries(self) -> list[int]:
        indexes = sorted(self._retry)
        self._retry = set()
        return indexes

    def give_up(self, indexes: list[int], error: TabletStoreError | None) -> None:
        """The deadline passed, or the tablets could not be found (``error``): each of
        ``indexes`` fails, a retryable reason reported as the deadline passing."""
        for i in indexes:
            why = error if error is not None else self._last.get(i)
            if why is None or _refused(type(why)) or why.may_have_applied:
                why = Unavailable(
                    f"row {self.entries[i].row[:64]!r}: tablet not served within the retry "
                    f"deadline (last: {type(why).__name__}: {why})"
                )
            self.failures.append(self._failure(i, why))

    def _failure(self, i: int, error: TabletStoreError) -> MutationError:
        row = self.entries[i].row
        earlier = self._ambiguous.get(i)
        if earlier is not None and not isinstance(error, Indeterminate):
            # This attempt was not applied (or got no answer), but an earlier one may have been.
            error = Indeterminate(
                f"the mutation of row {row[:64]!r} may have been applied: "
                f"{type(earlier).__name__}: {earlier}; then {type(error).__name__}: {error}"
            )
        return MutationError(i, row, error)


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """What ``tabletstore status`` prints: the master, every worker and its tablets, and the
    most recent tablet events."""

    master: str | None
    workers: dict[str, ServerStatusResponse | str]
    events: list[tuple[float, str, str, str]]


class AsyncTable:
    """One table's data API (§3)."""

    def __init__(self, client: AsyncClient, name: str) -> None:
        self._client = client
        self.name = name

    # ------------------------------------------------------------------ writes

    async def mutate_row(self, row: bytes, mutations: Sequence[Mutation]) -> None:
        """Apply mutations to one row atomically (§2). A split, move or recovery of the tablet
        is retried within the client's deadline (see the module docstring)."""
        muts = tuple(mutations)
        client = self._client
        info = client._tables.get(self.name) or await client._info(self.name)
        validate_row_mutation(info.schema, row, muts, client.identity)
        # With the row's tablet in the cache (nearly always), the first attempt goes straight
        # to it, without the batch path's lookups; what it leaves to retry is retried there.
        rec = client.locations.cached(info.table_id, row)
        first = [(rec, [0])] if rec is not None and rec.location is not None else None
        failures = await self._send_batches((RowMutation(row, muts),), [0], first=first)
        if failures:
            raise failures[0].error

    async def mutate_rows(self, entries: Sequence[RowMutation]) -> None:
        """Apply many row mutations, each atomic on its own (§3). Entries go to their tablets
        in one request per tablet, concurrently; failures are reported per entry by raising
        :class:`MutationsFailed` after every entry was tried."""
        if not entries:
            return
        info = await self._client._info(self.name)
        failures: list[MutationError] = []
        pending: list[int] = []
        for i, e in enumerate(entries):
            try:
                validate_row_mutation(info.schema, e.row, e.mutations, self._client.identity)
                pending.append(i)
            except TabletStoreError as exc:
                failures.append(MutationError(i, e.row, exc))
        failures.extend(await self._send_batches(entries, pending))
        if failures:
            failures.sort(key=lambda f: f.index)
            raise MutationsFailed(failures, len(entries))

    async def _send_batches(
        self,
        entries: Sequence[RowMutation],
        indexes: list[int],
        *,
        first: list[tuple[TabletRecord, list[int]]] | None = None,
    ) -> list[MutationError]:
        """Send ``entries[i]`` for each of ``indexes``, one MutateRows request per tablet, and
        send again, after looking the tablets up again, the entries that were certainly not
        applied (refused, never sent) or are idempotent, until none is left or the deadline
        passes. Returns the entries that failed, an entry that may have been applied (at any
        attempt) as Indeterminate. ``first``: the first attempt's groups, if the caller knows
        them (from the location cache)."""
        client = self._client
        loop = asyncio.get_running_loop()
        deadline = loop.time() + client.retry_deadline
        batch = _Batch(entries)
        refresh = False
        attempt = 0
        while indexes:
            if first is not None:
                groups, first = first, None
            else:
                try:
                    groups = await self._group(entries, indexes, refresh=refresh, deadline=deadline)
                except TabletStoreError as exc:
                    # No location within the deadline (or the table is gone): what is left
                    # fails.
                    batch.give_up(indexes, exc)
                    break
            sends = [
                self._send(batch, rec, part)
                for rec, idx in groups
                for part in (_by_size(entries, idx) if len(idx) > 1 else (idx,))
            ]
            if len(sends) == 1:
                await sends[0]  # one request (a single row, say): no task of its own
            else:
                await asyncio.gather(*sends)
            indexes = batch.take_retries()
            if indexes:
                if loop.time() >= deadline:
                    batch.give_up(indexes, None)
                    break
                refresh = True
                await asyncio.sleep(min(0.5, 0.01 * 2**attempt))
                attempt += 1
        return batch.failures

    async def _group(
        self, entries: Sequence[RowMutation], indexes: list[int], *, refresh: bool, deadline: float
    ) -> list[tuple[TabletRecord, list[int]]]:
        """The entries by the tablet holding their row (looked up again with ``refresh``)."""
        client = self._client
        info = await client._info(self.name, refresh=refresh)
        groups: dict[str, tuple[TabletRecord, list[int]]] = {}
        # With refresh, each tablet's location is read again once, whatever the number of its
        # rows here (a failed read keeps the cached entry: LocationCache.locate).
        refreshed: list[TabletRecord] = []
        last: TabletRecord | None = None
        for i in indexes:
            row = entries[i].row
            if not refresh and last is not None and last.contains(row):
                rec = last  # the row's neighbour's tablet (batches are often in key order)
            else:
                again = refresh and not any(r.contains(row) for r in refreshed)
                rec = await client._locate(info.table_id, row, refresh=again, deadline=deadline)
                if again:
                    refreshed.append(rec)
                last = rec
            groups.setdefault(rec.tablet_id, (rec, []))[1].append(i)
        return list(groups.values())

    async def _send(self, batch: _Batch, rec: TabletRecord, idx: list[int]) -> None:
        """One MutateRows request to ``rec``'s worker; outcomes recorded in ``batch``."""
        client = self._client
        entries = batch.entries
        assert rec.location is not None
        try:
            if len(idx) == 1 and client._point_writes is not None:
                # One row (mutate_row): shares a request with others to this worker.
                key = (rec.location, client.identity, rec.table_id == METADATA_TABLE_ID)
                write = (rec.table_id, rec.tablet_id, entries[idx[0]])
                errors = [(0, e) for e in await client._point_writes.submit(key, write)]
            else:
                req = MutateRowsRequest(
                    rec.table_id, rec.tablet_id, tuple(entries[i] for i in idx), client.identity
                )
                resp = await client._worker(rec.location).mutate_rows(req)
                errors = [(e.index, e.exception()) for e in resp.errors]
        except Indeterminate as exc:
            # Sent, no answer: the owner may be dead or moved (forget where this tablet was);
            # any entry may have been applied.
            client.locations.invalidate(rec.table_id, rec.start_row)
            batch.maybe_applied(idx, exc)
            return
        except TabletStoreError as exc:
            if _refused_call(exc):
                batch.refused(idx, exc)  # refused or never sent: none was applied
            else:
                # Refused as a whole for another reason (a malformed request): none applied.
                batch.fail(idx, exc)
            return
        for index, error in errors:
            i = idx[index]
            if _refused(type(error)):
                batch.refused([i], error)
            elif isinstance(error, Indeterminate):
                batch.maybe_applied([i], error)
            else:
                batch.fail([i], error)

    async def check_and_mutate_row(
        self,
        row: bytes,
        predicate: RowFilter | None,
        *,
        true_mutations: Sequence[Mutation] = (),
        false_mutations: Sequence[Mutation] = (),
    ) -> bool:
        """Single-row transaction: apply ``true_mutations`` if the predicate matches any cell
        of the row, else ``false_mutations``. Returns whether it matched."""
        check_row_key(row)
        if not true_mutations and not false_mutations:
            raise InvalidArgument("check-and-mutate needs true or false mutations")
        resp = await self._client._with_retry(
            self.name,
            row,
            "check-and-mutate",
            lambda w, i, r: w.check_and_mutate(
                CheckAndMutateRequest(
                    i.table_id,
                    r.tablet_id,
                    row,
                    predicate,
                    tuple(true_mutations),
                    tuple(false_mutations),
                    self._client.identity,
                )
            ),
            safe=False,
        )
        return resp.matched

    async def read_modify_write_row(self, row: bytes, rules: Sequence[ReadModifyWriteRule]) -> Row:
        """Atomically append to / increment columns of one row; returns the new values."""
        check_row_key(row)
        return await self._client._with_retry(
            self.name,
            row,
            "read-modify-write",
            lambda w, i, r: w.read_modify_write(
                ReadModifyWriteRequest(
                    i.table_id, r.tablet_id, row, tuple(rules), self._client.identity
                )
            ),
            safe=False,
        )

    # ------------------------------------------------------------------ reads

    async def read_row(
        self, row: bytes, *, filter: RowFilter | None = None, families: Iterable[str] | None = None
    ) -> Row | None:
        """One row, or None if it has no (matching) cells. One unary request to the worker
        serving the row (no stream), retried transparently when the tablet moved."""
        check_row_key(row)
        fams = tuple(families) if families is not None else None
        client = self._client
        if fams is not None:
            info = await client._info(self.name)
            for f in fams:
                if f not in info.schema.families:
                    raise InvalidArgument(f"table {self.name!r} has no column family {f!r}")
        point_reads = client._point_reads
        if point_reads is not None and filter is None and fams is None:
            # A plain point read shares a request with others to this worker.
            got = await self._point_read(point_reads, row)
            if type(got) is not LargeRow:
                return cast(Row | None, got)
        reply = await self._read_one(row, filter, fams)
        if type(reply) is LargeRow:
            # Too large for one reply: read it again as a stream, which carries it in pieces
            # (one read of the row, so still atomic; the unary answer held none of it).
            async for whole in self.read_rows(keys=(row,), filter=filter, families=fams):
                return whole
            return None
        assert isinstance(reply, RowBatch)
        return reply.rows[0] if reply.rows else None

    async def _read_one(
        self, row: bytes, filter: RowFilter | None, fams: tuple[str, ...] | None
    ) -> RowBatch | LargeRow:
        """One ``read_row`` request for ``row``. With the table and the row's tablet in the
        caches (nearly always), the first try goes straight to the worker, without the retry
        loop's lookups (an embedded cold point read: ~3 us of coroutines, issue 18); a
        refusal or a request without answer (safe: a read) goes through ``_with_retry``,
        as :meth:`_point_read`'s."""
        client = self._client

        def send(w: TabletService, table_id: str, tablet_id: str) -> Awaitable[RowBatch | LargeRow]:
            return w.read_row(
                ReadRowsRequest(
                    table_id,
                    tablet_id,
                    keys=(row,),
                    filter=filter,
                    families=fams,
                    identity=client.identity,
                )
            )

        info = client._tables.get(self.name)
        rec = None if info is None else client.locations.cached(info.table_id, row)
        if info is not None and rec is not None and rec.location is not None:
            try:
                return await send(client._worker(rec.location), info.table_id, rec.tablet_id)
            except Indeterminate:
                client.locations.invalidate(info.table_id, row)  # as _with_retry does
            except (Unavailable, Fenced):
                pass
        return await client._with_retry(
            self.name, row, "read", lambda w, i, r: send(w, i.table_id, r.tablet_id), safe=True
        )

    async def _point_read(
        self, point_reads: Coalescer[_WorkerKey, _PointRead, Row | LargeRow | None], row: bytes
    ) -> Row | LargeRow | None:
        """A coalesced point read (``AsyncClient._read_group``). With the table and the row's
        tablet in the caches (nearly always), it is submitted at once, without the retry
        loop's lookups; a refusal or a request without answer (safe: a read) goes through
        ``_with_retry``, which looks the tablet up again as usual."""
        client = self._client
        info = client._tables.get(self.name)
        rec = None if info is None else client.locations.cached(info.table_id, row)
        if info is not None and rec is not None and rec.location is not None:
            try:
                return await point_reads.submit(
                    (rec.location, client.identity), (info.table_id, rec.tablet_id, row)
                )
            except Indeterminate:
                client.locations.invalidate(info.table_id, row)  # as _with_retry does
            except (Unavailable, Fenced):
                pass
        return await client._with_retry(
            self.name,
            row,
            "read",
            lambda w, i, r: point_reads.submit(
                (cast(str, r.location), client.identity), (i.table_id, r.tablet_id, row)
            ),
            safe=True,
        )

    async def read_rows(
        self,
        *,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        keys: Iterable[bytes] | None = None,
        row_set: RowSet | None = None,
        filter: RowFilter | None = None,
        limit: int | None = None,
        families: Iterable[str] | None = None,
        reverse: bool = False,
    ) -> AsyncIterator[Row]:
        """Rows in key order, streamed tablet by tablet; in descending key order when
        ``reverse`` (the last tablet first; ``limit`` then takes the highest keys).

        Choose rows by ``start``/``end`` (end exclusive), ``prefix``, explicit ``keys``, or a
        ``row_set``; no selection means the whole table. ``limit`` bounds the number of rows.
        """
        rs = _row_set(start, end, prefix, keys, row_set)
        async for batch in self._read(rs, filter, limit, families, reverse, stats=False):
            for row in cast(Sequence[Row], batch):
                yield row

    async def read_rows_with_stats(
        self,
        *,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        keys: Iterable[bytes] | None = None,
        row_set: RowSet | None = None,
        filter: RowFilter | None = None,
        limit: int | None = None,
        families: Iterable[str] | None = None,
        reverse: bool = False,
    ) -> AsyncIterator[Row | ScanProgress]:
        """:meth:`read_rows`, with :class:`ScanProgress` items among the rows: the rows and
        cells seen so far (before the filter, over the whole read) and, for forward scans, the
        last row key scanned -- after every long run of rows the filter removed and once per
        tablet. The last item is always a ScanProgress with the read's totals."""
        rs = _row_set(start, end, prefix, keys, row_set)
        async for item in self._read(rs, filter, limit, families, reverse, stats=True):
            if type(item) is ScanProgress:
                yield item
            else:
                for row in cast(Sequence[Row], item):
                    yield row

    async def _read(
        self,
        rs: RowSet,
        filter: RowFilter | None,
        limit: int | None,
        families: Iterable[str] | None,
        reverse: bool,
        *,
        stats: bool,
    ) -> AsyncIterator[Sequence[Row] | ScanProgress]:
        """The rows in non-empty batches (one generator step per stream item, not per row:
        issue 18), and with ``stats`` ScanProgress items; resumes after the last row handed
        out when a tablet splits or moves."""
        if limit is not None and limit < 0:
            raise InvalidArgument(f"row limit must be >= 0, not {limit}")
        fams = tuple(families) if families is not None else None
        info = await self._client._info(self.name)
        if fams is not None:
            for f in fams:
                if f not in info.schema.families:
                    raise InvalidArgument(f"table {self.name!r} has no column family {f!r}")
        remaining = limit
        resume_after: bytes | None = None
        totals = _Totals() if stats else None
        loop = asyncio.get_running_loop()
        # A scan that keeps delivering rows may meet many splits and moves: the deadline
        # bounds the time without progress, not the scan.
        deadline = loop.time() + self._client.retry_deadline
        attempt = 0
        refresh = False
        while remaining is None or remaining > 0:
            try:
                items = self._read_from(
                    info, rs, resume_after, filter, remaining, fams, reverse, totals, refresh
                )
                async for item in items:
                    if type(item) is not ScanProgress and remaining is not None:
                        item = cast(Sequence[Row], item)[:remaining]
                        if not item:
                            continue
                    yield item
                    attempt = 0
                    deadline = loop.time() + self._client.retry_deadline
                    if type(item) is ScanProgress:
                        # Rows up to the last one scanned need not be read again.
                        scanned = item.last_scanned
                        if scanned and (resume_after is None or scanned > resume_after):
                            resume_after = scanned
                        continue
                    batch = cast(Sequence[Row], item)
                    resume_after = batch[-1].key
                    if remaining is not None:
                        remaining -= len(batch)
                        # With stats, the stream ends by itself (its limit is what was left)
                        # after one last ScanProgress: read it for the totals.
                        if remaining <= 0 and totals is None:
                            break
                break
            except (Unavailable, Indeterminate):
                # The tablet split or moved, or its worker stopped answering: a read is safe
                # to send again, so resume after the last row delivered.
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(min(0.5, 0.01 * 2**attempt))
                attempt += 1
                info = await self._client._info(self.name, refresh=True)
                # Read the table's locations again, but keep the cached ones should METADATA
                # not answer (LocationCache.tablets): dropping them all would stall every
                # request to the table's healthy tablets until METADATA is served (issue 11).
                refresh = True
        if totals is not None:
            yield ScanProgress(b"", totals.rows, totals.cells)

    async def _read_from(
        self,
        info: TableInfo,
        rs: RowSet,
        resume_after: bytes | None,
        filter: RowFilter | None,
        limit: int | None,
        families: tuple[str, ...] | None,
        reverse: bool,
        totals: _Totals | None,
        refresh: bool = False,
    ) -> AsyncIterator[Sequence[Row] | ScanProgress]:
        if resume_after is not None:
            rs = _before(rs, resume_after) if reverse else _after(rs, resume_after)
        client = self._client
        tablets = await client.locations.tablets(info.table_id, refresh=refresh)
        sent = 0
        for rec in reversed(tablets) if reverse else tablets:
            if limit is not None and sent >= limit:
                return
            part = rs.clip(rec.start_row, rec.end_row)
            if part.is_empty():
                continue
            if rec.location is None:
                raise NotServing(f"tablet {rec.tablet_id} has no location yet")
            req = ReadRowsRequest(
                info.table_id,
                rec.tablet_id,
                keys=tuple(part.keys),
                ranges=tuple(part.ranges),
                filter=filter,
                limit=None if limit is None else limit - sent,
                families=families,
                identity=client.identity,
                reverse=reverse,
                stats=totals is not None,
            )
            # Whole rows come in batches; a large row in pieces, handed out once complete.
            assembler = RowAssembler(rec.location)
            seen = ScanProgress(b"", 0, 0)  # this stream's counts so far
            async for item in client._worker(rec.location).read_rows(req):
                if type(item) is ScanProgress:
                    if totals is not None:
                        totals.rows += item.rows_seen - seen.rows_seen
                        totals.cells += item.cells_seen - seen.cells_seen
                        seen = item
                        scanned = b"" if reverse else item.last_scanned
                        yield ScanProgress(scanned, totals.rows, totals.cells)
                    continue
                rows = assembler.rows(item)
                if rows:
                    sent += len(rows)
                    yield rows
            assembler.finish()

    async def snapshot(self, *, ttl: float | None = None) -> SnapshotManifest:
        """:meth:`AsyncClient.snapshot` of this table."""
        return await self._client.snapshot(self.name, ttl=ttl)

    async def bulk_load(self, url: str, *, load_id: str | None = None) -> tuple[int, int]:
        """:meth:`AsyncClient.bulk_load` into this table."""
        return await self._client.bulk_load(self.name, url, load_id=load_id)

    async def sample_row_keys(self) -> list[tuple[bytes, int]]:
        """(row key, approximate bytes up to it) pairs that split the table evenly-ish.
        Asked again from the start, within the retry deadline, when a tablet split or moved
        meanwhile."""
        client = self._client
        loop = asyncio.get_running_loop()
        deadline = loop.time() + client.retry_deadline
        for attempt in itertools.count():
            try:
                return await self._sample_row_keys()
            except (Unavailable, Indeterminate):
                if loop.time() >= deadline:
                    raise
            await asyncio.sleep(min(0.5, 0.01 * 2**attempt))
        raise AssertionError("unreachable")

    async def _sample_row_keys(self) -> list[tuple[bytes, int]]:
        client = self._client
        info = await client._info(self.name)
        out: list[tuple[bytes, int]] = []
        base = 0
        for rec in await client.locations.tablets(info.table_id, refresh=True):
            if rec.location is None:
                raise NotServing(f"tablet {rec.tablet_id} has no location yet")
            resp = await client._worker(rec.location).sample_row_keys(
                SampleRowKeysRequest(info.table_id, rec.tablet_id)
            )
            for key, off in zip(resp.keys, resp.offsets, strict=True):
                out.append((key, base + off))
            base += resp.offsets[-1] if resp.offsets else 0
        return out


def _by_size(entries: Sequence[RowMutation], indexes: list[int]) -> list[list[int]]:
    """``indexes`` cut into requests of at most ``_REQUEST_BYTES`` of row mutations each (a
    larger entry alone), so a batch of any size fits the frames that carry it."""
    parts: list[list[int]] = [[]]
    size = 0
    for i in indexes:
        entry = entries[i]
        n = mutation_bytes(entry.row, entry.mutations)
        if parts[-1] and size + n > _REQUEST_BYTES:
            parts.append([])
            size = 0
        parts[-1].append(i)
        size += n
    return parts


def _row_set(
    start: bytes | None,
    end: bytes | None,
    prefix: bytes | None,
    keys: Iterable[bytes] | None,
    row_set: RowSet | None,
) -> RowSet:
    chosen = sum(x is not None for x in (prefix, keys, row_set)) + (
        1 if start is not None or end is not None else 0
    )
    if chosen > 1:
        raise InvalidArgument("choose rows by one of start/end, prefix, keys or row_set")
    if row_set is not None:
        return row_set
    if keys is not None:
        ks = list(keys)
        for k in ks:
            check_row_key(k)
        return RowSet(keys=ks)
    if prefix is not None:
        return RowSet(ranges=[RowRange.prefix(prefix)])
    return RowSet(ranges=[RowRange(start, end)])


def _after(rs: RowSet, key: bytes) -> RowSet:
    """The part of ``rs`` strictly after ``key`` (to resume a scan after a retry)."""
    tail = RowRange(key, None, start_inclusive=False)
    return RowSet(
        [k for k in rs.keys if k > key],
        [c for r in rs.ranges if (c := r.intersect(tail)) is not None],
    )


class _Totals:
    """Rows and cells a read has seen over all its streams (``read_rows_with_stats``)."""

    __slots__ = ("cells", "rows")

    def __init__(self) -> None:
        self.rows = 0
        self.cells = 0


def _before(rs: RowSet, key: bytes) -> RowSet:
    """The part of ``rs`` strictly before ``key`` (to resume a reversed scan)."""
    head = RowRange(None, key)
    return RowSet(
        [k for k in rs.keys if k < key],
        [c for r in rs.ranges if (c := r.intersect(head)) is not None],
    )


def _schema_error(exc: ValueError) -> str:
    """pydantic's multi-line report as one line naming what is wrong."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        parts = [str(e.get("msg", "")).removeprefix("Value error, ") for e in errors()]
        return "; ".join(p for p in parts if p) or str(exc)
    return str(exc)
