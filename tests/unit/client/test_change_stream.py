"""The change-stream reader (client/change_stream.py) over a bucket of commit-log segments:
every change once, every token resuming exactly after its change, a segment in flight waited
for, a split ending the partition with successors that continue it exactly, and the bad
requests."""

from __future__ import annotations

import asyncio
import random

import pytest

from tabletstore.client import change_stream
from tabletstore.client.change_plan import Change, ChangePartition, Heartbeat, PartitionEnd
from tabletstore.client.change_stream import ChangeItem
from tabletstore.commitlog.format import encode_record, encode_segment
from tabletstore.data.schema import TableSchema
from tabletstore.errors import InvalidArgument, Unavailable
from tabletstore.keys import Cell, CellKind
from tabletstore.metadata.catalog import TableInfo
from tabletstore.metadata.record import TabletRecord
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.testing.store_conformance import create_many

T0 = 1_800_000_000.0


class _Clock:
    """Wall time that moves only by the reader's sleeps (and the test)."""

    def __init__(self) -> None:
        self.now = T0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)

    def random(self) -> random.Random:
        return random.Random(0)


class _Catalog:
    def __init__(self, info: TableInfo, splits: list[bytes]) -> None:
        self.info = info
        self.splits = splits

    async def get_table(self, name: str) -> TableInfo:
        assert name == self.info.schema.name
        return self.info

    async def list_tablets(self, table_id: str) -> list[TabletRecord]:
        bounds: list[bytes | None] = [b"", *self.splits, None]
        return [
            TabletRecord(table_id, f"t{i}", bounds[i] or b"", bounds[i + 1])
            for i in range(len(bounds) - 1)
        ]


INFO = TableInfo("t-1", TableSchema(name="t", changes=3600.0))


async def _segment(
    store: MemoryObjectStore,
    worker: str,
    number: int,
    at: float,
    rows: list[tuple[bytes, int]],
    table_id: str = "t-1",
    incarnation: int = 1,
) -> None:
    records = [
        encode_record(table_id, row, [Cell(row, "f", b"q", 7, seq, CellKind.PUT, b"%d" % seq)])
        for row, seq in rows
    ]
    data = encode_segment(worker, incarnation, number, records, written_at=at)
    await store.create(layout.log_segment_key(worker, incarnation, number), data)


async def _collect(it: object) -> list[ChangeItem]:
    out: list[ChangeItem] = []
    async for item in it:  # type: ignore[attr-defined]
        out.append(item)
    return out


def _changes(items: list[ChangeItem]) -> list[tuple[bytes, int]]:
    return [(c.row, c.seq) for c in items if isinstance(c, Change)]


async def _bucket() -> tuple[MemoryObjectStore, list[tuple[bytes, int]]]:
    """Two workers' logs: row r moved from w1 to w2; a record of another table."""
    store = MemoryObjectStore()
    await _segment(store, "w1", 0, T0 - 50, [(b"a", 1), (b"r", 2)])
    await _segment(store, "w1", 1, T0 - 40, [(b"r", 3), (b"x", 4)])
    await _segment(store, "w1", 2, T0 - 39, [(b"zz", 9)], table_id="t-2")
    await _segment(store, "w2", 0, T0 - 45, [(b"r", 10), (b"n", 11)])  # w2's clock behind
    await _segment(store, "w2", 1, T0 - 30, [(b"r", 12), (b"b", 13), (b"y", 14)])
    acknowledged = [(b"a", 1), (b"r", 2), (b"r", 3), (b"x", 4), (b"r", 10), (b"n", 11)]
    return store, [*acknowledged, (b"r", 12), (b"b", 13), (b"y", 14)]


def _read(store: MemoryObjectStore, catalog: _Catalog, clock: _Clock, **kw: object) -> object:
    kw.setdefault("end_time", T0)
    return change_stream.read_changes(
        store,
        catalog,
        "t",
        clock=clock,
        poll=1.0,
        **kw,  # type: ignore[arg-type]
    )


async def test_every_change_once_in_row_order_and_every_token_resumes_exactly() -> None:
    store, written = await _bucket()
    catalog = _Catalog(INFO, [])
    clock = _Clock()
    whole = ChangePartition(b"", None)
    items = await _collect(_read(store, catalog, clock, partition=whole, start_time=T0 - 3000))
    got = _changes(items)
    assert sorted(got) == sorted(written)
    assert [s for r, s in got if r == b"r"] == [2, 3, 10, 12]  # seq order across the move
    assert isinstance(items[-1], Heartbeat) and items[-1].watermark >= T0
    for k, item in enumerate(items):
        assert isinstance(item, Change | Heartbeat)
        rest = _changes(await _collect(_read(store, catalog, clock, tokens=[item.token])))
        assert _changes(items[: k + 1]) + rest == got, k


async def test_a_segment_in_flight_is_waited_for_and_later_segments_after_it() -> None:
    store = MemoryObjectStore()
    clock = _Clock()
    catalog = _Catalog(INFO, [])
    await _segment(store, "w1", 0, T0 - 50, [(b"a", 1)])
    await _segment(store, "w1", 2, T0 - 48, [(b"a", 3)])  # 1 is still in flight
    first = await _collect(
        _read(store, catalog, clock, partition=ChangePartition(b"", None), start_time=T0 - 100)
    )
    assert _changes(first) == [(b"a", 1)]
    await _segment(store, "w1", 1, T0 - 49, [(b"a", 2)])
    last = [i for i in first if isinstance(i, Heartbeat)][-1].token
    rest = await _collect(_read(store, catalog, clock, tokens=[last], end_time=clock.now))
    assert _changes(rest) == [(b"a", 2), (b"a", 3)]


async def test_a_writer_whose_clock_was_stepped_back_loses_nothing() -> None:
    # A reader follows from T0 - 20; then w1's clock is stepped 30 s back: its next segments
    # are stamped before the start time, and are changes after it all the same.
    store = MemoryObjectStore()
    clock = _Clock()
    catalog = _Catalog(INFO, [])
    await _segment(store, "w1", 0, T0 - 30, [(b"a", 1)])
    await _segment(store, "w1", 1, T0 - 10, [(b"a", 2)])
    first = await _collect(
        _read(store, catalog, clock, partition=ChangePartition(b"", None), start_time=T0 - 20)
    )
    assert _changes(first) == [(b"a", 2)]
    await _segment(store, "w1", 2, T0 - 39, [(b"a", 3), (b"b", 4)])  # stepped back
    await _segment(store, "w1", 3, T0 - 38, [(b"a", 5)])
    last = [i for i in first if isinstance(i, Heartbeat)][-1].token
    rest = await _collect(_read(store, catalog, clock, tokens=[last], end_time=clock.now))
    assert _changes(rest) == [(b"a", 3), (b"b", 4), (b"a", 5)]


async def test_a_split_ends_the_partition_and_its_halves_continue_it_exactly() -> None:
    store, written = await _bucket()
    catalog = _Catalog(INFO, [])
    clock = _Clock()
    items = await _collect(
        _read(store, catalog, clock, partition=ChangePartition(b"", None), start_time=T0 - 3000)
    )
    token = next(i.token for i in items if isinstance(i, Change) and i.seq == 4)
    catalog.splits = [b"m"]
    # The token is in the middle of a batch: the batch is finished, then the partition ends.
    ended = await _collect(_read(store, catalog, clock, tokens=[token]))
    end = ended[-1]
    assert isinstance(end, PartitionEnd)
    halves = end.successors
    assert [p for p, _ in halves] == [ChangePartition(b"", b"m"), ChangePartition(b"m", None)]
    rest = _changes(ended)
    for part, tok in halves:
        rest += _changes(await _collect(_read(store, catalog, clock, partition=part, tokens=[tok])))
    before = _changes(items)[: _changes(items).index((b"x", 4)) + 1]
    assert sorted(before + rest) == sorted(written)
    # The halves merge again: the merged partition takes both halves' tokens.
    catalog.splits = []
    ends = [
        (await _collect(_read(store, catalog, clock, partition=p, tokens=[t])))[-1]
        for p, t in halves
    ]
    assert all(isinstance(e, PartitionEnd) for e in ends)
    merged_tokens = [e.successors[0][1] for e in ends if isinstance(e, PartitionEnd)]
    with pytest.raises(InvalidArgument, match="do not tile"):
        await _collect(
            _read(
                store,
                catalog,
                clock,
                partition=ChangePartition(b"", None),
                tokens=merged_tokens[:1],
            )
        )
    again = await _collect(
        _read(store, catalog, clock, partition=ChangePartition(b"", None), tokens=merged_tokens)
    )
    assert _changes(again) == []


async def test_bad_requests_are_clear_errors() -> None:
    store, _ = await _bucket()
    clock = _Clock()
    catalog = _Catalog(INFO, [])
    items = await _collect(
        _read(store, catalog, clock, partition=ChangePartition(b"", None), start_time=T0 - 3000)
    )
    token = items[-1].token  # type: ignore[union-attr]
    other = _Catalog(TableInfo("t-9", TableSchema(name="t", changes=60.0)), [])
    with pytest.raises(InvalidArgument, match="another table"):
        await _collect(_read(store, other, clock, tokens=[token]))
    clock.now += 7200
    with pytest.raises(InvalidArgument, match="outside the change retention"):
        await _collect(_read(store, catalog, clock, tokens=[token], end_time=clock.now))
    plain = _Catalog(TableInfo("t-1", TableSchema(name="t")), [])
    with pytest.raises(InvalidArgument, match="keeps no changes"):
        await _collect(_read(store, plain, clock, partition=ChangePartition(b"", None)))
    with pytest.raises(InvalidArgument, match="name a partition"):
        await _collect(_read(store, catalog, clock))


class _CountingStore(MemoryObjectStore):
    """Counts GETs per key, each held a moment so concurrent reads overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.gets: dict[str, int] = {}

    async def get(self, key: str) -> bytes | None:  # type: ignore[override]
        self.gets[key] = self.gets.get(key, 0) + 1
        await asyncio.sleep(0.01)
        return await super().get(key)


async def test_partitions_read_at_once_in_one_process_fetch_each_segment_once() -> None:
    """...and share their listings: three readers cost fewer refreshes than three alone."""
    store = _CountingStore()
    for n in range(6):
        await _segment(store, "w1", n, T0 - 50 + n, [(b"a%d" % n, n + 1), (b"m%d" % n, n + 10)])
    catalog = _Catalog(INFO, [b"h", b"p"])
    clock = _Clock()
    cache = change_stream.SegmentCache()
    parts = [ChangePartition(b"", b"h"), ChangePartition(b"h", b"p"), ChangePartition(b"p", None)]
    reads = [
        _collect(_read(store, catalog, clock, partition=p, start_time=T0 - 100, cache=cache))
        for p in parts
    ]
    got = [_changes(items) for items in await asyncio.gather(*reads)]
    assert sorted(c for g in got for c in g) == sorted(
        [(b"a%d" % n, n + 1) for n in range(6)] + [(b"m%d" % n, n + 10) for n in range(6)]
    )
    assert set(store.gets.values()) == {1}, store.gets
    assert (cache.fetched, len(store.gets)) == (6, 6)
    alone = change_stream.SegmentCache()
    await _collect(
        _read(store, catalog, clock, partition=parts[0], start_time=T0 - 100, cache=alone)
    )
    # Unshared, each of the three would list at least as often as one alone. How many
    # listings a partition joins rather than starts depends on scheduling: no closer bound.
    assert cache.listings < len(parts) * alone.listings


class _CatalogDown(_Catalog):
    """METADATA unreachable: every tablet listing fails."""

    async def list_tablets(self, table_id: str) -> list[TabletRecord]:
        raise Unavailable("METADATA not reachable within the deadline")


async def test_changes_flow_while_metadata_is_unreachable() -> None:
    store, written = await _bucket()
    clock = _Clock()
    items = await _collect(
        _read(
            store,
            _CatalogDown(INFO, []),
            clock,
            partition=ChangePartition(b"", None),
            start_time=T0 - 3000,
        )
    )
    assert sorted(_changes(items)) == sorted(written)
    assert isinstance(items[-1], Heartbeat) and items[-1].watermark >= T0


async def test_the_cache_keeps_stamps_only_of_segments_still_in_the_bucket() -> None:
    store, _ = await _bucket()
    catalog = _Catalog(INFO, [])
    clock = _Clock()
    cache = change_stream.SegmentCache()
    whole = ChangePartition(b"", None)
    await _collect(_read(store, catalog, clock, partition=whole, start_time=T0 - 3000, cache=cache))
    read = set(cache.stamps)
    assert layout.log_segment_key("w1", 1, 0) in read
    # GC collects w1's log; the next read's listing forgets its stamps.
    for n in range(3):
        await store.delete(layout.log_segment_key("w1", 1, n))
    await _collect(_read(store, catalog, clock, partition=whole, start_time=T0 - 3000, cache=cache))
    w2 = {k for k in read if k.startswith("logs/w2/")}
    assert w2 and set(cache.stamps) == w2


# Listing only what is new ---------------------------------------------------------------------


def _view_of(view: change_stream.LogView) -> dict[str, dict[int, tuple[str, int]]]:
    return {
        name: {n: (i.key, i.size) for n, i in numbers.items()}
        for name, numbers in view.logs.items()
    }


async def test_a_refresh_sees_exactly_what_a_full_listing_sees() -> None:
    """Random appends (some out of order: a PUT in flight), new logs whose keys sort anywhere
    (new workers, an incarnation below a known one landing late), collection trimming logs
    from their heads or whole: a refresh that jumps over every known run sees what listing
    everything sees."""
    rng = random.Random(7)
    store = MemoryObjectStore()
    await store.create("logs/not-a-segment", b"")
    logs: dict[tuple[str, int], list[int]] = {}
    view: change_stream.LogView | None = None
    for step in range(300):
        roll = rng.random()
        if roll < 0.1 or not logs:
            ref = (rng.choice(["a", "m", "m-", "m0", "w", "z"]), rng.randrange(1, 6))
            logs.setdefault(ref, [])
        ref = rng.choice(sorted(logs))
        numbers = logs[ref]
        if roll < 0.8:
            nxt = max(numbers, default=-1) + 1
            gaps = [n for n in range(min(numbers, default=0), nxt) if n not in numbers]
            choices = [[nxt], [nxt, nxt + 1], [nxt + 1], list(range(nxt, nxt + 5)), gaps[:1]]
            for n in rng.choice(choices):
                key = layout.log_segment_key(ref[0], ref[1], n)
                if n not in numbers:
                    await store.create(key, b"x" * rng.randrange(0, 3))
                    numbers.append(n)
        elif roll < 0.95 and numbers:
            for n in sorted(numbers)[: rng.randrange(1, len(numbers) + 1)]:  # a head trim
                await store.delete(layout.log_segment_key(ref[0], ref[1], n))
                numbers.remove(n)
        else:
            for n in numbers:  # the log collected whole
                await store.delete(layout.log_segment_key(ref[0], ref[1], n))
            del logs[ref]
        view, _ = await change_stream._refresh(store, view, float(step), skip=2)
        full, _ = await change_stream._refresh(store, None, float(step), skip=2)
        assert _view_of(view) == _view_of(full), step
        assert [e.key for e in view.entries] == [e.key for e in full.entries], step
        assert view.resume == full.resume, step


async def test_a_refresh_costs_what_is_new_not_what_is_retained() -> None:
    """The LIST requests of a poll do not grow with the retained segments: one per long log
    jumped over, plus one, where listing everything costs one per 1,000 segments."""
    costs = {}
    for retained in (2_500, 10_000):
        store = InstrumentedObjectStore(MemoryObjectStore())
        for w in ("w1", "w2", "w3"):
            await create_many(
                store, [(layout.log_segment_key(w, 1, n), b"x") for n in range(retained)]
            )
        for w in ("d1", "d2"):  # short logs of dead incarnations: read through
            await create_many(store, [(layout.log_segment_key(w, 1, n), b"x") for n in range(20)])
        view, _ = await change_stream._refresh(store, None, 0.0, skip=change_stream.SKIP)
        full = store.stats()[Op.LIST].requests
        for w in ("w1", "w2", "w3"):  # the live logs go on
            await store.create(layout.log_segment_key(w, 1, retained), b"x")
        view, calls = await change_stream._refresh(store, view, 1.0, skip=change_stream.SKIP)
        assert sum(len(n) for n in view.logs.values()) == 3 * (retained + 1) + 40
        costs[retained] = (full, store.stats()[Op.LIST].requests - full, calls)
    assert costs[2_500][0] == 8 and costs[10_000][0] == 31  # listing everything
    assert costs[2_500][1:] == costs[10_000][1:] == (4, 4)  # one, and a jump per long log


async def test_reads_that_jump_deliver_what_reads_that_list_everything_deliver() -> None:
    """A reader follows a bucket while segments arrive, a gap fills, a worker whose key sorts
    first starts, an older incarnation's segment lands late and collection trims a log: with
    every known run jumped over (skip=1) it yields exactly what a reader listing everything
    yields."""

    async def run(skip: int) -> list[tuple[bytes, int]]:
        store, _ = await _bucket()
        clock = _Clock()
        events = [
            lambda: _segment(store, "w1", 3, T0 + 5, [(b"r", 20)]),
            lambda: _segment(store, "w1", 5, T0 + 6, [(b"r", 22)]),  # 4 is in flight
            lambda: _segment(store, "a0", 0, T0 + 7, [(b"r", 30), (b"c", 31)]),
            lambda: _segment(store, "w1", 4, T0 + 6, [(b"r", 21)]),  # the gap fills
            lambda: store.delete(layout.log_segment_key("w2", 1, 0)),  # collected
            lambda: _segment(store, "w2", 0, T0 + 9, [(b"d", 40)], incarnation=0),  # late
            lambda: _segment(store, "w2", 2, T0 + 10, [(b"r", 41)]),
        ]
        sleep = clock.sleep

        async def sleep_then_change(seconds: float) -> None:
            if events:
                await events.pop(0)()
            await sleep(seconds)

        clock.sleep = sleep_then_change  # type: ignore[method-assign]
        cache = change_stream.SegmentCache(skip=skip)
        items = await _collect(
            _read(
                store,
                _Catalog(INFO, []),
                clock,
                partition=ChangePartition(b"", None),
                start_time=T0 - 3000,
                end_time=T0 + 20,
                cache=cache,
            )
        )
        assert not events  # every change above happened while the reader followed
        jumps.append(cache.list_calls - cache.listings)
        return [(c.row, c.seq) for c in items if isinstance(c, Change)]

    jumps: list[int] = []
    jumping, listing = await run(skip=1), await run(skip=10**9)
    assert jumps[0] > 0 and jumps[1] == 0
    assert jumping == listing
    assert {s for _, s in jumping} >= {20, 21, 22, 30, 31, 40, 41}
    assert len(jumping) == len(set(jumping))
