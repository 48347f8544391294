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
from tabletstore.storage_s3.memory import MemoryObjectStore

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
) -> None:
    records = [
        encode_record(table_id, row, [Cell(row, "f", b"q", 7, seq, CellKind.PUT, b"%d" % seq)])
        for row, seq in rows
    ]
    data = encode_segment(worker, 1, number, records, written_at=at)
    await store.create(layout.log_segment_key(worker, 1, number), data)


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
