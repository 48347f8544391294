"""The garbage collector's shell: list the bucket, mark from METADATA, sweep (§5.2, §5.4).

:func:`collect` gathers the inputs of the pure planner :func:`tabletstore.master.gc_plan.plan`, calls it
and deletes what it returns. The master runs a :class:`GarbageCollector` every ``gc_interval``
seconds (by default a sixth of the grace period: :func:`interval_for`) while it leads; the embedded database and ``tabletstore gc`` call :func:`collect` once.

Why the listing comes first and the mark second. Let ``t0`` be when the listing ends. Every
listed object was created before ``t0``; objects created later are not considered at all. The
mark then reads, in this order, the live workers with their current incarnations (at ``t1``)
and the tablet records (at ``t2 > t1``). An object that is referenced at ``t2`` is marked. An
object referenced later but not at ``t2`` is either

* an SSTable a compaction uploaded before ``t0`` and commits after ``t2``: younger than the
  grace period, because the grace period is larger than any upload-to-commit time; or
* a log that a record lists again: a record only ever adds the log of the worker loading the
  tablet, with that worker's current incarnation. That worker was live at ``t1`` (it wrote a
  listed object, so it registered before ``t0``, and a worker whose lease is gone cannot claim
  a tablet), so its log is marked live. Reading the records *before* the live workers would
  break this: a worker could load a tablet after the records were read and die before the
  servers directory was, and the head of the log recovery needs would be deleted.

Trimming a live worker's log (``gc_plan`` rule 3a) needs one more read: the live workers
again, after the records (``t3 > t2``). A log is trimmed below the least position the records
at ``t2`` give it only if its worker was live with that incarnation at ``t1`` and at ``t3``.
Recovery sorts a log only once its writer is gone, from records it reads after that, so after
``t3`` and after ``t2``: their positions are at or above the floor, and no sort task of that
log reads a segment below it. (A worker that died between ``t1`` and ``t2`` could otherwise be
planned from records older than ``t2``, which may list a lower position.)

Marking before listing would be wrong too: an SSTable uploaded and committed between the mark
and the listing would be listed, unmarked and (if the grace period were short) deleted.

Splits. A split's new tablets list their parent's SSTables and logs. In the coordinator the
swap is one transaction, seen whole by one prefix read; in METADATA the parent's row carries
the new records as a split intent until they are inserted, and ``list_tablets`` returns them.
A key that only a new tablet lists was written after the split began, so it is younger than the
grace period. A table with a schema but no records aborts the collection: records are created
before their schema and deleted after it, so the mark would be missing something.

Clock contract: ``grace`` compares the collector's clock with the store's ``last_modified``
(the S3 server's clock); their skew must be small next to ``grace``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tabletstore.clock import Clock
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.errors import (
    Corruption,
    InvalidArgument,
    NotFound,
    TabletStoreError,
    Unavailable,
    Unimplemented,
)
from tabletstore.master import gc_plan as gc
from tabletstore.master.checkpoints import log_retention
from tabletstore.master.gc_state import GcMemory
from tabletstore.metadata.backup import BackupManifest, read_backup
from tabletstore.metadata.catalog import Catalog, ClusterSettings, TableInfo
from tabletstore.metadata.record import LogRef
from tabletstore.storage_s3 import layout, open_store
from tabletstore.storage_s3.base import S3_BATCH, ObjectInfo, ObjectStore

__all__ = [
    "GarbageCollector",
    "GcReport",
    "collect",
    "interval_for",
    "list_objects",
    "mark",
]

log = logging.getLogger(__name__)


def interval_for(grace: float) -> float:
    """Seconds between two collections for a grace period of ``grace`` seconds (when
    ``MasterOptions.gc_interval`` is None): a sixth of it, from 10 s to 10 minutes. An object
    is deleted at most two intervals after it has been garbage for ``grace``; every
    collection lists the whole bucket, which on S3 is a LIST request per 1,000 objects (a
    bucket of 10 million objects listed every minute: 14 million requests a day)."""
    return min(600.0, max(10.0, grace / 6))


@dataclass(frozen=True, slots=True)
class GcReport:
    """What one collection found and did."""

    #: Objects listed and their bytes.
    listed: int
    listed_bytes: int
    #: Objects deleted (or, with ``dry_run``, that would have been) and their bytes.
    deleted: int
    deleted_bytes: int
    dry_run: bool
    #: Objects per reason (``gc.Reason`` values, kept and deleted).
    counts: Mapping[gc.Reason, int]
    #: Keys no layout parser recognizes (never deleted).
    unknown: tuple[str, ...]
    #: The keys deleted (or that would have been).
    deleted_keys: tuple[str, ...] = ()
    #: When each held object was first found deletable (the planner's ``since``).
    since: Mapping[str, float] = field(default_factory=dict)
    #: Bytes per reason (kept and deleted); the bytes kept for history windows are
    #: ``bytes[Reason.KEEP_HISTORY]``.
    bytes: Mapping[gc.Reason, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for logs and the CLI."""
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"listed {self.listed} objects ({self.listed_bytes} bytes), {verb} "
            f"{self.deleted} ({self.deleted_bytes} bytes), {len(self.unknown)} unrecognized"
        )


async def list_objects(store: ObjectStore) -> list[ObjectInfo]:
    """Every object in the store (the store's ``list`` paginates under the hood)."""
    return [info async for info in store.list("")]


async def mark(
    catalog: Catalog,
    coordinator: Coordinator,
    store: ObjectStore,
    listed: Sequence[ObjectInfo],
) -> gc.LiveSet:
    """Read the roots: live workers' incarnations, tablet records, snapshot and backup
    manifests.

    REQUIRES: called after ``listed`` was read (see the module docstring).
    """
    # Live workers first, records second: see the module docstring.
    live = await _live_incarnations(catalog, coordinator)
    infos = await _tables(catalog, coordinator)
    tables = set(infos)
    sstables: set[str] = set()
    logs: set[LogRef] = set()
    floors: dict[LogRef, int] = {}
    for table_id in sorted(tables):
        records = await catalog.list_tablets(table_id)
        if not records:
            # Every table has at least one tablet, and its records outlive its schema (created
            # first, deleted last): an empty answer means the mark cannot be trusted.
            raise Unavailable(
                f"table {table_id} has a schema but no tablet records; not collecting"
            )
        for record in records:
            sstables.update(ref.key for refs in record.sstables.values() for ref in refs)
            logs.update(record.logs)
            for ref in record.logs:
                floors[ref] = min(floors.get(ref, record.log_start(ref)), record.log_start(ref))
    # The live workers again, after the records: a log is trimmed only if its worker was live
    # with that incarnation at both reads (gc_plan rule 3a: no recovery of it can have read
    # the records before these).
    still = await _live_incarnations(catalog, coordinator)
    trimmable = {
        ref: floor
        for ref, floor in floors.items()
        if live.get(ref.worker_id) == ref.incarnation
        and still.get(ref.worker_id) == ref.incarnation
    }
    snapshots: dict[str, frozenset[str] | None] = {}
    expiry: dict[str, float] = {}
    load_parts: dict[str, frozenset[str] | None] = {}
    for obj in listed:
        if obj.key.startswith(layout.SNAPSHOTS):
            names, expires = await _snapshot_names(store, obj.key)
            snapshots[obj.key] = names
            if expires is not None:
                expiry[obj.key] = expires
        elif obj.key.startswith(layout.LOADS):
            # A bulk-load part names SSTables as a snapshot manifest does (gc_plan rule 9).
            load_parts[obj.key], _ = await _snapshot_names(store, obj.key)
    backups, backup_expiry = await _backup_names(store, listed)
    default = await catalog.history_default()
    return gc.LiveSet(
        backups=backups,
        backup_expiry=backup_expiry,
        history=max((log_retention(i.schema, default) for i in infos.values()), default=0.0),
        tables=frozenset(tables),
        sstables=frozenset(sstables),
        logs=frozenset(logs),
        live_workers=live,
        snapshots=snapshots,
        snapshot_expiry=expiry,
        load_parts=load_parts,
        log_floors=trimmable,
    )


async def _live_incarnations(catalog: Catalog, coordinator: Coordinator) -> dict[str, int | None]:
    """Live worker id -> its current incarnation (None: unknown)."""
    return {
        worker_id: await _current_incarnation(coordinator, worker_id)
        for worker_id in await catalog.live_workers()
    }


async def _tables(catalog: Catalog, coordinator: Coordinator) -> dict[str, TableInfo]:
    """Every table with a schema, by id: the catalog's user tables, and every schema key in
    the coordinator — which includes the METADATA system table that ``list_tables()`` leaves
    out (its tablets' SSTables and logs are roots like any other)."""
    out = {info.table_id: info for info in await catalog.list_tables()}
    for kv in await coordinator.get_prefix(paths.SCHEMAS):
        info = TableInfo.from_bytes(kv.value, kv.mod_revision)
        out.setdefault(info.table_id, info)
    return out


async def _current_incarnation(coordinator: Coordinator, worker_id: str) -> int | None:
    """The latest incarnation the worker took (``settings/incarnation.<worker>``, bumped by
    the worker before it writes its first segment); None if absent or unreadable."""
    kv = await coordinator.get(paths.setting(f"incarnation.{worker_id}"))
    if kv is None:
        return None
    try:
        return int(kv.value)
    except ValueError:
        log.warning("worker %s has an unreadable incarnation %r", worker_id, kv.value)
        return None


async def _snapshot_names(
    store: ObjectStore, key: str
) -> tuple[frozenset[str] | None, float | None]:
    """The SSTable keys a snapshot manifest names (every string anywhere in its JSON that is
    an SSTable key) and when its TTL passes (its ``expires_at``; None: never). None names
    when the manifest is not JSON (the planner then keeps every SSTable of its table); empty
    when the manifest vanished meanwhile (it pins nothing any more)."""
    data = await store.get(key)
    if data is None:
        return frozenset(), None
    try:
        doc = json.loads(data)
    except ValueError:
        log.warning("snapshot manifest %s is not JSON; keeping all of its table's SSTables", key)
        return None, None
    expires = doc.get("expires_at") if isinstance(doc, dict) else None
    if not isinstance(expires, (int, float)) or isinstance(expires, bool):
        expires = None
    return frozenset(s for s in _strings(doc) if _is_sstable_key(s)), expires


async def _backup_names(
    store: ObjectStore, listed: Sequence[ObjectInfo]
) -> tuple[dict[str, frozenset[str] | None], dict[str, float]]:
    """Per listed backup manifest version, the SSTable keys it names (None when it cannot be
    read: the planner then keeps every SSTable), and per version its backup's expiry (the
    newest version's ``expires_at``; absent: never). A version replaced meanwhile (an
    update publishes the next version, unlisted here, and deletes this one) is read as the
    backup's newest version: it pins what that names."""
    names: dict[str, frozenset[str] | None] = {}
    versions: dict[str, list[str]] = {}
    expires: dict[str, float] = {}
    for obj in listed:
        try:
            backup_id = layout.parse_backup_key(obj.key).backup_id
        except InvalidArgument:
            continue  # not a backup manifest (the planner keeps an unknown key)
        versions.setdefault(backup_id, []).append(obj.key)
        try:
            manifest = await _backup_version(store, obj.key, backup_id)
        except NotFound:
            names[obj.key] = frozenset()  # the backup was deleted meanwhile
            continue
        except (Corruption, Unimplemented) as exc:
            log.warning("%s; keeping every SSTable while it exists", exc)
            names[obj.key] = None
            continue
        names[obj.key] = frozenset(manifest.sstable_keys())
        if manifest.expires_at is not None:
            expires[obj.key] = manifest.expires_at
    expiry: dict[str, float] = {}
    for keys in versions.values():
        newest = max(keys)
        if newest in expires:
            expiry.update(dict.fromkeys(keys, expires[newest]))
    return names, expiry


async def _backup_version(store: ObjectStore, key: str, backup_id: str) -> BackupManifest:
    """The manifest version ``key``, or the backup's newest if ``key`` is gone; NotFound if
    the backup has no version left."""
    data = await store.get(key)
    if data is None:
        return await read_backup(store, backup_id)
    return BackupManifest.from_bytes(data, name=key)


def _strings(doc: Any) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for value in doc.values():
            yield from _strings(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _strings(value)


def _is_sstable_key(s: str) -> bool:
    try:
        layout.parse_sstable_key(s)
    except InvalidArgument:
        return False
    return True


async def collect(
    store: ObjectStore,
    catalog: Catalog,
    coordinator: Coordinator,
    *,
    clock: Clock,
    grace: float = gc.DEFAULT_GRACE,
    fence_grace: float = gc.DEFAULT_FENCE_GRACE,
    dry_run: bool = False,
    since: Mapping[str, float] | None = None,
) -> GcReport:
    """One collection: list, mark, plan, delete (unless ``dry_run``).

    ``since`` turns on the dereference grace (see :mod:`tabletstore.master.gc_plan`); pass the returned
    report's ``since`` to the next call.
    """
    listed = await list_objects(store)
    live = await mark(catalog, coordinator, store, listed)
    # The plan is pure CPU, O(objects): seconds for a bucket of 100,000 objects on a loaded
    # host. On the event loop it would stall the master's lease keep-alives past the lease.
    decided = await asyncio.to_thread(
        gc.plan, live, listed, clock.time(), grace=grace, fence_grace=fence_grace, since=since
    )
    if not dry_run:
        for i in range(0, len(decided.delete), S3_BATCH):
            await store.delete_many(decided.delete[i : i + S3_BATCH])
    return GcReport(
        listed=len(listed),
        listed_bytes=sum(o.size for o in listed),
        deleted=len(decided.delete),
        deleted_bytes=decided.delete_bytes,
        dry_run=dry_run,
        counts=decided.counts,
        unknown=decided.unknown,
        deleted_keys=decided.delete,
        since=decided.since,
        bytes=decided.bytes,
    )


class GarbageCollector:
    """The master's periodic collector: runs :func:`collect` at most every ``interval``
    seconds and carries the dereference grace (``since``) from one run to the next, so an
    SSTable a long scan may still read is deleted only ``grace`` after it was found
    unreferenced. It saves that map in the bucket after every run and, until its first run
    succeeds, adopts the newest saved map (:mod:`tabletstore.master.gc_state`), so a new leader
    goes on from where the last one stopped. Failures are logged, never raised: garbage waits
    for the next run."""

    def __init__(
        self,
        store: ObjectStore | None,
        catalog: Catalog,
        coordinator: Coordinator,
        *,
        clock: Clock,
        interval: float | None = None,
        grace: float = gc.DEFAULT_GRACE,
        fence_grace: float = gc.DEFAULT_FENCE_GRACE,
        store_url: str | None = None,
        on_report: Callable[[GcReport], None] | None = None,
    ) -> None:
        """``store`` None opens (and, at :meth:`close`, closes) the store ``store_url`` names,
        or the cluster's (``ClusterSettings``), at the first run. ``on_report`` is called with
        every successful run's report (the master counts rounds and deletions in metrics).
        ``interval`` None: :func:`interval_for` ``grace``."""
        if interval is None:
            interval = interval_for(grace)
        if interval <= 0:
            raise InvalidArgument(f"gc interval must be > 0 seconds, got {interval}")
        if grace < 0 or fence_grace < 0:
            raise InvalidArgument(f"gc grace periods must be >= 0 seconds, got {grace}")
        self._store = store
        self._owned: ObjectStore | None = None
        self._store_url = store_url
        self._on_report = on_report
        self._catalog = catalog
        self._coord = coordinator
        self._clock = clock
        self.interval = interval
        self.grace = grace
        self.fence_grace = fence_grace
        self._since: Mapping[str, float] = {}
        self._memory: GcMemory | None = None
        self._last_run: float | None = None
        #: The last successful run's report (for status pages and tests).
        self.last_report: GcReport | None = None

    async def _the_store(self) -> ObjectStore:
        if self._store is None:
            url = self._store_url or (await ClusterSettings.load(self._coord)).store_url
            self._store = self._owned = open_store(url)
        return self._store

    async def close(self) -> None:
        """Close the store if this collector opened it."""
        if self._owned is not None:
            await self._owned.close()
            self._owned = self._store = None
            self._memory = None

    async def maybe_run(self) -> GcReport | None:
        """Collect if ``interval`` has passed since the last attempt; never raises a
        TabletStoreError (logged instead)."""
        now = self._clock.monotonic()
        if self._last_run is not None and now - self._last_run < self.interval:
            return None
        self._last_run = now
        try:
            store = await self._the_store()
            memory = self._memory = self._memory or GcMemory(store)
            if self.last_report is None:
                # This process's first collection: go on from the last leader's memory.
                self._since = await memory.adopt(self._clock.time(), self.grace)
            report = await collect(
                store,
                self._catalog,
                self._coord,
                clock=self._clock,
                grace=self.grace,
                fence_grace=self.fence_grace,
                since=self._since,
            )
        except TabletStoreError as exc:
            # Nothing was lost: what was not deleted now is found again next time.
            log.warning("garbage collection failed: %s", exc)
            return None
        self._since = report.since
        self.last_report = report
        await memory.save(report.since, self._clock.time())
        if self._on_report is not None:
            self._on_report(report)
        if report.deleted or report.unknown:
            log.info("garbage collection: %s", report.summary())
        return report
