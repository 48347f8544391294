"""A client's administrative requests: tables, column families, compactions, snapshots and
bulk loads, sent to the master (§3 "creating and deleting tables and column families", §8).

Administrative requests are ``rpc.services.MasterService`` calls (:data:`Admin`): to the embedded
database's Master itself, or through a stub to a cluster's elected master
(``client/cluster.py``). :class:`TableAdmin` sends them and keeps what they answer about each
table (its id and schema, :meth:`TableAdmin._info`, kept apart for each caller a front door
acts for: :class:`TableInfos`), which the data requests read too;
:class:`~tabletstore.client.client.AsyncClient` is a TableAdmin (the public API keeps one
object: ``client.create_table(...)``, as happybase's connection has). Requests that go to the
workers tablet by tablet (``compact_tablets``) or ask every worker (``status``) are the
client's.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from tabletstore.client.backup_admin import BackupRequests
from tabletstore.client.location import LocationCache
from tabletstore.data.schema import ColumnFamily, GcRule, LocalityGroup, ReplicaOf, TableSchema
from tabletstore.errors import InvalidArgument
from tabletstore.metadata.catalog import TableInfo
from tabletstore.metadata.snapshot import SnapshotManifest
from tabletstore.rpc.auth import ACTING_FOR
from tabletstore.rpc.messages import (
    BulkLoadRequest,
    CompactTableRequest,
    CreateSnapshotRequest,
    CreateTableRequest,
    DeleteSnapshotRequest,
    HistoryDefaultRequest,
    ListSnapshotsRequest,
    ListTablesRequest,
    ModifyFamiliesRequest,
    SetAdminsRequest,
    SetChangesRequest,
    SetHistoryRequest,
    SetReplicaRequest,
    TableNameRequest,
)
from tabletstore.rpc.services import MasterService

if TYPE_CHECKING:
    from tabletstore.client.table import AsyncTable

__all__ = ["Admin", "TableAdmin", "TableInfos"]

#: What the client asks of the master: the master's service (the embedded database's Master
#: itself, or a stub to a cluster's elected master).
Admin = MasterService


class TableInfos:
    """Each table's id and schema by name, as the master last answered, for each principal
    the client acts for (``ACTING_FOR``; a plain client has one, itself).

    The master answers a lookup as its caller: a table the caller may not know of is
    NOT_FOUND, as if it did not exist (``security.table_visibility``). A front door serves
    many callers through one client, so an answer kept for one caller and used for another
    would skip that check: the second caller's write would reach the tablet server, which
    refuses it PERMISSION_DENIED -- telling it that the table exists, and only once someone
    else had used it. Kept apart, a caller's answer depends on nothing but the caller.
    Bounded: past ``limit`` entries the cache starts over (a lookup costs one master call).
    """

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._infos: dict[tuple[str | None, str], TableInfo] = {}

    @staticmethod
    def _key(name: str) -> tuple[str | None, str]:
        return ACTING_FOR.get(), name

    def get(self, name: str) -> TableInfo | None:
        """The current caller's answer for table ``name``, if kept."""
        return self._infos.get(self._key(name))

    def __getitem__(self, name: str) -> TableInfo:
        return self._infos[self._key(name)]

    def __setitem__(self, name: str, info: TableInfo) -> None:
        if len(self._infos) >= self._limit:
            self._infos.clear()
        self._infos[self._key(name)] = info

    def pop(self, name: str, default: TableInfo | None = None) -> TableInfo | None:
        """Forget table ``name`` for every caller (it was deleted or replaced); the current
        caller's answer, if kept."""
        mine = self._infos.get(self._key(name), default)
        for key in [k for k in self._infos if k[1] == name]:
            del self._infos[key]
        return mine


class TableAdmin(BackupRequests):
    """The administrative requests a client sends to the master, and what they answer about
    each table (backups, restores and clones: client/backup_admin.py)."""

    def __init__(self, *, admin: Admin, locations: LocationCache) -> None:
        self._admin = admin
        #: Where tablets are served: the three-level lookup with its cache (§5.1).
        self.locations = locations
        #: Each table's id and schema by name, as the master last answered each caller.
        self._tables = TableInfos()

    @abc.abstractmethod
    def table(self, name: str) -> AsyncTable:
        """A handle on a table (no request is made until it is used)."""

    async def create_table(
        self,
        name: str,
        families: Iterable[str | ColumnFamily] = (),
        *,
        split_keys: Sequence[bytes] = (),
        locality_groups: Iterable[LocalityGroup] = (),
        history: float | None = None,
        changes: float | None = None,
        replica_of: ReplicaOf | None = None,
    ) -> AsyncTable:
        """Create a table with column families (names or ColumnFamily values). ``history``:
        seconds of history to keep (any instant that far back can be restored); ``changes``:
        seconds of change retention (its change stream can be read that far back,
        ``client/change_stream.py``); ``replica_of``: a replica from its first moment
        (``client/replicator.py``: only the replicator writes it)."""
        try:
            fams = {}
            for f in families:
                fam = ColumnFamily(name=f) if isinstance(f, str) else f
                fams[fam.name] = fam
            groups = {"default": LocalityGroup(name="default")}
            groups.update({g.name: g for g in locality_groups})
            schema = TableSchema(
                name=name,
                families=fams,
                locality_groups=groups,
                history=history,
                changes=changes,
                replica_of=replica_of,
            )
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise InvalidArgument(_schema_error(exc)) from exc
        msg = await self._admin.create_table(CreateTableRequest.of(schema, split_keys))
        self._tables[name] = msg.info()
        return self.table(name)

    async def delete_table(self, name: str) -> None:
        await self._admin.delete_table(TableNameRequest(name))
        info = self._tables.pop(name, None)
        if info is not None:
            self.locations.invalidate(info.table_id)

    async def set_history(self, name: str, seconds: float | None) -> None:
        """Keep ``seconds`` of history for table ``name`` (None: end its own setting; the
        database's default, if any, then applies; ``HISTORY_OFF`` from
        ``tabletstore.data.schema``: no history, whatever the default): any instant that far
        back can be restored.
        The master takes the first checkpoint before this returns. Only the table's admins."""
        req = SetHistoryRequest(name, seconds)
        self._tables[name] = (await self._admin.set_history(req)).info()

    async def set_changes(self, name: str, seconds: float | None) -> None:
        """Keep ``seconds`` of changes for table ``name`` (None: no change stream): its change
        stream (``table.read_changes``) can be read that far back. Only the table's admins."""
        req = SetChangesRequest(name, seconds)
        self._tables[name] = (await self._admin.set_changes(req)).info()

    async def set_replica(
        self, name: str, replica_of: ReplicaOf | None, *, promoting: bool = False
    ) -> None:
        """Make table ``name`` a replica (only the replicator writes it; with ``promoting``,
        nobody), or with None a primary again; every worker applies it before this returns.
        Only the table's admins (client/replicator.py runs it)."""
        if replica_of is None:
            req = SetReplicaRequest(name, None)
        else:
            req = SetReplicaRequest(name, replica_of.source, replica_of.table, promoting)
        self._tables[name] = (await self._admin.set_replica(req)).info()

    async def history_default(self) -> float | None:
        """The database's default history window in seconds (None: none)."""
        return (await self._admin.history_default(HistoryDefaultRequest())).seconds

    async def set_history_default(self, seconds: float | None) -> None:
        """Set (None: end) the database's default history window, which applies to every table
        without a window of its own. On a cluster with auth, only its master identity may."""
        await self._admin.history_default(HistoryDefaultRequest(change=True, seconds=seconds))

    async def set_admins(self, name: str, admins: Sequence[str]) -> None:
        """Replace who administers table ``name`` (on a cluster with auth on, only they may
        delete it or change its families and ACLs; master/master_service_guard.py)."""
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

    async def bulk_load(
        self, table: str, url: str, *, load_id: str | None = None
    ) -> tuple[int, int]:
        """Load the SSTables a job wrote to its staging area (``url``: the load's name, or
        the URL ``staging_url`` gave for it) into ``table``, atomically per tablet; all
        are checked first and bad input loads nothing. Any other location is
        PermissionDenied: the cluster never fetches a location its caller names. Returns
        (tablets loaded, cells loaded) by this call.

        Safe to repeat: ``load_id`` (default: a hash of the files' contents) names the load;
        once it is done, running it again loads nothing and returns (0, 0), and a load that
        was interrupted (a crash, a failover) loads only what it had not loaded yet."""
        resp = await self._admin.bulk_load(BulkLoadRequest(table, url, load_id or ""))
        return resp.tablets, resp.cells

    async def _info(self, name: str, *, refresh: bool = False) -> TableInfo:
        """Table ``name``'s id and schema: as cached, or asked of the master (``refresh``:
        asked again)."""
        info = self._tables.get(name)
        if info is None or refresh:
            info = self._tables[name] = (await self._admin.get_table(TableNameRequest(name))).info()
        return info


def _schema_error(exc: ValueError) -> str:
    """pydantic's multi-line report as one line naming what is wrong."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        parts = [str(e.get("msg", "")).removeprefix("Value error, ") for e in errors()]
        return "; ".join(p for p in parts if p) or str(exc)
    return str(exc)
