"""A client's backup, restore and clone requests (docs/operations/backups.md).

A backup lives in one *location*: the database's own bucket (the master keeps it:
master/backups.py) or a backup location outside any database, ``s3://other-bucket/prefix``
(or ``file://``), that this client reads and writes with its own credentials
(metadata/backup_copy.py). The master only ever reads its own bucket, so whatever crosses
buckets goes through the client:

* ``create_backup(T, to=URL)``: the master backs T up in the database's bucket (the cut, pinned
  there), this client copies that backup to ``URL``, then the database's copy is deleted: the
  backup lives at ``URL`` alone and restores from it after the source bucket is gone.
* ``restore_table(ID, NEW, source=URL)``: this client copies the backup from ``URL`` into the
  database's bucket (a local backup of the same id, listed afterwards; deleting it later never
  harms the restored table, whose records name its SSTables), then the master restores it.
  ``source`` may be another database's store URL too: that is how a backup moves between
  clusters. The request says what the copy verified (``restore_copied``), so the master
  checks the backup in one round trip to its bucket instead of two (master/backups.py).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING

from tabletstore.clock import wall_time
from tabletstore.errors import AlreadyExists, InvalidArgument, NotFound, Unimplemented
from tabletstore.metadata.backup import (
    COPIED_VERSION,
    BackupManifest,
    list_backups,
    new_backup_id,
    read_backup,
    write_next_version,
)
from tabletstore.metadata.backup_copy import copy_backup, delete_from_location
from tabletstore.metadata.catalog import TableInfo
from tabletstore.rpc.messages import (
    BackupIdRequest,
    CloneTableRequest,
    CopiedBackup,
    CreateBackupRequest,
    ListBackupsRequest,
    RestoreTableRequest,
    TableInfoMessage,
    TableNameRequest,
    UpdateBackupRequest,
)
from tabletstore.rpc.services import MasterService
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectStore

if TYPE_CHECKING:
    from tabletstore.client.table_admin import TableInfos

__all__ = ["BackupRequests"]

log = logging.getLogger(__name__)


class BackupRequests(abc.ABC):
    """Backups, restores and clones; the abstract members are the client's."""

    _admin: MasterService
    _tables: TableInfos

    @abc.abstractmethod
    def _database_store(self) -> contextlib.AbstractAsyncContextManager[ObjectStore]:
        """The database's own object store, opened with this client's credentials."""

    async def create_backup(
        self,
        table: str,
        backup_id: str | None = None,
        *,
        expires_at: float | None = None,
        to: str | None = None,
    ) -> BackupManifest:
        """Back up ``table`` as of now (every write acknowledged before the call is in it,
        none started after it returns) as ``backup_id`` (default: a fresh id). It expires at
        ``expires_at`` (seconds since the epoch; None: kept until deleted). ``to``: a backup
        location URL to keep it in instead of the database's bucket (module docstring)."""
        backup_id = backup_id or new_backup_id()
        if to is None:
            msg = await self._admin.create_backup(CreateBackupRequest(table, backup_id, expires_at))
            return BackupManifest.from_bytes(msg.manifest_json)
        async with _opened(to) as dst:
            with contextlib.suppress(NotFound):
                await read_backup(dst, backup_id)
                raise AlreadyExists(f"backup {backup_id!r} already exists in {dst.url}")
            await self._admin.create_backup(CreateBackupRequest(table, backup_id, expires_at))
            try:
                async with self._database_store() as src:
                    return await copy_backup(src, dst, backup_id, now=wall_time())
            finally:
                # The database's copy only pinned the cut while it was copied.
                await self._admin.delete_backup(BackupIdRequest(backup_id))

    async def list_backups(
        self, table: str | None = None, *, location: str | None = None
    ) -> list[BackupManifest]:
        """Backups (of ``table``, by name) in the database's bucket or in ``location``,
        oldest first; a backup outlives its table, so a deleted table's are listed too."""
        if location is not None:
            async with _opened(location) as store:
                return await list_backups(store, table)
        resp = await self._admin.list_backups(ListBackupsRequest(table))
        return [BackupManifest.from_bytes(m.manifest_json) for m in resp.backups]

    async def get_backup(self, backup_id: str, *, location: str | None = None) -> BackupManifest:
        """One backup's manifest (NotFound if there is none)."""
        if location is not None:
            async with _opened(location) as store:
                return await read_backup(store, backup_id)
        msg = await self._admin.get_backup(BackupIdRequest(backup_id))
        return BackupManifest.from_bytes(msg.manifest_json)

    async def update_backup(
        self, backup_id: str, *, expires_at: float | None, location: str | None = None
    ) -> BackupManifest:
        """Set when a backup expires (None: never); it must lie in the future."""
        if location is None:
            msg = await self._admin.update_backup(UpdateBackupRequest(backup_id, expires_at))
            return BackupManifest.from_bytes(msg.manifest_json)
        now = wall_time()
        if expires_at is not None and expires_at <= now:
            raise InvalidArgument(f"backup {backup_id!r}: expiry {expires_at} is in the past")
        async with _opened(location) as store:
            manifest = await read_backup(store, backup_id)
            return await write_next_version(store, manifest.changed(expires_at=expires_at))

    async def delete_backup(self, backup_id: str, *, location: str | None = None) -> None:
        """Delete a backup. In the database's bucket GC then frees what only it kept; in a
        backup location its SSTables no other backup there names are deleted at once."""
        if location is None:
            await self._admin.delete_backup(BackupIdRequest(backup_id))
            return
        async with _opened(location) as store:
            await delete_from_location(store, backup_id)

    async def copy_backup(
        self,
        backup_id: str,
        to: str | None = None,
        *,
        new_id: str | None = None,
        source: str | None = None,
        expires_at: float | None = None,
    ) -> BackupManifest:
        """Copy a ready backup (from the database's bucket, or ``source``) to the location
        ``to`` (default: the database's bucket) as ``new_id`` (default: the same id). It keeps
        its expiry unless ``expires_at`` is given. Within one bucket only a manifest is
        written: the copy names the same SSTables."""
        async with contextlib.AsyncExitStack() as stack:
            src = await stack.enter_async_context(
                self._database_store() if source is None else _opened(source)
            )
            dst = await stack.enter_async_context(
                self._database_store() if to is None else _opened(to)
            )
            return await copy_backup(
                src,
                dst,
                backup_id,
                now=wall_time(),
                new_id=new_id,
                expires_at=expires_at,
                keep_expiry=expires_at is None,
            )

    async def restore_table(
        self, backup_id: str, new_table: str, *, source: str | None = None
    ) -> TableInfo:
        """Restore a backup into the new table ``new_table`` (same schema and split points,
        exactly the cells of the backup's cut). ``source``: the location (or another
        database's store URL) the backup is in; default the database's bucket."""
        await self._check_absent(new_table)
        request = RestoreTableRequest(backup_id, new_table)
        if source is None:
            msg = await self._admin.restore_table(request)
        else:
            # The copy's creating version is deleted while the master restores (``later``):
            # the ready version is the newest, the one every reader takes, from its creation.
            async with (
                self._database_store() as own,
                _opened(source) as src,
                asyncio.TaskGroup() as later,
            ):
                copy = await _bring_in(src, own, backup_id, later)
                msg = await self._restore_copied(request, copy)
        info = self._tables[new_table] = msg.info()
        return info

    async def _restore_copied(
        self, request: RestoreTableRequest, copy: BackupManifest | None
    ) -> TableInfoMessage:
        """The master's restore of a backup just brought in; ``copy``: the ready manifest
        this client's copy wrote (None: the backup was there already, nothing was verified).
        A master that predates ``restore_copied`` refuses it before running anything
        (Unimplemented): it gets ``restore_table``, and checks the backup itself."""
        if copy is not None:
            sizes = {
                r.key: r.size for t in copy.tablets for refs in t.sstables.values() for r in refs
            }
            copied = CopiedBackup(copy.version, sizes, dict(copy.checksums))
            try:
                return await self._admin.restore_copied(replace(request, copied=copied))
            except Unimplemented as exc:
                log.info("restoring %s with restore_table: %s", request.backup_id, exc)
        return await self._admin.restore_table(request)

    async def clone_table(self, table: str, new_table: str) -> TableInfo:
        """A writable zero-copy clone of ``table`` as of now, named ``new_table``: it shares
        the source's SSTables, and from then on writes to either reach only that one."""
        msg = await self._admin.clone_table(CloneTableRequest(table, new_table))
        info = self._tables[new_table] = msg.info()
        return info

    async def _check_absent(self, name: str) -> None:
        """AlreadyExists if table ``name`` exists (before anything is copied)."""
        try:
            await self._admin.get_table(TableNameRequest(name))
        except NotFound:
            return
        raise AlreadyExists(
            f"table {name!r} already exists; a restore creates a new table (delete it or "
            "choose another name)"
        )


async def _bring_in(
    src: ObjectStore,
    own: ObjectStore,
    backup_id: str,
    later: asyncio.TaskGroup | None = None,
) -> BackupManifest | None:
    """Copy backup ``backup_id`` from ``src`` into the database's bucket unless the same
    backup (same table and cut) is there already; returns the copy's ready manifest (None:
    nothing was copied). ``later``: where the copy's tidying runs (metadata/backup_copy.py
    ``copy_backup``)."""
    # Both manifests read at once; the location's listed and read at once too (a backup in a
    # location is a copy: its newest version is usually the copy's ready one).
    source, here = await asyncio.gather(
        read_backup(src, backup_id, guess=COPIED_VERSION), _read_if_any(own, backup_id)
    )
    source.check_restorable(wall_time(), src.url)
    if here is None:
        return await copy_backup(
            src, own, backup_id, now=wall_time(), source=source, absent=True, later=later
        )
    if (here.table_id, here.created_at) != (source.table_id, source.created_at):
        raise AlreadyExists(
            f"the database already has a different backup {backup_id!r} (of {here.table} at "
            f"{here.created_at:.0f}); copy this one in under another id (copy_backup new_id=)"
        )
    return None


async def _read_if_any(store: ObjectStore, backup_id: str) -> BackupManifest | None:
    try:
        return await read_backup(store, backup_id)
    except NotFound:
        return None


@contextlib.asynccontextmanager
async def _opened(url: str) -> AsyncIterator[ObjectStore]:
    """A backup location's store, closed afterwards. Copies read whole objects from it in
    large ranged parts, so an S3 location reads them in threads (storage_s3/s3.py)."""
    store = open_store(url, threaded_reads=True)
    try:
        yield store
    finally:
        await store.close()
