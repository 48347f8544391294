"""Change streams: reading a table's changes from its retained commit log (the shell around
``client/change_plan.py``, which says what is read, in which order, and why it is exact).

:func:`read_changes` follows one partition (a row range) of a table with a change retention:
it lists the commit logs in the bucket, reads each log's new segments up to the batch's cut
(by the bucket's object times and the writers' stamps; no writer's clock alone decides),
and yields the batch's :class:`~tabletstore.client.change_plan.Change` records, each with the
token that resumes just after it, then a
:class:`~tabletstore.client.change_plan.Heartbeat` with the low watermark; it polls for the
next batch until ``end_time`` is passed by the watermark, or ends with a
:class:`~tabletstore.client.change_plan.PartitionEnd` naming the partitions that replace it
when the table's tablets no longer have its range. Everything is read from the bucket (the
store abstraction) and the catalog; no worker is asked. METADATA unreachable (its worker dead
and not yet recovered) delays a partition's end, never its changes.

:class:`SegmentCache` keeps the segments and stamps one client has read, and its last view of
the logs, so the reads of all of a table's partitions in one process (``tabletstore watch``,
a replicator) fetch each segment once and share each listing.
:func:`follow` reads every partition of a table at once, and the successors each end names.

**Listing only what is new.** A batch needs every segment that landed before its listing
began (``change_plan``'s cut), and retention keeps hours of segments, so listing all of
``logs/`` for every poll would cost a request per 1,000 retained segments per poll and
partition. A refresh (:func:`_refresh`) lists ``logs/`` in key order, but when it meets a
segment of a log it knows it jumps (``start_after``) to the end of that log's *contiguous*
run of known segments, keeping the known ones in between. Nothing can appear in a run it
jumps over: every number in it was already listed, and keys are created once. So a refresh
sees exactly what a full listing would, minus deletions strictly inside a run (collection
trims a log from its head, which the refresh sees: it enters each log at its first remaining
key; a log collected whole is not met at all): each log's new segments, a segment that fills
a gap (the run ends before the gap, so what follows it is listed again until the gap fills),
and every new log wherever its key sorts (a new worker, a new incarnation, one whose first
segment landed late). A refresh costs one request, plus one per log with at least
:data:`SKIP` (a page) known segments to jump over, plus the pages of what it reads through
(new segments; shorter runs, which cost no more read through than jumped over): not a
request per 1,000 retained segments. Partitions read in one process share refreshes: a read
that needs a listing while one is running waits for it and takes its start time as its own
(the cut is computed from when the listing began).
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from tabletstore.client import change_plan as plan
from tabletstore.client.change_plan import (
    Change,
    ChangePartition,
    Cursor,
    Heartbeat,
    Lane,
    PartitionEnd,
)
from tabletstore.clock import Clock
from tabletstore.commitlog.format import LogRecord, decode_segment
from tabletstore.errors import Corruption, InvalidArgument, Unavailable
from tabletstore.metadata.catalog import Catalog
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import S3_BATCH, ObjectInfo, ObjectStore, object_url

__all__ = ["ChangeItem", "SegmentCache", "change_partitions", "follow", "read_changes"]

#: What a change stream yields.
ChangeItem = Change | Heartbeat | PartitionEnd

#: Segment reads in flight at once.
PARALLEL = 16

#: Known segments a refresh jumps over with a new listing request rather than reading through
#: (module docstring): a page of a listing, so a jump costs no more requests than reading
#: through would.
SKIP = S3_BATCH


@dataclass(frozen=True, slots=True)
class _Listed:
    """One listed segment."""

    key: str
    log: str
    worker_id: str
    incarnation: int
    number: int
    info: ObjectInfo


@dataclass(frozen=True, slots=True)
class LogView:
    """The commit logs in the bucket as one refresh saw them; never changed afterwards (a read
    in the middle of a batch keeps the view it began with)."""

    #: Clock time when the refresh began (the batch's cut is computed from it).
    started: float
    #: Every segment, in key order.
    entries: tuple[_Listed, ...] = ()
    #: Log name -> segment number -> its object.
    logs: dict[str, dict[int, ObjectInfo]] = field(default_factory=dict)
    #: Log name -> (worker id, incarnation).
    refs: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: Log name -> the key of the last segment of its contiguous run from its first listed
    #: one: where the next refresh jumps to.
    resume: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, started: float, entries: Sequence[_Listed]) -> LogView:
        logs: dict[str, dict[int, ObjectInfo]] = {}
        refs: dict[str, tuple[str, int]] = {}
        resume: dict[str, str] = {}
        following: dict[str, int] = {}  # the number that continues the log's run
        for e in entries:  # key order: each log's segments in number order
            numbers = logs.get(e.log)
            if numbers is None:
                numbers = logs[e.log] = {}
                refs[e.log] = (e.worker_id, e.incarnation)
                following[e.log] = e.number
            numbers[e.number] = e.info
            if following[e.log] == e.number:
                resume[e.log] = e.key
                following[e.log] = e.number + 1
        return cls(started, tuple(entries), logs, refs, resume)


async def _refresh(
    store: ObjectStore, base: LogView | None, started: float, skip: int
) -> tuple[LogView, int]:
    """The logs now, listing only what ``base`` does not hold (module docstring), and the
    listing requests begun (one per jump, plus one)."""
    prev = base.entries if base is not None else ()
    # Positions, not a bisection: a server may order keys by path component rather than by
    # byte (SeaweedFS), and only within one log (fixed-width numbers) do all orders agree.
    where = {e.key: i for i, e in enumerate(prev)}
    resume = base.resume if base is not None else {}
    out: list[_Listed] = []
    after: str | None = None
    calls = 0
    while True:
        jump: str | None = None
        calls += 1
        listing = store.list(layout.LOGS, start_after=after)
        try:
            async for info in listing:
                try:
                    key = layout.parse_log_segment_key(info.key)
                except InvalidArgument:
                    continue  # not a segment: not ours to judge
                name = plan.log_name(key.worker_id, key.incarnation)
                out.append(_Listed(info.key, name, key.worker_id, key.incarnation, key.seq, info))
                target = resume.get(name)
                at = where.get(info.key)
                if target is None or at is None:
                    continue  # a new log, or below its known first segment: read on
                # A log's segments are contiguous in every listing order: the known run
                # after this key, up to the log's resume key, is prev[at + 1 : end].
                end = where[target] + 1
                if end - (at + 1) >= skip:
                    out.extend(prev[at + 1 : end])
                    jump = target
                    break
        finally:
            close: Callable[[], Awaitable[None]] | None = getattr(listing, "aclose", None)
            if close is not None:
                await close()
        if jump is None:
            return LogView.of(started, out), calls
        after = jump


class SegmentCache:
    """Decoded segments (the most recent ``capacity``) and every stamp read, by object key,
    and the last view of the logs (refreshed as the module docstring says, jumping over runs
    of at least ``skip`` known segments). Segments are immutable once written, so a cached
    one is never stale. Also counts what the reads cost (``bench/changes.py`` reports it):
    segments fetched, their bytes, refreshes of the logs' view (``listings``) and the
    listing requests they began (``list_calls``; a request past the first page of one
    counts once)."""

    def __init__(self, capacity: int = 128, *, skip: int = SKIP) -> None:
        if skip < 1:
            raise InvalidArgument(f"SegmentCache needs skip >= 1, got {skip}")
        self.capacity = capacity
        self.skip = skip
        self._segments: OrderedDict[str, tuple[float, list[LogRecord]]] = OrderedDict()
        self.stamps: dict[str, float] = {}
        self.fetched = 0
        self.fetched_bytes = 0
        self.listings = 0
        self.list_calls = 0
        #: The newest view of the logs, and the refresh running (the loop running it).
        self.view: LogView | None = None
        self.refreshing: tuple[asyncio.AbstractEventLoop, asyncio.Task[LogView]] | None = None
        #: Segments being fetched, by object key: (the loop fetching it, its task).
        self.inflight: dict[
            str, tuple[asyncio.AbstractEventLoop, asyncio.Task[tuple[float, list[LogRecord]]]]
        ] = {}

    def settled(self, key: str, task: asyncio.Task[tuple[float, list[LogRecord]]]) -> None:
        """A fetch finished: it is no longer in flight (its failure, if every reader waiting
        for it was cancelled, is not reported as never retrieved)."""
        if self.inflight.get(key, (None, None))[1] is task:
            del self.inflight[key]
        if not task.cancelled():
            task.exception()

    def get(self, key: str) -> tuple[float, list[LogRecord]] | None:
        hit = self._segments.get(key)
        if hit is not None:
            self._segments.move_to_end(key)
        return hit

    def put(self, key: str, stamp: float, records: list[LogRecord]) -> None:
        self.stamps[key] = stamp
        self._segments[key] = (stamp, records)
        while len(self._segments) > self.capacity:
            self._segments.popitem(last=False)

    def forget_gone(self, listed: Collection[str]) -> None:
        """Drop the stamps of segments no longer in the bucket (``listed`` is a complete
        listing of the logs): a stream that follows a table for weeks keeps one stamp per
        segment that still exists, not one per segment it ever read. A stamp dropped while a
        concurrent read still lists its segment costs that read one fetch, nothing else."""
        for key in [k for k in self.stamps if k not in listed]:
            del self.stamps[key]

    async def refresh(self, store: ObjectStore, clock: Clock) -> LogView:
        """A view of the logs begun no earlier than this call: the refresh running in this
        loop if there is one (its view begins when it began, which is when this read's batch
        then begins), else a new one from the newest view."""
        loop = asyncio.get_running_loop()
        running = self.refreshing
        if running is None or running[0] is not loop or running[1].done():
            task = loop.create_task(self._refresh(store, clock.time()))
            running = self.refreshing = (loop, task)
            task.add_done_callback(self._refreshed)
        # Shielded: one reader cancelled leaves the refresh to the others waiting for it.
        return await asyncio.shield(running[1])

    async def _refresh(self, store: ObjectStore, started: float) -> LogView:
        view, calls = await _refresh(store, self.view, started, self.skip)
        self.listings += 1
        self.list_calls += calls
        if self.view is None or view.started >= self.view.started:
            self.view = view
        self.forget_gone({e.key for e in view.entries})
        return view

    def _refreshed(self, task: asyncio.Task[LogView]) -> None:
        if self.refreshing is not None and self.refreshing[1] is task:
            self.refreshing = None
        if not task.cancelled():
            task.exception()  # a failure every waiter was cancelled from is not "never retrieved"


class _Source:
    """One read's view of the bucket's commit logs."""

    def __init__(self, store: ObjectStore, cache: SegmentCache, clock: Clock) -> None:
        self.store = store
        self.cache = cache
        self.clock = clock
        self.sem = asyncio.Semaphore(PARALLEL)
        #: Log name -> segment number -> listed object, of the last refresh.
        self.listed: dict[str, dict[int, ObjectInfo]] = {}
        #: Log name -> (worker id, incarnation), of every log listed so far.
        self.refs: dict[str, tuple[str, int]] = {}

    async def relist(self) -> float:
        """Take a view of the logs begun now or later; returns when it began."""
        view = await self.cache.refresh(self.store, self.clock)
        self.listed = view.logs
        self.refs.update(view.refs)
        return view.started

    async def segment(self, name: str, number: int) -> tuple[float, list[LogRecord]]:
        """The stamp and records of a listed segment (a fence: no records). The partitions
        read in one process poll at about the same moments: a segment another read of this
        cache is already fetching is waited for, not fetched again."""
        info = self.listed[name][number]
        hit = self.cache.get(info.key)
        if hit is not None:
            return hit
        if info.size == 0:
            return (info.last_modified, [])
        loop = asyncio.get_running_loop()
        shared = self.cache.inflight.get(info.key)
        if shared is None or shared[0] is not loop:
            task = loop.create_task(self._fetch(name, number, info))
            shared = (loop, task)
            self.cache.inflight[info.key] = shared
            task.add_done_callback(functools.partial(self.cache.settled, info.key))
        # Shielded: one reader cancelled (a partition's read ended) leaves the fetch to the
        # others waiting for it.
        return await asyncio.shield(shared[1])

    async def _fetch(
        self, name: str, number: int, info: ObjectInfo
    ) -> tuple[float, list[LogRecord]]:
        where = object_url(self.store.url, info.key)
        async with self.sem:
            data = await self.store.get(info.key)
        if data is None:
            raise InvalidArgument(
                f"{where} was collected while the change stream read it: the read is older "
                "than the table's change retention; start again from a start time"
            )
        self.cache.fetched += 1
        self.cache.fetched_bytes += len(data)
        contents = await asyncio.to_thread(decode_segment, data, where=where)
        assert contents.header is not None
        worker, incarnation = self.refs[name]
        if (contents.header.worker_id, contents.header.incarnation, contents.header.segment) != (
            worker,
            incarnation,
            number,
        ):
            raise Corruption(f"{where}: its header names another log or segment")
        stamp = contents.header.written_at
        written = info.last_modified if stamp is None else stamp
        self.cache.put(info.key, written, contents.records)
        return (written, contents.records)

    async def stamps(
        self, lows: dict[str, int], since: float | None = None
    ) -> dict[str, list[plan.SegmentStamp]]:
        """Every listed segment with its landing time and, from ``lows[log]`` on, its stamp
        (read now if unknown); with ``since``, also the stamps of those whose object is not
        older than it (a start time)."""

        async def stamp(name: str, number: int, info: ObjectInfo) -> plan.SegmentStamp:
            landed = info.last_modified
            if info.size == 0:
                return plan.SegmentStamp(number, 0, landed, landed)
            known = self.cache.stamps.get(info.key)
            if known is None:
                wanted = number >= lows.get(name, 0) or (
                    since is not None and info.last_modified >= since - plan.CLOCK_SKEW
                )
                if not wanted:
                    return plan.SegmentStamp(number, info.size, None, landed)
                known, _ = await self.segment(name, number)
            return plan.SegmentStamp(number, info.size, known, landed)

        out: dict[str, list[plan.SegmentStamp]] = {}
        for name, numbers in sorted(self.listed.items()):
            out[name] = list(
                await asyncio.gather(*(stamp(name, n, i) for n, i in sorted(numbers.items())))
            )
        return out

    async def read(self, spans: dict[str, tuple[int, int]]) -> list[plan.Logged]:
        async def one(name: str, number: int) -> list[plan.Logged]:
            written, records = await self.segment(name, number)
            return [plan.Logged(name, number, i, written, r) for i, r in enumerate(records)]

        jobs = [
            one(name, n)
            for name, (low, high) in sorted(spans.items())
            for n in range(low, high)
            if n in self.listed.get(name, {})
        ]
        return [item for batch in await asyncio.gather(*jobs) for item in batch]


async def change_partitions(catalog: Catalog, table: str) -> list[ChangePartition]:
    """The table's partitions now: its tablets' row ranges, in row order."""
    info = await catalog.get_table(table)
    return await change_partitions_of(catalog, info.table_id)


async def read_changes(
    store: ObjectStore,
    catalog: Catalog,
    table: str,
    partition: ChangePartition | None = None,
    *,
    tokens: Sequence[str] = (),
    start_time: float | None = None,
    end_time: float | None = None,
    poll: float = 0.5,
    heartbeat: float = 2.0,
    clock: Clock,
    cache: SegmentCache | None = None,
) -> AsyncIterator[ChangeItem]:
    """Follow ``partition`` of ``table``: from ``tokens`` (one, or those of every partition
    a merged one replaces), else from ``start_time`` (seconds since the epoch; default now).
    Yields changes, heartbeats (after a batch with changes, and every ``heartbeat`` seconds)
    and, last, a PartitionEnd if a split or merge ends the partition; stops once the
    watermark reaches ``end_time``. InvalidArgument for a token of another table, a token or
    start time outside the change retention, or tokens that do not tile the partition."""
    info = await catalog.get_table(table)
    window = info.schema.changes
    source = _Source(store, cache if cache is not None else SegmentCache(), clock)
    now = clock.time()
    if tokens:
        cursors = [plan.decode_token(t, info.table_id, table) for t in tokens]
        for c in cursors:
            plan.check_window(table, window, c.made_at, now)
        if partition is None:
            if len(cursors) > 1:
                raise InvalidArgument("name the partition that several tokens are read into")
            partition = cursors[0].partition
        cursor = plan.join_tokens(cursors, partition)
    else:
        if partition is None:
            raise InvalidArgument(
                "name a partition (table.change_partitions() lists them) or pass tokens"
            )
        since = now if start_time is None else start_time
        plan.check_since(table, window, since, now)
        started = await source.relist()
        positions = plan.start_positions(await source.stamps({}, since), since)
        cursor = Cursor(
            table_id=info.table_id,
            lanes=(Lane(partition.start, partition.end, positions),),
            since=since,
            made_at=started,
        )
    last_beat = float("-inf")
    while True:
        if cursor.batch is None:
            try:
                tablets = await change_partitions_of(catalog, info.table_id)
            except Unavailable:
                # METADATA unreachable (its worker died and no master has recovered it yet):
                # the stream of a range does not depend on its tablets, so the read goes on
                # from the bucket and a split or merge ends the partition at a later batch.
                tablets = None
            after = None if tablets is None else plan.successors(cursor, tablets)
            if after is not None:
                yield PartitionEnd(
                    cursor.partition, tuple((p, plan.encode_token(c)) for p, c in after)
                )
                return
            started = await source.relist()
            plan.check_retained(cursor, _listed_numbers(source))
            cursor = plan.forget_logs(cursor, source.listed)
            lows = _lows(cursor, source.listed)
            cut, _ = plan.cut_of(started)
            ends = plan.readable_ends(await source.stamps(lows), lows, cut)
            cursor = replace(cursor, batch=ends, made_at=started, delivered=0)
        else:
            await source.relist()
        assert cursor.batch is not None
        ends = dict(cursor.batch)
        read = await source.read(plan.batch_spans(cursor, ends))
        changes = plan.order_changes(cursor, ends, read)
        for i in range(cursor.delivered, len(changes)):
            token = plan.encode_token(replace(cursor, delivered=i + 1))
            yield plan.to_change(changes[i], token)
        _, watermark = plan.cut_of(cursor.made_at)
        watermark = max(watermark, cursor.watermark)
        cursor = replace(plan.settle(cursor, ends), watermark=watermark)
        beat = clock.monotonic()
        done = end_time is not None and watermark >= end_time
        if changes or done or beat - last_beat >= heartbeat:
            last_beat = beat
            yield Heartbeat(watermark, plan.encode_token(cursor))
        if done:
            return
        await clock.sleep(poll)


async def change_partitions_of(catalog: Catalog, table_id: str) -> list[ChangePartition]:
    return [ChangePartition(r.start_row, r.end_row) for r in await catalog.list_tablets(table_id)]


def _lows(cursor: Cursor, listed: Collection[str]) -> dict[str, int]:
    """Per listed log, the lowest position of any lane (a log a lane does not name began
    after its cursor was made: it reads it from its start)."""
    return {name: min(x.positions.get(name, 0) for x in cursor.lanes) for name in listed}


def _listed_numbers(source: _Source) -> dict[str, list[plan.SegmentStamp]]:
    return {
        name: [plan.SegmentStamp(n, i.size, None) for n, i in numbers.items()]
        for name, numbers in source.listed.items()
    }


#: Reads one partition (``AsyncTable.read_changes`` bound to its table and bounds).
ReadPartition = Callable[[ChangePartition, Sequence[str]], AsyncIterator[ChangeItem]]


async def follow(
    partitions: Sequence[ChangePartition], read: ReadPartition, *, queue_size: int = 1024
) -> AsyncIterator[tuple[ChangePartition, ChangeItem]]:
    """Every partition's stream, interleaved as items come: each of ``partitions`` is read
    with no token (``read`` supplies the start time), and each successor a partition end
    names is read with the tokens it was handed, once the tokens of every partition it
    replaces are in (a merge). Ends when every stream has ended (an end time)."""
    queue: asyncio.Queue[tuple[ChangePartition, ChangeItem | Exception | None]] = asyncio.Queue(
        queue_size
    )
    covered: dict[ChangePartition, list[ChangePartition]] = {}
    handed: dict[ChangePartition, list[str]] = {}

    async def run(part: ChangePartition, tokens: Sequence[str]) -> None:
        try:
            async for item in read(part, tokens):
                await queue.put((part, item))
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put((part, exc))
        else:
            await queue.put((part, None))

    tasks: set[asyncio.Task[None]] = set()

    def start(part: ChangePartition, tokens: Sequence[str]) -> None:
        task = asyncio.create_task(run(part, tokens))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        for p in partitions:
            start(p, ())
        running = len(partitions)
        while running:
            part, item = await queue.get()
            if item is None:
                running -= 1
                continue
            if isinstance(item, Exception):
                raise item
            yield part, item
            if not isinstance(item, PartitionEnd):
                continue
            for succ, token in item.successors:
                handed.setdefault(succ, []).append(token)
                covered.setdefault(succ, []).append(plan.overlap(part, succ))
                if plan.tiles(covered[succ], succ):
                    start(succ, tuple(handed.pop(succ)))
                    del covered[succ]
                    running += 1
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
