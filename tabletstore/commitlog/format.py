"""The commit-log segment format: the bytes of one log segment object (§5.3, §6).

A worker's commit log is a numbered sequence of immutable segment objects
(docs/architecture/design.md §5), at ``storage_s3.layout.log_segment_key(worker_id, incarnation,
segment)``. This module specifies and encodes/decodes one segment; it does no I/O. All integers are
big-endian.

Segment::

    header   = magic "TSCL" | u16 format version (1 or 2) | u16 len(worker_id) (1..200)
               | u64 incarnation | u64 segment number | u32 record count
               | u64 len(records) | [version 2: u64 written_at (microseconds since the epoch)]
               | worker_id (UTF-8) | u32 crc32c(all preceding header bytes)
    records  = record*          (exactly "record count" records, "len(records)" bytes)

Version 2 adds ``written_at``: the writer's wall clock when it sealed the segment, before its
PUT. A write is acknowledged only after its segment's PUT, so a write acknowledged before an
instant T lies in a segment stamped before T, and every write in a segment stamped before T
began before T: a point-in-time restore to T replays exactly the segments stamped at or
before T (a write in flight at T may land on either side, as linearizability allows; the
bound holds to the skew between the writer's clock and the clock T is read from). Readers
accept both versions; version 1 segments (no stamp) are written by older builds and by
:func:`encode_segment` without ``written_at``.

    record   = u32 len(payload) | u32 crc32c(payload) | payload
    payload  = u16 len(table_id) | u32 len(row) | u64 first_seq | u32 cell count
               | table_id (UTF-8) | row | cell*
    cell     = u8 kind | u8 len(family) | u32 len(qualifier) | u32 len(value) | i64 ts
               | u32 seq - first_seq | family (ASCII) | qualifier | value

``first_seq`` is the smallest seq of the record's cells; each cell stores its offset from it.
Kinds are ``keys.CellKind`` values. A record is one row mutation of one tablet's row; the row
key is tablet-independent (the table id and row locate the tablet after splits and moves).
The header says how many bytes follow it, so a short object is told apart from a damaged one.

A **fence** is a zero-byte segment object (no header): recovery creates it to stop a worker's
log (docs/architecture/design.md §6 rule 4). It has no records.

Damage. A segment PUT is atomic on an object store (and on the local directory store, which
writes a temporary file and links it into place), so every segment object that exists was
written whole. There is therefore no "torn" segment to tolerate, unlike leveldb's log on a
file system (log_format.md): an object shorter than its header declares, cut inside its header,
with bad magic, version or checksum, a record running past the declared length, a wrong record
count, bytes beyond the declared length or a malformed payload is
:class:`~tabletstore.errors.Corruption` — reported, never read as a shorter log (reading a
short segment's prefix once lost acknowledged writes silently).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.keys import Cell, CellKind

__all__ = [
    "FORMAT_VERSION",
    "IN_FLIGHT_WINDOW",
    "MAGIC",
    "READABLE_VERSIONS",
    "LogRecord",
    "SegmentContents",
    "SegmentHeader",
    "decode_records",
    "decode_segment",
    "decode_segment_header",
    "encode_record",
    "encode_segment",
]

MAGIC = b"TSCL"
#: The version the writer writes (with ``written_at``); :data:`READABLE_VERSIONS` are read.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

#: The most segment PUTs a writer ever has outstanding at once: part of the log's protocol,
#: because it bounds where a missing segment can be legitimate. The writer acknowledges in
#: order, so when it dies every segment below its oldest PUT in flight exists; a number missing
#: within ``IN_FLIGHT_WINDOW`` of the log's last listed segment may be a PUT that failed while
#: later ones were in flight (nothing from it on was acknowledged), and a number missing
#: further down is a lost object: Corruption.
IN_FLIGHT_WINDOW = 8

# magic, version, len(worker_id), incarnation, segment, record count, len(records)
_HEADER = struct.Struct(">4sHHQQIQ")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_FRAME = struct.Struct(">II")  # len(payload), crc32c(payload)
_PAYLOAD = struct.Struct(">HIQI")  # len(table_id), len(row), first_seq, cell count
_CELL = struct.Struct(">BBIIqI")  # kind, len(family), len(qualifier), len(value), ts, seq delta

_MAX_U32 = 0xFFFFFFFF
#: Longest worker id a header may carry (object-key components are at most 200 characters).
MAX_WORKER_ID_BYTES = 200
_MAX_U64 = (1 << 64) - 1
_KINDS = frozenset(int(k) for k in CellKind)


class LogRecord(NamedTuple):
    """One row mutation as the log holds it."""

    #: The segment it was read from (``-1`` for a record not read from a segment).
    segment: int
    table_id: str
    row: bytes
    first_seq: int
    #: Largest seq among the cells (``first_seq`` for a single-cell record).
    last_seq: int
    cells: list[Cell]


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """Who wrote a segment: what recovery checks to know it reads the right log."""

    worker_id: str
    incarnation: int
    segment: int
    record_count: int
    records_length: int
    version: int = FORMAT_VERSION
    #: Seconds since the epoch when the writer sealed the segment (version 2); None in
    #: version 1.
    written_at: float | None = None


@dataclass(frozen=True, slots=True)
class SegmentContents:
    """A decoded segment. ``header`` is None for a fence."""

    header: SegmentHeader | None
    records: list[LogRecord]
    fence: bool


# --- encoding --------------------------------------------------------------------------------


def encode_record(table_id: str, row: bytes, cells: Sequence[Cell]) -> bytes:
    """One framed record (length, checksum, payload) for one row mutation.

    Every cell must belong to ``row``; the cells' seqs must lie within 2^32 of each other.
    """
    if not cells:
        raise InvalidArgument(f"log record of row {row!r} has no cells")
    if len(cells) == 1:
        return _encode_one(table_id, row, cells[0])
    first = min(c.seq for c in cells)
    tid = table_id.encode()
    parts: list[bytes] = [_PAYLOAD.pack(len(tid), len(row), first, len(cells)), tid, row]
    pack = _CELL.pack
    append = parts.append
    try:
        for c in cells:
            if c.row != row:
                raise InvalidArgument(f"cell of row {c.row!r} in a log record of row {row!r}")
            fam = c.family.encode("ascii")
            delta = c.seq - first
            if delta > _MAX_U32:
                raise InvalidArgument(f"seqs of one log record of row {row!r} span over 2^32")
            append(pack(c.kind, len(fam), len(c.qualifier), len(c.value), c.ts, delta))
            append(fam)
            append(c.qualifier)
            append(c.value)
    except (struct.error, UnicodeEncodeError) as exc:
        raise InvalidArgument(f"log record of row {row!r} cannot be encoded: {exc}") from exc
    payload = b"".join(parts)
    if len(payload) > _MAX_U32:
        raise InvalidArgument(f"log record of row {row!r} is larger than 4 GiB")
    return _FRAME.pack(len(payload), crc32c(payload)) + payload


def _encode_one(table_id: str, row: bytes, c: Cell) -> bytes:
    """:func:`encode_record` of a single cell (a SetCell write, the common record): the same
    bytes with one join and no per-cell loop."""
    if c.row != row:
        raise InvalidArgument(f"cell of row {c.row!r} in a log record of row {row!r}")
    tid = table_id.encode()
    try:
        fam = c.family.encode("ascii")
        qualifier, value = c.qualifier, c.value
        payload = b"".join(
            (
                _PAYLOAD.pack(len(tid), len(row), c.seq, 1),
                tid,
                row,
                _CELL.pack(c.kind, len(fam), len(qualifier), len(value), c.ts, 0),
                fam,
                qualifier,
                value,
            )
        )
    except (struct.error, UnicodeEncodeError) as exc:
        raise InvalidArgument(f"log record of row {row!r} cannot be encoded: {exc}") from exc
    if len(payload) > _MAX_U32:
        raise InvalidArgument(f"log record of row {row!r} is larger than 4 GiB")
    return _FRAME.pack(len(payload), crc32c(payload)) + payload


def encode_segment(
    worker_id: str,
    incarnation: int,
    segment: int,
    records: Sequence[bytes],
    *,
    written_at: float | None = None,
) -> bytes:
    """A whole segment from framed records (:func:`encode_record`): version 2 stamped
    ``written_at`` (seconds since the epoch; the writer passes its wall clock before the PUT),
    or version 1 without it."""
    wid = worker_id.encode()
    if not wid or len(wid) > MAX_WORKER_ID_BYTES:
        raise InvalidArgument(
            f"worker id {worker_id!r} must be 1-{MAX_WORKER_ID_BYTES} UTF-8 bytes"
        )
    for what, value in (("incarnation", incarnation), ("segment number", segment)):
        if not 0 <= value <= _MAX_U64:
            raise InvalidArgument(f"{what} {value} is outside [0, 2^64)")
    length = sum(len(r) for r in records)
    version = 1 if written_at is None else 2
    head = _HEADER.pack(MAGIC, version, len(wid), incarnation, segment, len(records), length)
    if written_at is not None:
        micros = round(written_at * 1_000_000)
        if not 0 <= micros <= _MAX_U64:
            raise InvalidArgument(f"segment time {written_at} is outside the u64 microseconds")
        head += _U64.pack(micros)
    head += wid
    return b"".join((head, _U32.pack(crc32c(head)), *records))


# --- decoding --------------------------------------------------------------------------------


def _decode_header(data: bytes, where: str) -> tuple[SegmentHeader, int]:
    """The header and the offset after it."""
    if len(data) < _HEADER.size:
        if not MAGIC.startswith(data[:4]):
            raise Corruption(f"{where}: not a commit-log segment (starts {data[:4]!r})")
        raise Corruption(f"{where}: {len(data)} bytes, shorter than a segment header")
    magic, version, wid_len, incarnation, segment, count, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise Corruption(f"{where}: not a commit-log segment (magic {magic!r})")
    if version not in READABLE_VERSIONS:
        raise Corruption(
            f"{where}: unsupported commit-log format version {version} (this build reads "
            f"{READABLE_VERSIONS})"
        )
    if not 0 < wid_len <= MAX_WORKER_ID_BYTES:
        raise Corruption(f"{where}: worker id length {wid_len} is out of range")
    start = _HEADER.size + (_U64.size if version >= 2 else 0)
    end = start + wid_len
    if len(data) < end + 4:
        raise Corruption(f"{where}: {len(data)} bytes, cut inside the segment header")
    (crc,) = _U32.unpack_from(data, end)
    if crc != crc32c(data[:end]):
        raise Corruption(f"{where}: header checksum mismatch")
    written_at = _U64.unpack_from(data, _HEADER.size)[0] / 1_000_000 if version >= 2 else None
    try:
        worker_id = data[start:end].decode()
    except UnicodeDecodeError as exc:
        raise Corruption(f"{where}: worker id is not UTF-8") from exc
    header = SegmentHeader(worker_id, incarnation, segment, count, length, version, written_at)
    return header, end + 4


def decode_segment_header(data: bytes, *, where: str) -> tuple[SegmentHeader, int]:
    """The header of a segment from the object's first bytes (at least the header's), and
    the object's length the header declares: a verifier compares it with the listed size
    without reading the records. Corruption if the header is damaged."""
    header, pos = _decode_header(data, where)
    return header, pos + header.records_length


def _decode_payload(payload: bytes, segment: int, where: str) -> LogRecord:
    try:
        tid_len, row_len, first, count = _PAYLOAD.unpack_from(payload)
        pos = _PAYLOAD.size
        table_id = payload[pos : pos + tid_len].decode()
        pos += tid_len
        row = payload[pos : pos + row_len]
        pos += row_len
        cells: list[Cell] = []
        last = first
        unpack = _CELL.unpack_from
        size = _CELL.size
        for _ in range(count):
            kind, fam_len, q_len, v_len, ts, delta = unpack(payload, pos)
            pos += size
            family = payload[pos : pos + fam_len].decode("ascii")
            pos += fam_len
            qualifier = payload[pos : pos + q_len]
            pos += q_len
            value = payload[pos : pos + v_len]
            pos += v_len
            if kind not in _KINDS:
                raise ValueError(f"unknown cell kind {kind}")
            seq = first + delta
            if seq > last:
                last = seq
            cells.append(Cell(row, family, qualifier, ts, seq, kind, value))
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise Corruption(f"{where}: malformed record payload ({exc})") from exc
    if pos != len(payload) or len(row) != row_len or len(table_id.encode()) != tid_len:
        raise Corruption(f"{where}: record payload length does not match its contents")
    return LogRecord(segment, table_id, row, first, last, cells)


def decode_segment(
    data: bytes, *, where: str = "commit-log segment", frames: list[bytes] | None = None
) -> SegmentContents:
    """Decode one segment object; any damage is Corruption (see the module docstring).

    ``where`` names the object in error messages. The caller checks that the header names the
    worker, incarnation and segment number it expected. ``frames``: see :func:`decode_records`.
    """
    if not data:
        return SegmentContents(None, [], fence=True)
    header, pos = _decode_header(data, where)
    end_of_records = pos + header.records_length
    if len(data) > end_of_records:
        raise Corruption(f"{where}: {len(data) - end_of_records} bytes beyond the declared end")
    if len(data) < end_of_records:
        raise Corruption(
            f"{where}: {len(data)} bytes where the header declares {end_of_records}; a "
            "segment is written whole, so it was damaged after it was written"
        )
    records = decode_records(
        data,
        pos,
        end_of_records,
        header.record_count,
        segment=header.segment,
        where=where,
        frames=frames,
    )
    return SegmentContents(header, records, fence=False)


def decode_records(
    data: bytes,
    pos: int,
    end_of_records: int,
    count: int,
    *,
    segment: int,
    where: str,
    frames: list[bytes] | None = None,
) -> list[LogRecord]:
    """Exactly ``count`` framed records filling ``data[pos:end_of_records]``; any damage is
    Corruption. Shared by segments and recovery runs (:mod:`tabletstore.commitlog.runs`).
    With ``frames``, each record's whole frame (checked) is appended to it as well, so a
    sorter copies records into runs without encoding them again."""
    records: list[LogRecord] = []
    frame = _FRAME.unpack_from
    start_of_records = pos
    while pos < end_of_records and len(records) < count:
        start = pos + _FRAME.size
        if start > end_of_records:
            raise Corruption(f"{where}: record {len(records)} frame runs past the object's end")
        length, crc = frame(data, pos)
        end = start + length
        if end > end_of_records:
            raise Corruption(f"{where}: record {len(records)} runs past the object's end")
        payload = data[start:end]
        if crc32c(payload) != crc:
            raise Corruption(f"{where}: checksum mismatch in record {len(records)} at {pos}")
        records.append(_decode_payload(payload, segment, f"{where} record {len(records)}"))
        if frames is not None:
            frames.append(data[pos:end])
        pos = end
    if pos != end_of_records or len(records) != count:
        raise Corruption(
            f"{where}: header declares {count} records in "
            f"{end_of_records - start_of_records} bytes, found {len(records)} in "
            f"{pos - start_of_records}"
        )
    return records
