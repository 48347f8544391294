"""The commit log is authoritative (§5.3): a write whose record became durable is in the table,
whatever its caller heard, so the table, a replay of the log after a crash, and the change
stream (which reads the log's segments) agree.

A chaos run found the table and the change stream disagreeing on two writes whose clients had
timed out: the server cancelled their handlers while the records were in the log writer's
queue, the records became durable, and the cancelled handlers never put the cells into the
memtable; a minor compaction's redo point then passed them, so neither the table nor a
recovery ever held them while the change stream (and a replica fed by it) did.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tabletstore.clock import ManualClock
from tabletstore.commitlog import replay
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.model import IncrementValue, Mutation, SetCell
from tabletstore.errors import Indeterminate, TabletStoreError, Unavailable
from tabletstore.metadata.record import LogRef
from tabletstore.options import TabletOptions
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.worker.log import WorkerLog
from tests.tablet_harness import LogGate, TabletHarness

BIG = TabletOptions(memtable_flush_bytes=1 << 30, max_sstables_per_group=2)


def put(value: bytes) -> list[Mutation]:
    return [SetCell("a", b"q", value, 1000)]


async def _logged_values(h: TabletHarness, row: bytes) -> list[bytes]:
    """The values the change stream would show for ``row``: every durable record of every
    incarnation of the harness worker's log, in log order."""
    out: list[bytes] = []
    for incarnation in range(h.incarnation + 1):
        async for record in replay(h.store, h.worker_id, incarnation, h.table_id):
            if record.row == row:
                out += [c.value for c in record.cells]
    return out


async def _table_value(h: TabletHarness, row: bytes) -> bytes | None:
    assert h.tablet is not None
    got = await h.tablet.read_row(row)
    return None if got is None else got.latest("a", b"q")


async def _moved_and_crashed(h: TabletHarness, row: bytes) -> tuple[bytes | None, bytes | None]:
    """The row's value after a minor compaction (what a clean move does first: the tablet's
    log position passes the write) and a recovery, then after a plain crash and recovery."""
    assert h.tablet is not None
    await h.tablet.minor_compact()
    await h.recover()
    after_move = await _table_value(h, row)
    await h.crash()
    await h.recover()
    return after_move, await _table_value(h, row)


@pytest.mark.parametrize("batch", [False, True])
async def test_a_write_cancelled_while_its_record_is_in_flight_still_reaches_the_table(
    batch: bool,
) -> None:
    harness = TabletHarness(MemoryObjectStore(), options=BIG)
    gated = LogGate(MemoryObjectStore(), harness.worker_id)
    harness.store = gated  # type: ignore[assignment]
    tablet = await harness.start()
    try:
        await tablet.apply(b"k", put(b"v0"))
        gated.gate = asyncio.Event()
        write: asyncio.Task[object] = asyncio.create_task(
            tablet.apply_many([(b"k", put(b"v1"))]) if batch else tablet.apply(b"k", put(b"v1"))
        )
        await asyncio.wait_for(gated.waiting.wait(), timeout=30)
        write.cancel()  # the RPC's client timed out: the server cancels the handler
        await asyncio.sleep(0)
        gated.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(write, timeout=30)
        assert await _logged_values(harness, b"k") == [b"v0", b"v1"]
        assert await _table_value(harness, b"k") == b"v1"
        assert tablet._writes.row_locks.locks == {}
        assert await _moved_and_crashed(harness, b"k") == (b"v1", b"v1")
    finally:
        await harness.close()


async def test_a_cancelled_increment_is_counted_once_by_table_and_log() -> None:
    harness = TabletHarness(MemoryObjectStore(), options=BIG)
    gated = LogGate(MemoryObjectStore(), harness.worker_id)
    harness.store = gated  # type: ignore[assignment]
    tablet = await harness.start()
    try:
        gated.gate = asyncio.Event()
        rmw = asyncio.create_task(tablet.read_modify_write(b"n", [IncrementValue("a", b"q", 1)]))
        await asyncio.wait_for(gated.waiting.wait(), timeout=30)
        rmw.cancel()
        await asyncio.sleep(0)
        gated.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(rmw, timeout=30)
        # The next increment reads the first one (row lock held until it settled).
        got = await tablet.read_modify_write(b"n", [IncrementValue("a", b"q", 1)])
        assert got.latest("a", b"q") == (2).to_bytes(8, "big")
        assert (await _logged_values(harness, b"n"))[-1] == (2).to_bytes(8, "big")
    finally:
        await harness.close()


async def test_a_log_put_stored_but_answered_with_an_error_is_in_the_table() -> None:
    """The segment PUT stores the object, then fails (the S3 fault proxy answers 500 after the
    upstream stored it): the writer reads the number back, finds its segment, and the write is
    acknowledged and applied. Reporting it failed left it in the log (change stream, replay)
    and not in the table, which a clean move then made permanent."""
    harness = TabletHarness(MemoryObjectStore(), options=BIG)
    gated = LogGate(MemoryObjectStore(), harness.worker_id)
    harness.store = gated  # type: ignore[assignment]
    tablet = await harness.start()
    try:
        gated.lose_acks = 1
        await tablet.apply(b"k", put(b"v1"))
        assert harness.log is not None and harness.log.writer.failed is None
        assert await _logged_values(harness, b"k") == [b"v1"]
        assert await _table_value(harness, b"k") == b"v1"
        assert await _moved_and_crashed(harness, b"k") == (b"v1", b"v1")
    finally:
        await harness.close()


@pytest.mark.parametrize("landed", [True, False])
async def test_a_write_whose_log_outcome_stays_unknown_is_in_the_table_after_recovery_iff_logged(
    landed: bool,
) -> None:
    """The segment PUT fails and so does the writer's plug that would settle it: the write is
    Indeterminate, never acknowledged, and its tablet must not go on as if it knew. It takes
    no more writes and no compaction (a compaction's redo point would pass the record: a
    record that had landed would then be in the log and the change stream, never in the
    table); its next load replays the log, so the table holds the write exactly if the log
    does."""
    harness = TabletHarness(MemoryObjectStore(), options=BIG)
    gated = LogGate(MemoryObjectStore(), harness.worker_id)
    harness.store = gated  # type: ignore[assignment]
    tablet = await harness.start()
    try:
        await tablet.apply(b"k", put(b"v0"))
        gated.fail_plugs = True
        if landed:
            gated.lose_acks = 1
        else:
            gated.fail_puts = 1
        with pytest.raises(Indeterminate):
            await tablet.apply(b"k", put(b"v1"))
        with pytest.raises(Unavailable, match="must be reloaded"):
            await tablet.minor_compact()
        with pytest.raises(Unavailable, match="must be reloaded"):  # its worker reloads it
            await tablet.add_log(LogRef(harness.worker_id, harness.incarnation + 1))
        with contextlib.suppress(TabletStoreError):
            await tablet.apply(b"other", put(b"x"))
        gated.fail_plugs = False
        await harness.recover()
        logged = await _logged_values(harness, b"k")
        assert logged == ([b"v0", b"v1"] if landed else [b"v0"])
        assert await _table_value(harness, b"k") == logged[-1]
    finally:
        await harness.close()


@pytest.mark.parametrize("batch", [False, True])
async def test_a_write_logged_after_its_lease_expired_is_indeterminate_and_in_the_table(
    batch: bool,
) -> None:
    """Fencing rule 1: a write whose worker's lease expired while its record was being logged
    is not acknowledged (Indeterminate: the tablet's next owner replays the log). Its cells are
    in the memtable all the same (on_durable), so this worker's table and log agree too."""
    harness = TabletHarness(MemoryObjectStore(), options=BIG)
    gated = LogGate(MemoryObjectStore(), harness.worker_id)
    harness.store = gated  # type: ignore[assignment]
    tablet = await harness.start()
    clock = ManualClock()
    coord = MemoryCoordinator(clock=clock)
    try:
        assert harness.log is not None
        lease = await coord.grant_lease(60.0)
        tablet._core.log = WorkerLog(harness.log.writer, harness.log.log_ref, lease, clock)
        gated.gate = asyncio.Event()
        write: asyncio.Task[object] = asyncio.create_task(
            tablet.apply_many([(b"k", put(b"v1"))]) if batch else tablet.apply(b"k", put(b"v1"))
        )
        await asyncio.wait_for(gated.waiting.wait(), timeout=30)
        await coord.revoke_lease(lease.id)
        assert lease.expired
        gated.gate.set()
        if batch:
            [error] = await asyncio.wait_for(write, timeout=30)  # type: ignore[misc]
            assert isinstance(error, Indeterminate)
        else:
            with pytest.raises(Indeterminate, match="lease expired"):
                await asyncio.wait_for(write, timeout=30)
        assert await _logged_values(harness, b"k") == [b"v1"]
        assert await _table_value(harness, b"k") == b"v1"
        await harness.recover()  # the tablet's next owner
        assert await _table_value(harness, b"k") == b"v1"
    finally:
        await coord.close()
        await harness.close()
