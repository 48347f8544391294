"""Replication: the pure decisions (no I/O), for ``client/replicator.py``.

A replica table follows a table of another cluster (its own etcd and bucket) through the
source's change stream (``client/change_plan.py``) and applies each change with the source's
cell timestamps, so its cells equal the source's. This module says how a change becomes a
row mutation of the replica, how a change that must not be applied twice is guarded, and
what the replica keeps of its progress.

**Mutations** (:func:`mutations_of`). A change's mods carry the cells as the source's log
holds them: a put with its timestamp, an aggregate part (its state) with its bucket's
timestamp, and deletions (of a column's time range, a family, the row). Each becomes the
mutation that writes the same cell on the replica: ``SetCell`` with the timestamp,
``MergeToCell`` of the state, ``DeleteCells`` of the range, ``DeleteFamily``, ``DeleteRow``.
A deletion deletes what its row held before it, in both clusters, because the replica
applies each row's changes in the source's order.

**Exactly once.** A put with an explicit timestamp and a deletion decide the cells they touch
whatever came before, so applying a suffix of a row's changes again leaves the row as it was:
a replicator resumed from an older token than the changes it applied does no harm with them.
A part of a ``sum`` aggregate adds, so applying it twice would count it twice; and it cannot
be guarded alone, because a deletion replayed after it (not guarded) would delete what a
later part, skipped as applied, had added. So every change of a table with a ``sum`` family
is applied as a check-and-mutate, one atomic row operation with its guard (:func:`guarded`):
the replica's row keeps, in the family :data:`MARKER_FAMILY`, the ``seq`` of the last change
applied (:func:`marker_cell`, written after the change's mutations, so a row deletion keeps
it); the change is applied, with the marker raised to its ``seq``, only if the marker is below
it (:func:`applied_predicate`). A row's ``seq`` grows with each change (across workers, splits
and merges), and a row's changes are applied in order, so the marker at ``s`` means every
change of the row up to ``s`` is in, and a replay skips exactly those. The family exists only
on replicas of tables with a ``sum`` family; promotion drops it.

**Progress** (:class:`Progress`, stored as JSON in the replica's coordinator under
``replication/<table>``): the source, the token of each partition being followed (a merged
partition's list: one token per partition it replaces), the tokens handed to a merge still
waiting for its other half, each partition's low watermark, and the instant a read without
tokens starts from. Saved after the changes it covers were applied, never before, so a
restart never skips a change; it may repeat some, which the above makes harmless. The
replica's **applied watermark** is the smallest watermark of its partitions: every write the
source acknowledged before it is in the replica; the replication lag is now minus it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tabletstore.client.change_plan import Change, ChangePartition, overlap, tiles
from tabletstore.data.filters import (
    Chain,
    ColumnQualifierRegex,
    FamilyNameRegex,
    RowFilter,
    ValueRange,
)
from tabletstore.data.model import (
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    MergeToCell,
    Mutation,
    SetCell,
)
from tabletstore.data.schema import ColumnFamily, MaxVersionsRule, TableSchema
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.keys import TS_MAX, decode_ts_range

__all__ = [
    "MARKER_FAMILY",
    "PROGRESS_VERSION",
    "Progress",
    "applied_predicate",
    "guarded",
    "marker_cell",
    "marker_family",
    "mutations_of",
    "partition_key",
    "replica_schema",
    "starting",
]

#: The family of a replica's rows that holds the ``seq`` of the last guarded change applied.
MARKER_FAMILY = "_replication"
_MARKER_QUALIFIER = b"seq"
_SEQ = struct.Struct(">Q")
PROGRESS_VERSION = 1

_AGGREGATES = {"aggregate_sum", "aggregate_min", "aggregate_max", "aggregate_hll"}


def mutations_of(change: Change) -> list[Mutation]:
    """The replica's row mutation for ``change``: the same cells, the source's timestamps."""
    out: list[Mutation] = []
    for m in change.mods:
        if m.kind == "put":
            out.append(SetCell(m.family, m.qualifier, m.value, m.timestamp))
        elif m.kind in _AGGREGATES:
            out.append(MergeToCell(m.family, m.qualifier, m.value, m.timestamp))
        elif m.kind == "delete_column":
            start, end = decode_ts_range(m.value)
            out.append(
                DeleteCells(m.family, m.qualifier, start or None, None if end >= TS_MAX else end)
            )
        elif m.kind == "delete_family":
            out.append(DeleteFamily(m.family))
        elif m.kind == "delete_row":
            out.append(DeleteRow())
        else:
            raise Corruption(f"a change of row {change.row[:64]!r} has an unknown kind {m.kind!r}")
    return out


def guarded(schema: TableSchema) -> bool:
    """Whether the changes of a replica table with ``schema`` are applied under the guard:
    those of a table with a ``sum`` family (whose replica has the marker family)."""
    return MARKER_FAMILY in schema.families


def marker_cell(seq: int) -> SetCell:
    """The marker a guarded change writes with its cells: its ``seq``."""
    return SetCell(MARKER_FAMILY, _MARKER_QUALIFIER, _SEQ.pack(seq), 0)


def applied_predicate(seq: int) -> RowFilter:
    """Matches a row whose marker is at ``seq`` or past it: the change is in already."""
    return Chain(
        [
            FamilyNameRegex(MARKER_FAMILY),
            ColumnQualifierRegex(_MARKER_QUALIFIER),
            ValueRange(start=_SEQ.pack(seq)),
        ]
    )


def marker_family() -> ColumnFamily:
    return ColumnFamily(name=MARKER_FAMILY, gc_rule=MaxVersionsRule(max_versions=1))


def replica_schema(source: TableSchema) -> TableSchema:
    """The schema a new replica of ``source`` gets: its families, locality groups and change
    retention (so that it can be followed in turn after a failover), and the marker family
    if a ``sum`` family needs guarding. Admins and history are the replica cluster's own."""
    if MARKER_FAMILY in source.families:
        raise InvalidArgument(
            f"table {source.name!r} has a family named {MARKER_FAMILY!r}, the name a replica "
            "keeps its markers in; it cannot be replicated"
        )
    families = dict(source.families)
    if any(f.value_type == "sum" for f in families.values()):
        families[MARKER_FAMILY] = marker_family()
    return TableSchema(
        name=source.name,
        families=families,
        locality_groups=dict(source.locality_groups),
        changes=source.changes,
    )


def partition_key(part: ChangePartition) -> str:
    """How a progress record names a partition: ``<start hex>-<end hex>`` (end empty: the
    table's end)."""
    return f"{part.start.hex()}-{'' if part.end is None else part.end.hex()}"


def _partition_of(key: str) -> ChangePartition:
    try:
        start, end = key.split("-")
        return ChangePartition(bytes.fromhex(start), bytes.fromhex(end) if end else None)
    except ValueError as exc:
        raise Corruption(f"replication progress names a bad partition {key!r}") from exc


@dataclass(frozen=True)
class Progress:
    """A replica table's replication state (module docstring)."""

    #: The source cluster's coordinator URL and the table there.
    source: str
    table: str
    #: ``following``; ``promoted`` once this table is a primary again (``promoted_at``: the
    #: instant its own writes begin, from which a follower of it starts).
    state: str = "following"
    #: Where a partition without tokens starts (seconds since the epoch).
    start_time: float = 0.0
    #: partition key -> the tokens it is read with (one; a merge's: one per replaced part).
    partitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: A merge waiting for its other half: successor key -> {ended partition key: token}.
    handed: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: partition key -> its low watermark (seconds since the epoch).
    watermarks: Mapping[str, float] = field(default_factory=dict)
    #: Changes applied (since the replica began) and when the record was saved.
    applied_changes: int = 0
    updated_at: float = 0.0
    #: Why following stopped or stalls (the source unreachable...), None while it goes well.
    error: str | None = None
    promoted_at: float | None = None

    # -------------------------------------------------------------------- reading

    @property
    def followed(self) -> list[tuple[ChangePartition, tuple[str, ...]]]:
        """The partitions being followed, with their tokens (none: from ``start_time``)."""
        return sorted(
            ((_partition_of(k), v) for k, v in self.partitions.items()), key=lambda p: p[0].start
        )

    def applied_watermark(self) -> float:
        """Every write the source acknowledged before this is applied here."""
        keys = set(self.partitions) | {k for v in self.handed.values() for k in v}
        if not keys:
            return self.promoted_at or self.start_time
        return min(self.watermarks.get(k, self.start_time) for k in keys)

    def lag(self, now: float) -> float:
        """Seconds the replica is behind the source (0 once promoted)."""
        if self.state != "following":
            return 0.0
        return max(0.0, now - self.applied_watermark())

    # -------------------------------------------------------------------- moving on

    def advanced(self, part: ChangePartition, token: str, watermark: float | None) -> Progress:
        """After ``part``'s changes up to ``token`` were applied (``watermark``: a heartbeat's)."""
        key = partition_key(part)
        marks = dict(self.watermarks)
        if watermark is not None:
            marks[key] = max(watermark, marks.get(key, 0.0))
        return replace(self, partitions={**self.partitions, key: (token,)}, watermarks=marks)

    def ended(
        self, part: ChangePartition, successors: Sequence[tuple[ChangePartition, str]]
    ) -> tuple[Progress, list[tuple[ChangePartition, tuple[str, ...]]]]:
        """``part`` ended (a split or merge) handing ``successors`` their tokens: the progress
        without it, and the successors now ready to follow (a merge's once every partition it
        replaces has ended)."""
        key = partition_key(part)
        partitions = {k: v for k, v in self.partitions.items() if k != key}
        handed = {k: dict(v) for k, v in self.handed.items()}
        # An ended partition's watermark stays while a merge waits for its other half: the
        # merged partition starts from the lower of the two.
        marks = dict(self.watermarks)
        marks.setdefault(key, self.start_time)
        ready: list[tuple[ChangePartition, tuple[str, ...]]] = []
        for succ, token in successors:
            skey = partition_key(succ)
            handed.setdefault(skey, {})[key] = token
            parts = [overlap(_partition_of(k), succ) for k in handed[skey]]
            if tiles(parts, succ):
                got = handed.pop(skey)
                ordered = sorted(got, key=lambda k: _partition_of(k).start)
                tokens = tuple(got[k] for k in ordered)
                partitions[skey] = tokens
                marks[skey] = min(marks.get(k, self.start_time) for k in ordered)
                ready.append((succ, tokens))
        waiting = {k for v in handed.values() for k in v}
        marks = {k: v for k, v in marks.items() if k in partitions or k in waiting}
        return replace(self, partitions=partitions, handed=handed, watermarks=marks), ready

    # -------------------------------------------------------------------- storing

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "version": PROGRESS_VERSION,
                "source": self.source,
                "table": self.table,
                "state": self.state,
                "start_time": self.start_time,
                "partitions": {k: list(v) for k, v in self.partitions.items()},
                "handed": {k: dict(v) for k, v in self.handed.items()},
                "watermarks": dict(self.watermarks),
                "applied_changes": self.applied_changes,
                "updated_at": self.updated_at,
                "error": self.error,
                "promoted_at": self.promoted_at,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str) -> Progress:
        try:
            raw = json.loads(data)
            if raw.get("version") != PROGRESS_VERSION:
                raise Corruption(f"{where}: replication progress version {raw.get('version')!r}")
            return cls(
                source=str(raw["source"]),
                table=str(raw["table"]),
                state=str(raw["state"]),
                start_time=float(raw["start_time"]),
                partitions={str(k): tuple(map(str, v)) for k, v in raw["partitions"].items()},
                handed={
                    str(k): {str(a): str(b) for a, b in v.items()} for k, v in raw["handed"].items()
                },
                watermarks={str(k): float(v) for k, v in raw["watermarks"].items()},
                applied_changes=int(raw["applied_changes"]),
                updated_at=float(raw["updated_at"]),
                error=None if raw["error"] is None else str(raw["error"]),
                promoted_at=None if raw["promoted_at"] is None else float(raw["promoted_at"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise Corruption(f"{where}: unreadable replication progress: {exc}") from exc


def starting(
    source: str, table: str, partitions: Iterable[ChangePartition], start_time: float
) -> Progress:
    """The progress of a replica that begins at ``start_time`` with the source's partitions."""
    return Progress(
        source=source,
        table=table,
        start_time=start_time,
        partitions={partition_key(p): () for p in partitions},
    )
