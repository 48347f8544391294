"""Backups, restores and zero-copy clones: the master's side (§5.4: SSTables are immutable, so
a table as of a cut is a list of names; docs/operations/backups.md).

* **Backup** (:func:`create_backup`): the table's cut (master/snapshots.py ``cut_table``, the
  snapshot machinery's two-phase cut), kept as a backup manifest in the database's bucket
  (metadata/backup.py) that pins what it names. Every SSTable a cut names holds only cells at
  or below its tablet's cut, so nothing written after the cut can reach a restore.
* **Restore** (:func:`restore_table`): a new table with the backup's schema and split points
  whose tablet records name the backup's SSTables as they are: zero bytes copied. The records
  list no commit logs and a redo point of 0; the worker that loads a tablet advances its
  sequence past every seq its SSTables hold (engine/log_replay.py), so writes to the restored
  table order after every restored cell. A backup in another location is first copied into
  this bucket by the client (metadata/backup_copy.py): the master reads only its own bucket.
  The client then says what its copy verified (``rpc.messages.CopiedBackup``): the master
  reads that manifest version directly and lists the SSTables while it reads it, one round
  trip to the bucket instead of two, and trusts none of it (:func:`_read_copied`).
* **Clone** (:func:`clone_table`): a cut, and at once a new table naming its SSTables. Its
  time is that of the cut (the memtables written out), whatever the table's size. From then
  on the two diverge: each tablet writes new SSTables under its own table's prefix, and GC
  keeps an SSTable while any tablet record of any table names it (master/gc_plan.py), so
  deleting either table leaves the other whole.

Bad input changes nothing: the new table's name is checked free, the backup ready and
unexpired, and every SSTable it names present with its recorded size, before anything is
written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tabletstore.clock import Clock
from tabletstore.data.schema import TableSchema
from tabletstore.errors import AlreadyExists, Corruption, InvalidArgument, NotFound
from tabletstore.master import snapshots
from tabletstore.metadata.backup import (
    COPIED_VERSION,
    BackupManifest,
    check_backup_id,
    read_backup,
    write_backup,
)
from tabletstore.metadata.backup_copy import look_up
from tabletstore.metadata.catalog import Catalog, TableInfo
from tabletstore.metadata.record import SSTableRef, TabletRecord
from tabletstore.metadata.snapshot import TabletSnapshot
from tabletstore.rpc.messages import CopiedBackup
from tabletstore.rpc.services import TabletService
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectInfo, ObjectStore, object_url

__all__ = ["check_new_table", "clone_table", "create_backup", "restore_table"]

#: HEAD requests in flight while a restore checks the backup's objects.
_CHECK_CONCURRENCY = 32

#: Creates the table's records and schema, then assigns its tablets; returns the table.
CreateTable = Callable[[TableSchema, list[TabletRecord]], Awaitable[TableInfo]]


async def create_backup(
    *,
    info: TableInfo,
    backup_id: str,
    expires_at: float | None,
    catalog: Catalog,
    worker: Callable[[str], TabletService],
    store: ObjectStore,
    clock: Clock,
    locate: snapshots.Locate,
) -> BackupManifest:
    """Back up table ``info`` as ``backup_id`` in the database's bucket (module docstring)."""
    check_backup_id(backup_id)
    now = clock.time()
    if expires_at is not None and expires_at <= now:
        raise InvalidArgument(
            f"backup {backup_id!r}: expiry {expires_at} is not in the future (now {now:.0f})"
        )
    try:
        await read_backup(store, backup_id)
    except NotFound:
        pass
    else:
        raise AlreadyExists(f"backup {backup_id!r} already exists in {store.url}")
    cut = await snapshots.cut_table(
        info=info, catalog=catalog, worker=worker, store=store, clock=clock, locate=locate
    )
    manifest = BackupManifest.of_cut(
        cut, backup_id=backup_id, source_url=store.url, expires_at=expires_at
    )
    return await write_backup(store, manifest)


async def check_new_table(catalog: Catalog, name: str) -> None:
    """AlreadyExists if a table ``name`` exists: a restore or clone never writes into one."""
    try:
        await catalog.get_table(name)
    except NotFound:
        return
    raise AlreadyExists(
        f"table {name!r} already exists; restore and clone create a new table (delete it or "
        "choose another name)"
    )


async def restore_table(
    *,
    backup_id: str,
    new_table: str,
    catalog: Catalog,
    store: ObjectStore,
    clock: Clock,
    create: CreateTable,
    creator: str | None = None,
    copied: CopiedBackup | None = None,
) -> TableInfo:
    """Restore backup ``backup_id`` of this bucket into the new table ``new_table``;
    ``copied``: what the client's copy of it into this bucket verified (:func:`_read_copied`)."""
    manifest = None
    if copied is not None:
        manifest = await _read_copied(store, catalog, backup_id, new_table, copied, clock)
    if manifest is None:
        # Both reads at once (neither writes): a taken name or a missing backup fails as
        # before. A backup restored from another location was just copied in: its newest
        # version is the copy's ready one, read while the versions are listed.
        _, read = await asyncio.gather(
            check_new_table(catalog, new_table),
            read_backup(store, backup_id, guess=COPIED_VERSION),
        )
        read.check_restorable(clock.time(), store.url)
        await _check_objects(store, read)
        manifest = read
    schema = _renamed(manifest.schema, new_table, creator)
    table_id = Catalog.new_table_id(new_table)
    records = tablet_records(table_id, manifest.tablets, clock.time(), f"restored {backup_id}")
    return await create(schema, records)


async def clone_table(
    *,
    info: TableInfo,
    new_table: str,
    catalog: Catalog,
    worker: Callable[[str], TabletService],
    store: ObjectStore,
    clock: Clock,
    locate: snapshots.Locate,
    create: CreateTable,
    creator: str | None = None,
) -> TableInfo:
    """A writable copy of table ``info`` as of now that shares its SSTables (module docstring)."""
    await check_new_table(catalog, new_table)
    cut = await snapshots.cut_table(
        info=info, catalog=catalog, worker=worker, store=store, clock=clock, locate=locate
    )
    schema = _renamed(cut.schema, new_table, creator)
    table_id = Catalog.new_table_id(new_table)
    event = f"cloned from {info.schema.name} ({info.table_id})"
    return await create(schema, tablet_records(table_id, cut.tablets, clock.time(), event))


def tablet_records(
    table_id: str, tablets: tuple[TabletSnapshot, ...], now: float, event: str
) -> list[TabletRecord]:
    """The new table's tablet records: the cut's row ranges, naming its SSTables as they are
    (no logs: everything the tablet holds is in them)."""
    return [
        TabletRecord(
            table_id=table_id,
            tablet_id=f"t{i:05d}",
            start_row=t.start_row,
            end_row=t.end_row,
            sstables=dict(t.sstables),
        ).with_event(now, "created", event)
        for i, t in enumerate(tablets)
    ]


def _renamed(schema: TableSchema, name: str, creator: str | None) -> TableSchema:
    """``schema`` for the new table ``name``, administered by its source's admins and its
    ``creator`` (the table belongs to whoever made it, as a created table does)."""
    update: dict[str, object] = {"name": name}
    if creator is not None:
        update["admins"] = sorted({*(schema.admins or ()), creator})
    try:
        return TableSchema.model_validate({**schema.model_dump(), **update})
    except ValueError as exc:
        raise InvalidArgument(f"cannot create table {name!r}: {exc}") from exc


async def _read_copied(
    store: ObjectStore,
    catalog: Catalog,
    backup_id: str,
    new_table: str,
    copied: CopiedBackup,
    clock: Clock,
) -> BackupManifest | None:
    """The manifest of a backup the client has just copied into this bucket, restorable, with
    every SSTable it names present at its recorded size; None if the bucket's manifest is not
    the one ``copied`` describes (a change since the copy, a client of another build): the
    caller then checks the backup as any other.

    ``copied`` only decides which reads start at once: the manifest version it names is read
    (a GET, no listing of the versions), and the SSTables it names are looked up (by listing
    their table's prefix: metadata/backup_copy.py ``look_up``) while that GET is under way,
    so the whole check is one round trip and, for a backup of one table, two requests. It is
    trusted for nothing:

    * the manifest comes from the bucket, never from the request: it decides which objects the
      new table names (a client must not make a table of objects no backup of that id names)
      and, with auth, who may restore it (its recorded admins, which the guard checked);
    * every SSTable that manifest names is looked up in the bucket (in the early listings, or
      by a HEAD now for a key they did not cover) and must exist at its recorded size: the
      client's account of its copy is no proof (a copy cut short, an object deleted since),
      and a table whose record names a missing object loses those rows;
    * ready and unexpired, as for any restore. The checksums the copy verified are not
      checked again (no restore reads an SSTable's bytes), only compared with the manifest's."""
    key = layout.backup_key(check_backup_id(backup_id), copied.version)
    lookups = asyncio.ensure_future(look_up(store, copied.sizes))
    try:
        _, data = await asyncio.gather(check_new_table(catalog, new_table), store.get(key))
        manifest = None
        if data is not None:
            manifest = BackupManifest.from_bytes(data, name=object_url(store.url, key))
        if manifest is None or not _describes(copied, manifest, backup_id):
            return None
        manifest.check_restorable(clock.time(), store.url)
        found = await lookups
    finally:
        if not lookups.done():
            lookups.cancel()
            await asyncio.wait([lookups])
        if not lookups.cancelled():
            lookups.exception()  # a failed lookup of a check given up is not an error
    await _check_objects(store, manifest, found)
    return manifest


def _describes(copied: CopiedBackup, manifest: BackupManifest, backup_id: str) -> bool:
    """Whether ``manifest`` is the one a client's copy verified: that backup and version,
    naming exactly those SSTables at those sizes, with those checksums."""
    sizes = {r.key: r.size for t in manifest.tablets for refs in t.sstables.values() for r in refs}
    return (
        manifest.backup_id == backup_id
        and manifest.version == copied.version
        and sizes == copied.sizes
        and manifest.checksums == copied.checksums
    )


async def _check_objects(
    store: ObjectStore,
    manifest: BackupManifest,
    found: dict[str, ObjectInfo | None] | None = None,
) -> None:
    """NotFound or Corruption naming the first SSTable of the backup that is missing or has
    another size than recorded (before anything is created). ``found``: what listings just
    found of some of them (``look_up``; the others are looked up by HEAD now)."""
    refs = {r.key: r for t in manifest.tablets for refs in t.sstables.values() for r in refs}
    gate = asyncio.Semaphore(_CHECK_CONCURRENCY)
    found = found or {}

    async def one(ref: SSTableRef) -> None:
        layout.parse_sstable_key(ref.key)
        if ref.key in found:
            info = found[ref.key]
        else:
            async with gate:
                info = await store.head(ref.key)
        if info is None:
            raise NotFound(
                f"backup {manifest.backup_id!r} names {object_url(store.url, ref.key)}, which "
                "does not exist: the backup is damaged; nothing was restored"
            )
        if info.size != ref.size:
            raise Corruption(
                f"{object_url(store.url, ref.key)} has {info.size} bytes, backup "
                f"{manifest.backup_id!r} recorded {ref.size}; nothing was restored"
            )

    try:
        async with asyncio.TaskGroup() as tg:
            for ref in refs.values():
                tg.create_task(one(ref))
    except* (NotFound, Corruption, InvalidArgument) as group:
        raise group.exceptions[0] from None
