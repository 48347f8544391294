"""Tablet records: what METADATA says about each tablet (§5.1, §5.2, §5.3).

A :class:`TabletRecord` is one METADATA row: the tablet's row range, its SSTables per locality
group (newest first), its redo point, the commit logs that may still hold its writes past the
redo point, its location (the worker serving it), its epoch, a short event log, and the
bulk loads it has taken (:class:`BulkLoadMark`: a load is never applied to a row range twice).

Row keys encode ``(table id, end row)`` as in the paper, so that a lookup for a row is a scan
for the first METADATA row whose key is at or after ``(table, row)``: see :func:`metadata_row_key`.
The last tablet of a table has no end row; it encodes as the table id followed by ``\\xff``
after every possible row key.

Records are serialized as compact JSON (bytes as base64) — they are small and read far less
often than data. Where records live (etcd in the embedded default, the METADATA table in the
cluster) is the catalog's business, not this module's.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from tabletstore.errors import Corruption

__all__ = [
    "SSTABLE_REF_VERSIONS",
    "BulkLoadMark",
    "LogRef",
    "SSTableFacts",
    "SSTableRef",
    "TabletEvent",
    "TabletRecord",
    "metadata_row_key",
    "uncovered",
]

_MAX_EVENTS = 32
#: Bulk-load marks a record keeps (the newest): a load interrupted and resumed after this many
#: later loads into the same tablet could load that tablet's part again.
MAX_BULK_LOAD_MARKS = 64


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode("ascii")


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def metadata_row_key(table_id: str, end_row: bytes | None) -> bytes:
    """METADATA row key of the tablet of ``table_id`` that ends at ``end_row`` (§5.1).

    ``table_id \\x00 0x01 end_row`` for a bounded tablet, ``table_id \\x00 0x02`` for the last
    one, so that the last tablet sorts after every bounded tablet of its table.
    """
    head = table_id.encode() + b"\x00"
    return head + b"\x02" if end_row is None else head + b"\x01" + end_row


#: Versions of an SSTable reference this build reads: 1 (no ``seq_base``), 2 (``seq_base``).
SSTABLE_REF_VERSIONS = (1, 2)


class SSTableFacts(Protocol):
    """What a written or opened SSTable tells about itself (``sstable.SSTableInfo``,
    ``sstable.SSTable``): what its reference records."""

    @property
    def cells(self) -> int: ...
    @property
    def min_seq(self) -> int: ...
    @property
    def max_seq(self) -> int: ...
    @property
    def first_row(self) -> bytes: ...
    @property
    def last_row(self) -> bytes: ...
    @property
    def tail_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SSTableRef:
    """An SSTable object as METADATA records it.

    ``seq_base`` (ref version 2) is added to every seq the object stores: an SSTable a bulk
    load adopted as the job wrote it (every stored seq 0, batch/load_files.py) takes its seqs
    from the tablet this way, so its cells are ordered against written ones exactly as if
    they had been written when it was loaded. ``min_seq``/``max_seq`` here include it. A
    ref with a ``seq_base`` is written with ``"version": 2`` (older refs have no version and
    read as 1, ``seq_base`` 0); a version this build does not know is Corruption, never a
    misread seq."""

    key: str
    size: int
    cells: int
    min_seq: int
    max_seq: int
    first_row: bytes
    last_row: bytes
    #: Bytes of the SSTable's footer and trailer: lets a reader open it with one ranged GET.
    tail_size: int = 0
    #: Added to every stored seq of the object (0: the stored seqs are the cells' seqs).
    seq_base: int = 0

    @classmethod
    def of(cls, key: str, size: int, facts: SSTableFacts) -> SSTableRef:
        """The reference to the object ``key`` of ``size`` bytes holding the SSTable ``facts``
        describes (seq base 0: its stored seqs are its cells')."""
        return cls(
            key=key,
            size=size,
            cells=facts.cells,
            min_seq=facts.min_seq,
            max_seq=facts.max_seq,
            first_row=facts.first_row,
            last_row=facts.last_row,
            tail_size=facts.tail_size,
        )

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "key": self.key,
            "size": self.size,
            "cells": self.cells,
            "min_seq": self.min_seq,
            "max_seq": self.max_seq,
            "first_row": _b64(self.first_row),
            "last_row": _b64(self.last_row),
            "tail_size": self.tail_size,
        }
        if self.seq_base:
            d["version"] = 2
            d["seq_base"] = self.seq_base
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SSTableRef:
        version = int(d.get("version", 1))
        if version not in SSTABLE_REF_VERSIONS:
            raise Corruption(
                f"SSTable reference {d.get('key')!r} has version {version}; this build reads "
                f"versions {SSTABLE_REF_VERSIONS}"
            )
        return cls(
            key=d["key"],
            size=int(d["size"]),
            cells=int(d["cells"]),
            min_seq=int(d["min_seq"]),
            max_seq=int(d["max_seq"]),
            first_row=_unb64(d["first_row"]) or b"",
            last_row=_unb64(d["last_row"]) or b"",
            tail_size=int(d.get("tail_size", 0)),
            seq_base=int(d.get("seq_base", 0)) if version >= 2 else 0,
        )


@dataclass(frozen=True, slots=True)
class LogRef:
    """A worker incarnation's commit log that may hold writes of the tablet past its redo point."""

    worker_id: str
    incarnation: int

    def to_json(self) -> list[str | int]:
        return [self.worker_id, self.incarnation]


@dataclass(frozen=True, slots=True)
class BulkLoadMark:
    """Bulk load ``load_id`` added its cells of ``[start_row, end_row)`` to this tablet, in
    the same record update that added its SSTables (master/bulk_load.py). Split children
    inherit their parent's marks and a merge keeps both sides', so a mark may reach past the
    tablet's own rows: only the overlap matters."""

    load_id: str
    start_row: bytes
    end_row: bytes | None

    def to_json(self) -> list[str | None]:
        return [self.load_id, _b64(self.start_row), _b64(self.end_row)]

    @classmethod
    def from_json(cls, d: list[Any]) -> BulkLoadMark:
        load_id, start, end = d
        return cls(str(load_id), _unb64(start) or b"", _unb64(end))


def uncovered(
    marks: tuple[BulkLoadMark, ...], load_id: str, start: bytes, end: bytes | None
) -> list[tuple[bytes, bytes | None]]:
    """The parts of ``[start, end)`` (in row order) that no mark of ``load_id`` covers."""
    spans = sorted((m.start_row, m.end_row) for m in marks if m.load_id == load_id)
    out: list[tuple[bytes, bytes | None]] = []
    lo: bytes | None = start
    for a, b in spans:
        if lo is None or (end is not None and a >= end):
            break
        if b is not None and b <= lo:
            continue
        if a > lo:
            out.append((lo, a if end is None else min(a, end)))
        lo = None if b is None else max(lo, b)
    if lo is not None and (end is None or lo < end):
        out.append((lo, end))
    return out


@dataclass(frozen=True, slots=True)
class TabletEvent:
    """One line of a tablet's event log (assigned, loaded, split, compacted, moved...)."""

    at: float
    kind: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class TabletRecord:
    """One tablet's METADATA row. Immutable: updates build a new record."""

    table_id: str
    tablet_id: str
    start_row: bytes
    end_row: bytes | None
    sstables: dict[str, tuple[SSTableRef, ...]] = field(default_factory=dict)
    redo_seq: int = 0
    logs: tuple[LogRef, ...] = ()
    location: str | None = None
    epoch: int = 0
    events: tuple[TabletEvent, ...] = ()
    bulk_loads: tuple[BulkLoadMark, ...] = ()
    #: Per listed log, the first segment that may hold a write of this tablet past its redo
    #: point (every earlier segment holds only writes its SSTables have): recovery reads that
    #: log from there (§5.3: a redo point is a position in the log). A log without an entry
    #: is read from its first segment.
    log_starts: dict[LogRef, int] = field(default_factory=dict)
    #: The newest timestamp (µs) a server assigned to a write of this tablet when the record
    #: was committed: the next server starts its own there (``TabletCore.write_micros``), so
    #: a move to a worker whose wall clock is behind stamps no later write below an earlier.
    timestamp_floor: int = 0

    def log_start(self, ref: LogRef) -> int:
        """The first segment of ``ref`` that may hold this tablet's writes past its redo point."""
        return self.log_starts.get(ref, 0)

    def contains(self, row: bytes) -> bool:
        """Whether ``row`` falls in ``[start_row, end_row)``."""
        return row >= self.start_row and (self.end_row is None or row < self.end_row)

    @property
    def row_key(self) -> bytes:
        return metadata_row_key(self.table_id, self.end_row)

    @property
    def size(self) -> int:
        """Bytes of SSTables (what splits and balancing look at)."""
        return sum(ref.size for refs in self.sstables.values() for ref in refs)

    def with_event(self, at: float, kind: str, detail: str = "") -> TabletRecord:
        events = (*self.events, TabletEvent(at, kind, detail))[-_MAX_EVENTS:]
        return replace(self, events=events)

    def with_bulk_loads(self, marks: tuple[BulkLoadMark, ...]) -> TabletRecord:
        kept = tuple(dict.fromkeys((*self.bulk_loads, *marks)))[-MAX_BULK_LOAD_MARKS:]
        return replace(self, bulk_loads=kept)

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = {
            "table_id": self.table_id,
            "tablet_id": self.tablet_id,
            "start_row": _b64(self.start_row),
            "end_row": _b64(self.end_row),
            "sstables": {g: [r.to_json() for r in refs] for g, refs in self.sstables.items()},
            "redo_seq": self.redo_seq,
            "logs": [log.to_json() for log in self.logs],
            "location": self.location,
            "epoch": self.epoch,
            "events": [[e.at, e.kind, e.detail] for e in self.events],
        }
        if self.bulk_loads:
            d["bulk_loads"] = [m.to_json() for m in self.bulk_loads]
        starts = [
            [*ref.to_json(), self.log_starts[ref]] for ref in self.logs if ref in self.log_starts
        ]
        if starts:
            d["log_starts"] = starts
        if self.timestamp_floor:
            d["timestamp_floor"] = self.timestamp_floor
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> TabletRecord:
        try:
            d = json.loads(data)
            return cls(
                table_id=d["table_id"],
                tablet_id=d["tablet_id"],
                start_row=_unb64(d["start_row"]) or b"",
                end_row=_unb64(d["end_row"]),
                sstables={
                    g: tuple(SSTableRef.from_json(r) for r in refs)
                    for g, refs in d["sstables"].items()
                },
                redo_seq=int(d["redo_seq"]),
                logs=tuple(LogRef(str(w), int(i)) for w, i in d["logs"]),
                location=d["location"],
                epoch=int(d["epoch"]),
                events=tuple(TabletEvent(float(a), k, x) for a, k, x in d["events"]),
                bulk_loads=tuple(BulkLoadMark.from_json(m) for m in d.get("bulk_loads", ())),
                log_starts={LogRef(str(w), int(i)): int(n) for w, i, n in d.get("log_starts", ())},
                timestamp_floor=int(d.get("timestamp_floor", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise Corruption(f"malformed tablet record: {exc}") from exc
