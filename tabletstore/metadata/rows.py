"""The METADATA table: its reserved names, its schema, and how a tablet record is a row (§5.1).

"We use a three-level hierarchy analogous to that of a B+-tree to store tablet location
information." (§5.1) The levels here:

1. the coordinator key ``root`` (``coordination.paths.ROOT_TABLET``) holds the root tablet's
   :class:`~tabletstore.metadata.record.TabletRecord` (etcd plays Chubby's part);
2. the **root tablet** — the first tablet of METADATA, ``[b"", ROOT_END)`` — holds one row per
   other METADATA tablet. It never splits, so the hierarchy never grows a fourth level;
3. the other METADATA tablets hold one row per user tablet.

Every row's key is ``metadata_row_key(table id, end row)``. METADATA's table id is
``"!metadata"``: ``!`` sorts before every character a user table id may contain, so METADATA's
own rows (``!metadata\\x00\\x01<end>``, and ``!metadata\\x00\\x02`` for its last tablet) come
first and the root tablet ``[b"", ROOT_END)`` holds exactly them.

A row is one family ``m`` (an in-memory locality group, as in the paper, keeping one version)
with these columns, all written at timestamp 0 so that the newest write of a column is decided
by sequence number alone — wall clocks of successive owners never order METADATA writes:

=========  ===========================================================================
``record`` the :class:`TabletRecord` as bytes (``TabletRecord.to_bytes``)
``epoch``  the record's epoch, 8 bytes big-endian: check-and-mutate predicates compare it,
           so a record update is conditional on the updater's epoch (fencing rule 2)
``split``  present only while a split is being committed: the new tablets' records (a
           JSON list of base64 records) that take over the front of this tablet's range
=========  ===========================================================================

This module is pure: it builds rows, mutations and predicates; ``catalog`` and
``client.location`` do the I/O.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass

from tabletstore.data.filters import Chain, ColumnRange, RowFilter, ValueRange
from tabletstore.data.model import Cell, DeleteCells, Mutation, Row, SetCell
from tabletstore.data.schema import (
    ColumnFamily,
    LocalityGroup,
    MaxVersionsRule,
    TableSchema,
    validate_table_name,
)
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.metadata.record import TabletRecord, metadata_row_key

__all__ = [
    "EPOCH",
    "FAMILY",
    "METADATA_TABLE",
    "METADATA_TABLE_ID",
    "RECORD",
    "ROOT_END",
    "ROOT_TABLET_ID",
    "SPLIT",
    "MetadataRow",
    "clear_split_mutations",
    "decode_row",
    "epoch_is",
    "initial_metadata_records",
    "is_root",
    "level",
    "metadata_schema",
    "metadata_split_keys",
    "record_mutations",
    "root_record",
    "routing_only",
    "row_table_id",
    "split_mutations",
    "table_range",
]

#: The table's name (reserved: users cannot create, change or delete it; hidden from listings).
METADATA_TABLE = "METADATA"
#: Its table id; sorts before every user table id (those are ``[A-Za-z0-9_.-]+-<hex>``).
METADATA_TABLE_ID = "!metadata"
ROOT_TABLET_ID = "root"
FAMILY = "m"
RECORD = b"record"
EPOCH = b"epoch"
SPLIT = b"split"

_META_HEAD = METADATA_TABLE_ID.encode() + b"\x00"
#: End of the root tablet: just after the last possible row describing a METADATA tablet.
ROOT_END = _META_HEAD + b"\x03"


def metadata_schema() -> TableSchema:
    """METADATA's schema: one in-memory family keeping the newest version of each column."""
    return TableSchema(
        name=METADATA_TABLE,
        families={
            FAMILY: ColumnFamily(
                name=FAMILY, gc_rule=MaxVersionsRule(max_versions=1), locality_group="location"
            )
        },
        locality_groups={
            "default": LocalityGroup(name="default"),
            "location": LocalityGroup(name="location", in_memory=True),
        },
    )


def is_root(record: TabletRecord) -> bool:
    return record.table_id == METADATA_TABLE_ID and record.tablet_id == ROOT_TABLET_ID


def level(table_id: str, tablet_id: str) -> int:
    """Where a tablet's record lives: 1 the coordinator (root tablet), 2 the root tablet
    (other METADATA tablets), 3 a METADATA tablet (user tablets)."""
    if table_id == METADATA_TABLE_ID:
        return 1 if tablet_id == ROOT_TABLET_ID else 2
    return 3


def table_range(table_id: str) -> tuple[bytes, bytes]:
    """``(lo, hi)``: every METADATA row of the table has ``lo < key <= hi``."""
    return table_id.encode() + b"\x00", metadata_row_key(table_id, None)


def root_record(at: float) -> TabletRecord:
    """The root tablet's first record (it is created empty and never splits)."""
    return TabletRecord(METADATA_TABLE_ID, ROOT_TABLET_ID, b"", ROOT_END).with_event(at, "created")


def metadata_split_keys(prefixes: Sequence[str]) -> list[bytes]:
    """METADATA split keys from table-name prefixes (an operator's choice of where METADATA
    is pre-split): a table id starts with its name, so the tablet that begins at ``prefix``
    holds the rows of every table whose name sorts at or after it (up to the next prefix)."""
    keys = []
    for prefix in prefixes:
        try:
            validate_table_name(prefix)
        except ValueError as exc:
            raise InvalidArgument(f"METADATA split prefix: {exc}") from None
        keys.append(prefix.encode())
    if len(set(keys)) != len(keys):
        raise InvalidArgument(f"METADATA split prefixes repeat: {sorted(prefixes)}")
    return sorted(keys)


def initial_metadata_records(split_keys: Sequence[bytes], at: float) -> list[TabletRecord]:
    """The METADATA tablets after the root: ``[ROOT_END, k1), [k1, k2) ... [kn, None)``.

    Split keys are METADATA row keys (e.g. ``metadata_row_key(table_id, row)``); each must sort
    after ``ROOT_END`` so the root keeps only METADATA's own rows."""
    keys = sorted(set(split_keys))
    for k in keys:
        if k <= ROOT_END:
            raise InvalidArgument(f"METADATA split key {k!r} must sort after the root tablet")
    bounds: list[bytes | None] = [*keys, None]
    out = []
    start = ROOT_END
    for i, end in enumerate(bounds):
        out.append(
            TabletRecord(METADATA_TABLE_ID, f"m{i:05d}", start, end).with_event(at, "created")
        )
        start = end or b""
    return out


def _epoch_bytes(epoch: int) -> bytes:
    return epoch.to_bytes(8, "big", signed=False)


def epoch_is(epoch: int) -> RowFilter:
    """A predicate matching the row only when its ``epoch`` column equals ``epoch``."""
    e = _epoch_bytes(epoch)
    return Chain(
        (
            ColumnRange(FAMILY, EPOCH, EPOCH, end_inclusive=True),
            ValueRange(e, e, end_inclusive=True),
        )
    )


def record_mutations(record: TabletRecord) -> tuple[Mutation, ...]:
    """Mutations that make a row hold ``record`` (timestamp 0: see the module docstring)."""
    return (
        SetCell(FAMILY, RECORD, record.to_bytes(), 0),
        SetCell(FAMILY, EPOCH, _epoch_bytes(record.epoch), 0),
    )


def split_mutations(pending: Sequence[TabletRecord]) -> tuple[Mutation, ...]:
    """Mutations recording a split intent: ``pending`` take over the front of the range."""
    blob = json.dumps([base64.b64encode(r.to_bytes()).decode("ascii") for r in pending])
    return (SetCell(FAMILY, SPLIT, blob.encode(), 0),)


def clear_split_mutations() -> tuple[Mutation, ...]:
    return (DeleteCells(FAMILY, SPLIT),)


@dataclass(frozen=True, slots=True)
class MetadataRow:
    """A decoded METADATA row: the record and the records of a split being committed."""

    key: bytes
    record: TabletRecord
    pending: tuple[TabletRecord, ...] = ()


def decode_row(row: Row) -> MetadataRow | None:
    """The row's record, or None for a row without one (being deleted, or not a record)."""
    values: dict[bytes, bytes] = {}
    for c in row.cells:
        if c.family == FAMILY:
            values.setdefault(c.qualifier, c.value)
    data = values.get(RECORD)
    if data is None:
        return None
    record = TabletRecord.from_bytes(data)
    if record.row_key != row.key:
        raise Corruption(f"METADATA row {row.key!r} holds the record of {record.row_key!r}")
    pending: tuple[TabletRecord, ...] = ()
    if SPLIT in values:
        try:
            pending = tuple(
                TabletRecord.from_bytes(base64.b64decode(s)) for s in json.loads(values[SPLIT])
            )
        except (TypeError, ValueError) as exc:
            raise Corruption(f"malformed split intent in METADATA row {row.key!r}") from exc
    return MetadataRow(row.key, record, pending)


def row_table_id(key: bytes) -> str | None:
    """The table id a METADATA row key describes (``metadata_row_key``), or None for a key
    that is not one (no separator, not UTF-8)."""
    head, sep, _ = key.partition(b"\x00")
    if not sep:
        return None
    try:
        return head.decode()
    except UnicodeDecodeError:
        return None


def _routing_record(record: TabletRecord) -> TabletRecord:
    return TabletRecord(
        record.table_id,
        record.tablet_id,
        record.start_row,
        record.end_row,
        location=record.location,
        epoch=record.epoch,
    )


def routing_only(row: Row) -> Row | None:
    """``row`` cut to what a client needs to route requests: each record (and each record of
    a split being committed) keeps its table, tablet, range, location and epoch, and loses its
    SSTables, logs, events and bulk-load marks, which name row keys and object names. None for
    a row without a record (being deleted: clients skip those)."""
    decoded = decode_row(row)
    if decoded is None:
        return None
    cells: list[Cell] = []
    for c in row.cells:
        if c.family != FAMILY:
            continue
        if c.qualifier == RECORD:
            value = _routing_record(decoded.record).to_bytes()
        elif c.qualifier == SPLIT:
            value = json.dumps(
                [
                    base64.b64encode(_routing_record(r).to_bytes()).decode("ascii")
                    for r in decoded.pending
                ]
            ).encode()
        elif c.qualifier == EPOCH:
            value = c.value
        else:
            continue
        cells.append(Cell(c.family, c.qualifier, c.timestamp, value))
    return Row(row.key, cells)
