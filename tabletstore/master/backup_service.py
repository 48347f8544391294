"""The master's backup, restore and clone requests (``rpc.services.MasterService``): thin
handlers over master/backups.py, a part of :class:`~tabletstore.master.master.Master` kept in
its own module (the master inherits it, as the worker's services are split in
worker/rpc_services.py)."""

from __future__ import annotations

import abc
import time

from tabletstore.clock import Clock
from tabletstore.data.schema import TableSchema
from tabletstore.errors import InvalidArgument, NotFound
from tabletstore.master import backups
from tabletstore.metadata import rows as mt
from tabletstore.metadata.backup import (
    BackupManifest,
    delete_backup_versions,
    list_backups,
    read_backup,
    write_next_version,
)
from tabletstore.metadata.catalog import Catalog, TableInfo
from tabletstore.metadata.record import TabletRecord
from tabletstore.rpc.auth import current_principal
from tabletstore.rpc.messages import (
    BackupIdRequest,
    BackupInfoMessage,
    CloneTableRequest,
    CreateBackupRequest,
    ListBackupsRequest,
    ListBackupsResponse,
    RestoreTableRequest,
    TableInfoMessage,
    UpdateBackupRequest,
)
from tabletstore.rpc.services import TabletService
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["BackupAdmin"]


class BackupAdmin(abc.ABC):
    """Backup requests of the master; the abstract members are the master's."""

    @property
    @abc.abstractmethod
    def catalog(self) -> Catalog: ...

    @property
    @abc.abstractmethod
    def clock(self) -> Clock: ...

    @abc.abstractmethod
    def _check_leading(self) -> None: ...

    @abc.abstractmethod
    async def _the_store(self) -> ObjectStore: ...

    @abc.abstractmethod
    async def _locate(self, records: list[TabletRecord]) -> dict[str, str]: ...

    @abc.abstractmethod
    def _worker(self, address: str, *, timeout: float | None = None) -> TabletService: ...

    @abc.abstractmethod
    async def _check_table_quota(self, name: str) -> None: ...

    @abc.abstractmethod
    async def assign(self) -> int: ...

    async def _create_table_with(
        self, schema: TableSchema, records: list[TabletRecord]
    ) -> TableInfo:
        """Create a table from ready records (the caller's table quota checked, as
        create_table checks it) and assign its tablets."""
        await self._check_table_quota(schema.name)
        info = await self.catalog.create_table(schema, records)
        await self.assign()
        return info

    async def create_backup(self, req: CreateBackupRequest) -> BackupInfoMessage:
        """Back up a table in the database's bucket (master/backups.py)."""
        self._check_leading()
        info = await self._user_table(req.table)
        manifest = await backups.create_backup(
            info=info,
            backup_id=req.backup_id,
            expires_at=req.expires_at,
            catalog=self.catalog,
            worker=self._worker,
            store=await self._the_store(),
            clock=self.clock,
            locate=self._locate,
        )
        return BackupInfoMessage(manifest.to_bytes())

    async def list_backups(self, req: ListBackupsRequest) -> ListBackupsResponse:
        """Backups in the database's bucket (of one table, by name), oldest first."""
        self._check_leading()
        listed = await list_backups(await self._the_store(), req.table)
        return ListBackupsResponse(tuple(BackupInfoMessage(m.to_bytes()) for m in listed))

    async def get_backup(self, req: BackupIdRequest) -> BackupInfoMessage:
        self._check_leading()
        manifest = await read_backup(await self._the_store(), req.backup_id)
        return BackupInfoMessage(manifest.to_bytes())

    async def update_backup(self, req: UpdateBackupRequest) -> BackupInfoMessage:
        """Set a backup's expiry; it must lie in the future (None: never expires)."""
        self._check_leading()
        store = await self._the_store()
        now = self.clock.time()
        if req.expires_at is not None and req.expires_at <= now:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(req.expires_at))
            raise InvalidArgument(f"backup {req.backup_id!r}: expiry {when} is not in the future")
        manifest: BackupManifest = await read_backup(store, req.backup_id)
        if manifest.expired(now):
            raise InvalidArgument(
                f"backup {req.backup_id!r} has expired; its expiry can no longer be changed"
            )
        updated = await write_next_version(store, manifest.changed(expires_at=req.expires_at))
        return BackupInfoMessage(updated.to_bytes())

    async def delete_backup(self, req: BackupIdRequest) -> None:
        """Delete a backup's manifest; GC frees what only it kept."""
        self._check_leading()
        await delete_backup_versions(await self._the_store(), req.backup_id)

    async def restore_table(self, req: RestoreTableRequest) -> TableInfoMessage:
        """Restore a backup of this bucket into a new table (master/backups.py), with what
        the client's copy verified if the request carries it."""
        self._check_leading()
        info = await backups.restore_table(
            backup_id=req.backup_id,
            new_table=req.new_table,
            catalog=self.catalog,
            store=await self._the_store(),
            clock=self.clock,
            create=self._create_table_with,
            creator=_creator(),
            copied=req.copied,
        )
        return TableInfoMessage.of(info)

    async def restore_copied(self, req: RestoreTableRequest) -> TableInfoMessage:
        """``restore_table`` of a backup the client has just copied in (``req.copied``)."""
        return await self.restore_table(req)

    async def clone_table(self, req: CloneTableRequest) -> TableInfoMessage:
        """A zero-copy clone of a table as of now (master/backups.py)."""
        self._check_leading()
        info = await backups.clone_table(
            info=await self._user_table(req.table),
            new_table=req.new_table,
            catalog=self.catalog,
            worker=self._worker,
            store=await self._the_store(),
            clock=self.clock,
            locate=self._locate,
            create=self._create_table_with,
            creator=_creator(),
        )
        return TableInfoMessage.of(info)

    async def _user_table(self, name: str) -> TableInfo:
        if name == mt.METADATA_TABLE:
            raise InvalidArgument(f"table {name!r} is the system table; it has no backups")
        try:
            return await self.catalog.get_table(name)
        except NotFound:
            raise NotFound(f"table {name!r} does not exist") from None


def _creator() -> str | None:
    """The principal a new table is made for (None without auth, or for the cluster's own)."""
    principal = current_principal()
    if principal is None or principal.is_cluster:
        return None
    return principal.name
