"""Requests and responses between clients, the master and tablet-server workers (§5, §8).

Frozen dataclasses, the same in-process and on the wire (the codec registers each with a
fixed type id, :data:`WIRE_TYPES`; those ids are part of the protocol). Data requests name the
tablet they are for, so a worker that no longer serves it answers ``NotServing`` and the client
refreshes its location (§5.1) — data never flows through the master.

Which method takes which request and answers what: the service Protocols of
``rpc/services.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel

from tabletstore.data.filters import RowFilter
from tabletstore.data.model import Cell, Mutation, ReadModifyWriteRule, Row, RowMutation
from tabletstore.data.query import RowRange
from tabletstore.data.schema import ColumnFamily, LocalityGroup, TableSchema
from tabletstore.errors import InvalidArgument, TabletStoreError, error_code, error_from_code
from tabletstore.metadata.catalog import TableInfo
from tabletstore.metadata.record import SSTableRef, TabletRecord

M = TypeVar("M", bound=BaseModel)

__all__ = [
    "AdoptCompactionRequest",
    # backups, restores and clones
    "BackupIdRequest",
    "BackupInfoMessage",
    # snapshots and bulk load (tabletstore.batch, §8)
    "BulkLoadRequest",
    "BulkLoadResponse",
    "BulkLoadTabletRequest",
    "BulkLoadTabletResponse",
    "CheckAndMutateRequest",
    "CheckAndMutateResponse",
    "CloneTableRequest",
    "CompactTableRequest",
    "CompactTabletRequest",
    "CopiedBackup",
    "CreateBackupRequest",
    "CreateSnapshotRequest",
    "CreateTableRequest",
    "DeleteSnapshotRequest",
    "EntryError",
    "HistoryDefaultMessage",
    "HistoryDefaultRequest",
    "LargeRow",
    "ListBackupsRequest",
    "ListBackupsResponse",
    "ListSnapshotsRequest",
    "ListSnapshotsResponse",
    "ListTablesRequest",
    "ListTablesResponse",
    "LoadTabletAtRequest",
    "LoadTabletRequest",
    "ModifyFamiliesRequest",
    "MutateRowsRequest",
    "MutateRowsResponse",
    "MutateTabletsRequest",
    "PointReadsRequest",
    "PointReadsResponse",
    "ReadModifyWriteRequest",
    "ReadRowsRequest",
    "RestoreTableRequest",
    "RowBatch",
    "RowPiece",
    "SampleRowKeysRequest",
    "SampleRowKeysResponse",
    "ScanProgress",
    "ServerStatusRequest",
    "ServerStatusResponse",
    "SetAdminsRequest",
    "SetChangesRequest",
    "SetHistoryRequest",
    "SetReplicaRequest",
    "SnapshotHoldRequest",
    "SnapshotInfoMessage",
    "SnapshotTablet",
    "SnapshotWriteRequest",
    "SnapshotWriteResponse",
    "TableInfoMessage",
    "TableNameRequest",
    "TabletKeys",
    "TabletMutations",
    "TabletStatus",
    "UnloadTabletRequest",
    "UpdateBackupRequest",
    "UpdateSchemaRequest",
]


@dataclass(frozen=True, slots=True)
class MutateRowsRequest:
    """Row mutations for rows of one tablet; each row atomic on its own (§3 batch writes)."""

    table_id: str
    tablet_id: str
    entries: tuple[RowMutation, ...]
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class EntryError:
    """Why one entry of a batch failed: its error's ``errors.ErrorCode`` and message."""

    index: int
    code: int
    message: str

    @classmethod
    def of(cls, index: int, exc: TabletStoreError) -> EntryError:
        return cls(index, int(error_code(exc)), str(exc))

    def exception(self) -> TabletStoreError:
        """The error this entry failed with (its class from the code)."""
        return error_from_code(self.code, self.message)


@dataclass(frozen=True, slots=True)
class MutateRowsResponse:
    """Per-entry failures (empty: every entry applied)."""

    errors: tuple[EntryError, ...] = ()


@dataclass(frozen=True, slots=True)
class TabletMutations:
    """The row mutations of one tablet inside a :class:`MutateTabletsRequest`."""

    table_id: str
    tablet_id: str
    entries: tuple[RowMutation, ...]


@dataclass(frozen=True, slots=True)
class MutateTabletsRequest:
    """Row mutations of several tablets of one worker in one request: a cluster client's
    concurrent ``mutate_row`` calls (client/coalesce.py). Each row atomic on its own,
    each acknowledged only once durable. ``identity`` applies to every part (the worker's guard
    replaces it by the proven one). Answered by a :class:`MutateRowsResponse` whose entry
    indexes count the parts' entries one after another (part 0's first, then part 1's...); a
    part refused as a whole (its tablet not served there) fails each of its entries alone."""

    parts: tuple[TabletMutations, ...]
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class ReadRowsRequest:
    """Rows of one tablet: the given keys and ranges, filtered server-side, at most ``limit``;
    in descending key order when ``reverse``; with ``ScanProgress`` items when ``stats``."""

    table_id: str
    tablet_id: str
    keys: tuple[bytes, ...] = ()
    ranges: tuple[RowRange, ...] = ()
    filter: RowFilter | None = None
    limit: int | None = None
    families: tuple[str, ...] | None = None
    identity: str | None = None
    reverse: bool = False
    #: Send ``ScanProgress`` items: after long filtered-out runs, and one last at the end.
    stats: bool = False


@dataclass(frozen=True, slots=True)
class RowBatch:
    """One stream item of whole rows (``read_rows``), or ``read_row``'s reply (0 or 1 row)."""

    rows: tuple[Row, ...]


@dataclass(frozen=True, slots=True)
class RowPiece:
    """One stream item carrying part of a row too large for one item (``rpc.row_pieces``).

    A large row is sent as consecutive pieces with the same ``key``, each holding the next
    cells in row order; ``last`` marks the row's final piece. When ``split_value`` is set, the
    piece's last cell holds only the beginning of its value: the next piece opens with the same
    cell (family, qualifier, timestamp, labels) holding the value's next bytes. No other item
    of the stream comes between the pieces of a row.
    """

    key: bytes
    cells: tuple[Cell, ...]
    split_value: bool
    last: bool


@dataclass(frozen=True, slots=True)
class ScanProgress:
    """A ``read_rows`` stream item (requests with ``stats``): the scan has read every row up to
    ``last_scanned`` (b"" if none), having seen ``rows_seen`` rows and ``cells_seen`` cells
    before the filter since the stream began. Sent after a long run of rows the filter removed
    (rows sent before it precede it) and once at the end of the stream. The client sums the
    last counts of each stream, and may resume a forward scan after ``last_scanned``."""

    last_scanned: bytes
    rows_seen: int
    cells_seen: int


@dataclass(frozen=True, slots=True)
class LargeRow:
    """``read_row``'s reply when the row is larger than one reply may be: read it with
    ``read_rows``, which streams it in pieces (the client does so by itself)."""

    key: bytes
    size: int


@dataclass(frozen=True, slots=True)
class TabletKeys:
    """The point reads of one tablet inside a :class:`PointReadsRequest`."""

    table_id: str
    tablet_id: str
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class PointReadsRequest:
    """Plain point reads (no filter, no family list) of several tablets of one worker in one
    request: a cluster client's concurrent ``read_row`` calls (client/coalesce.py).
    ``identity`` applies to every part (the worker's guard replaces it by the proven one)."""

    parts: tuple[TabletKeys, ...]
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class PointReadsResponse:
    """One answer per part, in order: what ``read_row`` of that tablet's keys would answer
    (a ``RowBatch`` of the rows with cells, in key order, or ``LargeRow``), or the part's own
    error (``EntryError`` whose ``index`` is the part's), so that one tablet that moved fails
    only its own callers."""

    answers: tuple[RowBatch | LargeRow | EntryError, ...]


@dataclass(frozen=True, slots=True)
class CheckAndMutateRequest:
    table_id: str
    tablet_id: str
    row: bytes
    predicate: RowFilter | None
    true_mutations: tuple[Mutation, ...]
    false_mutations: tuple[Mutation, ...]
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class CheckAndMutateResponse:
    matched: bool


@dataclass(frozen=True, slots=True)
class ReadModifyWriteRequest:
    table_id: str
    tablet_id: str
    row: bytes
    rules: tuple[ReadModifyWriteRule, ...]
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class SampleRowKeysRequest:
    table_id: str
    tablet_id: str


@dataclass(frozen=True, slots=True)
class SampleRowKeysResponse:
    """Row keys splitting the tablet into roughly equal parts, with the byte offset of each."""

    keys: tuple[bytes, ...]
    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LoadTabletRequest:
    """Master to worker: claim and serve this tablet (§5.2)."""

    table_id: str
    tablet_id: str


@dataclass(frozen=True, slots=True)
class LoadTabletAtRequest:
    """Master to worker: claim and serve this tablet, whose METADATA row is the one of its
    ``end_row`` (None: the table's last tablet), so the worker reads that one row for its record
    instead of every row of its table (protocol version 8, ``versions.LOAD_TABLET_AT_VERSION``;
    a worker of version 7 gets ``LoadTabletRequest``)."""

    table_id: str
    tablet_id: str
    end_row: bytes | None


@dataclass(frozen=True, slots=True)
class UnloadTabletRequest:
    """Master to worker: stop serving, minor-compacting first when ``flush`` (§5.2)."""

    table_id: str
    tablet_id: str
    flush: bool = True


@dataclass(frozen=True, slots=True)
class CompactTabletRequest:
    """Run a minor (``major=False``) or major compaction of a tablet now (§5.4)."""

    table_id: str
    tablet_id: str
    major: bool = False


@dataclass(frozen=True, slots=True)
class AdoptCompactionRequest:
    """To the tablet's worker: adopt a major compaction run elsewhere (a serverless function,
    ``master/remote_compaction.py``; ``Tablet.adopt_major``). It read the tablet's record at
    ``epoch`` and every SSTable it listed, ``read_json`` (``{group: [keys, newest first]}``),
    under the schema ``schema_json``, and wrote ``outputs_json`` (``{group: SSTableRef JSON}``).
    The worker commits it with its own epoch-conditional record update, or refuses it."""

    table_id: str
    tablet_id: str
    epoch: int
    schema_json: bytes
    read_json: bytes
    outputs_json: bytes

    @classmethod
    def of(
        cls,
        record: TabletRecord,
        schema: TableSchema,
        outputs: Mapping[str, SSTableRef],
    ) -> AdoptCompactionRequest:
        """The request for a rewrite of every SSTable ``record`` lists into ``outputs``."""
        read = {g: [r.key for r in refs] for g, refs in record.sstables.items() if refs}
        return cls(
            record.table_id,
            record.tablet_id,
            record.epoch,
            schema.model_dump_json().encode(),
            json.dumps(read, sort_keys=True).encode(),
            json.dumps({g: r.to_json() for g, r in outputs.items()}, sort_keys=True).encode(),
        )

    def schema(self) -> TableSchema:
        return _parse(TableSchema, self.schema_json)

    def read(self) -> dict[str, tuple[str, ...]]:
        try:
            parsed = json.loads(self.read_json)
            return {str(g): tuple(str(k) for k in keys) for g, keys in parsed.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise InvalidArgument(f"malformed read_json of a compaction: {exc}") from exc

    def outputs(self) -> dict[str, SSTableRef]:
        try:
            parsed = json.loads(self.outputs_json)
            return {str(g): SSTableRef.from_json(r) for g, r in parsed.items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidArgument(f"malformed outputs_json of a compaction: {exc}") from exc


@dataclass(frozen=True, slots=True)
class UpdateSchemaRequest:
    """Master to worker: re-read the schema of a table (families, GC rules, ACLs changed)."""

    table_name: str


@dataclass(frozen=True, slots=True)
class ServerStatusRequest:
    pass


@dataclass(frozen=True, slots=True)
class TabletStatus:
    table_id: str
    tablet_id: str
    start_row: bytes
    end_row: bytes | None
    sstables: int
    sstable_bytes: int
    memtable_bytes: int
    requests: int


@dataclass(frozen=True, slots=True)
class ServerStatusResponse:
    worker_id: str
    address: str
    tablets: tuple[TabletStatus, ...]


# Snapshots and bulk load (tabletstore.batch, §8). A snapshot's cut is taken in two calls
# per worker: ``snapshot_hold`` holds writes to the tablets and takes their cuts, and once
# every worker holds, ``snapshot_write`` lets writes go on and writes what the memtables held
# at the cut (see master/snapshots.py for why two).


@dataclass(frozen=True, slots=True)
class SnapshotHoldRequest:
    """Master to worker: hold writes to these tablets (at most ``hold_seconds``) and take
    their side of snapshot ``snapshot_id``'s cut."""

    snapshot_id: str
    table_id: str
    tablet_ids: tuple[str, ...]
    hold_seconds: float


@dataclass(frozen=True, slots=True)
class SnapshotWriteRequest:
    """Master to worker: end the hold of ``snapshot_id``; unless ``abort``, write the
    memtables' part of the cut and answer with the tablets' snapshot SSTables."""

    snapshot_id: str
    abort: bool = False


@dataclass(frozen=True, slots=True)
class SnapshotTablet:
    """One tablet in a snapshot: its record as of the cut (``TabletRecord.to_bytes``, its
    SSTables those the snapshot reads) and its cut's seq mark."""

    tablet_id: str
    record: bytes
    cut_seq: int


@dataclass(frozen=True, slots=True)
class SnapshotWriteResponse:
    """``held``: every tablet's hold lasted until the write call (else the cut is void)."""

    held: bool
    tablets: tuple[SnapshotTablet, ...]


@dataclass(frozen=True, slots=True)
class BulkLoadTabletRequest:
    """Master to worker: add the cells of these SSTable objects (in the store ``source_url``,
    which must be the database's own bucket, under its ``staging/`` keys) that fall in the
    tablet's range and in ``[start_row, end_row)``, as new SSTables of the
    tablet, in one record update. ``load_id`` (when not empty) makes it idempotent: rows
    the tablet's record marks as already loaded by that load are skipped, and the update
    marks the rows it loads (master/bulk_load.py). ``adopt``: SSTable objects the master
    staged in the database's bucket, each inside those rows, that the tablet adds as they
    are (batch/load_files.py step 2), in the same record update."""

    table_id: str
    tablet_id: str
    source_url: str
    keys: tuple[str, ...]
    start_row: bytes = b""
    end_row: bytes | None = None
    load_id: str = ""
    adopt: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BulkLoadTabletResponse:
    cells: int


# ---------------------------------------------------------------------- client -> master (admin)
# Schemas cross the wire as their JSON (pydantic validates them again on arrival): ``of``
# builds a message from the models, and the readers below turn it back, in this one place.


def _parse(kind: type[M], blob: bytes) -> M:
    try:
        return kind.model_validate_json(blob)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidArgument(f"malformed {kind.__name__}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class TableInfoMessage:
    """A table as the catalog knows it: id, schema JSON, schema revision."""

    table_id: str
    schema_json: bytes
    revision: int

    @classmethod
    def of(cls, info: TableInfo) -> TableInfoMessage:
        return cls(info.table_id, info.schema.model_dump_json().encode(), info.revision)

    def info(self) -> TableInfo:
        return TableInfo(self.table_id, _parse(TableSchema, self.schema_json), self.revision)


@dataclass(frozen=True, slots=True)
class CreateTableRequest:
    schema_json: bytes
    split_keys: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, schema: TableSchema, split_keys: Sequence[bytes] = ()) -> CreateTableRequest:
        return cls(schema.model_dump_json().encode(), tuple(split_keys))

    def schema(self) -> TableSchema:
        return _parse(TableSchema, self.schema_json)


@dataclass(frozen=True, slots=True)
class TableNameRequest:
    """get_table / delete_table."""

    name: str


@dataclass(frozen=True, slots=True)
class ListTablesRequest:
    pass


@dataclass(frozen=True, slots=True)
class ListTablesResponse:
    tables: tuple[TableInfoMessage, ...]

    def infos(self) -> list[TableInfo]:
        return [m.info() for m in self.tables]


@dataclass(frozen=True, slots=True)
class ModifyFamiliesRequest:
    """Families and locality groups as JSON of schema.ColumnFamily / LocalityGroup."""

    name: str
    create: tuple[bytes, ...] = ()
    update: tuple[bytes, ...] = ()
    drop: tuple[str, ...] = ()
    locality_groups: tuple[bytes, ...] = ()

    @classmethod
    def of(
        cls,
        name: str,
        *,
        create: Sequence[ColumnFamily] = (),
        update: Sequence[ColumnFamily] = (),
        drop: Sequence[str] = (),
        locality_groups: Sequence[LocalityGroup] = (),
    ) -> ModifyFamiliesRequest:
        return cls(
            name,
            tuple(f.model_dump_json().encode() for f in create),
            tuple(f.model_dump_json().encode() for f in update),
            tuple(drop),
            tuple(g.model_dump_json().encode() for g in locality_groups),
        )

    def families_created(self) -> list[ColumnFamily]:
        return [_parse(ColumnFamily, b) for b in self.create]

    def families_updated(self) -> list[ColumnFamily]:
        return [_parse(ColumnFamily, b) for b in self.update]

    def groups_added(self) -> list[LocalityGroup]:
        return [_parse(LocalityGroup, b) for b in self.locality_groups]


@dataclass(frozen=True, slots=True)
class SetAdminsRequest:
    """Replace a table's admins (``TableSchema.admins``); empty: nobody but the cluster."""

    name: str
    admins: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CompactTableRequest:
    name: str
    major: bool = False


@dataclass(frozen=True, slots=True)
class CreateSnapshotRequest:
    """``ttl_seconds``: the snapshot expires (GC may delete it) that long after it is taken."""

    table: str
    ttl_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class SnapshotInfoMessage:
    """A snapshot: its manifest's JSON (``batch.manifest.SnapshotManifest``)."""

    manifest_json: bytes


@dataclass(frozen=True, slots=True)
class ListSnapshotsRequest:
    table: str | None = None


@dataclass(frozen=True, slots=True)
class ListSnapshotsResponse:
    snapshots: tuple[SnapshotInfoMessage, ...]


@dataclass(frozen=True, slots=True)
class DeleteSnapshotRequest:
    snapshot_id: str


@dataclass(frozen=True, slots=True)
class BulkLoadRequest:
    """Load the SSTables under ``url`` (a store URL: s3://, file://) into ``table``, as the
    load ``load_id`` (empty: a hash of the files' contents). A load that is done already
    loads nothing; one that was interrupted loads the rows it had not loaded yet."""

    table: str
    url: str
    load_id: str = ""


@dataclass(frozen=True, slots=True)
class BulkLoadResponse:
    """Tablets and cells loaded by this call (0, 0: nothing left to load), and the load id."""

    tablets: int
    cells: int
    load_id: str = ""


# Backups, restores and clones (master/backups.py). Manifests travel as their JSON
# (metadata/backup.py ``BackupManifest``); expiry is seconds since the epoch (None: never).


@dataclass(frozen=True, slots=True)
class CreateBackupRequest:
    """Back up ``table`` as ``backup_id`` in the database's bucket."""

    table: str
    backup_id: str
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class BackupInfoMessage:
    """A backup: its manifest's JSON (``metadata.backup.BackupManifest``)."""

    manifest_json: bytes


@dataclass(frozen=True, slots=True)
class ListBackupsRequest:
    """Backups of table ``table`` (by name; None: of every table, deleted ones included)."""

    table: str | None = None


@dataclass(frozen=True, slots=True)
class ListBackupsResponse:
    backups: tuple[BackupInfoMessage, ...]


@dataclass(frozen=True, slots=True)
class BackupIdRequest:
    """get_backup / delete_backup."""

    backup_id: str


@dataclass(frozen=True, slots=True)
class UpdateBackupRequest:
    """Set a backup's expiry (None: never expires)."""

    backup_id: str
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class CopiedBackup:
    """What a client that has just copied a backup into the database's bucket verified there
    (client/backup_admin.py): the version of the manifest it wrote ready, and the size and
    checksum of every SSTable that manifest names, by key. The master reads exactly that
    version and checks the SSTables' presence while it reads it, instead of one after the
    other (master/backups.py ``restore_table``); it trusts none of it."""

    version: int
    sizes: dict[str, int]
    checksums: dict[str, str]


@dataclass(frozen=True, slots=True)
class RestoreTableRequest:
    """Restore backup ``backup_id`` of the database's bucket into the new table ``new_table``.

    ``copied``: what the client verified of a copy it has just made (:class:`CopiedBackup`),
    sent only by ``restore_copied`` (rpc/services.py). Optional on the wire (rpc/wire.py
    ``RESTORE_TABLE_FORM``): without it the request is the two fields every build sends and
    reads."""

    backup_id: str
    new_table: str
    copied: CopiedBackup | None = None


@dataclass(frozen=True, slots=True)
class CloneTableRequest:
    """A writable zero-copy clone of ``table`` named ``new_table``."""

    table: str
    new_table: str


@dataclass(frozen=True, slots=True)
class SetHistoryRequest:
    """Set table ``name``'s history window in seconds (master/checkpoints.py); None ends its
    own window (the database's default, if any, then applies)."""

    name: str
    seconds: float | None


@dataclass(frozen=True, slots=True)
class SetChangesRequest:
    """Set table ``name``'s change retention in seconds (its change stream can be read that
    far back, client/change_stream.py); None ends it."""

    name: str
    seconds: float | None


@dataclass(frozen=True, slots=True)
class SetReplicaRequest:
    """Make table ``name`` a replica of ``table`` at the cluster ``source`` (only the
    replicator writes it; ``promoting``: nobody does, for the moment a promotion fences), or
    with ``source`` None a primary again (client/replicator.py)."""

    name: str
    source: str | None
    table: str = ""
    promoting: bool = False


@dataclass(frozen=True, slots=True)
class HistoryDefaultRequest:
    """Read the database's default history window, or with ``change`` set it to ``seconds``
    (None: no default). It applies to every table without a window of its own."""

    change: bool = False
    seconds: float | None = None


@dataclass(frozen=True, slots=True)
class HistoryDefaultMessage:
    """The database's default history window in seconds (None: none)."""

    seconds: float | None
