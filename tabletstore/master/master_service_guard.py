"""Authorization on the master: table administration by the table's admins only (paper §5.3:
"Chubby ... stores access control lists").

:func:`guard` wraps the master's dispatch table (``MASTER.handlers``). On a master with auth
on, each request runs with the principal the RPC layer proved (``rpc.auth``):

- ``create_table``: any authenticated principal; it becomes one of the table's admins
  (``TableSchema.admins``).
- ``delete_table``, ``modify_families`` (families, GC rules, ACLs), ``set_admins``,
  ``compact_table``, ``create_snapshot``, ``delete_snapshot``, ``bulk_load``: only the table's
  admins, or the cluster's master identity. A table without an admin list (made without auth)
  may be administered by anyone authenticated, until an admin list is set. A table the caller
  may not know of (below), or that does not exist, is refused alike (PermissionDenied naming
  no admins), as a cloud service refuses a resource the caller has no rights on.
- ``create_backup``, ``clone_table``: only the (source) table's admins.
- ``set_history``, ``set_changes``: only the table's admins (its window is its cost and its recoverability).
- ``set_replica``: only the table's admins (it decides who may write the table).
- ``history_default``: anyone authenticated reads the database's default history window; only
  the cluster's ``master`` identity changes it (it governs every table without its own).
- ``get_backup``, ``update_backup``, ``delete_backup``, ``restore_table``,
  ``restore_copied``: only the admins the backup recorded with its table's schema (a backup
  outlives its table); ``list_backups`` answers only those backups. A restored or cloned table is administered by its source's
  admins and its creator.
- ``list_tables``: the tables the principal may know of (``security.table_visibility``: it
  administers the table, may read or write one of its families, or the table has no admin
  list); ``get_table`` of any other
  table is NotFound, exactly as for a table that does not exist, so a name is no oracle.
  Tenants sharing a cluster (or the front door's plain instance) see only their own tables.
- ``list_snapshots``: only the snapshots of tables the principal administers or may read some
  family of (a manifest names every tablet's boundaries, which are row keys); naming a table
  it may not read is PermissionDenied (permission "read").

The cluster's own identities (worker, master, function) see every table.

A refusal is PermissionDenied naming the principal, the table and the permission ("admin"),
counted by ``denied``. Without auth (no principal: the embedded database) nothing changes.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tabletstore.errors import NotFound, PermissionDenied
from tabletstore.master.master import Master
from tabletstore.rpc.auth import current_principal
from tabletstore.rpc.messages import (
    BackupIdRequest,
    CreateTableRequest,
    DeleteSnapshotRequest,
    ListBackupsResponse,
    ListSnapshotsRequest,
    ListSnapshotsResponse,
    ListTablesResponse,
    TableInfoMessage,
    TableNameRequest,
)
from tabletstore.rpc.services import MASTER, MasterService
from tabletstore.rpc.transport import Handler
from tabletstore.security.principal import Principal
from tabletstore.security.table_visibility import may_know_table, may_see_keys

__all__ = ["ADMIN_METHODS", "BACKUP_METHODS", "guard"]

#: Methods that change a table or expose all of it: its admins only.
ADMIN_METHODS = frozenset(
    MASTER.method(fn).name
    for fn in (
        MasterService.delete_table,
        MasterService.modify_families,
        MasterService.set_admins,
        MasterService.compact_table,
        MasterService.create_snapshot,
        MasterService.delete_snapshot,
        MasterService.bulk_load,
        MasterService.create_backup,
        MasterService.clone_table,
        MasterService.set_history,
        MasterService.set_changes,
        MasterService.set_replica,
    )
)
#: Methods naming a backup: the admins its manifest recorded only.
BACKUP_METHODS = frozenset(
    MASTER.method(fn).name
    for fn in (
        MasterService.get_backup,
        MasterService.update_backup,
        MasterService.delete_backup,
        MasterService.restore_table,
        MasterService.restore_copied,
    )
)
_LIST_BACKUPS = MASTER.method(MasterService.list_backups).name
_CREATE = MASTER.method(MasterService.create_table).name
_LIST_SNAPSHOTS = MASTER.method(MasterService.list_snapshots).name
_LIST_TABLES = MASTER.method(MasterService.list_tables).name
_GET_TABLE = MASTER.method(MasterService.get_table).name
_HISTORY_DEFAULT = MASTER.method(MasterService.history_default).name

Denied = Callable[[str, str], None]


def _no_count(method: str, permission: str) -> None:
    return None


def _table_of(request: Any) -> str | None:
    for name in ("name", "table"):
        value = getattr(request, name, None)
        if isinstance(value, str):
            return value
    return None


async def _snapshot_table(master: Master, snapshot_id: str) -> str:
    listed = await master.list_snapshots(ListSnapshotsRequest(None))
    for message in listed.snapshots:
        manifest = json.loads(message.manifest_json)
        if manifest.get("snapshot_id") == snapshot_id:
            return str(manifest["table"])
    raise NotFound(f"no snapshot {snapshot_id!r}")


async def check_admin(master: Master, principal: Principal, method: str, request: Any) -> None:
    """PermissionDenied unless ``principal`` administers the table ``request`` names."""
    if principal.role == "master":
        return
    table = (
        await _snapshot_table(master, request.snapshot_id)
        if isinstance(request, DeleteSnapshotRequest)
        else _table_of(request)
    )
    if table is None:
        raise PermissionDenied(f"{principal.name} may not call {method}: no table named")
    try:
        schema = (await master.get_table(TableNameRequest(table))).info().schema
    except NotFound:
        schema = None
    if schema is None or not may_know_table(principal, schema):
        # A table the caller may not know of is refused exactly as a missing one: no oracle.
        raise PermissionDenied(
            f"{principal.name} may not {method} table {table!r}: it holds no permission admin "
            "on a table of that name"
        )
    admins = schema.admins
    if admins is not None and principal.name not in admins:
        raise PermissionDenied(
            f"{principal.name} may not {method} table {table!r}: permission admin is held by "
            f"{', '.join(admins) or 'nobody'}"
        )


async def _may_see(master: Master, principal: Principal, table: str) -> bool:
    """Whether ``principal`` may see table ``table``'s row keys: it administers the table or
    may read one of its families (a table without families or ACLs: anyone)."""
    try:
        schema = (await master.get_table(TableNameRequest(table))).info().schema
    except NotFound:
        return False
    return may_see_keys(principal, schema)


def _known_tables(principal: Principal, response: ListTablesResponse) -> ListTablesResponse:
    return ListTablesResponse(
        tuple(t for t in response.tables if may_know_table(principal, t.info().schema))
    )


def _known_table(principal: Principal, name: str, response: TableInfoMessage) -> TableInfoMessage:
    """``response`` if ``principal`` may know of the table; else the NotFound a missing table
    gets (the catalog's words)."""
    if not may_know_table(principal, response.info().schema):
        raise NotFound(f"table {name!r} does not exist")
    return response


async def _visible_snapshots(
    master: Master, principal: Principal, response: ListSnapshotsResponse
) -> ListSnapshotsResponse:
    seen: dict[str, bool] = {}
    kept = []
    for message in response.snapshots:
        table = str(json.loads(message.manifest_json).get("table"))
        if table not in seen:
            seen[table] = await _may_see(master, principal, table)
        if seen[table]:
            kept.append(message)
    return ListSnapshotsResponse(tuple(kept))


def _administers(principal: Principal, manifest_json: bytes) -> bool:
    """Whether ``principal`` is one of the admins a backup manifest recorded (a table made
    without auth has none: anyone authenticated)."""
    admins = json.loads(manifest_json).get("schema", {}).get("admins")
    return principal.role == "master" or admins is None or principal.name in admins


async def check_backup_admin(
    master: Master, principal: Principal, method: str, backup_id: str
) -> None:
    """PermissionDenied unless ``principal`` administers the table backup ``backup_id`` is of."""
    message = await master.get_backup(BackupIdRequest(backup_id))
    if not _administers(principal, message.manifest_json):
        raise PermissionDenied(
            f"{principal.name} may not {method} backup {backup_id!r}: permission admin of "
            "its table is not held"
        )


def _with_creator(request: CreateTableRequest, principal: Principal) -> CreateTableRequest:
    schema = request.schema()
    admins = sorted({*(schema.admins or ()), principal.name})
    return CreateTableRequest.of(schema.model_copy(update={"admins": admins}), request.split_keys)


def guard(
    master: Master, handlers: Mapping[str, Handler], *, denied: Denied = _no_count
) -> dict[str, Handler]:
    """``handlers`` (the master's unary methods) with authorization in front."""
    return {name: _guarded(master, name, fn, denied) for name, fn in handlers.items()}


def _guarded(master: Master, method: str, fn: Handler, denied: Denied) -> Handler:
    unary: Callable[[Any], Awaitable[Any]] = fn  # type: ignore[assignment]

    async def guarded(request: Any) -> Any:
        principal = current_principal()
        if principal is not None and method == _LIST_SNAPSHOTS:
            table = request.table
            if table is not None and not await _may_see(master, principal, table):
                denied(method, "read")
                raise PermissionDenied(
                    f"{principal.name} may not list the snapshots of table {table!r}: it may "
                    "read none of its families (permission: read)"
                )
            return await _visible_snapshots(master, principal, await unary(request))
        if principal is not None and method == _HISTORY_DEFAULT:
            if request.change and principal.role != "master":
                denied(method, "admin")
                raise PermissionDenied(
                    f"{principal.name} may not change the database's default history window: "
                    "it applies to every table, so only the cluster's master identity may"
                )
            return await unary(request)
        if principal is not None and method == _LIST_TABLES:
            return _known_tables(principal, await unary(request))
        if principal is not None and method == _GET_TABLE:
            return _known_table(principal, request.name, await unary(request))
        if principal is not None and method == _LIST_BACKUPS:
            listed: ListBackupsResponse = await unary(request)
            mine = [m for m in listed.backups if _administers(principal, m.manifest_json)]
            return ListBackupsResponse(tuple(mine))
        if principal is not None and method in BACKUP_METHODS:
            try:
                await check_backup_admin(master, principal, method, request.backup_id)
            except PermissionDenied:
                denied(method, "admin")
                raise
            return await unary(request)
        if principal is not None:
            if method == _CREATE:
                request = _with_creator(request, principal)
            elif method in ADMIN_METHODS:
                try:
                    await check_admin(master, principal, method, request)
                except PermissionDenied:
                    denied(method, "admin")
                    raise
        return await unary(request)

    return guarded
