"""Change streams: the pure decisions (no I/O), for ``client/change_stream.py``.

A table with a change retention (``TableSchema.changes``) has a change stream: every row
mutation its commit log holds (§5.3: the log is the redo record of every acknowledged write),
with its row key, its commit time and its order within the row. The stream is read from the
retained log segments in the bucket only, never from a worker, so a worker's death loses
nothing of it, and it is partitioned by row range.

**Records.** A log record is one row mutation of one table (``commitlog/format.py``); it names
its table and row, never a tablet, so the stream of a row range is the records of that range
in every log, whatever served the rows when. A worker that loads a tablet replays the log
into its memtable without writing it again, so every mutation is in exactly one log. A
mutation's *commit time* is its segment's stamp (the writer's clock when it sealed the
segment, before its PUT: a write is acknowledged after it); its *order within the row* is its
sequence number (a row's seqs grow across workers: a worker that loads a tablet advances its
sequence past every cell the tablet has).

**What trusts which clock.** A writer's clock is one process's and may be stepped (an NTP
step, an operator's mistake): its stamps may run ahead of true time or go back within its
log. So a stamp labels and orders changes, and what is delivered never depends on it alone.
A read's start is a position in each log (a read from a start time chooses its positions
once, :func:`start_positions`), and every record from there on is delivered whatever its
stamp. Which segments are ready (the cut) and the watermark rest on the reader's clock and
the bucket's: a segment's *landing time* is its object's time in the listing (the store's
clock, ``LastModified``; S3 lists it to the second, hence ``LANDED_RESOLUTION``). The stamp
of a writer whose clock is right is used too, so a segment is read as soon as either says so.

**Readable segments** (:func:`readable_ends`). Each log is read as recovery reads it: up to
its first fence; a number missing within the in-flight window of its last listed segment ends
what can be read for now (a PUT still in flight: nothing from it on is acknowledged yet; for a
fenced log, never: recovery dropped it too); one missing further down is Corruption. Of that
prefix, the segments that landed, or were stamped, at or before the batch's *cut* are read
(:func:`ready`):

    cut = listing start - 2 * CLOCK_SKEW
    watermark = cut - CLOCK_SKEW - LANDED_RESOLUTION

with the reader's clock and the store's within ``CLOCK_SKEW`` of true time. Why the cut: a
row that moved from worker A to worker B has its last mutations in A's log acknowledged
before B took its first. A listing is not a snapshot; a segment of B listed now could have a
predecessor in A that landed after A's part of the listing was read. Any segment of B that
landed (or, B's clock right, was stamped) at or before the cut landed before the listing
began, so its row's predecessors, acknowledged before, are in the listing. A B whose clock was
stepped back stamps early, so one of its segments can be read a batch before its row's
predecessor in A: that row's order across that move rests on B's clock, but nothing is lost
or repeated, as positions, not stamps, say what each batch reads. The watermark: a write
acknowledged before it is in a segment that landed before the cut by the store's clock,
whatever its writer's clock said, with every segment before it in its log, so it has been
delivered. A writer whose clock runs ahead neither holds its log back nor makes the watermark
wrong.

**Batches and tokens.** A read proceeds in batches: one listing, then each log's segments from
the reader's position up to its readable end. A batch's changes are ordered by commit time,
with each row's changes in seq order (:func:`order_changes`); that order depends only on the
segments read, so a token names the position before the batch, the batch's ends and how many
of its changes were delivered (:class:`Cursor`), and reading again from it yields exactly the
changes after. Positions are per log (next segment number); a log not yet named is read from
its first segment (it began after the token). A row range read with several tokens (a merge)
keeps one *lane* per token until a batch brings their positions level.

**Partitions** are tablet ranges. The stream of a range does not depend on where its rows are
served, so a move or a worker's death changes nothing; when the table's tablets no longer have
the partition's range (a split or a merge), the partition ends between two batches and names
its successors, the tablets now overlapping it, each with a token for its part
(:func:`successors`). A merged tablet is read with the tokens of every partition it replaces.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tabletstore.commitlog.format import IN_FLIGHT_WINDOW, LogRecord
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.keys import CellKind

__all__ = [
    "CLOCK_SKEW",
    "LANDED_RESOLUTION",
    "Change",
    "ChangePartition",
    "Cursor",
    "Heartbeat",
    "Lane",
    "Mod",
    "PartitionEnd",
    "SegmentStamp",
    "check_since",
    "check_window",
    "cut_of",
    "decode_token",
    "encode_token",
    "join_tokens",
    "log_name",
    "order_changes",
    "overlap",
    "readable_ends",
    "settle",
    "start_positions",
    "successors",
    "tiles",
    "utc",
]

#: Seconds the reader's clock and the bucket's may be off true time (and a writer's, for its
#: stamps to order a row's changes across a move: see the module docstring).
CLOCK_SKEW = 1.0
#: Seconds a listed object time may be below the true one (S3 lists whole seconds).
LANDED_RESOLUTION = 1.0
TOKEN_VERSION = 1


def utc(t: float) -> str:
    """``2026-11-28T09:15:00.250Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f"{t % 1:.3f}"[1:] + "Z"


def log_name(worker_id: str, incarnation: int) -> str:
    """How a token names a log."""
    return f"{worker_id}/{incarnation}"


@dataclass(frozen=True, slots=True)
class ChangePartition:
    """A row range ``[start, end)`` of a table (``end`` None: to the table's end)."""

    start: bytes
    end: bytes | None

    def holds(self, row: bytes) -> bool:
        return row >= self.start and (self.end is None or row < self.end)

    def __str__(self) -> str:
        end = "end" if self.end is None else repr(self.end)
        return f"[{self.start!r}, {end})"


@dataclass(frozen=True, slots=True)
class Mod:
    """One cell of a mutation as the log holds it: ``kind`` is a ``keys.CellKind`` name in
    lower case (``put``, ``delete_column``, ``delete_family``, ``delete_row``,
    ``aggregate_sum``...), ``timestamp`` the cell's (microseconds), ``value`` its value (for
    a deletion, what ``engine/cells.py`` encodes in it)."""

    kind: str
    family: str
    qualifier: bytes
    timestamp: int
    value: bytes


@dataclass(frozen=True, slots=True)
class Change:
    """One committed row mutation: atomic, in the row's order (``seq``)."""

    row: bytes
    #: Seconds since the epoch: its log segment's stamp.
    commit_time: float
    #: Its order within the row: larger is later.
    seq: int
    mods: tuple[Mod, ...]
    #: Resumes the partition's stream just after this change.
    token: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Every write acknowledged before ``watermark`` (seconds since the epoch) has been
    delivered; ``token`` resumes from here."""

    watermark: float
    token: str


@dataclass(frozen=True, slots=True)
class PartitionEnd:
    """The partition's stream ended (a split or merge): read each successor with its token
    (a merged successor with the tokens of every partition it replaces)."""

    partition: ChangePartition
    successors: tuple[tuple[ChangePartition, str], ...]


@dataclass(frozen=True, slots=True)
class Lane:
    """A row range read from the same log positions (log name -> next segment number)."""

    start: bytes
    end: bytes | None
    positions: Mapping[str, int]

    @property
    def partition(self) -> ChangePartition:
        return ChangePartition(self.start, self.end)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a partition's read stands; a token is its encoding."""

    table_id: str
    lanes: tuple[Lane, ...]
    #: The start time the read began from (seconds): its positions were chosen by it, and
    #: nothing else depends on it (a record past a position is delivered whatever its stamp).
    since: float
    #: When the listing of the current batch (or the last one) began: the token's age.
    made_at: float
    #: The segment ends of the batch being delivered (None between batches) and how many of
    #: its changes were delivered.
    batch: Mapping[str, int] | None = None
    delivered: int = 0
    watermark: float = field(default=0.0)

    @property
    def partition(self) -> ChangePartition:
        return ChangePartition(self.lanes[0].start, self.lanes[-1].end)


# --- tokens ----------------------------------------------------------------------------------


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).decode()


def encode_token(c: Cursor) -> str:
    """The cursor as an opaque printable string."""
    doc = {
        "v": TOKEN_VERSION,
        "t": c.table_id,
        "l": [
            [_b64(x.start), None if x.end is None else _b64(x.end), dict(x.positions)]
            for x in c.lanes
        ],
        "s": c.since,
        "m": c.made_at,
        "b": None if c.batch is None else dict(c.batch),
        "k": c.delivered,
        "w": c.watermark,
    }
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw)).decode().rstrip("=")


def _positions(v: object) -> dict[str, int]:
    if not isinstance(v, dict) or not all(
        isinstance(k, str) and isinstance(n, int) and n >= 0 for k, n in v.items()
    ):
        raise ValueError("bad log positions")
    return dict(v)


def decode_token(text: str, table_id: str, table: str) -> Cursor:
    """The cursor of a token of table ``table`` (id ``table_id``); InvalidArgument if it is
    not a change-stream token or belongs to another table (or an earlier one of that name)."""
    try:
        raw = zlib.decompress(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        doc = json.loads(raw)
        if doc["v"] != TOKEN_VERSION:
            raise ValueError(f"token version {doc['v']!r}")
        lanes = tuple(
            Lane(
                base64.urlsafe_b64decode(s),
                None if e is None else base64.urlsafe_b64decode(e),
                _positions(p),
            )
            for s, e, p in doc["l"]
        )
        if not lanes:
            raise ValueError("no row range")
        cursor = Cursor(
            table_id=str(doc["t"]),
            lanes=lanes,
            since=float(doc["s"]),
            made_at=float(doc["m"]),
            batch=None if doc["b"] is None else _positions(doc["b"]),
            delivered=int(doc["k"]),
            watermark=float(doc["w"]),
        )
    except (binascii.Error, zlib.error, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(f"not a change-stream token of table {table!r} ({exc})") from exc
    if cursor.table_id != table_id:
        raise InvalidArgument(
            f"the change-stream token belongs to another table (id {cursor.table_id!r}), "
            f"not to table {table!r} (id {table_id!r})"
        )
    return cursor


def join_tokens(cursors: Sequence[Cursor], partition: ChangePartition) -> Cursor:
    """One cursor reading ``partition`` from ``cursors`` whose ranges tile it exactly (the
    tokens a split or merge handed out); InvalidArgument otherwise."""
    if len(cursors) == 1 and cursors[0].partition == partition:
        return cursors[0]
    if any(c.batch is not None for c in cursors):
        raise InvalidArgument(
            "a token taken in the middle of a batch resumes its own partition only; pass it "
            "alone, with that partition"
        )
    lanes = sorted((x for c in cursors for x in c.lanes), key=lambda x: x.start)
    pos = partition.start
    for x in lanes:
        if x.start != pos or pos is None:
            raise InvalidArgument(
                f"the tokens' row ranges do not tile partition {partition}: pass the tokens "
                "of every partition it replaces, once each"
            )
        pos = x.end  # type: ignore[assignment]
    if pos != partition.end:
        raise InvalidArgument(
            f"the tokens' row ranges do not tile partition {partition}: pass the tokens of "
            "every partition it replaces, once each"
        )
    return Cursor(
        table_id=cursors[0].table_id,
        lanes=tuple(lanes),
        since=min(c.since for c in cursors),
        made_at=min(c.made_at for c in cursors),
        watermark=min(c.watermark for c in cursors),
    )


# --- windows ---------------------------------------------------------------------------------


def check_window(table: str, window: float | None, made_at: float, now: float) -> None:
    """InvalidArgument unless a token made at ``made_at`` is within ``table``'s change
    retention at ``now``."""
    if window is None:
        raise InvalidArgument(
            f"table {table!r} keeps no changes: set a retention (tabletstore changes {table} "
            "24h) to read its change stream from then on"
        )
    if made_at < now - window:
        raise InvalidArgument(
            f"the change-stream token of {utc(made_at)} is outside the change retention of "
            f"table {table!r}: it keeps {window:g} s, from {utc(now - window)} to now; start "
            "again from a start time"
        )


def check_since(table: str, window: float | None, since: float, now: float) -> None:
    """InvalidArgument unless a read may start at ``since``."""
    if window is None:
        check_window(table, window, since, now)
    assert window is not None
    if since < now - window:
        raise InvalidArgument(
            f"start time {utc(since)} is outside the change retention of table {table!r}: it "
            f"keeps {window:g} s, from {utc(now - window)} to now"
        )
    if since > now + CLOCK_SKEW:
        raise InvalidArgument(f"start time {utc(since)} is in the future (now is {utc(now)})")


# --- segments --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentStamp:
    """One listed segment: its number, size (0: a fence) and stamp (its header's; its
    object's time for a format version 1 segment). ``written_at`` is None while unknown
    (a segment below every position, never read). ``landed`` is its object's time in the
    listing (the store's clock); None when not known."""

    number: int
    size: int
    written_at: float | None
    landed: float | None = None


def cut_of(listing_started: float) -> tuple[float, float]:
    """(cut, watermark) of a batch whose listing began at ``listing_started``."""
    cut = listing_started - 2 * CLOCK_SKEW
    return cut, cut - CLOCK_SKEW - LANDED_RESOLUTION


def ready(segment: SegmentStamp, cut: float) -> bool:
    """Whether a batch of this cut reads the segment: it landed at or before the cut by the
    store's clock, or was stamped at or before it (module docstring)."""
    if segment.landed is not None and segment.landed + LANDED_RESOLUTION <= cut:
        return True
    if segment.written_at is None:
        raise AssertionError(f"stamp of segment {segment.number} not read")
    return segment.written_at <= cut


def readable_ends(
    logs: Mapping[str, Sequence[SegmentStamp]], since: Mapping[str, int], cut: float
) -> dict[str, int]:
    """Per log, the end (exclusive) of the segments a batch reads: the recovery-readable
    prefix, each segment :func:`ready` at ``cut``, from ``since[log]`` (the lowest position of any
    lane; its stamps must be known from there on)."""
    ends: dict[str, int] = {}
    for name, segments in logs.items():
        ordered = sorted(segments, key=lambda s: s.number)
        if not ordered:
            continue
        last = ordered[-1].number
        present = {s.number: s for s in ordered}
        end = last + 1
        fence = next((s.number for s in ordered if s.size == 0), None)
        if fence is not None:
            end = fence
        for n in range(ordered[0].number, end):
            if n not in present:
                if n > last - IN_FLIGHT_WINDOW:
                    end = n
                    break
                raise Corruption(
                    f"commit log {name}: segment {n} is missing below segment {last}; a change "
                    "stream never skips a segment"
                )
        start = since.get(name, 0)
        n = max(start, ordered[0].number)
        while n < end and ready(present[n], cut):
            n += 1
        ends[name] = max(n, start)
    return ends


def start_positions(logs: Mapping[str, Sequence[SegmentStamp]], since: float) -> dict[str, int]:
    """Per listed log, its first segment stamped at or after ``since`` or that landed after
    it by the store's clock (a writer whose clock was stepped back stamps early), its end if
    none: a read from a start time, which delivers every record from there on whatever its
    stamp. Segments whose stamp is unknown are older than ``since``."""
    out: dict[str, int] = {}
    for name, segments in logs.items():
        ordered = sorted(segments, key=lambda s: s.number)
        n = ordered[-1].number + 1 if ordered else 0
        for s in ordered:
            if s.size == 0:
                n = s.number
                break
            landed_after = s.landed is not None and s.landed >= since + CLOCK_SKEW
            if landed_after or (s.written_at is not None and s.written_at >= since):
                n = s.number
                break
        out[name] = n
    return out


def first_listed(logs: Mapping[str, Sequence[SegmentStamp]]) -> dict[str, int]:
    return {name: min(s.number for s in segs) for name, segs in logs.items() if segs}


def check_retained(cursor: Cursor, logs: Mapping[str, Sequence[SegmentStamp]]) -> None:
    """InvalidArgument if a position of the cursor is below what its log still holds (the
    segments it would read next were collected): the token is older than the retention."""
    first = first_listed(logs)
    for lane in cursor.lanes:
        for name, n in lane.positions.items():
            if name in first and n < first[name]:
                raise InvalidArgument(
                    f"the change-stream token's position in commit log {name} (segment {n}) "
                    f"is no longer retained (its first segment is {first[name]}); start again "
                    "from a start time"
                )


# --- batches ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Logged:
    """One record of a batch and where it was read."""

    log: str
    segment: int
    index: int
    commit_time: float
    record: LogRecord


def batch_spans(cursor: Cursor, ends: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Per log, the segment numbers ``[low, high)`` some lane of the cursor reads."""
    spans: dict[str, tuple[int, int]] = {}
    for name, end in ends.items():
        low = min(x.positions.get(name, 0) for x in cursor.lanes)
        if low < end:
            spans[name] = (low, end)
    return spans


def order_changes(cursor: Cursor, ends: Mapping[str, int], read: Iterable[Logged]) -> list[Logged]:
    """The batch's changes: the records of the cursor's table, each in the lane holding its
    row and read by it (between its position and the batch's end), whatever its stamp (a
    writer whose clock was stepped back stamps records before the read's start time; past
    its positions, they are changes after it); ordered by (commit time, log, segment, index), then each row's records put in
    seq order in the places its records hold."""
    starts = [x.start for x in cursor.lanes]
    chosen: list[Logged] = []
    for item in read:
        rec = item.record
        if rec.table_id != cursor.table_id:
            continue
        i = bisect.bisect_right(starts, rec.row) - 1
        if i < 0:
            continue
        lane = cursor.lanes[i]
        if lane.end is not None and rec.row >= lane.end:
            continue
        if not lane.positions.get(item.log, 0) <= item.segment < ends.get(item.log, 0):
            continue
        chosen.append(item)
    chosen.sort(key=lambda x: (x.commit_time, x.log, x.segment, x.index))
    slots: dict[bytes, list[int]] = {}
    for i, item in enumerate(chosen):
        slots.setdefault(item.record.row, []).append(i)
    out = list(chosen)
    for places in slots.values():
        if len(places) > 1:
            by_seq = sorted((chosen[i] for i in places), key=lambda x: x.record.first_seq)
            for place, item in zip(places, by_seq, strict=True):
                out[place] = item
    return out


def to_change(item: Logged, token: str) -> Change:
    rec = item.record
    mods = tuple(
        Mod(CellKind(c.kind).name.lower(), c.family, c.qualifier, c.ts, c.value) for c in rec.cells
    )
    return Change(rec.row, item.commit_time, rec.first_seq, mods, token)


def settle(cursor: Cursor, ends: Mapping[str, int]) -> Cursor:
    """The cursor after a whole batch: every lane at the batch's ends, and adjacent lanes at
    the same positions made one."""
    lanes: list[Lane] = []
    for x in cursor.lanes:
        pos = dict(x.positions)
        for name, end in ends.items():
            pos[name] = max(pos.get(name, 0), end)
        if lanes and lanes[-1].positions == pos and lanes[-1].end == x.start:
            lanes[-1] = Lane(lanes[-1].start, x.end, pos)
        else:
            lanes.append(Lane(x.start, x.end, pos))
    return replace(cursor, lanes=tuple(lanes), batch=None, delivered=0)


def forget_logs(cursor: Cursor, listed: Iterable[str]) -> Cursor:
    """Drop the positions of logs no longer in the bucket (collected: nothing more can come
    of them); positions of listed logs stay."""
    keep = set(listed)
    lanes = tuple(
        Lane(x.start, x.end, {k: v for k, v in x.positions.items() if k in keep})
        for x in cursor.lanes
    )
    return replace(cursor, lanes=lanes)


def successors(
    cursor: Cursor, tablets: Sequence[ChangePartition]
) -> tuple[tuple[ChangePartition, Cursor], ...] | None:
    """The partitions replacing the cursor's (the tablets overlapping its range), each with
    the cursor for its part of the range; None while the cursor's range is still one
    tablet's, or the tablets do not cover it yet (a change caught half-way)."""
    part = cursor.partition
    if part in tablets:
        return None
    overlapping = [
        t
        for t in sorted(tablets, key=lambda t: t.start)
        if (t.end is None or t.end > part.start) and (part.end is None or t.start < part.end)
    ]
    pos = part.start
    covered = False
    for t in overlapping:
        if t.start > pos:
            return None  # a gap: the tablets are changing
        if t.end is None:
            covered = True
            break
        pos = max(pos, t.end)
        if part.end is not None and pos >= part.end:
            covered = True
            break
    if not covered:
        return None
    out: list[tuple[ChangePartition, Cursor]] = []
    for t in overlapping:
        lanes: list[Lane] = []
        for x in cursor.lanes:
            lo = max(x.start, t.start)
            ends = [e for e in (x.end, t.end) if e is not None]
            hi = min(ends) if ends else None
            if hi is None or lo < hi:
                lanes.append(Lane(lo, hi, x.positions))
        if lanes:
            out.append((t, replace(cursor, lanes=tuple(lanes), batch=None, delivered=0)))
    return tuple(out)


def overlap(a: ChangePartition, b: ChangePartition) -> ChangePartition:
    """The rows two overlapping partitions share."""
    ends = [e for e in (a.end, b.end) if e is not None]
    return ChangePartition(max(a.start, b.start), min(ends) if ends else None)


def tiles(parts: Sequence[ChangePartition], whole: ChangePartition) -> bool:
    """Whether ``parts`` cover ``whole`` exactly, without gaps or overlaps."""
    pos: bytes | None = whole.start
    for p in sorted(parts, key=lambda p: p.start):
        if pos is None or p.start != pos:
            return False
        pos = p.end
    return pos == whole.end
