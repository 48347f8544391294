"""The embedded default: master, one worker and the client in one process
(docs/architecture/design.md §8).

``tabletstore.connect("file:///path")`` opens a database in a local directory with no
servers: the directory holds the object store (``objects/``: SSTables and commit-log
segments, exactly as they would sit in a bucket) and the durable in-process coordinator's
journal (schemas, tablet records). The client reaches the worker through the in-process
transport, so requests take the same client → tablet-server path as in the cluster.

Opening a directory is a recovery (§5.3): the new worker incarnation claims every tablet —
the root tablet, then the METADATA tablets, then the user tablets, as a cluster's master
assigns them — fences the previous incarnation's commit log and replays what was not yet in
SSTables, so every acknowledged write is there even after ``kill -9``. The master sorts that
log first (§6; ``master.log_recovery`` with an in-process executor), so each tablet reads only
its own part of it instead of the whole log. The tablet records are
METADATA rows served by the in-process worker, exactly as in a cluster; the root tablet's
record is in the coordinator's journal. ``memory://name`` opens the same stack on in-memory
storage (shared by name within a process; gone with it); with ``store_url`` its objects are
kept in that object store instead (an S3 bucket: benchmarks and tests of what S3 does
differently), its coordination state still in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import unquote

from tabletstore.client.client import AsyncClient
from tabletstore.client.cluster import ClusterClient
from tabletstore.client.sync import Portal, SyncClient, blocking
from tabletstore.clock import Clock, SystemClock
from tabletstore.coordination.base import Coordinator
from tabletstore.coordination.local import LocalCoordinator
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.master.gc import GcReport, collect
from tabletstore.master.gc_plan import DEFAULT_FENCE_GRACE, DEFAULT_GRACE
from tabletstore.master.log_recovery import InProcessSortExecutor, LogRecovery
from tabletstore.master.master import Master
from tabletstore.master.pitr_restore import RestoreReport, restore_as_of
from tabletstore.master.verify import verify, verify_backup
from tabletstore.master.verify_plan import VerifyReport
from tabletstore.metadata.snapshot import SnapshotManifest
from tabletstore.metadata.store_location import OBJECTS_DIR, embedded_store_url
from tabletstore.ops.metrics import WorkerMetrics
from tabletstore.options import IN_PROCESS_LEASE, MasterOptions, TabletOptions, WorkerOptions
from tabletstore.rpc.inprocess import InProcessTransport
from tabletstore.rpc.services import TABLET
from tabletstore.security import TlsConfig
from tabletstore.storage_s3 import layout, open_store
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.worker.tablet_server import TabletServer, check_options

log = logging.getLogger(__name__)

#: Seconds between two looks for tables with history whose checkpoint is due.
CHECKPOINT_POLL = 30.0
#: Seconds between two assignment rounds (a cluster's master: ``MasterOptions.interval``).
ASSIGN_INTERVAL = 1.0

__all__ = ["DEFAULT_DIRECTORY", "Database", "SyncDatabase", "connect", "connect_async"]

#: Where ``tabletstore`` keeps data when no URL is given.
DEFAULT_DIRECTORY = "./tabletstore-data"
_WORKER_ID = "embedded"
_ADDRESS = "inproc://embedded"


def _parse(url: str | None) -> tuple[str, str]:
    """(kind, location): ("file", absolute directory) or ("memory", name)."""
    if url is None:
        return "file", str(Path(DEFAULT_DIRECTORY).resolve())
    if url.startswith("memory://"):
        return "memory", url[len("memory://") :] or "default"
    if url.startswith("file://"):
        # file:///abs/dir, or file://./rel/dir and file://rel/dir relative to the cwd.
        path = unquote(url[len("file://") :])
        if not path:
            raise InvalidArgument(f"file URL {url!r} has no path (expected file:///dir)")
        return "file", str(Path(path).resolve())
    if "://" not in url:
        return "file", str(Path(url).resolve())
    raise InvalidArgument(
        f"unsupported database URL {url!r}: expected file:///dir, memory://name or a "
        "directory path, or a cluster's etcd://host:port/namespace"
    )


class Database(AsyncClient):
    """An embedded database: an :class:`AsyncClient` that also owns its master and worker."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        coordinator: Coordinator,
        transport: InProcessTransport,
        master: Master,
        worker: TabletServer,
        url: str,
        identity: str | None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        super().__init__(
            catalog=master.catalog, transport=transport, admin=master, identity=identity
        )
        self.url = url
        self.store = store
        self.coordinator = coordinator
        self.master = master
        self.worker = worker
        #: The embedded worker's Prometheus metrics (tabletstore.ops.metrics); see metrics_text().
        #: (Without ``metrics`` only the collectors are there: requests are not counted.)
        if metrics is None:
            metrics = WorkerMetrics(worker.worker_id)
            metrics.observe_server(worker)
        self.metrics = metrics
        self._closed = False
        #: Checkpoints the tables with history while the database is open (a cluster's
        #: master does this in its loop).
        self._checkpoints = asyncio.create_task(self._checkpoint_loop())
        #: Keeps every tablet served while the database is open, as a cluster's leading master
        #: does (``master_process``): a tablet the worker dropped is loaded again.
        self._assigning = asyncio.create_task(self._assignment_loop())

    async def _checkpoint_loop(self) -> None:
        while True:
            try:
                await self.master.checkpointer.run_round()
            except TabletStoreError as exc:
                log.warning("checkpoint round failed: %s", exc)
            await self.master.clock.sleep(CHECKPOINT_POLL)

    async def _assignment_loop(self) -> None:
        """An assignment round every ``ASSIGN_INTERVAL`` seconds (one that finds nothing
        changed since a round that found every tablet served costs O(1): ``Master.assign``).
        The worker drops a tablet that must be reloaded (a write whose record may or may not
        be in its failed commit log, a failed background compaction) or that could not take
        its new log; opening the database is the only round there would be otherwise, and
        such a tablet stayed unserved until the database was opened again."""
        while True:
            await self.master.clock.sleep(ASSIGN_INTERVAL)
            try:
                await self.master.assign(if_changed=True)
            except TabletStoreError as exc:
                log.warning("assignment round failed: %s", exc)

    @classmethod
    async def open(
        cls,
        url: str | None = None,
        *,
        identity: str | None = None,
        clock: Clock | None = None,
        tablet_options: TabletOptions | None = None,
        worker_options: WorkerOptions | None = None,
        instrument: bool = False,
        store_url: str | None = None,
    ) -> Database:
        """Open (and recover) the database at ``url``; see the module docstring.

        ``instrument`` counts object-store requests and bytes (S3 cost): reach the counters with
        ``find_layer(db.store, InstrumentedObjectStore).stats()``; they are then in
        :meth:`metrics_text` too. ``store_url``: a ``memory://`` database's objects in that
        object store (module docstring).
        """
        kind, where = _parse(url)
        wopts = worker_options or WorkerOptions(lease=IN_PROCESS_LEASE)
        check_options(wopts, tablet_options or TabletOptions())  # before anything is opened
        if store_url is not None and kind != "memory":
            raise InvalidArgument(
                f"store_url is for memory:// databases; {url!r} keeps its objects in its directory"
            )
        metrics = WorkerMetrics(_WORKER_ID)
        registry = metrics.registry if instrument else None
        explicit_clock = clock
        clock = clock or SystemClock()
        coordinator: Coordinator
        if kind == "file":
            os.makedirs(os.path.join(where, OBJECTS_DIR), exist_ok=True)
            coordinator = LocalCoordinator(where, clock=clock, leases_bound_to_process=True)
            store = open_store(embedded_store_url(where), instrument=instrument, registry=registry)
            canonical = f"file://{where}"
        else:
            # A named in-memory database outlives its handles: reopening it must not
            # insist on a new clock (its state keeps the one it was created with).
            coordinator = MemoryCoordinator.open(
                where, clock=explicit_clock, leases_bound_to_process=True
            )
            store = open_store(
                store_url or f"memory://{where}", instrument=instrument, registry=registry
            )
            canonical = f"memory://{where}"
        transport = InProcessTransport()
        worker = TabletServer(
            _WORKER_ID,
            _ADDRESS,
            store=store,
            coordinator=coordinator,
            transport=transport,
            clock=clock,
            options=wopts,
            tablet_options=tablet_options,
        )
        metrics.observe_server(worker)
        handlers = metrics.instrument(TABLET.handlers(worker.services))
        try:
            await worker.start()
            transport.register(_ADDRESS, handlers)
            mopts = MasterOptions()
            recovery = LogRecovery(
                store,
                InProcessSortExecutor(store),
                coordinator,
                task_bytes=mopts.sort_task_bytes,
                attempts=mopts.sort_attempts,
                owner_bytes=mopts.sort_owner_bytes,
            )
            master = Master(
                coordinator=coordinator,
                transport=transport,
                clock=clock,
                options=mopts,
                recovery=recovery,
                store=store,
            )
            await master.assign()
        except BaseException:
            await coordinator.close()
            await store.close()
            raise
        return cls(
            store=store,
            coordinator=coordinator,
            transport=transport,
            master=master,
            worker=worker,
            url=canonical,
            identity=identity,
            metrics=metrics,
        )

    async def metrics_text(self) -> str:
        """This process's metrics in Prometheus' text format (requests by method, tablets,
        memtable bytes, block cache, compactions, commit log; object-store requests when
        opened with ``instrument``). Async so that the collectors read the engine's state on
        its event loop (the sync API runs it there too)."""
        return self.metrics.exposition().decode()

    async def staging_url(self, load_name: str) -> str:
        """Where a job writes the files of load ``load_name``: ``staging/anonymous/<name>/``
        of the database's own store (``objects/`` of its directory). An in-memory store has
        no prefixes in its URL: a job writes to ``db.store`` under that key prefix
        (``layout.staging_prefix``) instead."""
        return layout.staging_url(self.store.url, self._staging_principal(), load_name)

    async def store_url(self) -> str:
        """The URL of the database's own store."""
        return self.store.url

    @contextlib.asynccontextmanager
    async def _database_store(self) -> AsyncIterator[ObjectStore]:
        """The database's own store (left open: the database owns it)."""
        yield self.store

    async def close(self) -> None:
        """Minor-compact every tablet (fast next open), stop the worker, release files."""
        if self._closed:
            return
        self._closed = True
        for task in (self._checkpoints, self._assigning):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            await self.master.close()
            await self.worker.stop(flush=True)
        finally:
            await self._transport.close()
            await self.coordinator.close()
            await self.store.close()

    async def gc(
        self,
        *,
        grace: float = DEFAULT_GRACE,
        fence_grace: float = DEFAULT_FENCE_GRACE,
        dry_run: bool = False,
    ) -> GcReport:
        """Delete the objects nothing references any more (compacted-away SSTables, deleted
        tables' objects, commit logs no tablet needs), each only once older than ``grace``
        seconds (fences: ``fence_grace``); see :mod:`tabletstore.master.gc_plan` for the rules. With
        ``dry_run``, only report. A scan running meanwhile may still read an SSTable that a
        compaction replaced: give it ``grace`` seconds after that SSTable was written."""
        return await collect(
            self.store,
            self.master.catalog,
            self.coordinator,
            clock=self.master.clock,
            grace=grace,
            fence_grace=fence_grace,
            dry_run=dry_run,
        )

    async def verify(self, table: str | None = None, *, deep: bool = False) -> VerifyReport:
        """Check that the database (or ``table``) is whole: every object its records and
        snapshots reference exists with its recorded size, tablets tile each table, each log
        a tablet needs runs without a gap; objects nothing references are listed as orphans
        (:mod:`tabletstore.master.verify_plan`). ``deep`` reads every needed log segment whole."""
        return await verify(
            self.store,
            self.master.catalog,
            self.coordinator,
            clock=self.master.clock,
            table=table,
            deep=deep,
        )

    async def verify_backup(self, backup_id: str, *, location: str | None = None) -> VerifyReport:
        """Check backup ``backup_id`` (in the database's bucket, or in the backup location
        ``location``): it is ready and unexpired, every SSTable its manifest names exists with its recorded size, and
        with its recorded checksum where it records one (a copied backup's). NotFound if
        there is no such backup (master/verify.py ``verify_backup``)."""
        now = self.master.clock.time()
        if location is None:
            return await verify_backup(self.store, backup_id, now=now)
        store = open_store(location)
        try:
            return await verify_backup(store, backup_id, now=now)
        finally:
            await store.close()

    async def checkpoint(self) -> list[SnapshotManifest]:
        """Checkpoint every table with history now (the database also does, every interval
        of each table's window, while it is open; a cluster's master does it in its loop)."""
        return await self.master.checkpointer.run_round(force=True)

    async def restore_as_of(
        self, table: str, instant: float, new_table: str, *, zero_copy: bool = False
    ) -> RestoreReport:
        """Rebuild ``table`` as it was at ``instant`` (seconds since the epoch, within its
        history window) into the new table ``new_table`` (master/pitr_restore.py);
        ``zero_copy``: :meth:`clone_as_of`."""
        return await restore_as_of(
            self.store,
            self.master.catalog,
            table=table,
            instant=instant,
            new_table=new_table,
            clock=self.master.clock,
            assign=self.master.assign,
            zero_copy=zero_copy,
        )

    async def clone_as_of(self, table: str, instant: float, new_table: str) -> RestoreReport:
        """A writable zero-copy clone of ``table`` as it was at ``instant`` (within its history
        window), named ``new_table``: it names the checkpoint's SSTables and writes only the
        replayed log tail (master/pitr_restore.py)."""
        return await self.restore_as_of(table, instant, new_table, zero_copy=True)

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SyncDatabase(SyncClient):
    """The blocking face of a :class:`Database` or a cluster client; same method names."""

    # An embedded database's own methods (a cluster client has neither: AttributeError).
    gc = blocking(Database.gc)
    verify = blocking(Database.verify)
    verify_backup = blocking(Database.verify_backup)
    checkpoint = blocking(Database.checkpoint)
    restore_as_of = blocking(Database.restore_as_of)
    clone_as_of = blocking(Database.clone_as_of)
    metrics_text = blocking(Database.metrics_text)

    def close(self) -> None:
        """Close the database, then stop the portal's event loop."""
        portal: Portal = self._portal
        try:
            portal.call(self._target.close())
        finally:
            portal.close()


def connect(
    url: str | None = None,
    *,
    identity: str | None = None,
    tls: TlsConfig | None = None,
    token: str | None = None,
) -> SyncDatabase:
    """Open a database with the synchronous API: embedded (see :class:`Database`) for
    ``file://`` / ``memory://`` / a directory, a cluster client for ``etcd://``.

    The embedded database is open: one process, one user; ``identity`` is only what ACL checks
    compare against. A cluster with auth on takes the caller's identity from ``tls`` (its
    client certificate) or ``token`` instead (docs/operations/security.md)."""
    portal = Portal()
    try:
        db = portal.call(connect_async(url, identity=identity, tls=tls, token=token))
    except BaseException:
        portal.close()
        raise
    return SyncDatabase(db, portal)


async def connect_async(
    url: str | None = None,
    *,
    identity: str | None = None,
    tls: TlsConfig | None = None,
    token: str | None = None,
) -> AsyncClient:
    """Open a database with the asyncio API (embedded, or a cluster for ``etcd://`` URLs)."""
    if url is not None and url.startswith("etcd://"):
        return await ClusterClient.open(url, identity=identity, tls=tls, token=token)
    if tls is not None or token is not None:
        raise InvalidArgument("tls and token are for a cluster (etcd://); embedded is open")
    return await Database.open(url, identity=identity)
