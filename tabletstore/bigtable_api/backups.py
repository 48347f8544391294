"""The backup methods of ``google.bigtable.admin.v2.BigtableTableAdmin`` over tabletstore's
backups (client/backup_admin.py, docs/operations/backups.md).

Implemented: CreateBackup, GetBackup, ListBackups, UpdateBackup, DeleteBackup, RestoreTable
and CopyBackup, so the official clients' backup code works unchanged (Google's emulator has
none of them).

Names. A Bigtable backup belongs to a cluster of an instance:
``projects/P/instances/I/clusters/C/backups/B``. tabletstore keeps it in the database's bucket
under the stored id ``<instance prefix>C.B`` (the instance prefix of instances.py, empty for
the plain instance): a cluster id has no ``.``, so the id splits back unambiguously, and
backups of different instances and clusters never collide. ``clusters/-`` in ListBackups
lists every cluster's.

Contracts:

* CreateBackup, RestoreTable and CopyBackup do their work before answering and return a done
  long-running operation with the service's metadata and response, as the instance admin's
  creations do: a cut takes the time of a flush, a restore or a copy within the bucket only
  writes records and a manifest.
* ``expire_time`` is required and must lie in the future (the service also bounds it to
  between 6 hours and 90 days ahead; tabletstore does not).
* UpdateBackup changes ``expire_time`` only (the update mask must name it).
* ListBackups answers every matching backup in one page, oldest first. Its ``filter`` takes
  terms ``FIELD:TEXT`` (contains) and ``FIELD=TEXT`` (equals) joined by ``AND``, FIELD one of
  ``name``, ``source_table``, ``state`` (what the official client sends); ``order_by`` takes
  one of ``name``, ``source_table``, ``expire_time``, ``start_time``, ``end_time``,
  ``size_bytes``, optionally followed by ``desc``. Anything else is INVALID_ARGUMENT naming
  what is supported.
* Tenancy: the caller must have access to every instance a request names (the backup's, the
  source table's, the restored table's), checked first (instances.py); the master then
  checks that the caller administers the backup's table (master/master_service_guard.py).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as bta
from google.cloud.bigtable_admin_v2.types import table as admin_table
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, timestamp_pb2

from tabletstore.bigtable_api.instances import PREFIX_RE, InstanceAdmin, Namespaces
from tabletstore.bigtable_api.translate import (
    TableName,
    check_table_id,
    parse_instance_name,
    parse_table_name,
    table_to_pb,
)
from tabletstore.client.client import AsyncClient
from tabletstore.errors import InvalidArgument
from tabletstore.metadata.backup import BackupManifest, BackupState

__all__ = ["BackupAdmin", "BackupName"]

_CLUSTER_RE = re.compile(r"^projects/([^/]+)/instances/([^/]+)/clusters/([^/]+)$")
_BACKUP_RE = re.compile(r"^projects/([^/]+)/instances/([^/]+)/clusters/([^/]+)/backups/([^/]+)$")
_BACKUP_ID_RE = re.compile(r"^[_a-zA-Z0-9][-_.a-zA-Z0-9]{0,49}$")

BackupPB: Any = admin_table.Backup.pb()
ListBackupsResponsePB: Any = bta.ListBackupsResponse.pb()
_READY, _CREATING = 2, 1
_RESTORE_FROM_BACKUP = 1


class BackupName:
    """A parsed ``projects/P/instances/I/clusters/C/backups/B``."""

    __slots__ = ("backup", "cluster", "instance", "project")

    def __init__(self, project: str, instance: str, cluster: str, backup: str) -> None:
        if not _BACKUP_ID_RE.match(backup):
            raise InvalidArgument(
                f"backup id {backup!r}: 1-50 letters, digits, '_', '-' or '.', not starting "
                "with '-' or '.'"
            )
        if "." in cluster or not cluster or cluster == "-":
            raise InvalidArgument(f"cluster id {cluster!r} cannot hold a backup")
        self.project, self.instance, self.cluster, self.backup = project, instance, cluster, backup

    @classmethod
    def parse(cls, name: str) -> BackupName:
        m = _BACKUP_RE.match(name)
        if m is None:
            raise InvalidArgument(
                f"backup name {name!r} is not "
                "projects/<project>/instances/<instance>/clusters/<cluster>/backups/<backup>"
            )
        return cls(*m.groups())

    def __str__(self) -> str:
        return (
            f"projects/{self.project}/instances/{self.instance}/clusters/{self.cluster}"
            f"/backups/{self.backup}"
        )


def _parse_cluster(name: str) -> tuple[str, str, str]:
    m = _CLUSTER_RE.match(name)
    if m is None:
        raise InvalidArgument(
            f"cluster name {name!r} is not projects/<project>/instances/<instance>/clusters/<id>"
        )
    return m.group(1), m.group(2), m.group(3)


def _timestamp(seconds: float | None) -> Any:
    out = timestamp_pb2.Timestamp()
    if seconds is not None:
        out.FromNanoseconds(int(seconds * 1e9))
    return out


def _seconds(ts: Any) -> float:
    return float(ts.seconds) + float(ts.nanos) / 1e9


def _operation(name: str, metadata: Any, response: Any) -> Any:
    op = operations_pb2.Operation(name=f"{name}/operations/{uuid.uuid4().hex}", done=True)
    op.metadata.Pack(metadata)
    op.response.Pack(response)
    return op


_FILTER_TERM = re.compile(r"^\s*(name|source_table|state)\s*([:=])\s*\"?([^\"]*?)\"?\s*$")
_ORDER_FIELDS = ("name", "source_table", "expire_time", "start_time", "end_time", "size_bytes")
_STATES = {_READY: "READY", _CREATING: "CREATING"}


def _filter(text: str) -> Any:
    """A predicate on Backup messages for ListBackups' ``filter`` (module docstring)."""
    terms = []
    for part in re.split(r"\s+AND\s+", text.strip()) if text.strip() else []:
        m = _FILTER_TERM.match(part)
        if m is None:
            raise InvalidArgument(
                f"ListBackups filter term {part!r}: supported are name, source_table and "
                "state with ':' (contains) or '=' (equals), joined by AND"
            )
        terms.append(m.groups())

    def value(b: Any, field: str) -> str:
        return _STATES.get(b.state, "") if field == "state" else str(getattr(b, field))

    return lambda b: all(
        (want in value(b, f)) if op == ":" else (value(b, f) == want) for f, op, want in terms
    )


def _order(text: str) -> tuple[str, bool]:
    parts = text.split()
    if not parts or parts[0] not in _ORDER_FIELDS or parts[1:] not in ([], ["desc"], ["asc"]):
        raise InvalidArgument(
            f"ListBackups order_by {text!r}: one of {', '.join(_ORDER_FIELDS)}, optionally "
            "followed by desc"
        )
    return parts[0], parts[1:] == ["desc"]


def _sort_key(b: Any, field: str) -> Any:
    value = getattr(b, field)
    return (value.seconds, value.nanos) if field.endswith("_time") else value


class BackupAdmin:
    """The backup RPCs; each takes a raw request message and returns the response."""

    def __init__(
        self, client: AsyncClient, namespaces: Namespaces, instances: InstanceAdmin
    ) -> None:
        self._client = client
        self._ns = namespaces
        self._instances = instances

    def _stored(self, name: BackupName) -> str:
        return f"{self._ns.prefix(name.project, name.instance)}{name.cluster}.{name.backup}"

    async def _named(self, text: str) -> tuple[BackupName, str]:
        name = BackupName.parse(text)
        await self._instances.check_access(name.project, name.instance)
        return name, self._stored(name)

    def _to_pb(self, name: BackupName, m: BackupManifest) -> Any:
        prefix = self._ns.prefix(name.project, name.instance)
        table = m.table.removeprefix(prefix)
        out = BackupPB(
            name=str(name),
            source_table=str(TableName(name.project, name.instance, table)),
            expire_time=_timestamp(m.expires_at),
            start_time=_timestamp(m.created_at),
            end_time=_timestamp(m.created_at),
            size_bytes=m.size_bytes,
            state=_READY if m.state is BackupState.READY else _CREATING,
            backup_type=1,  # STANDARD
        )
        return out

    def _expiry(self, ts: Any, *, what: str) -> float:
        if not ts.seconds and not ts.nanos:
            raise InvalidArgument(f"{what}: expire_time must be set")
        return _seconds(ts)

    async def create_backup(self, req: Any) -> Any:
        project, instance, cluster = _parse_cluster(req.parent)
        await self._instances.check_access(project, instance)
        name = BackupName(project, instance, cluster, req.backup_id)
        source = parse_table_name(req.backup.source_table)
        if (source.project, source.instance) != (project, instance):
            raise InvalidArgument(
                f"backup {req.backup_id!r}: source table {req.backup.source_table!r} is not "
                f"in instance projects/{project}/instances/{instance}"
            )
        expires = self._expiry(req.backup.expire_time, what=f"backup {req.backup_id!r}")
        m = await self._client.create_backup(
            self._ns.table(source), self._stored(name), expires_at=expires
        )
        backup = self._to_pb(name, m)
        meta = bta.CreateBackupMetadata.pb()(
            name=str(name),
            source_table=backup.source_table,
            start_time=backup.start_time,
            end_time=backup.end_time,
        )
        return _operation(str(name), meta, backup)

    async def get_backup(self, req: Any) -> Any:
        name, stored = await self._named(req.name)
        return self._to_pb(name, await self._client.get_backup(stored))

    async def list_backups(self, req: Any) -> Any:
        project, instance, cluster = _parse_cluster(req.parent)
        await self._instances.check_access(project, instance)
        keep = _filter(req.filter)
        prefix = self._ns.prefix(project, instance)
        out = ListBackupsResponsePB()
        for m in await self._client.list_backups():
            if prefix and not m.backup_id.startswith(prefix):
                continue
            if not prefix and PREFIX_RE.match(m.backup_id):
                continue  # another instance's
            rest = m.backup_id.removeprefix(prefix)
            owner, dot, backup = rest.partition(".")
            if not dot or (cluster != "-" and owner != cluster):
                continue
            pb = self._to_pb(BackupName(project, instance, owner, backup), m)
            if keep(pb):
                out.backups.append(pb)
        if req.order_by:
            field, desc = _order(req.order_by)
            ordered = sorted(out.backups, key=lambda b: _sort_key(b, field), reverse=desc)
            del out.backups[:]
            out.backups.extend(ordered)
        return out

    async def update_backup(self, req: Any) -> Any:
        name, stored = await self._named(req.backup.name)
        if list(req.update_mask.paths) != ["expire_time"]:
            raise InvalidArgument(
                f"UpdateBackup changes expire_time only; update_mask was "
                f"{list(req.update_mask.paths)}"
            )
        expires = self._expiry(req.backup.expire_time, what=f"backup {name.backup!r}")
        return self._to_pb(name, await self._client.update_backup(stored, expires_at=expires))

    async def delete_backup(self, req: Any) -> Any:
        _, stored = await self._named(req.name)
        await self._client.delete_backup(stored)
        return empty_pb2.Empty()

    async def restore_table(self, req: Any) -> Any:
        project, instance = parse_instance_name(req.parent)
        await self._instances.check_access(project, instance)
        if req.WhichOneof("source") != "backup":
            raise InvalidArgument("RestoreTable needs a backup to restore")
        backup, stored = await self._named(req.backup)
        table = TableName(project, instance, check_table_id(req.table_id))
        await self._instances.register_implicitly(project, instance)
        m = await self._client.get_backup(stored)
        await self._client.restore_table(stored, self._ns.table(table))
        schema = await self._client.describe_table(self._ns.table(table))
        pb = self._to_pb(backup, m)
        info = admin_table.BackupInfo.pb()(
            backup=backup.backup,
            start_time=pb.start_time,
            end_time=pb.end_time,
            source_table=pb.source_table,
        )
        meta = bta.RestoreTableMetadata.pb()(
            name=str(table), source_type=_RESTORE_FROM_BACKUP, backup_info=info
        )
        return _operation(str(table), meta, table_to_pb(table, schema, 0))

    async def copy_backup(self, req: Any) -> Any:
        project, instance, cluster = _parse_cluster(req.parent)
        await self._instances.check_access(project, instance)
        name = BackupName(project, instance, cluster, req.backup_id)
        source, stored_source = await self._named(req.source_backup)
        expires = self._expiry(req.expire_time, what=f"backup {req.backup_id!r}")
        m = await self._client.copy_backup(
            stored_source, new_id=self._stored(name), expires_at=expires
        )
        backup = self._to_pb(name, m)
        backup.source_backup = str(source)
        info = admin_table.BackupInfo.pb()(
            backup=source.backup,
            start_time=backup.start_time,
            end_time=backup.end_time,
            source_table=backup.source_table,
            source_backup=str(source),
        )
        meta = bta.CopyBackupMetadata.pb()(name=str(name), source_backup_info=info)
        return _operation(str(name), meta, backup)
