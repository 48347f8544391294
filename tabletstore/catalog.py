"""The catalog: table schemas and tablet records, kept in the coordination layer (§4, §5.1).

The paper keeps schemas and ACLs in Chubby (§4) and tablet records in the METADATA table
(§5.1). Here, schemas live under ``schemas/<table>`` and tablet records under
``tablets/<table-id>/<tablet-id>`` in the coordinator (etcd, or the embedded coordinator).
Every write is a transaction (DESIGN.md §6 rule 2):

* creating a table succeeds only if its schema key is absent;
* a tablet record update succeeds only if the stored record still carries the epoch the
  updater holds — a zombie worker's late update is rejected with ``Fenced``.

A table has a name (what users say) and an id (what object keys and records use), so a table
deleted and created again never meets the old one's objects.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator, Delete, Put, absent, mod_revision_is
from tabletstore.errors import (
    AlreadyExists,
    Corruption,
    Fenced,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
)
from tabletstore.metadata import TabletRecord
from tabletstore.schema import TableSchema

__all__ = ["Catalog", "ClusterSettings", "TableInfo"]


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A table as the catalog knows it."""

    table_id: str
    schema: TableSchema
    #: The coordinator revision of the schema key (for compare-and-swap schema changes).
    revision: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"table_id": self.table_id, "schema": self.schema.model_dump(mode="json")},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, revision: int = 0) -> TableInfo:
        try:
            d = json.loads(data)
            return cls(d["table_id"], TableSchema.model_validate(d["schema"]), revision)
        except (KeyError, TypeError, ValueError) as exc:
            raise Corruption(f"malformed table schema record: {exc}") from exc


class Catalog:
    """Schemas and tablet records over a :class:`Coordinator`. Also a ``TabletCatalog``."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coord = coordinator

    # ------------------------------------------------------------------ tables

    async def create_table(self, schema: TableSchema, records: list[TabletRecord]) -> TableInfo:
        """Create a table with its initial tablets; AlreadyExists if the name is taken."""
        if not records:
            raise InvalidArgument("a table needs at least one tablet")
        table_id = records[0].table_id
        info = TableInfo(table_id, schema)
        key = paths.schema(schema.name)
        ops: list[Put | Delete] = [Put(key, info.to_bytes())]
        ops += [Put(paths.tablet(r.table_id, r.tablet_id), r.to_bytes()) for r in records]
        result = await self._coord.txn([absent(key)], ops, [])
        if not result.succeeded:
            raise AlreadyExists(f"table {schema.name!r} already exists")
        return await self.get_table(schema.name)

    @staticmethod
    def new_table_id(name: str) -> str:
        return f"{name}-{uuid.uuid4().hex[:12]}"

    async def get_table(self, name: str) -> TableInfo:
        kv = await self._coord.get(paths.schema(name))
        if kv is None:
            raise NotFound(f"table {name!r} does not exist")
        return TableInfo.from_bytes(kv.value, kv.mod_revision)

    async def list_tables(self) -> list[TableInfo]:
        kvs = await self._coord.get_prefix(paths.SCHEMAS)
        return [TableInfo.from_bytes(kv.value, kv.mod_revision) for kv in kvs]

    async def update_schema(self, old: TableInfo, schema: TableSchema) -> TableInfo:
        """Replace a table's schema if nobody changed it since ``old`` was read."""
        key = paths.schema(old.schema.name)
        new = TableInfo(old.table_id, schema)
        result = await self._coord.txn(
            [mod_revision_is(key, old.revision)], [Put(key, new.to_bytes())], []
        )
        if not result.succeeded:
            raise PreconditionFailed(
                f"schema of table {old.schema.name!r} changed concurrently; read it again"
            )
        return await self.get_table(schema.name)

    async def delete_table(self, name: str) -> TableInfo:
        """Remove a table's schema and tablet records. Its objects become garbage."""
        info = await self.get_table(name)
        result = await self._coord.txn(
            [mod_revision_is(paths.schema(name), info.revision)],
            [
                Delete(paths.schema(name)),
                Delete(paths.tablets_prefix(info.table_id), prefix=True),
            ],
            [],
        )
        if not result.succeeded:
            raise PreconditionFailed(f"table {name!r} changed while being deleted; try again")
        return info

    # ------------------------------------------------------------------ servers

    async def live_workers(self) -> dict[str, str]:
        """worker id -> address: the servers directory (§5.2)."""
        kvs = await self._coord.get_prefix(paths.SERVERS)
        return {paths.parse_server(kv.key): kv.value.decode() for kv in kvs}

    async def master_address(self) -> str | None:
        """The elected master's address, or None when no master holds the lock."""
        leader = await self._coord.election(paths.MASTER_ELECTION).leader()
        return None if leader is None else leader.value.decode()

    # ------------------------------------------------------------------ tablets

    async def list_tablets(self, table_id: str) -> list[TabletRecord]:
        """The table's tablet records in row order."""
        kvs = await self._coord.get_prefix(paths.tablets_prefix(table_id))
        records = [TabletRecord.from_bytes(kv.value) for kv in kvs]
        records.sort(key=lambda r: r.start_row)
        return records

    async def get_tablet(self, table_id: str, tablet_id: str) -> TabletRecord:
        kv = await self._coord.get(paths.tablet(table_id, tablet_id))
        if kv is None:
            raise NotFound(f"tablet {table_id}/{tablet_id} does not exist")
        return TabletRecord.from_bytes(kv.value)

    async def update(self, old: TabletRecord, new: TabletRecord) -> TabletRecord:
        """Store ``new`` if the stored record still has ``old``'s epoch (fencing rule 2)."""
        key = paths.tablet(old.table_id, old.tablet_id)
        kv = await self._coord.get(key)
        if kv is None:
            raise Fenced(f"tablet {old.table_id}/{old.tablet_id} no longer exists")
        current = TabletRecord.from_bytes(kv.value)
        if current.epoch != old.epoch:
            raise Fenced(
                f"tablet {old.tablet_id} is at epoch {current.epoch}, not {old.epoch}: "
                "another worker owns it now"
            )
        result = await self._coord.txn(
            [mod_revision_is(key, kv.mod_revision)], [Put(key, new.to_bytes())], []
        )
        if not result.succeeded:
            # Someone wrote in between; re-check the epoch once (it may have been our own
            # event write racing a compaction of the same owner, which the tablet serializes).
            return await self.update(old, new)
        return new

    async def replace_tablets(self, old: list[TabletRecord], new: list[TabletRecord]) -> None:
        """Atomically swap a set of records for another (splits and merges, §5.2)."""
        compares = []
        for rec in old:
            key = paths.tablet(rec.table_id, rec.tablet_id)
            kv = await self._coord.get(key)
            if kv is None or TabletRecord.from_bytes(kv.value).epoch != rec.epoch:
                raise Fenced(f"tablet {rec.tablet_id} changed owner during a split or merge")
            compares.append(mod_revision_is(key, kv.mod_revision))
        new_keys = {paths.tablet(r.table_id, r.tablet_id) for r in new}
        ops: list[Put | Delete] = [
            Delete(paths.tablet(r.table_id, r.tablet_id))
            for r in old
            if paths.tablet(r.table_id, r.tablet_id) not in new_keys
        ]
        ops += [Put(paths.tablet(r.table_id, r.tablet_id), r.to_bytes()) for r in new]
        result = await self._coord.txn(compares, ops, [])
        if not result.succeeded:
            raise Fenced("tablet records changed during a split or merge; try again")


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """What every process of a cluster reads at start: where the objects live."""

    store_url: str

    async def save(self, coordinator: Coordinator) -> None:
        await coordinator.put(
            paths.setting("cluster"), json.dumps({"store_url": self.store_url}).encode()
        )

    @classmethod
    async def load(cls, coordinator: Coordinator) -> ClusterSettings:
        kv = await coordinator.get(paths.setting("cluster"))
        if kv is None:
            raise NotFound(
                f"no cluster is set up at {getattr(coordinator, 'url', 'the coordinator')}: "
                "start a master with --store first (tabletstore master --store URL)"
            )
        try:
            return cls(store_url=json.loads(kv.value)["store_url"])
        except (KeyError, TypeError, ValueError) as exc:
            raise Corruption(f"malformed cluster settings: {exc}") from exc
