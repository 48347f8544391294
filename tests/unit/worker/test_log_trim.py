"""Which tablets a worker's log trim moves: the segment and byte bounds (worker/log_trim.py)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tabletstore.clock import Random
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.embedded import Database
from tabletstore.options import IN_PROCESS_LEASE, TabletOptions, WorkerOptions
from tabletstore.worker.log_trim import LogTail, TrimShares, lags

KB = 1000


def test_a_tail_is_measured_from_the_last_sample_at_or_before_its_segment() -> None:
    tail = LogTail()
    assert tail.bytes_after(0, 500) == 500  # no sample yet: everything written
    tail.sample("log", 10, 1_000 * KB)
    tail.sample("log", 20, 2_000 * KB)
    tail.sample("log", 30, 3_500 * KB)
    assert tail.bytes_after(20, 4_000 * KB) == 2_000 * KB
    # Between samples: from the one before (a slight overestimate, never an under).
    assert tail.bytes_after(25, 4_000 * KB) == 2_000 * KB
    assert tail.bytes_after(5, 4_000 * KB) == 4_000 * KB
    # A mark that did not move adds no sample.
    tail.sample("log", 30, 3_600 * KB)
    assert len(tail) == 3 and tail.bytes_after(30, 4_000 * KB) == 500 * KB


def test_samples_no_position_needs_are_dropped_and_a_new_log_starts_over() -> None:
    tail = LogTail()
    for i in range(1, 11):
        tail.sample("log", i * 10, i * 100 * KB)
    tail.forget_before(55)  # keeps the sample at 50, which measures positions 50..59
    assert len(tail) == 6
    assert tail.bytes_after(55, 1_000 * KB) == 500 * KB
    tail.forget_before(0)
    assert len(tail) == 6
    tail.sample("next incarnation", 3, 10 * KB)
    assert len(tail) == 1 and tail.bytes_after(3, 50 * KB) == 40 * KB


def test_a_tablet_lags_by_segments_or_by_bytes_whichever_comes_first() -> None:
    tail = LogTail()
    tail.sample("log", 100, 0)

    def lagging(position: int, mark: int, written: int) -> bool:
        return lags(position, mark, tail, written, max_segments=256, max_bytes=64_000 * KB)

    # A light load: one-write segments. The segment bound keeps recovery's GETs few.
    assert not lagging(100, 355, 300 * KB)
    assert lagging(100, 356, 300 * KB)
    # A heavy one: 100 KB group commits. The byte bound comes first.
    assert not lagging(100, 200, 10_000 * KB)
    assert lagging(100, 200, 64_000 * KB)


def test_many_small_requests_leave_the_byte_bound_to_set_the_flush_size() -> None:
    """A worker taking many small requests writes many small group commits: 30 a second of
    45 KB. At 256 segments the segment bound came first, after 8.5 s and 11 MB, and a worker of
    16 tablets flushed 0.7 MB each per trim. The default lets the tail reach most of its bytes
    first (34 s, 46 MB)."""
    opts = WorkerOptions()
    tail = LogTail()
    for second in range(61):
        tail.sample("log", 30 * second, 30 * second * 45 * KB)

    def lagging(seconds: int) -> bool:
        return lags(
            0,
            30 * seconds,
            tail,
            30 * seconds * 45 * KB,
            max_segments=opts.log_trim_segments,
            max_bytes=opts.log_trim_bytes,
        )

    assert not lagging(30)
    assert lagging(35)


def test_tablets_written_evenly_are_trimmed_apart_and_within_the_bounds() -> None:
    """Sixteen tablets whose positions lag alike (written evenly since the same segment) no
    longer all reach the byte bound in the same trim round: each is trimmed at its own share,
    between half the bound and the bound."""
    shares = TrimShares(Random(7))
    tail = LogTail()
    crossed: dict[int, int] = {}
    for second in range(1, 100):  # 100 KB of log a second, the bound 6.4 MB: 64 s
        tail.sample("log", second, second * 100 * KB)
        for key in range(16):
            bound = round(6_400 * KB * shares.of(key))
            if key not in crossed and lags(
                0, second, tail, second * 100 * KB, max_segments=10**9, max_bytes=bound
            ):
                crossed[key] = second
    assert len(crossed) == 16 and all(32 <= s <= 64 for s in crossed.values())
    assert len(set(crossed.values())) >= 8, "spread over many rounds"
    # A trim draws the tablet's next share; tablets no longer served are forgotten.
    before = [shares.of(k) for k in range(16)]
    for key in range(16):
        shares.trimmed(key)
    after = [shares.of(k) for k in range(16)]
    assert all(TrimShares.LOW <= x <= 1.0 for x in after) and after != before
    shares.keep({3})
    assert len(shares._shares) == 1 and shares.of(3) == after[3]


@pytest.mark.parametrize(
    ("max_segments", "max_bytes"),
    [(1_000_000, 100 * KB), (8, 1_000_000_000)],
    ids=["by-bytes", "by-segments"],
)
async def test_the_worker_flushes_the_tablets_its_log_trim_finds_lagging(
    max_segments: int, max_bytes: int
) -> None:
    options = WorkerOptions(
        lease=IN_PROCESS_LEASE,
        log_trim_interval=0.02,
        log_trim_segments=max_segments,
        log_trim_bytes=max_bytes,
    )
    db = await Database.open(f"memory://log-trim-{uuid.uuid4().hex}", worker_options=options)
    try:
        t = await db.create_table("t", ["cf"], split_keys=[b"m"])
        for i in range(40):  # 40 group commits of 20 KB, about 800 KB of log
            rows = [b"%s%03d-%02d" % (b"az"[j % 2 : j % 2 + 1], i, j) for j in range(10)]
            await t.mutate_rows([RowMutation(r, (SetCell("cf", b"q", b"v" * 2000),)) for r in rows])
        user = [
            tablet
            for (table_id, _), tablet in db.worker.tablets.items()
            if not table_id.startswith("!")
        ]
        assert len(user) == 2

        def flushed() -> bool:
            return all(tablet.record.sstables for tablet in user)

        deadline = asyncio.get_running_loop().time() + 60
        while not flushed():
            assert asyncio.get_running_loop().time() < deadline, "no trim flushed the tablets"
            await asyncio.sleep(0.02)
        # A trim's minor compaction moved each position past what it wrote.
        ref = db.worker._log.log_ref  # type: ignore[union-attr]
        assert all(tablet.record.log_start(ref) > 0 for tablet in user)
    finally:
        await db.close()


async def test_a_tablet_whose_rewrite_runs_holds_up_no_other_tablets_trim() -> None:
    """A trim merges in the background: a round of trims does not wait for a merge, which
    waits for its tablet's rewrite under way (after a split, a major compaction of minutes)."""
    options = WorkerOptions(
        lease=IN_PROCESS_LEASE,
        log_trim_interval=0.02,
        log_trim_segments=1_000_000,
        log_trim_bytes=100 * KB,
    )
    db = await Database.open(
        f"memory://log-trim-{uuid.uuid4().hex}",
        # Positions move by trims only: no memtable grows to its flush size.
        tablet_options=TabletOptions(max_sstables_per_group=2, memtable_flush_bytes=1 << 30),
        worker_options=options,
    )
    try:
        t = await db.create_table("t", ["cf"], split_keys=[b"m"])
        tablets = {
            tablet.record.start_row: tablet
            for (table_id, _), tablet in db.worker.tablets.items()
            if not table_id.startswith("!")
        }
        a, z = tablets[b""], tablets[b"m"]
        async with a._compactions._rewriting:  # a rewrite of tablet a that does not end
            ref = db.worker._log.log_ref  # type: ignore[union-attr]
            positions: set[int] = set()
            deadline = asyncio.get_running_loop().time() + 30
            # Until a merge of tablet a is due (its trims wrote 3 overlapping SSTables) and
            # tablet z's position has moved 5 times since.
            while len(positions) < 5:
                assert asyncio.get_running_loop().time() < deadline, (
                    f"tablet z trimmed {len(positions)} times once a's merge was due"
                )
                rows = [b"%s%02d" % (p, j) for p in (b"a", b"z") for j in range(10)]
                await t.mutate_rows(
                    [RowMutation(r, (SetCell("cf", b"q", b"v" * 2000),)) for r in rows]
                )
                if sum(len(refs) for refs in a.record.sstables.values()) > 2:
                    positions.add(z.record.log_start(ref))
                await asyncio.sleep(0.005)
    finally:
        await db.close()
