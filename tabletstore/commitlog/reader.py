"""Reading a worker incarnation's commit log, replay and fencing (§5.3, §6).

Paper §5.3: a tablet server recovering a tablet "reads its metadata ... [which] contains the
list of SSTables ... and a set of redo points, which are pointers into any commit logs that may
contain data for the tablet", and reconstructs the memtable by applying the updates committed
since the redo points. This module owns reading segments in order (:class:`CommitLogReader`),
the per-tablet filter of that stream (:func:`replay`, :func:`replay_cells`) and the fence that
stops a possibly-alive writer first (:func:`fence`, DESIGN.md §6 rule 4).

The log a reader sees: segments numbered consecutively (the oldest may have been deleted by
garbage collection), possibly ending with one or more zero-byte fences. Reading rules:

* reading stops at the first fence; nothing after a fence was acknowledged (the writer stops
  when its create of the fence's number collides, and it writes segments in order);
* a missing number between two listed segments is :class:`~tabletstore.errors.Corruption`:
  the writer acknowledges segment N only after every earlier one is durable, and plugs a
  number whose PUT failed with a fence, so an unplugged gap means a lost object (or a garbage
  collector that broke its rules). :func:`fence` plugs gaps too (a writer may have died
  before plugging), so recovery, which always fences first, reads up to the first plug;
* a torn segment (see the format module) yields its good prefix if it is the last data
  segment; a torn segment followed by another data segment is Corruption (the later one was
  acknowledged only after the torn one had been written whole);
* a segment whose header names another worker, incarnation or number is Corruption.

Recovery must call :func:`fence` before reading a log whose writer may be alive; otherwise a
write acknowledged after the listing could be missed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from tabletstore.commitlog.format import LogRecord, SegmentContents, decode_segment
from tabletstore.errors import Corruption, InvalidArgument, PreconditionFailed, Unavailable
from tabletstore.keys import Cell
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.layout import log_prefix, log_segment_key, parse_log_segment_key

__all__ = ["CommitLogReader", "fence", "list_segments", "replay", "replay_cells"]

#: How many times :func:`fence` re-lists after its create collided before giving up.
FENCE_ATTEMPTS = 50


async def list_segments(store: ObjectStore, worker_id: str, incarnation: int) -> list[int]:
    """The segment numbers (fences included) of one worker incarnation, ascending."""
    numbers: list[int] = []
    async for info in store.list(log_prefix(worker_id, incarnation)):
        try:
            parsed = parse_log_segment_key(info.key)
        except InvalidArgument:
            continue  # not a segment (a stray object under the prefix): not ours to judge
        numbers.append(parsed.seq)
    numbers.sort()
    return numbers


async def fence(store: ObjectStore, worker_id: str, incarnation: int) -> int:
    """Stop a worker incarnation's log: create the next segment number as an empty object.

    Returns the fence's number. After this returns, the writer cannot make any further segment
    durable, so the segments below the fence are all that was ever acknowledged. Safe to call
    concurrently and repeatedly. Fences are zero bytes, so two fencers racing through a
    retrying store may both be told they created the same number; either way the log is
    stopped there, which is all a fence is for. A writer's segments are never empty, so a
    writer can never mistake a fence for its own segment.
    """
    for _ in range(FENCE_ATTEMPTS):
        numbers = await list_segments(store, worker_id, incarnation)
        # A gap below the last number is a segment whose PUT failed while later ones were in
        # flight: nothing at or after it was acknowledged. Plug it with a fence first, so the
        # log reads as ending there (a PUT that lands meanwhile makes the plug collide).
        present = set(numbers)
        for gap in range(numbers[-1] if numbers else 0):
            if gap not in present:
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


class CommitLogReader:
    """Reads one worker incarnation's log, segment by segment, in order."""

    def __init__(self, store: ObjectStore, worker_id: str, incarnation: int) -> None:
        self.store = store
        self.worker_id = worker_id
        self.incarnation = incarnation
        #: Set once reading met a torn last segment (its good prefix was returned).
        self.torn = False
        #: The number of the fence that ended the log, once reading reached one.
        self.fenced_at: int | None = None

    async def read_segment(self, number: int) -> SegmentContents:
        """One segment decoded and checked against its key. Corruption if missing."""
        key = log_segment_key(self.worker_id, self.incarnation, number)
        data = await self.store.get(key)
        where = f"{self.store.url.rstrip('/')}/{key}"
        if data is None:
            raise Corruption(f"commit-log segment {where} is missing")
        contents = decode_segment(data, where=where)
        header = contents.header
        if header is not None and (
            header.worker_id != self.worker_id
            or header.incarnation != self.incarnation
            or header.segment != number
        ):
            raise Corruption(
                f"{where}: header names worker {header.worker_id!r} incarnation "
                f"{header.incarnation} segment {header.segment}"
            )
        return contents

    async def records(self, *, start_segment: int = 0) -> AsyncIterator[LogRecord]:
        """Every record in log order, from the first listed segment >= ``start_segment``."""
        numbers = [
            n
            for n in await list_segments(self.store, self.worker_id, self.incarnation)
            if n >= start_segment
        ]
        torn_at: int | None = None
        for i, number in enumerate(numbers):
            if i and number != numbers[i - 1] + 1:
                raise Corruption(
                    f"commit log {self.worker_id}/{self.incarnation}: segments "
                    f"{numbers[i - 1] + 1}..{number - 1} are missing"
                )
            contents = await self.read_segment(number)
            if contents.fence:
                self.fenced_at = number
                return
            if torn_at is not None:
                raise Corruption(
                    f"commit log {self.worker_id}/{self.incarnation}: segment {torn_at} is "
                    f"torn but segment {number} follows it"
                )
            if contents.torn:
                torn_at = number
                self.torn = True
            for record in contents.records:
                yield record


async def replay(
    store: ObjectStore,
    worker_id: str,
    incarnation: int,
    table_id: str,
    start_row: bytes = b"",
    end_row: bytes | None = None,
    after_seq: int = 0,
) -> AsyncIterator[LogRecord]:
    """The records of one tablet (``table_id``, rows in ``[start_row, end_row)``, None =
    unbounded) holding any cell with seq > ``after_seq`` (the tablet's redo point), in log
    order. Re-applying a cell already in an SSTable is harmless (memtables and merges drop
    identical entries), so whole records are yielded."""
    reader = CommitLogReader(store, worker_id, incarnation)
    async for record in reader.records():
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
) -> AsyncIterator[Cell]:
    """The cells with seq > ``after_seq`` of :func:`replay`'s records."""
    async for record in replay(
        store, worker_id, incarnation, table_id, start_row, end_row, after_seq
    ):
        for cell in record.cells:
            if cell.seq > after_seq:
                yield cell
