"""Recovery runs: the bytes of one sorted run, a sort task's manifest and a log's sort plan
(§5.3 "sort the log entries", §6 "Commit-log implementation"; docs/architecture/design.md §7).

Paper §6: to avoid every new owner of a dead server's tablet reading the whole co-mingled log,
the log is first *sorted* by ⟨table, row name, log sequence number⟩ in parallel over its
segments, so that a tablet's mutations are contiguous and each new owner reads only its own.
Here a log's sort is described by a **plan** (which segments form which task, and the tablet
boundaries the records are partitioned by); each **task** reads its segments once and writes
one **run** per tablet it found records of, then its **manifest**. All three are immutable
objects created with create-only PUTs; this module specifies and encodes/decodes them and does
no I/O (:mod:`tabletstore.commitlog.sorting` does). All integers are big-endian.

Run (``layout.recovery_run_key``)::

    run     = header | record*
    header  = magic "TSRN" | u16 format version (1) | u16 len(table_id) | u32 len(start_row)
              | u8 end_row present (0/1) | u32 len(end_row) | u32 record count
              | u64 len(records) | u64 min seq | u64 max seq
              | table_id (UTF-8) | start_row | end_row | u32 crc32c(all preceding header bytes)
    record  = exactly the segment format's framed record (``format.encode_record``: length,
              crc32c of the payload, payload)

The records are those of the task's segments whose (table id, row) falls in the run's range
``[start_row, end_row)`` (no end row: unbounded), sorted by (row, first seq, last seq), which
for one row is log order. ``min seq``/``max seq`` span the records' cells (0/0 for none). A run
names its row range, not only the tablet it was cut for, because tablets split, merge and move
after a sort: a new owner reads every run of its table whose range overlaps its own and keeps
the rows inside its range. Damage of any kind (short, extra bytes, bad magic, version or
checksum) is :class:`~tabletstore.errors.Corruption`.

Manifest (``layout.recovery_manifest_key``): compact JSON with sorted keys, written after every
run of the task exists; its existence is what "task done" means. Plan
(``layout.recovery_plan_key``): compact JSON with sorted keys, created once per log by the
master that fenced it; a later master (failover) reuses it, so a task's output is a function of
the plan and the segments alone and running it twice writes the same bytes. Row keys in JSON
are base64.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

from tabletstore.commitlog.format import LogRecord, decode_records, encode_record
from tabletstore.errors import Corruption, InvalidArgument

__all__ = [
    "RUN_FORMAT_VERSION",
    "RUN_MAGIC",
    "RunHeader",
    "RunInfo",
    "SortManifest",
    "SortPlan",
    "SortTask",
    "TabletRange",
    "decode_run",
    "encode_run",
    "encode_run_frames",
]

RUN_MAGIC = b"TSRN"
RUN_FORMAT_VERSION = 1
_PLAN_VERSION = 1

# magic, version, len(table_id), len(start_row), end present, len(end_row), count, len(records),
# min seq, max seq
_HEADER = struct.Struct(">4sHHIBIIQQQ")
_U32 = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class TabletRange:
    """One tablet's rows as the plan saw them: the unit records are partitioned by."""

    table_id: str
    tablet_id: str
    start_row: bytes
    end_row: bytes | None

    def holds(self, row: bytes) -> bool:
        return row >= self.start_row and (self.end_row is None or row < self.end_row)

    def overlaps(self, start_row: bytes, end_row: bytes | None) -> bool:
        """Whether ``[start_row, end_row)`` (None: unbounded) shares a row with this range."""
        below_end = self.end_row is None or start_row < self.end_row
        above_start = end_row is None or self.start_row < end_row
        return below_end and above_start

    def to_json(self) -> list[Any]:
        return [self.table_id, self.tablet_id, _b64(self.start_row), _b64(self.end_row)]

    @classmethod
    def from_json(cls, d: Any) -> TabletRange:
        table_id, tablet_id, start, end = d
        return cls(str(table_id), str(tablet_id), _unb64(start) or b"", _unb64(end))


@dataclass(frozen=True, slots=True)
class RunHeader:
    table_id: str
    start_row: bytes
    end_row: bytes | None
    record_count: int
    records_length: int
    min_seq: int
    max_seq: int


# --- runs ------------------------------------------------------------------------------------


def encode_run(
    table_id: str, start_row: bytes, end_row: bytes | None, records: Sequence[LogRecord]
) -> bytes:
    """One run of ``records`` (all of ``table_id``, rows in the range), sorted here."""
    return encode_run_frames(
        table_id,
        start_row,
        end_row,
        [(r, encode_record(r.table_id, r.row, r.cells)) for r in records],
    )


def encode_run_frames(
    table_id: str,
    start_row: bytes,
    end_row: bytes | None,
    items: Sequence[tuple[LogRecord, bytes]],
) -> bytes:
    """:func:`encode_run` from records with their frames as a segment held them (a sorter
    copies frames rather than encoding again). The sort is stable: records equal in
    (row, first seq, last seq) keep their order."""
    ordered = sorted(items, key=lambda item: (item[0].row, item[0].first_seq, item[0].last_seq))
    span = TabletRange(table_id, "", start_row, end_row)
    lo = hi = None
    for r, _ in ordered:
        if r.table_id != table_id or not span.holds(r.row):
            raise InvalidArgument(f"record of {r.table_id}/{r.row!r} outside the run's range")
        for c in r.cells:
            lo = c.seq if lo is None or c.seq < lo else lo
            hi = c.seq if hi is None or c.seq > hi else hi
    tid = table_id.encode()
    end = end_row or b""
    head = (
        _HEADER.pack(
            RUN_MAGIC,
            RUN_FORMAT_VERSION,
            len(tid),
            len(start_row),
            0 if end_row is None else 1,
            len(end),
            len(ordered),
            sum(len(f) for _, f in ordered),
            lo or 0,
            hi or 0,
        )
        + tid
        + start_row
        + end
    )
    return b"".join((head, _U32.pack(crc32c(head)), *(f for _, f in ordered)))


def decode_run(data: bytes, *, where: str = "recovery run") -> tuple[RunHeader, list[LogRecord]]:
    """The header and records of one run; any damage is Corruption."""
    if len(data) < _HEADER.size:
        raise Corruption(f"{where}: {len(data)} bytes, shorter than a run header")
    (magic, version, tid_len, start_len, has_end, end_len, count, length, lo, hi) = (
        _HEADER.unpack_from(data)
    )
    if magic != RUN_MAGIC:
        raise Corruption(f"{where}: not a recovery run (magic {magic!r})")
    if version != RUN_FORMAT_VERSION:
        raise Corruption(f"{where}: unsupported recovery-run format version {version}")
    pos = _HEADER.size
    head_end = pos + tid_len + start_len + end_len
    if len(data) < head_end + 4 or has_end not in (0, 1):
        raise Corruption(f"{where}: cut or malformed inside the run header")
    (crc,) = _U32.unpack_from(data, head_end)
    if crc != crc32c(data[:head_end]):
        raise Corruption(f"{where}: header checksum mismatch")
    try:
        table_id = data[pos : pos + tid_len].decode()
    except UnicodeDecodeError as exc:
        raise Corruption(f"{where}: table id is not UTF-8") from exc
    pos += tid_len
    start_row = data[pos : pos + start_len]
    pos += start_len
    end_row = data[pos : pos + end_len] if has_end else None
    pos = head_end + 4
    if len(data) != pos + length:
        raise Corruption(f"{where}: {len(data)} bytes where the header declares {pos + length}")
    records = decode_records(data, pos, pos + length, count, segment=-1, where=where)
    for r in records:
        if r.table_id != table_id or not TabletRange(table_id, "", start_row, end_row).holds(r.row):
            raise Corruption(f"{where}: record of {r.table_id}/{r.row!r} outside the run's range")
    return RunHeader(table_id, start_row, end_row, count, length, lo, hi), records


# --- plans and manifests --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SortTask:
    """Segments ``first .. stop - 1`` of the log: one unit of sorting work."""

    first: int
    stop: int
    #: Bytes of those segments (what the task will read).
    size: int


@dataclass(frozen=True, slots=True)
class SortPlan:
    """How one fenced log is sorted: its tasks and the tablet ranges records go to."""

    worker_id: str
    incarnation: int
    #: The first fence: segments below it are the whole acknowledged log.
    fence: int
    tasks: tuple[SortTask, ...]
    tablets: tuple[TabletRange, ...]
    #: Where the plan, its manifests and runs live: None under ``recovery/`` (a dead log's
    #: recovery), else under ``restores/<scope>/`` (``layout.recovery_prefix``): the part of a
    #: log a point-in-time restore sorts, which is not fenced and whose ``fence`` is the
    #: number past its last selected segment.
    scope: str | None = None

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = {
            "version": _PLAN_VERSION,
            "worker_id": self.worker_id,
            "incarnation": self.incarnation,
            "fence": self.fence,
            "tasks": [[t.first, t.stop, t.size] for t in self.tasks],
            "tablets": [t.to_json() for t in self.tablets],
        }
        if self.scope is not None:
            d["scope"] = self.scope  # absent for a recovery: its plans keep their bytes
        return _dump(d)

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "sort plan") -> SortPlan:
        d = _load(data, where)
        try:
            return cls(
                worker_id=str(d["worker_id"]),
                incarnation=int(d["incarnation"]),
                fence=int(d["fence"]),
                tasks=tuple(SortTask(int(a), int(b), int(c)) for a, b, c in d["tasks"]),
                tablets=tuple(TabletRange.from_json(t) for t in d["tablets"]),
                scope=None if d.get("scope") is None else str(d["scope"]),
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise Corruption(f"{where}: malformed sort plan ({exc!r})") from exc


@dataclass(frozen=True, slots=True)
class RunInfo:
    """One run a task wrote, as its manifest lists it."""

    key: str
    table_id: str
    tablet_id: str
    start_row: bytes
    end_row: bytes | None
    records: int
    size: int
    min_seq: int
    max_seq: int

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "table_id": self.table_id,
            "tablet_id": self.tablet_id,
            "start_row": _b64(self.start_row),
            "end_row": _b64(self.end_row),
            "records": self.records,
            "size": self.size,
            "min_seq": self.min_seq,
            "max_seq": self.max_seq,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunInfo:
        return cls(
            key=str(d["key"]),
            table_id=str(d["table_id"]),
            tablet_id=str(d["tablet_id"]),
            start_row=_unb64(d["start_row"]) or b"",
            end_row=_unb64(d["end_row"]),
            records=int(d["records"]),
            size=int(d["size"]),
            min_seq=int(d["min_seq"]),
            max_seq=int(d["max_seq"]),
        )


@dataclass(frozen=True, slots=True)
class SortManifest:
    """A finished task: the runs it wrote and what it read."""

    worker_id: str
    incarnation: int
    first: int
    stop: int
    runs: tuple[RunInfo, ...]
    #: Bytes of segments read, records read, and records of rows no plan range holds (kept
    #: in their table's catch-all run: ``sorting.CATCH_ALL_TABLET``).
    read_bytes: int
    records: int
    unplanned: int

    def to_bytes(self) -> bytes:
        return _dump(
            {
                "version": _PLAN_VERSION,
                "worker_id": self.worker_id,
                "incarnation": self.incarnation,
                "first": self.first,
                "stop": self.stop,
                "runs": [r.to_json() for r in self.runs],
                "read_bytes": self.read_bytes,
                "records": self.records,
                "unplanned": self.unplanned,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "sort manifest") -> SortManifest:
        d = _load(data, where)
        try:
            return cls(
                worker_id=str(d["worker_id"]),
                incarnation=int(d["incarnation"]),
                first=int(d["first"]),
                stop=int(d["stop"]),
                runs=tuple(RunInfo.from_json(r) for r in d["runs"]),
                read_bytes=int(d["read_bytes"]),
                records=int(d["records"]),
                # "dropped": a manifest of the version that dropped such records.
                unplanned=int(d["unplanned"] if "unplanned" in d else d["dropped"]),
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise Corruption(f"{where}: malformed sort manifest ({exc!r})") from exc


def _dump(d: dict[str, Any]) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def _load(data: bytes, where: str) -> dict[str, Any]:
    try:
        d = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Corruption(f"{where}: not JSON ({exc})") from exc
    if not isinstance(d, dict) or d.get("version") != _PLAN_VERSION:
        raise Corruption(f"{where}: unsupported version or shape")
    return d


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode("ascii")


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s, validate=True)
