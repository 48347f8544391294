"""Commit-log writer and reader: group commit, durability before ack, fencing, replay."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import pytest

from tabletstore.clock import ManualClock
from tabletstore.commitlog import (
    CommitLogReader,
    CommitLogWriter,
    encode_record,
    encode_segment,
    fence,
    list_segments,
    replay,
    replay_cells,
)
from tabletstore.commitlog.format import IN_FLIGHT_WINDOW
from tabletstore.commitlog.reader import plugged_gaps
from tabletstore.errors import (
    Closed,
    Corruption,
    Fenced,
    Indeterminate,
    InvalidArgument,
    Unavailable,
)
from tabletstore.keys import Cell, CellKind
from tabletstore.storage_s3.base import ObjectInfo, ObjectStore
from tabletstore.storage_s3.layout import log_segment_key
from tabletstore.storage_s3.memory import MemoryObjectStore


def cells_for(row: bytes, first_seq: int, n: int = 1) -> list[Cell]:
    return [
        Cell(row, "cf", b"q%d" % i, 1000 + i, first_seq + i, CellKind.PUT, b"value-%d" % i)
        for i in range(n)
    ]


class GatedStore:
    """Wraps a store; counts creates and can hold them until a test opens the gate."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.creates: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def create(self, key: str, data: bytes) -> None:
        self.creates.append(key)
        self.entered.set()
        await self.gate.wait()
        await self.inner.create(key, data)

    async def get(self, key: str) -> bytes | None:
        return await self.inner.get(key)

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        return await self.inner.get_range(key, offset, length)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self.inner.head(key)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        async for info in self.inner.list(prefix, start_after=start_after):
            yield info

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def delete_many(self, keys: Iterable[str]) -> None:
        await self.inner.delete_many(keys)

    async def close(self) -> None:
        await self.inner.close()


async def read_all(
    store: ObjectStore, worker: str = "w1", incarnation: int = 1
) -> list[tuple[str, bytes, list[Cell]]]:
    reader = CommitLogReader(store, worker, incarnation)
    return [(r.table_id, r.row, r.cells) async for r in reader.records()]


async def test_round_trip_through_the_store(object_store: ObjectStore) -> None:
    async with CommitLogWriter(object_store, "w1", 1, clock=ManualClock()) as log:
        written = []
        for i in range(20):
            row = b"row-%02d" % i
            cells = cells_for(row, log.allocate(3), 3)
            await log.append("t1" if i % 2 else "t2", row, cells)
            written.append(("t1" if i % 2 else "t2", row, cells))
    assert await read_all(object_store) == written
    numbers = await list_segments(object_store, "w1", 1)
    assert numbers == list(range(len(numbers))) and len(numbers) == 20


async def test_group_commit_batches_concurrent_appends(object_store: ObjectStore) -> None:
    store = GatedStore(object_store)
    async with CommitLogWriter(store, "w1", 1) as log:
        rows = [b"r%04d" % i for i in range(500)]
        await asyncio.gather(*(log.append("t", r, cells_for(r, log.allocate(1))) for r in rows))
        assert log.stats.appends == 500
    # The first append goes out alone; all others arrive while it is in flight.
    assert len(store.creates) <= 3
    got = await read_all(object_store)
    assert sorted(r for _, r, _ in got) == rows


async def test_ack_only_after_the_segment_and_all_earlier_ones_are_durable(
    object_store: ObjectStore,
) -> None:
    store = GatedStore(object_store)
    store.gate.clear()
    async with CommitLogWriter(store, "w1", 1, max_in_flight=1) as log:
        first = asyncio.create_task(log.append("t", b"a", cells_for(b"a", log.allocate(1))))
        await store.entered.wait()  # segment 0 is in flight
        second = asyncio.create_task(log.append("t", b"b", cells_for(b"b", log.allocate(1))))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not first.done() and not second.done()
        assert store.creates == [log_segment_key("w1", 1, 0)]  # segment 1 waits for 0
        assert await object_store.get(log_segment_key("w1", 1, 0)) is None
        store.gate.set()
        await first
        assert await object_store.get(log_segment_key("w1", 1, 0)) is not None
        await second
        assert await object_store.get(log_segment_key("w1", 1, 1)) is not None


class SlowFirstSegment(GatedStore):
    """Holds only segment 0's create at the gate; later segments go straight through."""

    async def create(self, key: str, data: bytes) -> None:
        self.creates.append(key)
        if key.endswith(log_segment_key("w1", 1, 0).rsplit("/", 1)[1]):
            self.entered.set()
            await self.gate.wait()
        await self.inner.create(key, data)


async def test_pipelined_segments_are_acknowledged_in_order(object_store: ObjectStore) -> None:
    store = SlowFirstSegment(object_store)
    store.gate.clear()
    async with CommitLogWriter(store, "w1", 1, max_in_flight=4) as log:
        first = asyncio.create_task(log.append("t", b"a", cells_for(b"a", log.allocate(1))))
        await store.entered.wait()  # segment 0 is in flight, held
        second = asyncio.create_task(log.append("t", b"b", cells_for(b"b", log.allocate(1))))
        await _until_stored(object_store, log_segment_key("w1", 1, 1))
        # Segment 1 was sent and is durable while 0 is not...
        assert await object_store.get(log_segment_key("w1", 1, 1)) is not None
        # ...but its write is not acknowledged before segment 0 is.
        assert not first.done() and not second.done()
        store.gate.set()
        await first
        await second


async def test_a_failed_segment_is_plugged_and_later_ones_are_not_acknowledged(
    object_store: ObjectStore,
) -> None:
    """Segment 0's PUT fails while segment 1 lands: nobody is told either is durable (0's
    write certainly is not: the writer's plug holds its number), and the log reads as ending
    at a fence in segment 0's place."""

    class FailFirst(GatedStore):
        async def create(self, key: str, data: bytes) -> None:
            if key == log_segment_key("w1", 1, 0) and data:
                self.entered.set()
                await self.gate.wait()
                raise Unavailable("injected: PUT of segment 0 failed")
            await self.inner.create(key, data)

    store = FailFirst(object_store)
    store.gate.clear()
    async with CommitLogWriter(store, "w1", 1, max_in_flight=4) as log:
        first = asyncio.create_task(log.append("t", b"a", cells_for(b"a", log.allocate(1))))
        await store.entered.wait()
        second = asyncio.create_task(log.append("t", b"b", cells_for(b"b", log.allocate(1))))
        await _until_stored(object_store, log_segment_key("w1", 1, 1))
        store.gate.set()
        with pytest.raises(Unavailable, match="not logged"):
            await first
        with pytest.raises(Indeterminate):
            await second
    assert await object_store.get(log_segment_key("w1", 1, 0)) == b""  # the plug
    reader = CommitLogReader(object_store, "w1", 1)
    assert [r.row async for r in reader.records()] == []
    assert reader.fenced_at == 0


async def test_a_failed_log_names_the_failure_in_what_every_later_append_raises(
    object_store: ObjectStore,
) -> None:
    """The sticky error is what the worker's tablets name while it moves to a new log, and
    what later appends raise: it must say why the log stopped (a full disk), not only that it
    did."""

    class Full(GatedStore):
        async def create(self, key: str, data: bytes) -> None:
            if data:
                raise Unavailable(f"cannot create {key}: No space left on device")
            await self.inner.create(key, data)  # an empty plug fits on a full disk

    async with CommitLogWriter(Full(object_store), "w1", 1) as log:
        with pytest.raises(Unavailable, match="plugged"):
            await log.append("t", b"a", cells_for(b"a", log.allocate(1)))
        assert log.failed is not None
        assert "No space left on device" in str(log.failed)
        with pytest.raises(Unavailable, match="No space left on device"):
            await log.append("t", b"b", cells_for(b"b", log.allocate(1)))


async def test_fence_plugs_a_gap_left_by_a_dead_writer(object_store: ObjectStore) -> None:
    """A writer died after segment 1 landed but before its failed segment 0 was plugged:
    recovery's fence plugs 0, so the log reads as empty instead of corrupt."""
    from tabletstore.commitlog.format import encode_record, encode_segment

    record = encode_record("t", b"b", cells_for(b"b", 7))
    await object_store.create(log_segment_key("w1", 1, 1), encode_segment("w1", 1, 1, [record]))
    assert await fence(object_store, "w1", 1) == 2
    reader = CommitLogReader(object_store, "w1", 1)
    assert [r.row async for r in reader.records()] == []
    assert reader.fenced_at == 0


async def test_fence_stops_the_writer(object_store: ObjectStore) -> None:
    async with CommitLogWriter(object_store, "w1", 1) as log:
        await log.append("t", b"a", cells_for(b"a", log.allocate(1)))
        assert await fence(object_store, "w1", 1) == 1
        with pytest.raises(Fenced, match="fenced"):
            await log.append("t", b"b", cells_for(b"b", log.allocate(1)))
        with pytest.raises(Fenced):
            await log.append("t", b"c", cells_for(b"c", log.allocate(1)))
        assert isinstance(log.failed, Fenced)
    reader = CommitLogReader(object_store, "w1", 1)
    assert [r.row async for r in reader.records()] == [b"a"]
    assert reader.fenced_at == 1
    # A second fence goes after the first; reading still stops at the first.
    assert await fence(object_store, "w1", 1) == 2
    assert [r.row async for r in CommitLogReader(object_store, "w1", 1).records()] == [b"a"]


async def test_fence_of_an_empty_log_is_segment_zero(object_store: ObjectStore) -> None:
    assert await fence(object_store, "w9", 4) == 0
    async with CommitLogWriter(object_store, "w9", 4) as log:
        with pytest.raises(Fenced):
            await log.append("t", b"a", cells_for(b"a", log.allocate(1)))


async def test_a_retried_create_that_had_landed_is_success(object_store: ObjectStore) -> None:
    clock = ManualClock()
    async with CommitLogWriter(object_store, "w1", 1, clock=clock) as log:
        seq = log.allocate(1)
        cells = cells_for(b"a", seq)
        # What the writer is about to PUT, already there (a first attempt that landed).
        await object_store.create(
            log_segment_key("w1", 1, 0),
            encode_segment("w1", 1, 0, [encode_record("t", b"a", cells)], written_at=clock.time()),
        )
        await log.append("t", b"a", cells)
        assert log.next_segment == 1


async def test_replay_filters_by_table_rows_and_redo_point(object_store: ObjectStore) -> None:
    async with CommitLogWriter(object_store, "w1", 1) as log:
        for i in range(10):
            row = b"r%d" % i
            await log.append("t1", row, cells_for(row, log.allocate(2), 2))
            await log.append("t2", row, cells_for(row, log.allocate(1)))
    # t1 record i has seqs 3i+1, 3i+2; t2 record i has seq 3i+3.
    got = [r async for r in replay(object_store, "w1", 1, "t1", b"r2", b"r7", after_seq=10)]
    assert [r.row for r in got] == [b"r3", b"r4", b"r5", b"r6"]
    assert all(r.table_id == "t1" and r.last_seq > 10 for r in got)
    all_t1 = [r async for r in replay(object_store, "w1", 1, "t1", after_seq=10)]
    straddling = all_t1[0]
    assert (straddling.row, straddling.first_seq, straddling.last_seq) == (b"r3", 10, 11)
    cells = [c async for c in replay_cells(object_store, "w1", 1, "t1", b"r3", b"r4", after_seq=10)]
    assert [c.seq for c in cells] == [11]
    assert [r.row async for r in replay(object_store, "w1", 1, "t2", b"r8")] == [b"r8", b"r9"]


async def test_seq_allocation_is_monotonic_and_advances(object_store: ObjectStore) -> None:
    log = CommitLogWriter(object_store, "w1", 1, first_seq=5)
    assert log.allocate(3) == 5
    assert log.allocate(1) == 8
    log.advance(100)
    assert log.allocate(1) == 101
    log.advance(50)  # never goes back
    assert log.allocate(2) == 102 and log.next_seq == 104
    with pytest.raises(InvalidArgument):
        log.allocate(0)


async def test_misuse_is_reported(object_store: ObjectStore) -> None:
    log = CommitLogWriter(object_store, "w1", 1)
    with pytest.raises(InvalidArgument, match="not started"):
        await log.append("t", b"a", cells_for(b"a", 1))
    with pytest.raises(InvalidArgument, match="worker id"):
        CommitLogWriter(object_store, "a/b", 1)
    async with log:
        with pytest.raises(InvalidArgument, match="no cells"):
            await log.append("t", b"a", [])
    with pytest.raises(Closed):
        await log.append("t", b"a", cells_for(b"a", 1))


async def test_reader_rejects_gaps_misplaced_and_short_segments(
    object_store: ObjectStore,
) -> None:
    rec = [encode_record("t", b"a", cells_for(b"a", 1))]
    seg = [encode_segment("w1", 1, n, rec) for n in range(4)]
    await object_store.create(log_segment_key("w1", 1, 0), seg[0])
    await object_store.create(log_segment_key("w1", 1, 2), seg[2])
    with pytest.raises(Corruption, match="missing"):
        await read_all(object_store)

    await object_store.create(log_segment_key("w2", 1, 0), seg[1])  # header says segment 1
    with pytest.raises(Corruption, match="header names"):
        await read_all(object_store, "w2")

    # A truncated last segment is not "torn": it was written whole, then damaged.
    await object_store.create(log_segment_key("w3", 1, 0), encode_segment("w3", 1, 0, rec)[:-3])
    with pytest.raises(Corruption, match="declares"):
        await read_all(object_store, "w3")


async def write_log(store: ObjectStore, worker: str, segments: int) -> None:
    """``segments`` acknowledged segments of one record each (row r<n>)."""
    async with CommitLogWriter(store, worker, 1, max_segment_bytes=1) as log:
        for n in range(segments):
            row = b"r%d" % n
            await log.append("t", row, cells_for(row, log.allocate(1)))
    assert len(await list_segments(store, worker, 1)) == segments


async def test_a_segment_deleted_below_the_window_is_corruption_not_a_fence(
    object_store: ObjectStore,
) -> None:
    """Deleting one segment in the middle of a log once lost every write after it with no
    error: recovery's fence plugged the hole as if the writer had died there."""
    await write_log(object_store, "w1", 30)
    await object_store.delete(log_segment_key("w1", 1, 10))
    number = await fence(object_store, "w1", 1)
    assert number == 30
    assert await object_store.get(log_segment_key("w1", 1, 10)) is None  # not plugged
    with pytest.raises(Corruption, match=r"segment\(s\) 10 missing"):
        await read_all(object_store)
    # The first segment gone: the same (a log is deleted only whole).
    await write_log(object_store, "w2", 12)
    await object_store.delete(log_segment_key("w2", 1, 0))
    await fence(object_store, "w2", 1)
    with pytest.raises(Corruption, match=r"segment\(s\) 0 missing"):
        await read_all(object_store, "w2")


class ListingCounter:
    """Wraps a store; records the keys every listing returned."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.listed: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        async for info in self.inner.list(prefix, start_after=start_after):
            self.listed.append(info.key)
            yield info


async def test_recovery_lists_only_the_tail_from_a_log_position(
    object_store: ObjectStore,
) -> None:
    """Fencing and reading from a log position (§5.3) list the log from there on, not the
    thousands of segments a long-lived worker leaves below it; a gap below the position is
    not the reader's business, one above it still is Corruption, and a log that ends below
    the position is still fenced past its end."""
    await write_log(object_store, "w1", 30)
    await object_store.delete(log_segment_key("w1", 1, 3))  # below the position: not read
    store = ListingCounter(object_store)
    assert await fence(store, "w1", 1, start=25) == 30  # type: ignore[arg-type]
    reader = CommitLogReader(store, "w1", 1)  # type: ignore[arg-type]
    assert [r.row async for r in reader.records(start_segment=25)] == [
        b"r%d" % n for n in range(25, 30)
    ]
    assert all(k >= log_segment_key("w1", 1, 25) for k in store.listed), store.listed
    await object_store.delete(log_segment_key("w1", 1, 27))
    with pytest.raises(Corruption, match=r"segment\(s\) 27 missing"):
        await CommitLogReader(object_store, "w1", 1).records(start_segment=25).__anext__()
    # A position past the log's end (an idle tablet moved to the next segment): the fence
    # still goes right after the last segment.
    await write_log(object_store, "w2", 4)
    assert await fence(object_store, "w2", 1, start=9) == 4
    assert [r async for r in CommitLogReader(object_store, "w2", 1).records(start_segment=9)] == []


async def test_fence_plugs_only_gaps_within_the_in_flight_window(
    object_store: ObjectStore,
) -> None:
    """A writer that died with PUTs in flight: segments 0..19 acknowledged, 20 failed, 21..23
    landed. Gaps inside the window of the last segment are plugged; the log ends at 20."""
    await write_log(object_store, "w1", 20)
    for n in (21, 22, 23):
        rec = encode_record("t", b"x%d" % n, cells_for(b"x%d" % n, 100 + n))
        await object_store.create(log_segment_key("w1", 1, n), encode_segment("w1", 1, n, [rec]))
    assert plugged_gaps(await list_segments(object_store, "w1", 1)) == [20]
    assert await fence(object_store, "w1", 1) == 24
    reader = CommitLogReader(object_store, "w1", 1)
    assert [r.row async for r in reader.records()] == [b"r%d" % n for n in range(20)]
    assert reader.fenced_at == 20
    # The window is the format's: a gap exactly IN_FLIGHT_WINDOW below the last is too far.
    numbers = [*range(10), *range(11, 10 + IN_FLIGHT_WINDOW + 1)]
    assert plugged_gaps(numbers) == []
    assert plugged_gaps([*range(10), *range(11, 10 + IN_FLIGHT_WINDOW)]) == [10]


async def test_the_durable_prefix_of_a_live_log(object_store: ObjectStore) -> None:
    """What a worker reading its own live log back sees: after a barrier, exactly the
    segments below durable_segments, every acknowledged write among them."""
    async with CommitLogWriter(object_store, "w1", 1, max_segment_bytes=1) as log:
        await asyncio.gather(
            *(log.append("t", b"r%d" % n, cells_for(b"r%d" % n, log.allocate(1))) for n in range(9))
        )
        pending = asyncio.ensure_future(
            log.append("t", b"late", cells_for(b"late", log.allocate(1)))
        )
        await asyncio.sleep(0)  # the append is made (queued), not yet durable
        await log.barrier()
        assert pending.done()
        stop = log.durable_segments
        rows = [r.row async for r in replay(object_store, "w1", 1, "t", stop_segment=stop)]
        assert sorted(rows) == sorted([b"r%d" % n for n in range(9)] + [b"late"])
    with pytest.raises(InvalidArgument, match="max_in_flight"):
        CommitLogWriter(object_store, "w2", 1, max_in_flight=IN_FLIGHT_WINDOW + 1)


async def test_corrupt_middle_record_is_corruption(object_store: ObjectStore) -> None:
    records = [encode_record("t", b"r%d" % i, cells_for(b"r%d" % i, i + 1)) for i in range(3)]
    data = bytearray(encode_segment("w1", 1, 0, records))
    data[len(data) - len(records[2]) - 5] ^= 0x40  # inside record 1's payload
    await object_store.create(log_segment_key("w1", 1, 0), bytes(data))
    with pytest.raises(Corruption, match="checksum"):
        await read_all(object_store)


async def test_reading_ahead_keeps_log_order_and_stops_at_a_damaged_segment(
    object_store: ObjectStore,
) -> None:
    """Segments are fetched READ_AHEAD at a time, with GETs finishing in any order; records
    still come in log order, and a damaged segment in the middle is Corruption after exactly
    the records before it."""
    import random

    from tabletstore.commitlog.reader import READ_AHEAD

    segments = READ_AHEAD * 3
    await write_log(object_store, "w1", segments)
    rnd = random.Random(4)

    class Jittery:
        """GETs that finish out of order."""

        def __getattr__(self, name: str) -> object:
            return getattr(object_store, name)

        async def get(self, key: str) -> bytes | None:
            await asyncio.sleep(rnd.random() / 100)
            return await object_store.get(key)

    reader = CommitLogReader(Jittery(), "w1", 1)  # type: ignore[arg-type]
    assert [r.row async for r in reader.records()] == [b"r%d" % n for n in range(segments)]
    damaged = READ_AHEAD + 3
    key = log_segment_key("w1", 1, damaged)
    data = await object_store.get(key)
    assert data is not None
    await object_store.delete(key)
    await object_store.create(key, data[:-1])
    seen: list[bytes] = []
    with pytest.raises(Corruption):
        async for record in CommitLogReader(Jittery(), "w1", 1).records():  # type: ignore[arg-type]
            seen.append(record.row)
    assert seen == [b"r%d" % n for n in range(damaged)]


async def _until_stored(store: ObjectStore, key: str, *, seconds: float = 10.0) -> None:
    """Wait until ``key`` is in ``store``, at most ``seconds``."""
    end = asyncio.get_running_loop().time() + seconds
    while await store.get(key) is None:
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"{key} not stored within {seconds} s")
        await asyncio.sleep(0.01)


async def _until(condition: object, *, seconds: float = 10.0) -> None:
    """Wait (yielding to the loop) until ``condition()`` holds, at most ``seconds``."""
    assert callable(condition)
    end = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"condition not met within {seconds} s")
        await asyncio.sleep(0.001)


async def test_linger_gathers_appends_made_while_a_put_is_in_flight(
    object_store: ObjectStore,
) -> None:
    """While segment 0's PUT is held, later appends are not cut into segments of their own:
    they wait (a long linger here) and go out as one segment once nothing is in flight."""
    store = GatedStore(object_store)
    store.gate.clear()
    async with CommitLogWriter(store, "w1", 1, max_in_flight=4, linger=60.0) as log:
        first = asyncio.create_task(log.append("t", b"a", cells_for(b"a", log.allocate(1))))
        await store.entered.wait()
        later = []
        for i in range(30):
            row = b"b%02d" % i
            later.append(asyncio.create_task(log.append("t", row, cells_for(row, log.allocate(1)))))
            await asyncio.sleep(0.001)  # the flusher runs between appends
        assert store.creates == [log_segment_key("w1", 1, 0)]
        assert not any(t.done() for t in later)  # nothing acknowledged before it is durable
        store.gate.set()
        await first
        await asyncio.gather(*later)
    assert store.creates == [log_segment_key("w1", 1, 0), log_segment_key("w1", 1, 1)]
    assert len(await read_all(object_store)) == 31


async def test_linger_ends_once_enough_bytes_are_queued(object_store: ObjectStore) -> None:
    store = GatedStore(object_store)
    store.gate.clear()
    async with CommitLogWriter(
        store, "w1", 1, max_in_flight=4, linger=60.0, linger_bytes=500
    ) as log:
        first = asyncio.create_task(log.append("t", b"a", cells_for(b"a", log.allocate(1))))
        await store.entered.wait()
        big = cells_for(b"big", log.allocate(40), 40)
        assert len(encode_record("t", b"big", big)) > 500
        later = [asyncio.create_task(log.append("t", b"big", big))]
        try:
            await _until(lambda: len(store.creates) == 2)  # cut without waiting out the linger
            assert not later[0].done()
        finally:
            store.gate.set()
        await first
        await later[0]


async def test_without_linger_appends_in_flight_get_segments_of_their_own(
    object_store: ObjectStore,
) -> None:
    """linger=0 keeps the old behaviour: a segment per wake while PUT slots are free."""
    store = GatedStore(object_store)
    store.gate.clear()
    async with CommitLogWriter(store, "w1", 1, max_in_flight=4, linger=0) as log:
        first = asyncio.create_task(log.append("t", b"a", cells_for(b"a", log.allocate(1))))
        await store.entered.wait()
        second = asyncio.create_task(log.append("t", b"b", cells_for(b"b", log.allocate(1))))
        await _until(lambda: len(store.creates) == 2)
        store.gate.set()
        await first
        await second


def test_linger_options_are_checked(object_store: ObjectStore) -> None:
    with pytest.raises(InvalidArgument, match="linger"):
        CommitLogWriter(object_store, "w1", 1, linger=-1)
    with pytest.raises(InvalidArgument, match="linger"):
        CommitLogWriter(object_store, "w1", 1, linger_bytes=0)


async def test_a_put_stored_but_answered_with_an_error_is_success(
    object_store: ObjectStore,
) -> None:
    """The segment PUT stores the object, then fails (a timeout, a 500 after the write): the
    writer reads the number back and finds its own segment, so the write is acknowledged and
    the log goes on. Reporting it failed left a write in the log (the change stream, a replay)
    that its tablet never applied."""

    class LoseFirstAck(GatedStore):
        async def create(self, key: str, data: bytes) -> None:
            await self.inner.create(key, data)
            if key == log_segment_key("w1", 1, 0) and data:
                raise Indeterminate("injected: stored, then the connection dropped")

    async with CommitLogWriter(LoseFirstAck(object_store), "w1", 1) as log:
        await log.append("t", b"a", cells_for(b"a", log.allocate(1)))
        await log.append("t", b"b", cells_for(b"b", log.allocate(1)))
        assert log.failed is None
    reader = CommitLogReader(object_store, "w1", 1)
    assert [r.row async for r in reader.records()] == [b"a", b"b"]


async def test_a_put_that_stored_nothing_is_a_definite_failure(object_store: ObjectStore) -> None:
    """The PUT fails before storing: the writer's plug lands, so the write is certainly not
    logged (Unavailable, the caller may retry), and nothing reads it back."""

    class FailFirst(GatedStore):
        async def create(self, key: str, data: bytes) -> None:
            if key == log_segment_key("w1", 1, 0) and data:
                raise Indeterminate("injected: connection dropped before the request was sent")
            await self.inner.create(key, data)

    async with CommitLogWriter(FailFirst(object_store), "w1", 1) as log:
        with pytest.raises(Unavailable, match="not logged"):
            await log.append("t", b"a", cells_for(b"a", log.allocate(1)))
    assert await object_store.get(log_segment_key("w1", 1, 0)) == b""
    assert [r.row async for r in CommitLogReader(object_store, "w1", 1).records()] == []


async def test_an_earlier_segment_landing_after_a_later_one_failed_is_acknowledged(
    object_store: ObjectStore,
) -> None:
    """Segment 0 is slow, segment 1 fails for good: 0's write is durable and every segment
    before it is, so it is acknowledged; the writer settles instead of waiting forever."""

    class SlowZeroFailOne(GatedStore):
        async def create(self, key: str, data: bytes) -> None:
            if key == log_segment_key("w1", 1, 0):
                self.entered.set()
                await self.gate.wait()
            if key == log_segment_key("w1", 1, 1) and data:
                raise Unavailable("injected: PUT of segment 1 refused")
            await self.inner.create(key, data)

    store = SlowZeroFailOne(object_store)
    store.gate.clear()
    async with CommitLogWriter(store, "w1", 1, max_in_flight=4) as log:
        first = asyncio.create_task(log.append("t", b"a", cells_for(b"a", log.allocate(1))))
        await store.entered.wait()
        second = asyncio.create_task(log.append("t", b"b", cells_for(b"b", log.allocate(1))))
        with pytest.raises(Unavailable):
            await asyncio.wait_for(second, timeout=10)
        store.gate.set()
        await asyncio.wait_for(first, timeout=10)
    reader = CommitLogReader(object_store, "w1", 1)
    assert [r.row async for r in reader.records()] == [b"a"]


async def test_a_writer_whose_flusher_is_cancelled_answers_every_queued_append() -> None:
    """The future an append waits on refuses cancellation, so the writer answers every queued
    record itself when its flusher is cancelled (a worker's task group ending), also with no
    PUT in flight: the queued append raises Closed (never sent: certainly not logged), and so
    does a later one."""
    writer = CommitLogWriter(MemoryObjectStore(), "w1", 0, linger=0)
    writer.start()
    await asyncio.sleep(0)  # the flusher waits for records
    queued = asyncio.create_task(writer.append("t", b"b", cells_for(b"b", writer.allocate(1))))
    await asyncio.sleep(0)  # queued; the flusher's wake-up is scheduled, not run
    assert writer._waiters and not writer._in_flight
    assert writer._flusher is not None
    writer._flusher.cancel()
    # asyncio.wait, not wait_for: a timeout cannot cancel an append that is never answered.
    await asyncio.wait({queued}, timeout=10)
    assert queued.done()
    with pytest.raises(Closed):
        await queued
    with pytest.raises(Closed):
        await writer.append("t", b"c", cells_for(b"c", writer.allocate(1)))
