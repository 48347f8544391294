"""The commit-log writer: group commit of one worker incarnation's log (§5.3, §6).

Paper §6 "Commit-log implementation": one log per tablet server, shared by all its tablets,
with mutations co-mingled; §5.3: a write is acknowledged after it is in the commit log. Here
the log is a sequence of immutable segment objects (format in
:mod:`tabletstore.commitlog.format`, keys from :mod:`tabletstore.storage_s3.layout`).

Group commit. ``append`` encodes its record and queues it. A flusher task cuts the queue into
segments (up to ``max_segment_bytes`` each) and PUTs them, create-only, with up to
``max_in_flight`` PUTs running at once (object stores have high latency and high concurrency:
one PUT at a time caps a worker at one segment per round trip). Segments are numbered
consecutively from ``first_segment``.

Linger. While segment PUTs are in flight, the flusher does not cut the next segment at once: it
lingers up to ``linger`` seconds (default 10 ms), or until ``linger_bytes`` (512 KiB) are
queued, or until no PUT is in flight any more. A write waits for the earlier segments anyway
(in-order acknowledgement), so lingering costs it little latency, while a lightly loaded log
is made of a few large segments instead of thousands of tiny ones: recovery reads a log one
GET per segment (§5.3; docs/architecture/design.md §7), so the segment count is what it pays for.
With nothing in flight a write goes out at once. Acknowledgement is in order: the waiters of segment
N are released only when N *and every earlier segment* are durable (docs/architecture/design.md §6
rule 4), so a gap can only hide writes nobody was told were durable.

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
* Any other PUT error may have happened after the object was stored (a timeout, a dropped
  connection, a 500 after the write), so the writer settles it before anyone hears back: it
  plugs the number with an empty fence object, create-only. If the plug collides and the object
  there is byte-for-byte the segment, the PUT had landed: that is success, and the log goes on.
  If the plug lands, the segment certainly holds nothing: its writes raise
  :class:`~tabletstore.errors.Unavailable` (not logged). If another object is there, recovery
  fenced the log first (Fenced, as above). Only if the settling itself fails is the outcome
  unknown: the segment's writes raise :class:`~tabletstore.errors.Indeterminate`. The log reads
  are authoritative, so a write must never be reported failed while its record may be read
  back: the change stream and a replay would show a write the table (which holds only what was
  acknowledged to the tablet) does not.
* Whenever a segment fails for good, the writes in every later segment already in flight raise
  Indeterminate (the PUTs may have landed), queued writes not yet sent raise Unavailable
  (certainly not logged), and so does every later append. The log reads as ending at the plug;
  recovery's :func:`~tabletstore.commitlog.reader.fence` plugs any gap the writer could not.

Outcomes cannot be abandoned. A queued record cannot be withdrawn, so the future an append
waits on refuses cancellation (:class:`_Outcome`): a task cancelled while it waits (an RPC
whose client timed out or hung up) goes on waiting until its record is settled, and only then
does asyncio deliver the cancellation. ``on_durable`` is called synchronously, by the writer,
the moment the record is durable, with the record's cells, whatever became of the caller: the
tablet puts the cells into its memtable there, so a durable record is in the table even if its caller was cancelled
or told something else afterwards (a lease that expired meanwhile). No task is created per
append for this: the common path is one future awaited, as without it.

Usage::

    async with CommitLogWriter(store, "worker-7", incarnation=12) as log:
        first = log.allocate(len(mutations))
        cells = ...  # built with seqs first, first + 1, ...
        await log.append(table_id, row, cells)   # returns once durable
"""

from __future__ import annotations

import asyncio
import contextlib
from bisect import bisect_left
from collections.abc import Callable, Sequence
from types import TracebackType

from tabletstore.clock import Clock, SystemClock
from tabletstore.commitlog.format import IN_FLIGHT_WINDOW, encode_record, encode_segment
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
#: Default number of segment PUTs in flight at once (at most format.IN_FLIGHT_WINDOW).
MAX_IN_FLIGHT = 4
#: Default seconds the flusher lingers for more records while a PUT is in flight.
LINGER_SECONDS = 0.010
#: Default bytes queued that end a linger early.
LINGER_BYTES = 512 * 1024


#: What the writer calls with a record's cells the moment the record is durable.
OnDurable = Callable[[Sequence[Cell]], object]


class _Outcome(asyncio.Future[None]):
    """The outcome of one queued record: set by the writer once the record is durable or has
    failed. It refuses cancellation (module docstring): asyncio then delivers a cancellation of
    the task awaiting it once it is done, so that task always learns the record settled, and
    :meth:`CommitLogWriter.barrier` always waits for it. The two slots are set right after
    construction (no Python ``__init__``: one is made per append)."""

    __slots__ = ("cells", "on_durable")

    #: Called with ``cells`` by the writer the moment the record is durable, before the
    #: waiting task wakes.
    on_durable: OnDurable | None
    cells: Sequence[Cell]

    def cancel(self, msg: object | None = None) -> bool:
        return False  # a record once queued cannot be withdrawn


#: Upper bounds (seconds) of the segment PUT histogram (:attr:`CommitLogStats.put_counts`).
PUT_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class CommitLogStats:
    """Counters a worker exports (plain attributes, updated by the writer)."""

    __slots__ = ("appends", "bytes", "last_put_seconds", "put_counts", "put_seconds", "segments")

    def __init__(self) -> None:
        self.appends = 0
        self.segments = 0
        self.bytes = 0
        self.last_put_seconds = 0.0
        #: Segment PUTs that succeeded, by duration: a count per bucket of
        #: :data:`PUT_SECONDS_BUCKETS` (not cumulative; the last one past them all). Every
        #: acknowledged write waited for one of them: the floor of a write's latency.
        self.put_counts = [0] * (len(PUT_SECONDS_BUCKETS) + 1)
        #: Their total duration.
        self.put_seconds = 0.0

    def observe_put(self, seconds: float) -> None:
        self.last_put_seconds = seconds
        self.put_counts[bisect_left(PUT_SECONDS_BUCKETS, seconds)] += 1
        self.put_seconds += seconds


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
        max_in_flight: int = MAX_IN_FLIGHT,
        linger: float = LINGER_SECONDS,
        linger_bytes: int = LINGER_BYTES,
    ) -> None:
        check_component("worker id", worker_id)
        if not 1 <= max_in_flight <= IN_FLIGHT_WINDOW:
            # Readers tell a failed PUT from a lost segment by this bound (format module).
            raise InvalidArgument(
                f"max_in_flight must be within 1..{IN_FLIGHT_WINDOW}, got {max_in_flight}"
            )
        if incarnation < 0 or first_segment < 0 or first_seq < 0 or max_segment_bytes < 1:
            raise InvalidArgument(
                "incarnation, first_segment and first_seq must be >= 0, max_segment_bytes >= 1"
            )
        if linger < 0 or linger_bytes < 1:
            raise InvalidArgument(
                f"linger must be >= 0 and linger_bytes >= 1, got {linger}, {linger_bytes}"
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
        self._waiters: list[_Outcome] = []
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        # Set once: the error every later append raises (Fenced, Unavailable or Closed).
        self._failure: TabletStoreError | None = None
        self._closing = False
        self._max_in_flight = max_in_flight
        self._linger = linger
        self._linger_bytes = min(linger_bytes, max_segment_bytes)
        # Set when a PUT finishes or enough bytes are queued: ends a linger early.
        self._nudge = asyncio.Event()
        # Segment number -> its PUT task and its waiters, for segments not yet acknowledged.
        self._in_flight: dict[int, tuple[asyncio.Task[None], list[_Outcome]]] = {}
        # The lowest segment number whose waiters have not been released yet.
        self._next_ack = first_segment
        self._slot = asyncio.Event()
        self._done: set[int] = set()

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
    def durable_segments(self) -> int:
        """Segments ``first_segment .. durable_segments - 1`` are durable and acknowledged
        (each exists whole in the store); later numbers may be in flight, failed or plugged."""
        return self._next_ack

    async def barrier(self) -> None:
        """Wait until every append made before this call is durable or has failed. A worker
        reading its own live log back (a tablet it served before, reloaded) calls this first,
        then reads the segments below :attr:`durable_segments`: every write it acknowledged
        is there, and no listing races the PUTs still in flight."""
        pending = [w for w in self._waiters if not w.done()]
        pending += [w for _, ws in self._in_flight.values() for w in ws if not w.done()]
        if pending:
            # asyncio.wait, not gather: cancelling this caller must not cancel the appends.
            await asyncio.wait(pending)

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
        self._nudge.set()
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

    def _check_accepting(self) -> None:
        """Raise what an append meets before anything is queued: the sticky failure, Closed
        while closing, InvalidArgument before start()."""
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise Closed(f"commit log {self._name()} is closing")
        if self._flusher is None:
            raise InvalidArgument("commit-log writer not started: use 'async with' or start()")

    async def append(
        self,
        table_id: str,
        row: bytes,
        cells: Sequence[Cell],
        on_durable: OnDurable | None = None,
    ) -> None:
        """Log one row mutation; return once its segment and every earlier one are durable.
        ``on_durable(cells)`` is called the moment it is (module docstring), even if the
        caller was cancelled meanwhile: a cancelled caller hears of it once the record settled.

        Raises Fenced, Indeterminate or Unavailable as described in the module docstring,
        Closed after close(), InvalidArgument for cells that cannot be logged.
        """
        self._check_accepting()
        record = encode_record(table_id, row, cells)
        waiter = _Outcome(loop=asyncio.get_running_loop())
        waiter.on_durable = on_durable
        waiter.cells = cells
        self._queued.append(record)
        self._waiters.append(waiter)
        self._queued_bytes += len(record)
        self.stats.appends += 1
        self._wake.set()
        if self._queued_bytes >= self._linger_bytes:
            self._nudge.set()
        # A cancellation of the caller arrives once the record settled (_Outcome).
        await waiter

    async def append_many(
        self,
        table_id: str,
        rows: Sequence[tuple[bytes, Sequence[Cell]]],
        on_durable: OnDurable | None = None,
    ) -> list[TabletStoreError | None]:
        """Log many row mutations at once: their records are queued together (so they share
        segments) and each is acknowledged as :meth:`append` acknowledges one. Returns, per
        row, None once its record is durable, or the error :meth:`append` would have raised
        for it (InvalidArgument for cells that cannot be logged: that row only); each durable
        row's cells are passed to ``on_durable`` the moment it is (as :meth:`append`). Raises,
        with nothing queued, what :meth:`append` raises before queueing."""
        self._check_accepting()
        out: list[TabletStoreError | None] = [None] * len(rows)
        loop = asyncio.get_running_loop()
        waiters: list[tuple[int, _Outcome]] = []
        for i, (row, cells) in enumerate(rows):
            try:
                record = encode_record(table_id, row, cells)
            except TabletStoreError as exc:
                out[i] = exc
                continue
            waiter = _Outcome(loop=loop)
            waiter.on_durable = on_durable
            waiter.cells = cells
            self._queued.append(record)
            self._waiters.append(waiter)
            self._queued_bytes += len(record)
            waiters.append((i, waiter))
        if not waiters:
            return out
        self.stats.appends += len(waiters)
        self._wake.set()
        if self._queued_bytes >= self._linger_bytes:
            self._nudge.set()
        # Segments are acknowledged in order, so once the first waiters are done the rest
        # mostly are too. A cancellation of the caller arrives once its records settled.
        for i, waiter in waiters:
            try:
                await waiter
            except TabletStoreError as exc:
                out[i] = exc
        return out

    def _name(self) -> str:
        return f"{self.store.url.rstrip('/')}/{self.worker_id}/{self.incarnation}"

    # --- the flusher -------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queued and self._failure is None:
                    while len(self._in_flight) >= self._max_in_flight and self._failure is None:
                        self._slot.clear()
                        await self._slot.wait()
                    if self._failure is not None:
                        break
                    await self._linger_while_in_flight()
                    if self._failure is not None:
                        break
                    records, waiters = self._take_batch()
                    self._start_segment(records, waiters)
                if self._failure is not None or (self._closing and not self._queued):
                    break
            # Closing (or failed): let the PUTs already sent finish, so their waiters learn.
            while self._in_flight:
                await asyncio.gather(
                    *(task for task, _ in self._in_flight.values()), return_exceptions=True
                )
        except asyncio.CancelledError:
            for number in sorted(self._in_flight):
                task, waiters = self._in_flight.pop(number)
                task.cancel()
                self._fail_indeterminate(waiters, number, None)
            # Records still queued were never sent, and their waiters cannot be cancelled
            # (_Outcome): they must hear it, as must every later append.
            if self._failure is None:
                self._failure = Closed(f"commit log {self._name()} stopped: its flusher ended")
            self._fail_queued(self._failure)
            raise

    async def _linger_while_in_flight(self) -> None:
        """Wait for more records before cutting a segment while earlier PUTs are in flight
        (module docstring): until ``linger`` seconds passed, ``linger_bytes`` are queued, no
        PUT is in flight, or the log closes or fails."""
        if self._linger <= 0:
            return
        deadline = self._clock.monotonic() + self._linger
        while (
            self._in_flight
            and self._queued_bytes < self._linger_bytes
            and not self._closing
            and self._failure is None
        ):
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return
            self._nudge.clear()
            try:
                await asyncio.wait_for(self._nudge.wait(), remaining)
            except TimeoutError:
                return

    def _start_segment(self, records: list[bytes], waiters: list[_Outcome]) -> None:
        number = self._next_segment
        self._next_segment = number + 1
        task = asyncio.get_running_loop().create_task(
            self._write_segment(number, records), name=f"commitlog segment {number}"
        )
        self._in_flight[number] = (task, waiters)

    def _take_batch(self) -> tuple[list[bytes], list[_Outcome]]:
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

    async def _write_segment(self, number: int, records: list[bytes]) -> None:
        """PUT segment ``number``, then acknowledge every segment that is now durable together
        with all the segments before it."""
        key = log_segment_key(self.worker_id, self.incarnation, number)
        # Stamped before the PUT: every write it acknowledges is acknowledged after this
        # instant (the bound a point-in-time restore relies on, commitlog/format.py).
        data = encode_segment(
            self.worker_id, self.incarnation, number, records, written_at=self._clock.time()
        )
        started = self._clock.monotonic()
        failure: BaseException | None = None
        plugged = False
        try:
            await self._create(key, data)
        except asyncio.CancelledError:
            raise
        except Fenced as exc:
            failure = exc
        except Exception as exc:  # includes an untranslated store error: same as a failed PUT
            failure, plugged = await self._settle_failed_put(key, data, exc)
        if failure is None:
            self.stats.segments += 1
            self.stats.bytes += len(data)
            self.stats.observe_put(self._clock.monotonic() - started)
            self._done.add(number)
            self._release_in_order()
        else:
            await self._segment_failed(number, failure, plugged=plugged)
        self._slot.set()
        self._nudge.set()

    def _release_in_order(self) -> None:
        # Also after a failure: a segment below the failed number that lands is durable with
        # every segment before it (recovery reads it), so its writes are acknowledged. Waiting
        # for the log to be healthy instead left them, and close(), waiting forever.
        while self._next_ack in self._done:
            number = self._next_ack
            self._done.discard(number)
            _, waiters = self._in_flight.pop(number)
            for waiter in waiters:
                if not waiter.done():
                    self._durable(waiter)
            self._next_ack = number + 1

    def _durable(self, waiter: _Outcome) -> None:
        """The waiter's record is durable: run its ``on_durable``, then wake it."""
        on_durable = waiter.on_durable
        if on_durable is not None:
            try:
                on_durable(waiter.cells)
            except Exception as exc:
                # Logged but not applied where the caller wanted it: the write takes effect
                # at the next replay of this log, so its outcome is unknown, never refused.
                err = Indeterminate(
                    f"commit log {self._name()}: a record was logged durably but applying it "
                    f"failed ({exc!r}); it may take effect when the log is replayed"
                )
                err.__cause__ = exc
                waiter.set_exception(err)
                return
        waiter.set_result(None)

    async def _settle_failed_put(
        self, key: str, data: bytes, failure: Exception
    ) -> tuple[BaseException | None, bool]:
        """Decide a segment PUT that raised (module docstring): plug its key, create-only.
        Returns (None, False) if the segment is there after all, (Fenced, False) if another
        process's object is, (the failure, True) if the plug landed (nothing logged), and
        (the failure, False) if the outcome stays unknown."""
        try:
            await self.store.create(key, b"")
        except PreconditionFailed:
            try:
                existing = await self.store.get(key)
            except Exception:
                return failure, False
            if existing == data:
                return None, False  # the PUT had landed: only its answer was lost
            if existing is None:
                return failure, False  # cannot happen with create-only keys; stay unknown
            fenced = Fenced(
                f"commit log {self._name()} is fenced: segment object {key} was created by "
                "another process (recovery of this worker started); stop serving"
            )
            fenced.__cause__ = failure
            return fenced, False
        except Exception:
            return failure, False
        return failure, True

    async def _segment_failed(
        self, number: int, failure: BaseException, *, plugged: bool = False
    ) -> None:
        """Segment ``number`` failed: it and every later segment sent are not acknowledged.
        ``plugged``: the writer's plug holds the number, so the segment's own writes were
        certainly not logged."""
        fenced = isinstance(failure, Fenced)
        if self._failure is None:
            later: TabletStoreError
            if isinstance(failure, Fenced):
                later = failure
            else:
                later = Unavailable(
                    f"commit log {self._name()} stopped after segment {number} failed "
                    f"({failure}); the worker must continue under a new incarnation"
                )
                later.__cause__ = failure
            self._failure = later
            self._fail_queued(later)
        doomed = [(n, *self._in_flight.pop(n)) for n in sorted(self._in_flight) if n >= number]
        for n, task, _ in doomed:
            self._done.discard(n)
            if n != number and not task.done():
                task.cancel()
        if not fenced and not plugged:
            # Plug the hole so the log reads as ending here (a PUT that landed after all makes
            # this collide, and then the log simply goes on to the later segments). Done before
            # the writers hear back, so a caller that sees the error sees the log settled.
            with contextlib.suppress(Exception):  # best effort: recovery's fence() plugs too
                await self.store.create(
                    log_segment_key(self.worker_id, self.incarnation, number), b""
                )
        for n, _, waiters in doomed:
            err: TabletStoreError
            if isinstance(failure, Fenced) and n == number:
                err = failure
            elif plugged and n == number:
                err = Unavailable(
                    f"commit log {self._name()}: PUT of segment {n} failed ({failure!r}) and "
                    "its number is plugged: the writes in it were not logged"
                )
                err.__cause__ = failure
            else:
                err = Indeterminate(
                    f"commit log {self._name()}: segment {n} was sent but segment {number} "
                    f"failed ({failure!r}); the writes may or may not be durable"
                )
                err.__cause__ = failure
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(err)

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
        self, waiters: list[_Outcome], number: int, cause: BaseException | None
    ) -> None:
        what = "was cancelled" if cause is None else f"failed ({cause!r})"
        in_flight = Indeterminate(
            f"commit log {self._name()}: PUT of segment {number} {what}; "
            "the writes in it may or may not be durable"
        )
        in_flight.__cause__ = cause
        later = Unavailable(
            f"commit log {self._name()} stopped after the PUT of segment {number} {what}; "
            "the worker must continue under a new incarnation"
        )
        later.__cause__ = cause
        self._fail(waiters, in_flight, later)

    def _fail(
        self,
        waiters: list[_Outcome],
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
