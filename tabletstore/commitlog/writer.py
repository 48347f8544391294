"""The commit-log writer: group commit of one worker incarnation's log (§5.3, §6).

Paper §6 "Commit-log implementation": one log per tablet server, shared by all its tablets,
with mutations co-mingled; §5.3: a write is acknowledged after it is in the commit log. Here
the log is a sequence of immutable segment objects (format in
:mod:`tabletstore.commitlog.format`, keys from :mod:`tabletstore.storage_s3.layout`).

Group commit. ``append`` encodes its record and queues it. One flusher task PUTs, create-only,
one segment holding every record queued while the previous PUT was in flight (up to
``max_segment_bytes``), then the next. Segments are numbered consecutively from
``first_segment``; a segment is PUT only after the previous one succeeded, so when the waiters
of a segment are released, it *and every earlier segment* are durable (DESIGN.md §6 rule 4).

Sequence numbers are allocated by the caller through :meth:`CommitLogWriter.allocate` (the
tablet needs them to build its cells before logging them) from one counter per writer, i.e.
per worker incarnation, increasing monotonically. Masking compares seqs across workers
(a tablet moves; its new owner's deletes must mask the old owner's puts), so a worker that
loads a tablet calls :meth:`CommitLogWriter.advance` with the tablet's largest known seq
before writing to it. The writer does not check that appended cells carry allocated seqs.

Failure (a failed log is sticky; the worker must start a new incarnation to write again):

* The create of segment N collides (PreconditionFailed) and the object there is not ours:
  recovery fenced this incarnation. Every queued and future append raises
  :class:`~tabletstore.errors.Fenced`. The writes in segment N were not made durable.
  (If the object there *is* byte-for-byte ours, a retrying store re-sent a create whose first
  attempt landed: that is success.)
* Any other PUT error: the writes in that segment raise
  :class:`~tabletstore.errors.Indeterminate` (the PUT may have landed — it can still become
  visible, and recovery would replay it), queued writes not yet sent raise
  :class:`~tabletstore.errors.Unavailable` (certainly not logged), and so does every later
  append. The writer stops rather than write segment N+1: acknowledging N+1 while N may be
  missing would let recovery (which stops at the first gap or fence) lose an acknowledged
  write.

Usage::

    async with CommitLogWriter(store, "worker-7", incarnation=12) as log:
        first = log.allocate(len(mutations))
        cells = ...  # built with seqs first, first + 1, ...
        await log.append(table_id, row, cells)   # returns once durable
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType

from tabletstore.clock import Clock, SystemClock
from tabletstore.commitlog.format import encode_record, encode_segment
from tabletstore.errors import (
    Closed,
    Fenced,
    Indeterminate,
    InvalidArgument,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)
from tabletstore.keys import Cell
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.layout import check_component, log_segment_key

__all__ = ["CommitLogStats", "CommitLogWriter"]

#: Default upper bound on one segment's records, in bytes. A record larger than this still gets
#: a segment of its own.
MAX_SEGMENT_BYTES = 16 * 1024 * 1024


class CommitLogStats:
    """Counters a worker exports (plain attributes, updated by the writer)."""

    __slots__ = ("appends", "bytes", "last_put_seconds", "segments")

    def __init__(self) -> None:
        self.appends = 0
        self.segments = 0
        self.bytes = 0
        self.last_put_seconds = 0.0


class CommitLogWriter:
    """Group-commit writer of one worker incarnation's commit log. Use as an async context
    manager (or call :meth:`start` and :meth:`close`); one flusher task runs in between."""

    def __init__(
        self,
        store: ObjectStore,
        worker_id: str,
        incarnation: int,
        *,
        clock: Clock | None = None,
        first_segment: int = 0,
        first_seq: int = 1,
        max_segment_bytes: int = MAX_SEGMENT_BYTES,
    ) -> None:
        check_component("worker id", worker_id)
        if incarnation < 0 or first_segment < 0 or first_seq < 0 or max_segment_bytes < 1:
            raise InvalidArgument(
                "incarnation, first_segment and first_seq must be >= 0, max_segment_bytes >= 1"
            )
        self.store = store
        self.worker_id = worker_id
        self.incarnation = incarnation
        self.stats = CommitLogStats()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._max_segment_bytes = max_segment_bytes
        self._next_seq = first_seq
        self._next_segment = first_segment
        # Queued records and their waiters, parallel lists (cheaper than a list of pairs).
        self._queued: list[bytes] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        # Set once: the error every later append raises (Fenced, Unavailable or Closed).
        self._failure: TabletStoreError | None = None
        self._closing = False

    # --- sequence numbers ------------------------------------------------------------------

    def allocate(self, n: int) -> int:
        """Reserve ``n`` >= 1 consecutive sequence numbers and return the first."""
        if n < 1:
            raise InvalidArgument(f"allocate needs n >= 1, got {n}")
        first = self._next_seq
        self._next_seq = first + n
        return first

    def advance(self, seq: int) -> None:
        """Make every later allocation larger than ``seq`` (call when loading a tablet whose
        SSTables or replayed records hold seqs up to ``seq``)."""
        if seq >= self._next_seq:
            self._next_seq = seq + 1

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def next_segment(self) -> int:
        """The number the next segment PUT will use (after a failure: the one that failed)."""
        return self._next_segment

    @property
    def failed(self) -> TabletStoreError | None:
        """The sticky error, once the log is fenced, failed or closed."""
        return self._failure

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> CommitLogWriter:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def start(self) -> None:
        """Start the flusher task (in the running event loop)."""
        if self._flusher is not None:
            raise InvalidArgument("commit-log writer already started")
        self._flusher = asyncio.get_running_loop().create_task(
            self._flush_loop(), name=f"commitlog-{self.worker_id}-{self.incarnation}"
        )

    async def close(self) -> None:
        """Write what is queued, then stop. Later appends raise Closed."""
        self._closing = True
        self._wake.set()
        if self._flusher is not None:
            try:
                await self._flusher
            finally:
                self._flusher = None
        if self._failure is None:
            self._failure = Closed(f"commit log {self._name()} is closed")
        # Appends queued without a flusher (never started) cannot be written any more.
        self._fail_queued(self._failure)

    # --- appending ---------------------------------------------------------------------------

    async def append(self, table_id: str, row: bytes, cells: Sequence[Cell]) -> None:
        """Log one row mutation; return once its segment and every earlier one are durable.

        Raises Fenced, Indeterminate or Unavailable as described in the module docstring,
        Closed after close(), InvalidArgument for cells that cannot be logged.
        """
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise Closed(f"commit log {self._name()} is closing")
        if self._flusher is None:
            raise InvalidArgument("commit-log writer not started: use 'async with' or start()")
        record = encode_record(table_id, row, cells)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append(record)
        self._waiters.append(waiter)
        self._queued_bytes += len(record)
        self.stats.appends += 1
        self._wake.set()
        # Cancelling the caller does not withdraw the record; it may still become durable.
        await waiter

    def _name(self) -> str:
        return f"{self.store.url.rstrip('/')}/{self.worker_id}/{self.incarnation}"

    # --- the flusher -------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queued and self._failure is None:
                records, waiters = self._take_batch()
                await self._write_segment(records, waiters)
            if self._failure is not None or self._closing:
                return

    def _take_batch(self) -> tuple[list[bytes], list[asyncio.Future[None]]]:
        """The longest prefix of the queue within max_segment_bytes (at least one record)."""
        if self._queued_bytes <= self._max_segment_bytes:
            records, waiters = self._queued, self._waiters
            self._queued, self._waiters, self._queued_bytes = [], [], 0
            return records, waiters
        size = 0
        n = 0
        for record in self._queued:
            if n and size + len(record) > self._max_segment_bytes:
                break
            size += len(record)
            n += 1
        records, waiters = self._queued[:n], self._waiters[:n]
        del self._queued[:n]
        del self._waiters[:n]
        self._queued_bytes -= size
        return records, waiters

    async def _write_segment(
        self, records: list[bytes], waiters: list[asyncio.Future[None]]
    ) -> None:
        number = self._next_segment
        key = log_segment_key(self.worker_id, self.incarnation, number)
        data = encode_segment(self.worker_id, self.incarnation, number, records)
        started = self._clock.monotonic()
        try:
            await self._create(key, data)
        except Fenced as exc:
            self._fail(waiters, exc, exc)
            return
        except TabletStoreError as exc:
            self._fail_indeterminate(waiters, number, exc)
            return
        except asyncio.CancelledError:
            self._fail_indeterminate(waiters, number, None)
            raise
        except Exception as exc:  # a store bug or an untranslated error: same as a failed PUT
            self._fail_indeterminate(waiters, number, exc)
            return
        self._next_segment = number + 1
        self.stats.segments += 1
        self.stats.bytes += len(data)
        self.stats.last_put_seconds = self._clock.monotonic() - started
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _create(self, key: str, data: bytes) -> None:
        """Create the segment; Fenced if another object holds its key."""
        try:
            await self.store.create(key, data)
        except PreconditionFailed as exc:
            existing = await self.store.get(key)
            if existing == data:
                return  # a retried create whose first attempt had landed
            raise Fenced(
                f"commit log {self._name()} is fenced: segment object {key} was created by "
                "another process (recovery of this worker started); stop serving"
            ) from exc

    def _fail_indeterminate(
        self, waiters: list[asyncio.Future[None]], number: int, cause: BaseException | None
    ) -> None:
        in_flight = Indeterminate(
            f"commit log {self._name()}: PUT of segment {number} failed ({cause!r}); "
            "the writes in it may or may not be durable"
        )
        in_flight.__cause__ = cause
        later = Unavailable(
            f"commit log {self._name()} stopped after segment {number} failed; "
            "the worker must continue under a new incarnation"
        )
        later.__cause__ = cause
        self._fail(waiters, in_flight, later)

    def _fail(
        self,
        waiters: list[asyncio.Future[None]],
        in_flight: TabletStoreError,
        later: TabletStoreError,
    ) -> None:
        """Fail the segment's waiters with ``in_flight``, everything queued or later with
        ``later``; the log is stopped."""
        self._failure = later
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(in_flight)
        self._fail_queued(later)

    def _fail_queued(self, error: TabletStoreError) -> None:
        waiters, self._waiters, self._queued, self._queued_bytes = self._waiters, [], [], 0
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
