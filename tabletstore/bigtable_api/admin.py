"""``google.bigtable.admin.v2.BigtableTableAdmin`` over tabletstore's admin API (§3, §5).

Implemented: CreateTable, GetTable, ListTables, DeleteTable, ModifyColumnFamilies,
DropRowRange, GenerateConsistencyToken and CheckConsistency; the backup methods are
:mod:`tabletstore.bigtable_api.backups`' (:attr:`TableAdmin.backups`). Every other method of the
service answers UNIMPLEMENTED (see :mod:`tabletstore.bigtable_api.front_door`).

Tables live in their instance's namespace (:mod:`tabletstore.bigtable_api.instances`): the
stored tabletstore table is the instance's prefix and the table id; CreateTable records an
instance it has not seen.

Contracts:

* ModifyColumnFamilies validates every modification against the current schema first (create
  of an existing family, update or drop of a missing one, bad GC rules), then applies them in
  order through the client's admin calls. tabletstore has no multi-family schema transaction,
  so a failure of the coordinator in the middle can leave a prefix applied; validation makes
  every other failure happen before anything changes.
* DropRowRange deletes through the public data API: it scans the rows (prefix, or the whole
  table) returning one empty cell per row and deletes each row, in batches. Rows written
  concurrently may survive, as in the service.
* Tenancy (with bearer tokens): every call runs acting for its caller, so the master and the
  workers authorize the caller itself, never the front door (``rpc.auth``, delegation). A
  table made through the front door has its caller as admin (only it may alter, drop or
  delete the table) and every family it creates, then or later, has an ACL naming the caller
  as reader and writer, so the workers serve its cells to nobody else. Table calls in another
  principal's instance are refused first, PERMISSION_DENIED (instances.py). In a shared
  instance (the plain one, or one made without tokens) ListTables and GetTable show the caller
  only tables it has some right on: the master lists and describes no other to it (NOT_FOUND,
  as for a missing table; master/master_service_guard.py).
* GenerateConsistencyToken / CheckConsistency: a tabletstore write is durable and visible when it
  is acknowledged, so a primary table's token is consistent at once. A replica table's
  (client/replicator.py: the front door of the replica's cluster) names the instant it was
  generated; it is consistent once the replica's applied watermark passes it, that is once the
  replica holds every write its source acknowledged before the token was made.
"""

from __future__ import annotations

from typing import Any

from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as bta
from google.protobuf import empty_pb2

from tabletstore.bigtable_api.backups import BackupAdmin
from tabletstore.bigtable_api.instances import InstanceAdmin, Namespaces, caller
from tabletstore.bigtable_api.translate import (
    TableName,
    check_table_id,
    family_from_pb,
    parse_instance_name,
    parse_table_name,
    table_to_pb,
    value_type_from_pb,
)
from tabletstore.client.client import AsyncClient
from tabletstore.client.replicator import load_progress
from tabletstore.clock import wall_time
from tabletstore.data.filters import CellsPerRowLimit, Chain, StripValue
from tabletstore.data.model import DeleteRow, RowMutation
from tabletstore.data.schema import Acl, ColumnFamily, GcRule
from tabletstore.errors import AlreadyExists, InvalidArgument, NotFound

__all__ = ["CONSISTENCY_TOKEN", "DROP_BATCH_ROWS", "REPLICA_TOKEN", "TableAdmin"]

#: The one consistency token of a primary table: every acknowledged write is already consistent.
CONSISTENCY_TOKEN = "tabletstore-writes-are-durable-when-acknowledged"
#: A replica table's tokens: this, the table's name, ``/`` and the instant they were made.
REPLICA_TOKEN = "tabletstore-replica/"
#: Rows deleted per MutateRows batch by DropRowRange.
DROP_BATCH_ROWS = 500

ListTablesResponsePB: Any = bta.ListTablesResponse.pb()
GenerateConsistencyTokenResponsePB: Any = bta.GenerateConsistencyTokenResponse.pb()
CheckConsistencyResponsePB: Any = bta.CheckConsistencyResponse.pb()
_VIEW_NAME_ONLY = 1


def _caller_acl() -> Acl:
    """The ACL of a family made for the current caller: the caller alone reads and writes it
    (everybody, without tokens)."""
    who = caller()
    return Acl() if who is None else Acl(readers=[who], writers=[who])


class TableAdmin:
    """The table admin RPCs; each takes a raw request message and returns the response."""

    def __init__(
        self,
        client: AsyncClient,
        namespaces: Namespaces | None = None,
        instances: InstanceAdmin | None = None,
    ) -> None:
        self._client = client
        self._ns = namespaces or Namespaces()
        self._instances = instances or InstanceAdmin(client, self._ns)
        #: CreateBackup, GetBackup, ListBackups, UpdateBackup, DeleteBackup, RestoreTable and
        #: CopyBackup.
        self.backups = BackupAdmin(client, self._ns, self._instances)

    async def _name(self, table_name: str) -> tuple[TableName, str]:
        """The parsed name and the stored tabletstore table it names; PermissionDenied if it
        is in another principal's instance."""
        name = parse_table_name(table_name)
        await self._instances.check_access(name.project, name.instance)
        return name, self._ns.table(name)

    async def create_table(self, req: Any) -> Any:
        project, instance = parse_instance_name(req.parent)
        name = TableName(project, instance, check_table_id(req.table_id))
        stored = self._ns.table(name)
        families = [
            ColumnFamily.model_validate(
                {
                    "name": fid,
                    "gc_rule": family_from_pb(fid, fam),
                    "value_type": value_type_from_pb(fid, fam),
                    "acl": _caller_acl(),
                }
            )
            for fid, fam in sorted(req.table.column_families.items())
        ]
        if req.table.granularity == 2:  # MICROS
            raise InvalidArgument("tabletstore tables have MILLIS timestamp granularity")
        splits = sorted({bytes(s.key) for s in req.initial_splits if s.key})
        await self._instances.register_implicitly(project, instance)
        await self._client.create_table(stored, families, split_keys=splits)
        return table_to_pb(name, await self._client.describe_table(stored), 0)

    async def get_table(self, req: Any) -> Any:
        name, stored = await self._name(req.name)
        return table_to_pb(name, await self._client.describe_table(stored), req.view)

    async def list_tables(self, req: Any) -> Any:
        project, instance = parse_instance_name(req.parent)
        await self._instances.check_access(project, instance)
        out = ListTablesResponsePB()
        view = req.view or _VIEW_NAME_ONLY
        stored = await self._client.list_tables()
        for table in self._ns.table_ids(project, instance, stored):
            name = TableName(project, instance, table)
            schema = (
                None
                if view == _VIEW_NAME_ONLY
                else await self._client.describe_table(self._ns.table(name))
            )
            out.tables.append(table_to_pb(name, schema, view))
        return out

    async def delete_table(self, req: Any) -> Any:
        _, stored = await self._name(req.name)
        await self._client.delete_table(stored)
        return empty_pb2.Empty()

    async def modify_column_families(self, req: Any) -> Any:
        name, stored = await self._name(req.name)
        if not req.modifications:
            raise InvalidArgument("ModifyColumnFamilies needs at least one modification")
        schema = await self._client.describe_table(stored)
        present = set(schema.families)
        plan: list[tuple[str, str, GcRule | None, str | None]] = []
        for mod in req.modifications:
            kind = mod.WhichOneof("mod")
            fid = mod.id
            if kind is None:
                raise InvalidArgument(f"modification of family {fid!r} has no create/update/drop")
            rule = family_from_pb(fid, getattr(mod, kind)) if kind != "drop" else None
            value_type = value_type_from_pb(fid, getattr(mod, kind)) if kind != "drop" else None
            if kind == "update" and fid in schema.families:
                current = schema.families[fid].value_type
                if getattr(mod, kind).HasField("value_type") and value_type != current:
                    raise InvalidArgument(
                        f"column family {name.table}:{fid} has value type {current or 'none'}; "
                        "a family's value type cannot change"
                    )
            if kind == "create":
                if fid in present:
                    raise AlreadyExists(f"column family {fid!r} already exists")
                present.add(fid)
            elif fid not in present:
                raise NotFound(f"table {name.table!r} has no column family {fid!r}")
            elif kind == "drop":
                present.discard(fid)
            plan.append((kind, fid, rule, value_type))
        for kind, fid, rule, value_type in plan:
            if kind == "create":
                family = ColumnFamily.model_validate(
                    {"name": fid, "gc_rule": rule, "value_type": value_type, "acl": _caller_acl()}
                )
                await self._client.create_family(stored, family)
            elif kind == "update":
                await self._client.set_gc_rule(stored, fid, rule)
            else:
                await self._client.delete_family(stored, fid)
        return table_to_pb(name, await self._client.describe_table(stored), 0)

    async def drop_row_range(self, req: Any) -> Any:
        _, stored = await self._name(req.name)
        target = req.WhichOneof("target")
        if target == "row_key_prefix" and req.row_key_prefix:
            prefix: bytes | None = bytes(req.row_key_prefix)
        elif target == "delete_all_data_from_table" and req.delete_all_data_from_table:
            prefix = None
        else:
            raise InvalidArgument(
                "DropRowRange needs a non-empty row_key_prefix or delete_all_data_from_table"
            )
        table = self._client.table(stored)
        # One empty cell per row is enough to learn the row's key.
        keys_only = Chain([CellsPerRowLimit(1), StripValue()])
        batch: list[RowMutation] = []
        async for row in table.read_rows(prefix=prefix, filter=keys_only):
            batch.append(RowMutation(row.key, (DeleteRow(),)))
            if len(batch) >= DROP_BATCH_ROWS:
                await table.mutate_rows(batch)
                batch = []
        if batch:
            await table.mutate_rows(batch)
        return empty_pb2.Empty()

    async def generate_consistency_token(self, req: Any) -> Any:
        _, stored = await self._name(req.name)
        schema = await self._client.describe_table(stored)  # NOT_FOUND for a missing table
        if schema.replica_of is None:
            return GenerateConsistencyTokenResponsePB(consistency_token=CONSISTENCY_TOKEN)
        token = f"{REPLICA_TOKEN}{stored}/{wall_time():.6f}"
        return GenerateConsistencyTokenResponsePB(consistency_token=token)

    async def check_consistency(self, req: Any) -> Any:
        _, stored = await self._name(req.name)
        await self._client.describe_table(stored)
        token = req.consistency_token
        if token == CONSISTENCY_TOKEN:
            return CheckConsistencyResponsePB(consistent=True)
        if not token.startswith(REPLICA_TOKEN):
            raise InvalidArgument(f"unknown consistency token {token!r}")
        table, _, instant = token[len(REPLICA_TOKEN) :].rpartition("/")
        if table != stored:
            raise InvalidArgument(
                f"consistency token {token!r} was generated for another table ({table!r})"
            )
        try:
            made = float(instant)
        except ValueError as exc:
            raise InvalidArgument(f"unknown consistency token {token!r}") from exc
        progress = await load_progress(self._client, stored)
        if progress is None:
            consistent = False  # its replicator has not started yet
        elif progress.state == "promoted":
            consistent = True  # a primary now: nothing more will arrive from the old source
        else:
            consistent = progress.applied_watermark() >= made
        return CheckConsistencyResponsePB(consistent=consistent)
