"""A read never holds the tablet server's event loop for long.

The lease keep-alive runs on the same loop as reads. ``ValueRegex(b"(a+)+$")`` over 31 ``a``s
and a ``b`` used to backtrack for hours inside the read path until the worker lost its lease;
RE2 answers it at once, in every filter kind that takes a regex. A long scan over data in
memory, which never awaits I/O, still lets other tasks run; and a row whose worst-case regex
work is large is filtered on a thread while the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Iterator

import pytest

from tabletstore.data.filters import (
    ColumnQualifierRegex,
    FamilyNameRegex,
    RowFilter,
    RowKeyRegex,
    ValueRegex,
)
from tabletstore.data.model import SetCell
from tabletstore.data.query import RowRange
from tabletstore.data.schema import ColumnFamily, LocalityGroup, TableSchema
from tabletstore.engine import read_path as read_path_module
from tabletstore.options import TabletOptions
from tabletstore.storage_s3.memory import MemoryObjectStore
from tests.tablet_harness import TabletHarness

HOSTILE = rb"(a+)+$"
#: Python's ``re`` needs about 2**31 steps to find that HOSTILE does not match this.
EVIL = b"a" * 31 + b"b"
#: ... and matches this at once.
GOOD = b"a" * 31


def _schema() -> TableSchema:
    return TableSchema(
        name="liveness",
        families={
            name: ColumnFamily(name=name, locality_group="mem")
            for name in ("a", EVIL.decode(), "v")
        },
        locality_groups={"mem": LocalityGroup(name="mem", in_memory=True)},
    )


@pytest.fixture
async def h() -> AsyncIterator[TabletHarness]:
    harness = TabletHarness(
        MemoryObjectStore(), options=TabletOptions(memtable_flush_bytes=1 << 30), schema=_schema()
    )
    await harness.start()
    yield harness
    await harness.close()


@contextlib.contextmanager
def ticking() -> Iterator[list[int]]:
    """A task counting its turns on the loop: ``ticks[0]`` grows only while others await."""
    ticks = [0]

    async def tick() -> None:
        while True:
            ticks[0] += 1
            await asyncio.sleep(0)

    task = asyncio.get_running_loop().create_task(tick())
    try:
        yield ticks
    finally:
        task.cancel()


KINDS: list[RowFilter] = [
    RowKeyRegex(HOSTILE),
    FamilyNameRegex(HOSTILE.decode()),
    ColumnQualifierRegex(HOSTILE),
    ValueRegex(HOSTILE),
]


# The asyncio timeout is the assertion's deadline; the pytest timeout is the backstop that
# interrupts a backtracking engine, which never returns to the loop for the first to fire.
@pytest.mark.timeout(90)
@pytest.mark.parametrize("hostile", KINDS, ids=lambda f: f.kind)
async def test_backtracking_pattern_answers_in_every_regex_filter(
    h: TabletHarness, hostile: RowFilter
) -> None:
    tablet = h.tablet
    assert tablet is not None
    # Row key, family, qualifier and value all EVIL in one row, all GOOD in the other.
    await tablet.apply(EVIL, [SetCell(EVIL.decode(), EVIL, EVIL)])
    await tablet.apply(GOOD, [SetCell("a", GOOD, GOOD)])
    async with asyncio.timeout(30):
        rows = [r async for r in tablet.scan(RowRange.all(), filter=hostile)]
        evil_row = await tablet.read_row(EVIL, filter=hostile)
        good_row = await tablet.read_row(GOOD, filter=hostile)
        matched = await tablet.check_and_mutate(EVIL, hostile, [SetCell("v", b"q", b"x")], [])
    assert [r.key for r in rows] == [GOOD]
    assert [(c.family, c.qualifier, c.value) for c in rows[0].cells] == [("a", GOOD, GOOD)]
    assert evil_row is None
    assert good_row == rows[0]
    assert not matched


async def test_long_in_memory_scan_lets_other_tasks_run(
    h: TabletHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    tablet = h.tablet
    assert tablet is not None
    for i in range(300):
        await tablet.apply(b"r%05d" % i, [SetCell("v", b"c", b"v%d" % i)])
    # Every slice is over at once: the scan must give the loop a turn after every row (with
    # the default slice it does so every 10 ms, which a fast machine might not reach here).
    monkeypatch.setattr(read_path_module, "READ_SLICE_SECONDS", 0.0, raising=False)
    seen: list[int] = []
    with ticking() as ticks:
        await asyncio.sleep(0)  # the ticker has started
        async for row in tablet.scan(RowRange.all(), filter=ValueRegex(rb"v[0-9]*[02468]")):
            seen.append(ticks[0])
            assert row.cells[0].value[-1:] in b"02468"
    assert len(seen) == 150
    # Data in the memtable never suspends the scan; without the slices the ticker would not
    # have run once between the first row and the last.
    assert seen[-1] > seen[0]


async def test_row_with_heavy_regex_work_is_filtered_off_the_loop(h: TabletHarness) -> None:
    tablet = h.tablet
    assert tablet is not None
    # RE2's DFA cannot hold this pattern's states over a/b text, so RE2 falls back to its NFA:
    # about a thousand steps per byte -- linear, but far too long to spend on the event loop.
    pattern = rb"\C*a\C{1000}"
    value = bytes(random.Random(11).choices(b"ab", k=4096))
    await tablet.apply(b"big", [SetCell("v", b"c", value)])
    with ticking() as ticks:
        await asyncio.sleep(0)
        before = ticks[0]
        row = await tablet.read_row(b"big", filter=ValueRegex(pattern))
        during = ticks[0] - before
    assert (row is not None) == (value[-1001] == ord("a"))
    # A memtable read never suspends; only filtering on a thread gave the ticker its turns.
    assert during > 0


async def test_a_scan_lets_point_reads_in_after_each_short_slice(
    h: TabletHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A point read queued behind a scan over data in memory waits for the rest of the scan's
    slice, so the slice is part of every reader's tail: the scan may compute at most about a
    millisecond before the read gets its turn. The scan's clock is simulated (each reading of
    it advances STEP) so the slice is counted in the scan's own work, not in wall time."""
    tablet = h.tablet
    assert tablet is not None
    rows = 2000
    for i in range(rows):
        await tablet.apply(b"r%05d" % i, [SetCell("v", b"c", b"x")])
    step = 20e-6
    now = [0.0]

    def simulated() -> float:
        now[0] += step
        return now[0]

    monkeypatch.setattr(read_path_module, "stopwatch", simulated)
    reads = [0]
    scanning = True

    async def reader() -> None:
        while scanning:
            assert await tablet.read_row(b"r00000") is not None
            reads[0] += 1
            await asyncio.sleep(0)

    task = asyncio.get_running_loop().create_task(reader())
    await asyncio.sleep(0)  # the reader has started
    gaps: list[float] = []
    last_reads, since = reads[0], now[0]
    async for _row in tablet.scan(RowRange.all()):
        if reads[0] != last_reads:
            gaps.append(now[0] - since)
            last_reads, since = reads[0], now[0]
    scanning = False
    await task
    # Data in the memtable never suspends a scan: only its slices let the reader in.
    assert len(gaps) >= 10, f"the reader got {len(gaps)} turns in a scan of {rows} rows"
    longest = max(gaps)
    # The scan's 40 ms of simulated computing; a 10 ms slice made readers wait 10 ms.
    assert longest <= 0.002, f"a point read waited for {longest * 1000:.1f} ms of the scan"
