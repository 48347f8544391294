"""The catalog: table schemas in the coordinator, tablet records in METADATA (§4, §5.1).

Schemas (and ACLs) live in the coordinator at ``schemas/<table>``, as the paper keeps them in
Chubby (§4). Tablet records live at three levels (``metadata_table`` has the layout):

=======================  ===================================  ===============================
record of                stored in                            conditional update
=======================  ===================================  ===============================
the root tablet          coordinator key ``root``             transaction: stored epoch ==
                                                              updater's, compare-on-revision
another METADATA tablet  its row in the root tablet           check-and-mutate, predicate
a user tablet            its row in a METADATA tablet         ``epoch == updater's epoch``
=======================  ===================================  ===============================

Either way a zombie's late update is rejected with ``Fenced`` (docs/architecture/design.md §6 rule
2). METADATA rows are reached through :class:`MetadataRows` (``client.location.LocationCache``: the
same three-level walk clients use), so METADATA writes are durable through the serving worker's
commit log like any other write.

Operations that touch more than one row or store are ordered so that a crash between steps
leaves nothing a reader can misread:

* **create table**: the tablet rows first (under a fresh table id nobody can name yet), then
  the schema with a create-if-absent transaction. A crash in between leaves unreachable rows
  (garbage); a lost race deletes them again.
* **delete table**: the schema first, then the rows; leftovers are likewise unreachable.
* **split** (:meth:`Catalog.replace_tablets`): bigtable relies on single-row atomicity, and so
  do we. (1) One check-and-mutate on the parent's row — which keeps its key, i.e. its end row —
  conditional on the parent's epoch, shrinks its range to the last new tablet and records the
  other new tablets as a *split intent* (column ``split``). (2) Each new tablet's row is
  inserted if absent. (3) The intent is cleared, again conditional on the epoch. Between (1)
  and (3) readers treat the intent's records as rows (without a location: "not served yet");
  anyone listing the table completes an unfinished split (steps 2-3 are idempotent), so a
  crash at any point leaves either the old tablet or the new ones, never a hole or a zombie's
  split.

Without a :class:`MetadataRows` (``Catalog(coordinator)``), every record is kept in the
coordinator under ``tablets/<table-id>/<tablet-id>`` instead: that standalone mode serves tests
and tools that run a tablet with no worker to host METADATA. Masters, workers and clients
always pass one.

A table has a name (what users say) and an id (what object keys and records use), so a table
deleted and created again never meets the old one's objects.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator, Delete, Put, absent, mod_revision_is
from tabletstore.data.filters import RowFilter
from tabletstore.data.model import DeleteRow, Mutation, Row
from tabletstore.data.schema import HISTORY_OFF, TableSchema
from tabletstore.errors import (
    AlreadyExists,
    Corruption,
    Fenced,
    Indeterminate,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    Unavailable,
    Unimplemented,
)
from tabletstore.metadata import rows as mt
from tabletstore.metadata.record import TabletRecord

__all__ = [
    "HISTORY_SETTING",
    "SCHEMA_RECORD_VERSION",
    "Catalog",
    "ClusterSettings",
    "MetadataRows",
    "TableInfo",
]

#: The setting holding the database's default history window.
HISTORY_SETTING = "history"

#: Version of stored table schema records: 1 (no ``version`` key) before aggregate families,
#: 2 with them (``ColumnFamily.value_type``), 3 with a history window (``TableSchema.history``),
#: 4 with a change retention (``TableSchema.changes``), 5 with a history opt-out (``history``
#: 0, ``HISTORY_OFF``: no history whatever the database's default; a build that reads up to 4
#: refuses the record rather than apply the default), 6 for a replica
#: (``TableSchema.replica_of``; a build that reads up to 5 refuses the record rather than take
#: client writes on a replica). A record is stored as the highest version whose feature it
#: uses. All are read.
SCHEMA_RECORD_VERSION = 6

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A table as the catalog knows it."""

    table_id: str
    schema: TableSchema
    #: The coordinator revision of the schema key (for compare-and-swap schema changes).
    revision: int = 0

    def to_bytes(self) -> bytes:
        """The stored record, as the highest version whose feature the schema uses: a
        replica's schema is stored as version 6, one that opts out of the database's default
        history window as version 5, one with a change retention as version 4, one with a
        history window as version 3, one with an aggregate family as version 2 (older builds
        cannot read them and must refuse the record rather than take client writes on a
        replica, or drop the opt-out, the retention, the window or the value type); any other
        schema keeps version 1's bytes (no ``version`` key)."""
        record: dict[str, object] = {
            "table_id": self.table_id,
            "schema": self.schema.model_dump(mode="json"),
        }
        if self.schema.replica_of is not None:
            record["version"] = 6
        elif self.schema.history == HISTORY_OFF:
            record["version"] = 5
        elif self.schema.changes is not None:
            record["version"] = 4
        elif self.schema.history is not None:
            record["version"] = 3
        elif any(f.value_type is not None for f in self.schema.families.values()):
            record["version"] = 2
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, revision: int = 0) -> TableInfo:
        try:
            d = json.loads(data)
            version = d.get("version", 1)
            if not isinstance(version, int) or not 1 <= version <= SCHEMA_RECORD_VERSION:
                raise Unimplemented(
                    f"table schema record version {version!r} is newer than this build "
                    f"reads (up to {SCHEMA_RECORD_VERSION}); upgrade tabletstore"
                )
            return cls(d["table_id"], TableSchema.model_validate(d["schema"]), revision)
        except (KeyError, TypeError, ValueError) as exc:
            raise Corruption(f"malformed table schema record: {exc}") from exc


class MetadataRows(Protocol):
    """Reads and single-row transactions on METADATA rows, wherever they are served.

    Any ``Unavailable`` (``NotServing`` included) means nothing was applied; only
    ``Indeterminate`` means a write may have been (the Transport contract, rpc/transport.py)."""

    async def read_rows(
        self,
        start: bytes,
        end: bytes,
        *,
        start_inclusive: bool = True,
        end_inclusive: bool = True,
        limit: int | None = None,
    ) -> list[Row]: ...

    async def check_and_mutate(
        self,
        key: bytes,
        predicate: RowFilter | None,
        true_mutations: Sequence[Mutation],
        false_mutations: Sequence[Mutation],
    ) -> bool: ...

    async def mutate_row(self, key: bytes, mutations: Sequence[Mutation]) -> None: ...


def _reserved(name: str) -> None:
    if name == mt.METADATA_TABLE:
        raise InvalidArgument(f"table name {name!r} is reserved for the system table")


class Catalog:
    """Schemas and tablet records. Also a ``TabletCatalog`` (``tablet.py``'s seam)."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        metadata: MetadataRows | None = None,
        retry_deadline: float = 30.0,
    ) -> None:
        self._coord = coordinator
        self._md = metadata
        #: Seconds METADATA operations keep retrying while METADATA is not served.
        self.retry_deadline = retry_deadline

    @property
    def coordinator(self) -> Coordinator:
        return self._coord

    @property
    def tiered(self) -> bool:
        """Whether records live in METADATA (else in the coordinator: standalone mode)."""
        return self._md is not None

    # ------------------------------------------------------------------ tables

    async def create_table(self, schema: TableSchema, records: list[TabletRecord]) -> TableInfo:
        """Create a table with its initial tablets; AlreadyExists if the name is taken."""
        if not records:
            raise InvalidArgument("a table needs at least one tablet")
        table_id = records[0].table_id
        info = TableInfo(table_id, schema)
        key = paths.schema(schema.name)
        if self._md is None:
            ops: list[Put | Delete] = [Put(key, info.to_bytes())]
            ops += [Put(paths.tablet(r.table_id, r.tablet_id), r.to_bytes()) for r in records]
            result = await self._coord.txn([absent(key)], ops, [])
            if not result.succeeded:
                raise AlreadyExists(f"table {schema.name!r} already exists")
            return await self.get_table(schema.name)
        _reserved(schema.name)
        if await self._coord.get(key) is not None:
            raise AlreadyExists(f"table {schema.name!r} already exists")
        # The rows inserted at once: the worker commits concurrent mutations of a METADATA
        # tablet in one log write, so a table of many tablets costs about one write, not one
        # per tablet. Each insert finishes (or fails) before any error is raised.
        inserted = await asyncio.gather(*map(self._insert, records), return_exceptions=True)
        for outcome in inserted:
            if isinstance(outcome, BaseException):
                raise outcome
        result = await self._coord.txn([absent(key)], [Put(key, info.to_bytes())], [])
        if not result.succeeded:
            for rec in records:
                await self._delete_row(rec.row_key)
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

    async def _all_tables(self) -> list[TableInfo]:
        kvs = await self._coord.get_prefix(paths.SCHEMAS)
        return [TableInfo.from_bytes(kv.value, kv.mod_revision) for kv in kvs]

    async def list_tables(self) -> list[TableInfo]:
        """Users' tables (the METADATA system table is not listed)."""
        return [t for t in await self._all_tables() if t.table_id != mt.METADATA_TABLE_ID]

    async def table_by_id(self, table_id: str) -> TableInfo:
        """The table with this id (METADATA included); NotFound if it was deleted.

        One coordinator read of the schema its name gives (an id is ``<name>-<hex>``,
        :meth:`new_table_id`): every load of a tablet asks, so a scan of every schema would
        cost each load O(tables). Only an id of another form is looked for among them all."""
        name = (
            mt.METADATA_TABLE if table_id == mt.METADATA_TABLE_ID else table_id.rpartition("-")[0]
        )
        try:
            kv = await self._coord.get(paths.schema(name)) if name else None
        except InvalidArgument:  # not a table name: no id of ours
            kv = None
        if kv is not None:
            info = TableInfo.from_bytes(kv.value, kv.mod_revision)
            if info.table_id == table_id:
                return info
        for info in await self._all_tables():
            if info.table_id == table_id:
                return info
        raise NotFound(f"table {table_id} no longer exists")

    async def history_default(self) -> float | None:
        """The database's default history window in seconds (None: none), the setting
        ``settings/history`` (master/checkpoints.py): it applies to every table without a
        window of its own. Read afresh on each call, so whoever reads it sees a change at once."""
        kv = await self._coord.get(paths.setting(HISTORY_SETTING))
        if kv is None:
            return None
        try:
            seconds = json.loads(kv.value)["default"]
            return None if seconds is None else float(seconds)
        except (KeyError, TypeError, ValueError) as exc:
            raise Corruption(f"malformed history setting: {exc}") from exc

    async def set_history_default(self, seconds: float | None) -> None:
        """Write the database's default history window (the master's, master/checkpoints.py)."""
        value = json.dumps({"default": seconds}).encode()
        await self._coord.put(paths.setting(HISTORY_SETTING), value)

    async def update_schema(self, old: TableInfo, schema: TableSchema) -> TableInfo:
        """Replace a table's schema if nobody changed it since ``old`` was read."""
        _reserved(old.schema.name)
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
        """Remove a table's schema, then its tablet records. Its objects become garbage."""
        _reserved(name)
        info = await self.get_table(name)
        ops: list[Put | Delete] = [Delete(paths.schema(name))]
        if self._md is None:
            ops.append(Delete(paths.tablets_prefix(info.table_id), prefix=True))
        result = await self._coord.txn(
            [mod_revision_is(paths.schema(name), info.revision)], ops, []
        )
        if not result.succeeded:
            raise PreconditionFailed(f"table {name!r} changed while being deleted; try again")
        if self._md is not None:
            for row in await self._rows_of(info.table_id):
                await self._delete_row(row.key)
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
        """The table's tablet records in row order. In METADATA, a split left half-committed
        is completed first (see the module docstring)."""
        if self._md is None:
            kvs = await self._coord.get_prefix(paths.tablets_prefix(table_id))
            records = [TabletRecord.from_bytes(kv.value) for kv in kvs]
            records.sort(key=lambda r: r.start_row)
            return records
        out: dict[bytes, TabletRecord] = {}
        if table_id == mt.METADATA_TABLE_ID:
            root = await self._root()
            out[root.row_key] = root
        rows = await self._rows_of(table_id)
        for row in rows:
            if row.pending:
                await self._finish_split(row)
            for rec in row.pending:
                out.setdefault(rec.row_key, rec)
            out[row.key] = row.record
        return await self._finish_merges(_in_range_order(list(out.values())))

    async def get_tablet(
        self, table_id: str, tablet_id: str, *, row_key: bytes | None = None
    ) -> TabletRecord:
        """The tablet's record. With ``row_key``, the METADATA row that should hold it (the
        key of its end row: ``metadata_row_key``), one row is read instead of every row of the
        table; if that row holds another tablet now (it split or merged since the caller
        looked), the table is listed as without it."""
        if self._md is None:
            kv = await self._coord.get(paths.tablet(table_id, tablet_id))
            if kv is None:
                raise NotFound(f"tablet {table_id}/{tablet_id} does not exist")
            return TabletRecord.from_bytes(kv.value)
        if mt.level(table_id, tablet_id) == 1:
            return await self._root()
        if row_key is not None:
            row = await self._read_row(row_key)
            if row is not None and not row.pending and row.record.tablet_id == tablet_id:
                return row.record
        for rec in await self.list_tablets(table_id):
            if rec.tablet_id == tablet_id:
                return rec
        raise NotFound(f"tablet {table_id}/{tablet_id} does not exist")

    async def update(
        self, old: TabletRecord, new: TabletRecord, *, wait: float | None = None
    ) -> TabletRecord:
        """Store ``new`` if the stored record still has ``old``'s epoch (fencing rule 2).
        ``wait``: seconds a METADATA tablet's refusals are retried (default
        :attr:`retry_deadline`); then Unavailable, with nothing applied."""
        if self._md is None:
            return await self._update_in_coordinator(
                paths.tablet(old.table_id, old.tablet_id), old, new
            )
        if mt.level(old.table_id, old.tablet_id) == 1:
            return await self._update_in_coordinator(paths.ROOT_TABLET, old, new)
        if old.row_key != new.row_key:
            raise InvalidArgument(
                f"tablet {old.tablet_id}: an update cannot change the end row (its METADATA "
                "row key); splits go through replace_tablets"
            )
        await self._cas(old, mt.record_mutations(new), new, wait=wait)
        return new

    async def _update_in_coordinator(
        self, key: str, old: TabletRecord, new: TabletRecord
    ) -> TabletRecord:
        while True:
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
            # On a lost race, re-check the epoch: the other write may have been our own event
            # write racing a compaction of the same owner, which the tablet serializes.
            if result.succeeded:
                return new

    async def replace_tablets(self, old: list[TabletRecord], new: list[TabletRecord]) -> None:
        """Atomically replace a tablet by the tablets it splits into (§5.2).

        ``new`` must tile ``old``'s range; the last new tablet keeps the parent's end row (its
        METADATA row). Fenced if the parent changed owner."""
        if self._md is None:
            await self._replace_in_coordinator(old, new)
            return
        if len(old) > 1 and len(new) == 1:
            await self._merge(old, new[0])
            return
        if len(old) != 1 or not new:
            raise InvalidArgument(
                "METADATA commits splits (one tablet into one or more) and merges (adjacent "
                "tablets into one)"
            )
        parent = old[0]
        if mt.level(parent.table_id, parent.tablet_id) == 1:
            raise InvalidArgument("the root tablet never splits")
        parts = sorted(new, key=lambda r: r.start_row)
        bounds = [parent.start_row] + [r.end_row for r in parts]
        if (
            any(r.table_id != parent.table_id for r in parts)
            or [r.start_row for r in parts] != bounds[:-1]
            or bounds[-1] != parent.end_row
        ):
            raise InvalidArgument(f"the new tablets do not tile tablet {parent.tablet_id}'s range")
        last, front = parts[-1], tuple(parts[:-1])
        muts = mt.record_mutations(last) + (mt.split_mutations(front) if front else ())
        await self._cas(parent, muts, last)
        if front:
            await self._finish_split(mt.MetadataRow(parent.row_key, last, front))

    async def _merge(self, old: list[TabletRecord], merged: TabletRecord) -> None:
        """Merge adjacent tablets (§5.2) with single-row steps: (1) the last one's row --
        whose key, the end row, the merged tablet keeps -- becomes the merged record,
        conditional on its epoch; (2) each other one's row is deleted, conditional on its
        epoch. Between the steps the leftover rows lie inside the merged range; lookups still
        find them first (unserved: clients retry) and :meth:`list_tablets` finishes the merge
        by deleting them, so a crash in between leaves no hole and no overlap anyone serves.
        The caller (the master) has unloaded the tablets first."""
        parts = sorted(old, key=lambda r: r.start_row)
        adjacent = all(a.end_row == b.start_row for a, b in itertools.pairwise(parts))
        if (
            not adjacent
            or any(r.table_id != merged.table_id or mt.level(r.table_id, r.tablet_id) != 3
                   for r in parts)
            or (merged.start_row, merged.end_row) != (parts[0].start_row, parts[-1].end_row)
        ):  # fmt: skip
            raise InvalidArgument("only adjacent user tablets merge, into their whole range")
        await self._cas(parts[-1], mt.record_mutations(merged), merged)
        for rec in parts[:-1]:
            await self._delete_leftover(rec)

    async def _delete_leftover(self, rec: TabletRecord) -> None:
        """Delete a merged-away tablet's row if it still has ``rec``'s epoch."""
        md = self._metadata
        predicate = mt.epoch_is(rec.epoch)
        await self._retry(lambda: md.check_and_mutate(rec.row_key, predicate, (DeleteRow(),), ()))

    async def _finish_merges(self, records: list[TabletRecord]) -> list[TabletRecord]:
        """Drop (and delete) rows a merge left behind: in ``records`` (in the order of
        :func:`_in_range_order`) a record lying within an earlier one's range."""
        out: list[TabletRecord] = []
        for rec in records:
            if out and out[-1].table_id == rec.table_id and _covers(out[-1], rec):
                await self._delete_leftover(rec)
                continue
            out.append(rec)
        return out

    async def _replace_in_coordinator(
        self, old: list[TabletRecord], new: list[TabletRecord]
    ) -> None:
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

    # ------------------------------------------------------------------ bootstrap

    async def bootstrap_root(self, at: float) -> bool:
        """Create METADATA's schema and the root tablet's record if absent (first start of a
        master). Returns whether this call created them."""
        key = paths.schema(mt.METADATA_TABLE)
        info = TableInfo(mt.METADATA_TABLE_ID, mt.metadata_schema())
        result = await self._coord.txn(
            [absent(key), absent(paths.ROOT_TABLET)],
            [Put(key, info.to_bytes()), Put(paths.ROOT_TABLET, mt.root_record(at).to_bytes())],
            [],
        )
        return result.succeeded

    async def ensure_metadata_tablets(self, records: Sequence[TabletRecord]) -> bool:
        """Insert the METADATA tablets' rows into the root unless the last one (unbounded) is
        there already. Inserts are create-if-absent and made in key order, so a bootstrap cut
        short is finished by the next call. Returns whether rows were inserted."""
        _, hi = mt.table_range(mt.METADATA_TABLE_ID)
        rows = await self._retry(lambda: self._metadata.read_rows(hi, hi))
        if rows:
            return False
        planned = sorted(records, key=lambda r: r.start_row)
        # A bootstrap cut short by a master that split METADATA elsewhere: finishing it with
        # other bounds would make overlapping METADATA tablets.
        begun = [
            (d.record.start_row, d.record.end_row)
            for d in await self._rows_of(mt.METADATA_TABLE_ID)
        ]
        if begun != [(r.start_row, r.end_row) for r in planned[: len(begun)]]:
            raise InvalidArgument(
                "METADATA's creation was begun with other split keys "
                f"(tablets {begun}); give every master the same METADATA splits"
            )
        for rec in planned[len(begun) :]:
            await self._insert(rec)
        return True

    async def migrate_coordinator_records(self) -> int:
        """Move records an older version kept at ``tablets/...`` into METADATA (each inserted
        if absent, then its key deleted). Returns how many moved."""
        kvs = await self._coord.get_prefix(paths.TABLETS)
        for kv in kvs:
            await self._insert(TabletRecord.from_bytes(kv.value))
            await self._coord.txn([mod_revision_is(kv.key, kv.mod_revision)], [Delete(kv.key)], [])
        return len(kvs)

    # ------------------------------------------------------------------ METADATA rows

    @property
    def _metadata(self) -> MetadataRows:
        if self._md is None:
            raise InvalidArgument("this catalog keeps records in the coordinator (no METADATA)")
        return self._md

    async def _root(self) -> TabletRecord:
        kv = await self._coord.get(paths.ROOT_TABLET)
        if kv is None:
            raise NotFound("the METADATA table has no root tablet yet (no master has run)")
        return TabletRecord.from_bytes(kv.value)

    async def _rows_of(self, table_id: str) -> list[mt.MetadataRow]:
        lo, hi = mt.table_range(table_id)
        rows = await self._retry(lambda: self._metadata.read_rows(lo, hi, start_inclusive=False))
        return [d for d in map(mt.decode_row, rows) if d is not None]

    async def _read_row(self, key: bytes) -> mt.MetadataRow | None:
        rows = await self._retry(lambda: self._metadata.read_rows(key, key, limit=1))
        return mt.decode_row(rows[0]) if rows else None

    async def _retry(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        only: tuple[type[Exception], ...] = (Unavailable, Indeterminate),
        wait: float | None = None,
    ) -> T:
        """Run ``op`` until it succeeds, retrying ``only`` errors (by default refusals and no
        answer alike: right for reads and idempotent writes; ``(Unavailable,)``: refusals only,
        nothing was applied) with back-off for ``wait`` seconds (default: the deadline) — a
        METADATA tablet being reassigned is a pause, not a failure. After the deadline:
        Unavailable, or Indeterminate if the last attempt got no answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.retry_deadline if wait is None else wait)
        attempt = 0
        while True:
            try:
                return await op()
            except only as exc:
                if loop.time() >= deadline:
                    late = Indeterminate if isinstance(exc, Indeterminate) else Unavailable
                    raise late(f"METADATA not reachable within the deadline: {exc}") from exc
            await asyncio.sleep(min(0.5, 0.01 * 2**attempt))
            attempt += 1

    async def _delete_row(self, key: bytes) -> None:
        md = self._metadata
        await self._retry(lambda: md.mutate_row(key, (DeleteRow(),)))

    async def _insert(self, rec: TabletRecord) -> None:
        """Insert ``rec``'s row if absent (idempotent, so ambiguous failures are retried)."""
        md, muts = self._metadata, mt.record_mutations(rec)
        await self._retry(lambda: md.check_and_mutate(rec.row_key, None, (), muts))

    async def _cas(
        self,
        old: TabletRecord,
        mutations: Sequence[Mutation],
        expect: TabletRecord,
        *,
        wait: float | None = None,
    ) -> None:
        """Apply ``mutations`` to ``old``'s row if it still has ``old``'s epoch; Fenced if not.
        Refusals are retried (nothing was applied); an ambiguous failure (Indeterminate) is
        resolved by reading the row back: it holds ``expect`` (done), still ``old``'s epoch
        (not applied yet: try again) or another epoch (Fenced).

        "Not applied yet" is not "never applied": the unanswered request may still be in the
        METADATA tablet's commit log (a slow object store) when the row is read back, and land
        before the retry is served. After an unanswered attempt, a retry that finds the row
        holding ``expect`` — or, for a takeover, at ``expect``'s new epoch, which is this
        caller's claim and nobody else's — finds its own write: done, not Fenced.

        Unanswered attempts are tried again until one deadline (``wait``, else the catalog's
        retry deadline) has passed since the first: then the change is Indeterminate, as one
        unanswered request is. Without it a METADATA tablet that never answered kept its caller
        (a load, a split's commit) retrying for ever."""
        key = old.row_key
        predicate = mt.epoch_is(old.epoch)
        unanswered = False
        loop = asyncio.get_running_loop()
        within = self.retry_deadline if wait is None else wait
        deadline = loop.time() + within
        attempt = 0
        while True:
            try:
                matched = await self._retry(
                    lambda: self._metadata.check_and_mutate(key, predicate, mutations, ()),
                    only=(Unavailable,),
                    wait=wait,
                )
            except Indeterminate as exc:
                unanswered = True
                current = await self._read_row(key)
                if current is not None and _holds(current.record, old, expect):
                    return
                if current is not None and current.record.epoch == old.epoch:
                    if loop.time() >= deadline:
                        raise Indeterminate(
                            f"tablet {old.tablet_id}: METADATA did not answer the change of its "
                            f"record within {within} s; it may still be applied"
                        ) from exc
                    await asyncio.sleep(min(0.5, 0.01 * 2**attempt))
                    attempt += 1
                    continue
                matched = False
            if matched:
                return
            current = await self._read_row(key)
            if unanswered and current is not None and _holds(current.record, old, expect):
                return
            raise Fenced(
                f"tablet {old.tablet_id} is at epoch "
                f"{'(deleted)' if current is None else current.record.epoch}, not {old.epoch}: "
                "another worker owns it now"
            )

    async def _finish_split(self, row: mt.MetadataRow) -> None:
        """Steps 2-3 of a split: insert the new tablets' rows, clear the intent."""
        for rec in row.pending:
            await self._insert(rec)
        clear = mt.clear_split_mutations()
        predicate = mt.epoch_is(row.record.epoch)
        # If the epoch moved on, the new owner's next listing finishes (idempotently) instead.
        await self._retry(lambda: self._metadata.check_and_mutate(row.key, predicate, clear, ()))


def _in_range_order(records: Sequence[TabletRecord]) -> list[TabletRecord]:
    """By start row; among equal starts the wider range first (a merged tablet before the
    rows its merge left behind)."""
    by_end = sorted(records, key=lambda r: (r.end_row is None, r.end_row or b""), reverse=True)
    return sorted(by_end, key=lambda r: r.start_row)


def _covers(outer: TabletRecord, inner: TabletRecord) -> bool:
    """Whether ``inner`` lies within ``outer``'s range (and is not ``outer``'s own row)."""
    if outer.row_key == inner.row_key or inner.start_row < outer.start_row:
        return False
    if outer.end_row is None:
        return True
    return inner.end_row is not None and inner.end_row <= outer.end_row


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


def _holds(current: TabletRecord, old: TabletRecord, expect: TabletRecord) -> bool:
    """Whether a row found holding ``current`` holds the update of ``old`` to ``expect``:
    that very record, or, when the update takes the tablet to a new epoch, any record at that
    epoch (an epoch is one claim's: only its holder writes records carrying it)."""
    return current == expect or (expect.epoch != old.epoch and current.epoch == expect.epoch)
