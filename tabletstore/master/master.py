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
holds back neither the others nor the next rounds. A load that fails or times out leaves the
tablet unclaimed, and the next round assigns it again, to whichever worker the planner picks. On first start it creates
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
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tabletstore.client.location import LocationCache
from tabletstore.clock import Clock, SystemClock
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.data.schema import TableSchema
from tabletstore.errors import (
    Indeterminate,
    InvalidArgument,
    NotFound,
    NotServing,
    TabletStoreError,
    Unavailable,
)
from tabletstore.master import assignment
from tabletstore.master.balancer import Balancer
from tabletstore.metadata import rows as mt
from tabletstore.metadata.catalog import Catalog, TableInfo
from tabletstore.metadata.record import TabletRecord
from tabletstore.options import MasterOptions
from tabletstore.rpc.messages import (
    CompactTableRequest,
    CompactTabletRequest,
    CreateTableRequest,
    ListTablesRequest,
    ListTablesResponse,
    LoadTabletRequest,
    ModifyFamiliesRequest,
    TableInfoMessage,
    TableNameRequest,
    UnloadTabletRequest,
    UpdateSchemaRequest,
)
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Transport

__all__ = ["Master"]

log = logging.getLogger(__name__)


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


class Master:
    """Table administration (``rpc.services.MasterService``) and assignment over a catalog and
    a transport to workers."""

    def __init__(
        self,
        *,
        coordinator: Coordinator,
        transport: Transport,
        clock: Clock | None = None,
        metadata_splits: Sequence[bytes] = (),
        options: MasterOptions | None = None,
    ) -> None:
        """``metadata_splits``: METADATA row keys at which METADATA is pre-split when this
        master creates it (none: one METADATA tablet after the root). ``options``: how
        :attr:`balancer` moves and merges tablets."""
        self._coord = coordinator
        # A short deadline: a METADATA tablet that is not served ends an assignment round
        # (the next one goes on) instead of stalling it.
        self.locations = LocationCache(coordinator, transport)
        self._catalog = Catalog(coordinator, metadata=self.locations, retry_deadline=5.0)
        self._transport = transport
        self._clock = clock or SystemClock()
        self._metadata_splits = tuple(metadata_splits)
        mt.initial_metadata_records(self._metadata_splits, 0.0)  # InvalidArgument early
        self._options = options or MasterOptions()
        _check_load_options(self._options)
        #: Whether this master answers admin requests. Only the elected master does: a standby
        #: (or a deposed master) answers ``NotServing`` so clients look the master up again.
        #: True for the embedded database's only master; the master process sets it.
        self.leading = True
        #: Loads sent, by tablet (table id, tablet id); finished ones are dropped at the start
        #: of the next round, after which the claims read then show their outcome.
        self._loads: dict[tuple[str, str], _Load] = {}
        #: Bounds the loads in flight to each worker (by worker id).
        self._load_slots: dict[str, asyncio.Semaphore] = {}
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

    async def assign(self) -> int:
        """Load every unclaimed tablet on a live worker, level by level (§5.2): the root tablet
        (its record is in the coordinator), then the METADATA tablets (rows of the root), then
        user tablets (rows of METADATA). A level that is not served yet ends the round early;
        the next round goes on from there. Returns how many tablets were assigned."""
        workers = await self.live_workers()
        # A load to a worker that left the servers directory will never serve: give it up now
        # (the worker, if it is only paused, is told to cancel it) so the tablet is reassigned.
        self._reap_loads(set(workers))
        if not workers:
            return 0
        # Locations at workers no longer in the servers directory are stale: forget them rather
        # than wait for a paused worker to time out.
        self.locations.retain(set(workers.values()))
        if await self._catalog.bootstrap_root(self._clock.time()):
            log.info("created the METADATA table")
        claims = await self._claims()
        known: dict[tuple[str, str], assignment.TabletLoad] = {}
        root = await self._catalog.get_tablet(mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID)
        done = await self._assign_level(workers, claims, known, [root])
        try:
            initial = mt.initial_metadata_records(self._metadata_splits, self._clock.time())
            await self._catalog.ensure_metadata_tablets(initial)
            metadata = await self._catalog.list_tablets(mt.METADATA_TABLE_ID)
            done += await self._assign_level(workers, claims, known, metadata)
            moved = await self._catalog.migrate_coordinator_records()
            if moved:
                log.info("moved %d tablet records from the coordinator into METADATA", moved)
            for info in await self._catalog.list_tables():
                tablets = await self._catalog.list_tablets(info.table_id)
                done += await self._assign_level(workers, claims, known, tablets)
        except (Unavailable, Indeterminate) as exc:
            # A METADATA tablet not served yet (NotServing) or not answering: the writes above
            # are idempotent, and the next round goes on from here.
            log.info("assignment round stopped early: %s", exc)
        return done

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
        sent: list[tuple[assignment.Assignment, asyncio.Task[bool]]] = []
        for a in assignment.plan(list(workers), list(known.values())):
            key = (a.table_id, a.tablet_id)
            if key not in wanted:
                continue
            task = self._start_load(a.worker, workers[a.worker], key)
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

    async def load_tablet(self, worker: str, address: str, key: tuple[str, str]) -> bool:
        """Load ``key`` on ``worker`` (balancing moves): True once it is served there; False
        if the load failed, or is still running after ``load_wait`` seconds (it then goes on
        in the background like a round's load)."""
        task = self._start_load(worker, address, key)
        await asyncio.wait([task], timeout=self._options.load_wait)
        return task.done() and not _failed(task)

    def _start_load(self, worker: str, address: str, key: tuple[str, str]) -> asyncio.Task[bool]:
        """Send ``load_tablet`` for ``key`` to ``worker`` in the background."""
        task = asyncio.get_running_loop().create_task(
            self._load(worker, address, key), name=f"load {key[1]} on {worker}"
        )
        self._loads[key] = _Load(worker, task)
        return task

    async def _load(self, worker: str, address: str, key: tuple[str, str]) -> bool:
        """One load, within the worker's bound of loads in flight and ``load_timeout``. False
        (logged) if it failed: the tablet stays unclaimed and the next round assigns it."""
        slots = self._load_slots.get(worker)
        if slots is None:
            slots = self._load_slots[worker] = asyncio.Semaphore(self._options.max_loads_per_worker)
        async with slots:
            # A replay may legitimately take minutes: the load's own bound, not the transport's.
            stub = self._worker(address, timeout=self._options.load_timeout)
            try:
                await stub.load_tablet(LoadTabletRequest(*key))
            except TabletStoreError as exc:  # Indeterminate after load_timeout: given up
                log.warning("assigning %s to %s failed: %s", key[1], worker, exc)
                return False
        return True

    def _reap_loads(self, live: set[str]) -> None:
        """Drop the finished loads (the claims, read next, show what they did) and cancel the
        ones in flight to workers not in ``live``."""
        for key, load in list(self._loads.items()):
            if load.task.done():
                if not load.task.cancelled() and (exc := load.task.exception()) is not None:
                    log.error("loading %s on %s raised %r", key[1], load.worker, exc)
                del self._loads[key]
            elif load.worker not in live:
                load.task.cancel()

    async def close(self) -> None:
        """Give up the loads in flight (a master that stops leading leaves them to the next)."""
        tasks = [load.task for load in self._loads.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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
            families[fam.name] = fam
        for fam_name in req.drop:
            if fam_name not in families:
                raise NotFound(f"table {name!r} has no column family {fam_name!r}")
            del families[fam_name]
        try:
            schema = TableSchema(name=name, families=families, locality_groups=groups)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc
        new = await self._catalog.update_schema(info, schema)
        workers = await self.live_workers()
        for address in set(workers.values()):
            await self._worker(address).update_schema(UpdateSchemaRequest(name))
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
        """``send`` to the worker holding each claimed tablet of the table, one at a time."""
        claims = await self._claims()
        workers = await self.live_workers()
        for rec in await self._catalog.list_tablets(info.table_id):
            holder = claims.get((rec.table_id, rec.tablet_id))
            address = workers.get(holder) if holder is not None else None
            if address is not None:
                await send(self._worker(address), rec)


def _check_load_options(options: MasterOptions) -> None:
    if options.max_loads_per_worker < 1:
        raise InvalidArgument(
            f"max_loads_per_worker must be at least 1, got {options.max_loads_per_worker}"
        )
    if options.load_wait < 0:
        raise InvalidArgument(f"load_wait must be >= 0 seconds, got {options.load_wait}")
    if options.load_timeout <= 0:
        raise InvalidArgument(f"load_timeout must be > 0 seconds, got {options.load_timeout}")
