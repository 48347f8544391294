"""Reading a worker incarnation's commit log, replay and fencing (§5.3, §6).

Paper §5.3: a tablet server recovering a tablet "reads its metadata ... [which] contains the
list of SSTables ... and a set of redo points, which are pointers into any commit logs that may
contain data for the tablet", and reconstructs the memtable by applying the updates committed
since the redo points. This module owns reading segments in order (:class:`CommitLogReader`),
the per-tablet filter of that stream (:func:`replay`, :func:`replay_cells`) and the fence that
stops a possibly-alive writer first (:func:`fence`, docs/architecture/design.md §6 rule 4).

The log a reader sees: segments numbered consecutively from its first one, possibly ending
with one or more zero-byte fences. Garbage collection deletes a finished log whole, once no
tablet record lists it, and trims a live worker's log only from its start, below every tablet's
log position (``master/gc_plan.py`` rule 3a), so a reader starting at a tablet's position
finds the log whole from there.
Every segment object that exists was written whole (a PUT is atomic), and a writer acknowledges
segment N only once N and every earlier segment are durable. Reading rules
(docs/architecture/design.md §7):

* reading stops at the first fence; nothing at or after a fence was acknowledged (the writer
  plugs a segment whose PUT failed with a fence, and stops when its create of a number
  collides with recovery's fence);
* a number missing *within the in-flight window* of the last listed segment
  (``format.IN_FLIGHT_WINDOW``) may be a PUT that failed while later ones were in flight, the
  writer dying before it could plug it: :func:`fence` plugs it, and the log reads as ending
  there. A number missing anywhere further down, or a segment that does not decode whole, was
  written and then lost or damaged: :class:`~tabletstore.errors.Corruption`, raised by the
  reader and never plugged or skipped — acknowledged writes may be in it;
* a segment whose header names another worker, incarnation or number is Corruption.

Recovery must call :func:`fence` before reading a log whose writer may be alive; otherwise a
write acknowledged after the listing could be missed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import AsyncIterator

from tabletstore.commitlog.format import (
    IN_FLIGHT_WINDOW,
    LogRecord,
    SegmentContents,
    SegmentHeader,
    decode_segment,
    decode_segment_header,
)
from tabletstore.errors import Corruption, InvalidArgument, PreconditionFailed, Unavailable
from tabletstore.keys import Cell
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.layout import log_prefix, log_segment_key, parse_log_segment_key

__all__ = [
    "CommitLogReader",
    "decode_log_segment",
    "fence",
    "list_segments",
    "plugged_gaps",
    "read_segment_header",
    "replay",
    "replay_cells",
]

#: Segment GETs a reader keeps in flight ahead of the one it is decoding.
READ_AHEAD = 16

#: How many times :func:`fence` re-lists after its create collided before giving up.
FENCE_ATTEMPTS = 50


async def list_segments(
    store: ObjectStore, worker_id: str, incarnation: int, *, start: int = 0
) -> list[int]:
    """The segment numbers (fences included) of one worker incarnation from ``start`` on,
    ascending. A log position (§5.3) lets recovery list only the log's tail: a worker that
    lived for hours has thousands of segments, and listing them all is one request per
    thousand keys before anything is read."""
    numbers: list[int] = []
    after = log_segment_key(worker_id, incarnation, start - 1) if start > 0 else None
    async for info in store.list(log_prefix(worker_id, incarnation), start_after=after):
        try:
            parsed = parse_log_segment_key(info.key)
        except InvalidArgument:
            continue  # not a segment (a stray object under the prefix): not ours to judge
        numbers.append(parsed.seq)
    numbers.sort()
    return numbers


#: Bytes of a segment's start that hold its header, whatever its worker id.
HEADER_BYTES = 512


async def read_segment_header(
    store: ObjectStore, key: str, size: int, *, where: str
) -> tuple[SegmentHeader, int] | None:
    """The header of the segment object ``key`` of ``size`` bytes (not a fence) from one
    ranged GET, and the object's length it declares; None if the object is gone.
    Corruption if the header is damaged. What a verifier or a restore reads to know a
    segment without reading its records."""
    head = await store.get_range(key, 0, min(size, HEADER_BYTES))
    if head is None:
        return None
    return decode_segment_header(head, where=where)


def plugged_gaps(numbers: list[int]) -> list[int]:
    """The missing numbers below the last of ``numbers`` (ascending) that a dead writer may
    legitimately have left: those within the in-flight window of the last listed segment."""
    if not numbers:
        return []
    present = set(numbers)
    low = max(0, numbers[-1] - IN_FLIGHT_WINDOW + 1)
    return [n for n in range(low, numbers[-1]) if n not in present]


async def fence(store: ObjectStore, worker_id: str, incarnation: int, *, start: int = 0) -> int:
    """Stop a worker incarnation's log: create the next segment number as an empty object.

    Returns the fence's number. After this returns, the writer cannot make any further segment
    durable, so the segments below the fence are all that was ever acknowledged. Safe to call
    concurrently and repeatedly. Fences are zero bytes, so two fencers racing through a
    retrying store may both be told they created the same number; either way the log is
    stopped there, which is all a fence is for. A writer's segments are never empty, so a
    writer can never mistake a fence for its own segment.

    Gaps within the in-flight window of the last segment are plugged with fences first (a
    writer that died before plugging a failed PUT); a gap further down is left alone, so the
    reader reports it as Corruption.

    ``start``: a log position (§5.3) of the caller; only the log from there on is listed
    (the fence goes past the last segment either way; gaps are plugged from ``start`` on).
    A log that ends below ``start`` is listed whole.
    """
    for _ in range(FENCE_ATTEMPTS):
        numbers = await list_segments(store, worker_id, incarnation, start=start)
        if not numbers and start > 0:
            numbers = await list_segments(store, worker_id, incarnation)
        for gap in (g for g in plugged_gaps(numbers) if g >= start):
            # A PUT that lands meanwhile makes the plug collide: then the segment is there.
            with contextlib.suppress(PreconditionFailed):
                await store.create(log_segment_key(worker_id, incarnation, gap), b"")
        number = numbers[-1] + 1 if numbers else 0
        try:
            await store.create(log_segment_key(worker_id, incarnation, number), b"")
        except PreconditionFailed:
            continue  # the writer (or another fencer) took that number meanwhile: re-list
        return number
    raise Unavailable(
        f"could not fence commit log {worker_id}/{incarnation}: {FENCE_ATTEMPTS} creates collided"
    )


def decode_log_segment(
    data: bytes,
    worker_id: str,
    incarnation: int,
    number: int,
    *,
    where: str,
    frames: list[bytes] | None = None,
) -> SegmentContents:
    """Segment ``number`` of ``worker_id/incarnation``'s log decoded from its bytes and checked
    against its key (a pure function: a sort task runs it in a pool process)."""
    contents = decode_segment(data, where=where, frames=frames)
    header = contents.header
    if header is not None and (
        header.worker_id != worker_id
        or header.incarnation != incarnation
        or header.segment != number
    ):
        raise Corruption(
            f"{where}: header names worker {header.worker_id!r} incarnation "
            f"{header.incarnation} segment {header.segment}"
        )
    return contents


class CommitLogReader:
    """Reads one worker incarnation's log, segment by segment, in order."""

    def __init__(self, store: ObjectStore, worker_id: str, incarnation: int) -> None:
        self.store = store
        self.worker_id = worker_id
        self.incarnation = incarnation
        #: The number of the fence that ended the log, once reading reached one.
        self.fenced_at: int | None = None

    async def read_segment(
        self, number: int, *, frames: list[bytes] | None = None
    ) -> SegmentContents:
        """One segment decoded and checked against its key. Corruption if missing.
        ``frames``: see :func:`~tabletstore.commitlog.format.decode_records`."""
        return decode_log_segment(
            await self.fetch_segment(number),
            self.worker_id,
            self.incarnation,
            number,
            where=self.where(number),
            frames=frames,
        )

    def where(self, number: int) -> str:
        """Segment ``number``'s object, named in error messages."""
        key = log_segment_key(self.worker_id, self.incarnation, number)
        return f"{self.store.url.rstrip('/')}/{key}"

    async def fetch_segment(self, number: int) -> bytes:
        """Segment ``number``'s bytes, not decoded (:func:`decode_log_segment` does that, in
        another process if need be). Corruption if missing."""
        data = await self.store.get(log_segment_key(self.worker_id, self.incarnation, number))
        if data is None:
            raise Corruption(f"commit-log segment {self.where(number)} is missing")
        return data

    async def records(
        self, *, start_segment: int = 0, stop_segment: int | None = None
    ) -> AsyncIterator[LogRecord]:
        """Every record in log order, from segment ``start_segment`` on.

        Without ``stop_segment`` the log is listed and must be whole up to its first fence.
        With it, exactly the segments ``start_segment .. stop_segment - 1`` are read, each of
        which must exist: the durable prefix of a log still being written (its writer knows
        that prefix; listing would race its PUTs in flight).
        """
        if stop_segment is None:
            numbers = await list_segments(
                self.store, self.worker_id, self.incarnation, start=start_segment
            )
            last = numbers[-1] if numbers else start_segment - 1
            present = set(numbers)
            missing = [n for n in range(start_segment, last) if n not in present]
            if missing:
                raise Corruption(
                    f"commit log {self.worker_id}/{self.incarnation}: segment(s) "
                    f"{_ranges(missing)} missing below segment {last}; acknowledged writes "
                    "may have been in them"
                )
            wanted = range(start_segment, last + 1)
        else:
            wanted = range(start_segment, stop_segment)
        async for number, contents in self._segments_in_order(wanted):
            if contents.fence:
                self.fenced_at = number
                return
            for record in contents.records:
                yield record

    async def _segments_in_order(
        self, numbers: range
    ) -> AsyncIterator[tuple[int, SegmentContents]]:
        """The segments ``numbers`` decoded, in order, with up to ``READ_AHEAD`` GETs in
        flight: recovery is bound by the store's latency, one GET per segment, and a worker's
        log may hold thousands of small segments. Leaving early (a fence, an error, the caller
        stopping) cancels the GETs still in flight."""
        pending: collections.deque[tuple[int, asyncio.Task[SegmentContents]]] = collections.deque()
        upcoming = iter(numbers)
        try:
            for number in itertools.islice(upcoming, READ_AHEAD):
                pending.append((number, asyncio.ensure_future(self.read_segment(number))))
            while pending:
                number, task = pending.popleft()
                contents = await task
                following = next(upcoming, None)
                if following is not None:
                    pending.append((following, asyncio.ensure_future(self.read_segment(following))))
                yield number, contents
        finally:
            for _, task in pending:
                task.cancel()
            # Retrieve what the cancelled reads raised, so none is reported as never retrieved.
            await asyncio.gather(*(task for _, task in pending), return_exceptions=True)


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1..3, 7"`` (for error messages)."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}..{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


async def replay(
    store: ObjectStore,
    worker_id: str,
    incarnation: int,
    table_id: str,
    start_row: bytes = b"",
    end_row: bytes | None = None,
    after_seq: int = 0,
    *,
    start_segment: int = 0,
    stop_segment: int | None = None,
) -> AsyncIterator[LogRecord]:
    """The records of one tablet (``table_id``, rows in ``[start_row, end_row)``, None =
    unbounded) holding any cell with seq > ``after_seq`` (the tablet's redo point), in log
    order. Re-applying a cell already in an SSTable is harmless (memtables and merges drop
    identical entries), so whole records are yielded. ``stop_segment``: read only the durable
    prefix below it (see :meth:`CommitLogReader.records`); ``start_segment``: the tablet's
    position in the log (earlier segments hold none of its writes past ``after_seq``)."""
    reader = CommitLogReader(store, worker_id, incarnation)
    async for record in reader.records(start_segment=start_segment, stop_segment=stop_segment):
        if (
            record.table_id == table_id
            and record.last_seq > after_seq
            and record.row >= start_row
            and (end_row is None or record.row < end_row)
        ):
            yield record


async def replay_cells(
    store: ObjectStore,
    worker_id: str,
    incarnation: int,
    table_id: str,
    start_row: bytes = b"",
    end_row: bytes | None = None,
    after_seq: int = 0,
    *,
    start_segment: int = 0,
    stop_segment: int | None = None,
) -> AsyncIterator[Cell]:
    """The cells with seq > ``after_seq`` of :func:`replay`'s records."""
    async for record in replay(
        store,
        worker_id,
        incarnation,
        table_id,
        start_row,
        end_row,
        after_seq,
        start_segment=start_segment,
        stop_segment=stop_segment,
    ):
        for cell in record.cells:
            if cell.seq > after_seq:
                yield cell
