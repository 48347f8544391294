"""The master's major-compaction cycle (§5.4; master/compaction_cycle.py): the pure ``due``
rule, and a round through the embedded database's master and worker that rewrites every
tablet with SSTables into one, deleted rows gone."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tabletstore.data.model import DeleteRow, SetCell
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument
from tabletstore.master.compaction_cycle import (
    MajorCompactionCycle,
    WorkerCompactionExecutor,
    due,
)
from tabletstore.metadata.record import SSTableRef, TabletEvent, TabletRecord

DAY = 86_400.0


def _rec(tablet: str, events: list[tuple[float, str]], sstables: bool = True) -> TabletRecord:
    ref = SSTableRef(f"tables/t/{tablet}/default/s.parquet", 1, 1, 1, 1, b"a", b"b")
    return TabletRecord(
        table_id="t",
        tablet_id=tablet,
        start_row=b"",
        end_row=None,
        sstables={"default": (ref,)} if sstables else {},
        events=tuple(TabletEvent(at, kind) for at, kind in events),
    )


def test_due_takes_the_last_major_compaction_or_the_oldest_event() -> None:
    now = 10 * DAY
    records = [
        _rec("fresh", [(now - DAY / 2, "major_compaction")]),
        _rec("stale", [(now - 3 * DAY, "created"), (now - 2 * DAY, "major_compaction")]),
        _rec("never", [(now - 5 * DAY, "created"), (now - 1, "loaded")]),
        _rec("empty", [(0.0, "created")], sstables=False),
        _rec("young", [(now - 60, "created")]),
    ]
    assert [r.tablet_id for r in due(records, now, DAY)] == ["never", "stale"]
    assert due(records, now, 100 * DAY) == []


async def _nothing() -> list[TabletRecord]:
    return []


async def _noop(rec: TabletRecord) -> None:
    return None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="period"):
        MajorCompactionCycle(
            period=0, records=_nothing, executor=WorkerCompactionExecutor(_noop), now=lambda: 0.0
        )


async def test_a_round_major_compacts_every_served_tablet_and_purges_deletes() -> None:
    db = await Database.open("memory://compaction-cycle-test")
    try:
        t = await db.create_table("t", ["cf"], split_keys=[b"m"])
        for flush in range(2):
            for i in range(20):
                await t.mutate_row(
                    b"%s%02d" % (b"az"[i % 2 : i % 2 + 1], i), [SetCell("cf", b"q", b"v%d" % flush)]
                )
            await db.flush("t")
        await t.mutate_row(b"a00", [DeleteRow()])
        await db.flush("t")
        cycle = db.master.compaction_cycle
        records = await db.master.catalog.list_tablets((await db._info("t")).table_id)
        assert all(sum(len(v) for v in r.sstables.values()) >= 2 for r in records)
        cycle.period = 1e-6
        cycle.max_in_flight = 100
        # One round starts every due tablet (user, and METADATA ones with SSTables); each is due again at
        # once with so short a period, so the test runs exactly one round.
        assert await cycle.scan() >= 2
        await cycle.wait()
        assert cycle.finished >= 2
        records = await db.master.catalog.list_tablets(records[0].table_id)
        for r in records:
            assert [len(v) for v in r.sstables.values()] == [1]
            assert any(e.kind == "major_compaction" for e in r.events)
        assert await t.read_row(b"a00") is None
        assert len([r async for r in t.read_rows()]) == 19
        # Right after, nothing is due for a day.
        cycle.period = DAY
        assert await cycle.scan() == 0
        assert replace(records[0]) == records[0]
    finally:
        await db.close()


async def test_a_round_never_waits_for_metadata() -> None:
    """The master loop calls run_round every second: a METADATA that does not answer (being
    recovered) must hold back neither it nor the assignment round after it."""
    hang = asyncio.Event()

    async def records() -> list[TabletRecord]:
        await hang.wait()
        return []

    cycle = MajorCompactionCycle(
        period=DAY, records=records, executor=WorkerCompactionExecutor(_noop), now=lambda: 0.0
    )
    cycle.run_round()  # starts the listing in the background and returns
    cycle.run_round()  # one listing at a time
    await asyncio.sleep(0)
    hang.set()
    end = asyncio.get_running_loop().time() + 10
    while cycle.next_scan == 0.0:  # until the listing is over
        assert asyncio.get_running_loop().time() < end, "the listing did not end"
        await asyncio.sleep(0.001)
    cycle.run_round()
    assert cycle.next_scan == DAY / 24  # the next listing an hour later, not at once
    await cycle.close()
