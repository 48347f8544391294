"""Commit-log writer under failing PUTs, lost acknowledgements and fencing races.

The invariant pinned throughout: after recovery fences the log, every acknowledged append is
read back, and nothing the writer failed with a definite error (Unavailable, Fenced) is.
Indeterminate appends may or may not be read back.
"""

from __future__ import annotations

import asyncio

import pytest

from tabletstore.clock import ManualClock
from tabletstore.commitlog import CommitLogReader, CommitLogWriter, fence
from tabletstore.errors import (
    Fenced,
    Indeterminate,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)
from tabletstore.keys import Cell, CellKind
from tabletstore.storage_s3.base import ObjectStore, Op, Throttled
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.storage_s3.retrying import RetryingObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore


def one_cell(row: bytes, seq: int) -> list[Cell]:
    return [Cell(row, "cf", b"q", 1, seq, CellKind.PUT, b"v")]


async def recovered_rows(
    store: ObjectStore, worker: str = "w", incarnation: int = 1
) -> list[bytes]:
    await fence(store, worker, incarnation)
    reader = CommitLogReader(store, worker, incarnation)
    return [r.row async for r in reader.records()]


async def run_waves(
    log: CommitLogWriter, waves: int, per_wave: int
) -> dict[bytes, BaseException | None]:
    """Append ``waves`` groups of concurrent appends; the outcome of each row."""
    outcome: dict[bytes, BaseException | None] = {}

    async def one(row: bytes) -> None:
        try:
            await log.append("t", row, one_cell(row, log.allocate(1)))
            outcome[row] = None
        except TabletStoreError as exc:
            outcome[row] = exc

    for w in range(waves):
        await asyncio.gather(*(one(b"w%02d-%03d" % (w, i)) for i in range(per_wave)))
    return outcome


def check_outcomes(outcome: dict[bytes, BaseException | None], read: list[bytes]) -> None:
    durable = set(read)
    assert len(read) == len(durable), "a record was read twice"
    for row, result in outcome.items():
        if result is None:
            assert row in durable, f"acknowledged {row!r} lost"
        elif isinstance(result, (Unavailable, Fenced)):
            assert row not in durable, f"{row!r} failed definitely but is in the log"
        else:
            assert isinstance(result, Indeterminate), result


@pytest.mark.parametrize("nth", [1, 2, 3, 5])
async def test_put_failing_mid_stream_stops_the_log(nth: int) -> None:
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.fail(Op.PUT, key="logs/*", nth=nth)
    async with CommitLogWriter(faulty, "w", 1) as log:
        outcome = await run_waves(log, waves=6, per_wave=10)
        assert isinstance(log.failed, Unavailable)
        with pytest.raises(Unavailable, match="new incarnation"):
            await log.append("t", b"late", one_cell(b"late", log.allocate(1)))
    kinds = {type(e) for e in outcome.values()}
    # The failed PUT stored nothing and the writer's plug holds its number: its writes are
    # definitely not logged (Unavailable); only segments sent after it stay Indeterminate.
    assert Unavailable in kinds
    assert (type(None) in kinds) == (nth > 1)
    assert log.stats.segments == nth - 1
    check_outcomes(outcome, await recovered_rows(faulty.inner))


async def test_a_lost_ack_is_settled_by_reading_the_segment_back() -> None:
    """The PUT landed but its answer was lost: the writer's create-only plug collides with
    the segment, which is its own, so the writes are acknowledged and the log goes on."""
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.lose_ack(Op.PUT, key="logs/*", nth=2)
    async with CommitLogWriter(faulty, "w", 1) as log:
        outcome = await run_waves(log, waves=4, per_wave=5)
        assert log.failed is None
    assert all(r is None for r in outcome.values()), outcome
    read = await recovered_rows(faulty.inner)
    check_outcomes(outcome, read)
    assert sorted(read) == sorted(outcome)


async def test_a_lost_ack_that_cannot_be_settled_stays_indeterminate() -> None:
    """The PUT landed, its answer was lost, and the store fails the settling too: the writes
    are Indeterminate (they are in the log and a replay brings them back)."""
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.lose_ack(Op.PUT, key="logs/*", nth=2)
    faulty.fail(Op.PUT, key="logs/*", nth=3, times=None)
    async with CommitLogWriter(faulty, "w", 1) as log:
        outcome = await run_waves(log, waves=4, per_wave=5)
    read = await recovered_rows(faulty.inner)
    check_outcomes(outcome, read)
    lost = [row for row, r in outcome.items() if isinstance(r, Indeterminate)]
    assert lost and set(lost) <= set(read)  # here they did happen


async def test_retrying_store_turns_a_lost_ack_into_success() -> None:
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.lose_ack(Op.PUT, key="logs/*", nth=2)
    faulty.fail(Op.PUT, key="logs/*", nth=4)
    store = RetryingObjectStore(faulty, clock=ManualClock(), base_delay=0.0, max_delay=0.0)
    async with CommitLogWriter(store, "w", 1) as log:
        outcome = await run_waves(log, waves=5, per_wave=5)
        assert log.failed is None
    assert all(r is None for r in outcome.values())
    read = await recovered_rows(faulty.inner)
    assert sorted(read) == sorted(outcome)


async def test_a_storm_of_throttles_slows_the_log_but_never_stops_it() -> None:
    """Half the segment PUTs are refused with 503 SlowDown, in runs longer than the store's
    max_attempts: every refusal is retried (it was never applied), so the log never stops, no
    write fails, and recovery reads each one once."""
    faulty = FaultyObjectStore(MemoryObjectStore())
    for start in range(1, 200, 20):
        faulty.fail(Op.PUT, key="logs/*", nth=start, times=8, exc=lambda: Throttled("SlowDown"))
    store = RetryingObjectStore(
        faulty, clock=ManualClock(), max_attempts=6, base_delay=0.0, max_delay=0.0
    )
    async with CommitLogWriter(store, "w", 1) as log:
        outcome = await run_waves(log, waves=8, per_wave=5)
        assert log.failed is None
    assert all(r is None for r in outcome.values()), outcome
    assert faulty.calls[Op.HEAD] == 0  # a refusal needs no resolution
    read = await recovered_rows(faulty.inner)
    assert sorted(read) == sorted(outcome)


class Gate:
    """Holds creates of one key until opened (a slow PUT racing with recovery)."""

    def __init__(self, inner: ObjectStore, key_suffix: str) -> None:
        self.faulty = FaultyObjectStore(inner)
        self.suffix = key_suffix
        self.open = asyncio.Event()
        self.waiting = asyncio.Event()
        original = self.faulty.create

        async def create(key: str, data: bytes) -> None:
            if key.endswith(self.suffix) and data:
                self.waiting.set()
                await self.open.wait()
            await original(key, data)

        self.faulty.create = create  # type: ignore[method-assign]


async def test_fence_while_a_put_is_in_flight() -> None:
    inner = MemoryObjectStore()
    gate = Gate(inner, "00000000000000000001.log")
    async with CommitLogWriter(gate.faulty, "w", 1) as log:
        await log.append("t", b"before", one_cell(b"before", log.allocate(1)))
        slow = asyncio.create_task(log.append("t", b"slow", one_cell(b"slow", log.allocate(1))))
        await gate.waiting.wait()
        assert await fence(inner, "w", 1) == 1  # recovery wins the race for number 1
        gate.open.set()
        with pytest.raises(Fenced):
            await slow
        with pytest.raises(Fenced):
            await log.append("t", b"after", one_cell(b"after", log.allocate(1)))
    assert [r.row async for r in CommitLogReader(inner, "w", 1).records()] == [b"before"]


async def test_many_random_failures_never_lose_an_acknowledged_append() -> None:
    for seed in range(12):
        faulty = FaultyObjectStore(MemoryObjectStore())
        nth = 1 + seed % 6
        if seed % 3 == 0:
            faulty.lose_ack(Op.PUT, key="logs/*", nth=nth)
        else:
            faulty.fail(Op.PUT, key="logs/*", nth=nth)
        async with CommitLogWriter(faulty, "w", 1, max_segment_bytes=200) as log:
            outcome = await run_waves(log, waves=4, per_wave=3 + seed)
        check_outcomes(outcome, await recovered_rows(faulty.inner))


# A segment create whose outcome cannot be learned in time -------------------------------------


class InstantClock(ManualClock):
    """Sleeps return at once, moving time by what they slept (requests that wait out their
    timeout cost the test nothing)."""

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


#: A HEAD's timeout on a store too busy to answer it.
TIMEOUT = 4.0
#: The retrying store's resolution deadline in these tests.
WITHIN = 20.0
SEGMENT_1 = "logs/w/00000000000000000001/00000000000000000001.log"


class Held(FaultyObjectStore):
    """Segment 1's PUT times out without applying, and the server holds its body: ``land``
    applies it later (an S3 request the client gave up on, applied after all)."""

    def __init__(self, inner: ObjectStore, clock: InstantClock) -> None:
        super().__init__(inner, clock=clock)
        self.held: bytes | None = None

    async def create(self, key: str, data: bytes) -> None:
        if key == SEGMENT_1 and data:
            self.held = data
            raise Indeterminate("PUT of segment 1: read timeout")
        await super().create(key, data)

    async def land(self) -> None:
        assert self.held is not None
        await self.inner.create(SEGMENT_1, self.held)


def stuck_store(faulty: FaultyObjectStore, clock: InstantClock) -> RetryingObjectStore:
    """Every HEAD waits out its timeout and fails: no ambiguous create can be resolved."""
    faulty.delay(TIMEOUT, Op.HEAD, times=None)
    faulty.fail(Op.HEAD, times=None)
    return RetryingObjectStore(faulty, clock=clock, resolve_within=WITHIN)


async def append_one(log: CommitLogWriter, row: bytes) -> BaseException | None:
    try:
        await log.append("t", row, one_cell(row, log.allocate(1)))
    except TabletStoreError as exc:
        return exc
    return None


async def acked_stuck_after(
    store: ObjectStore, clock: InstantClock, stuck: type[BaseException] | None
) -> tuple[dict[bytes, BaseException | None], float]:
    """Append ``acked`` (segment 0), ``stuck`` (segment 1, the one that cannot be resolved)
    and ``after``, one at a time; their outcomes and the clock time ``stuck`` took. ``stuck``
    is what the stuck write must end with: the writer settles the segment with a create-only
    plug, so None (acknowledged: the plug collided with the landed segment), Unavailable (the
    plug took the number: not logged) or Indeterminate (the plug failed too)."""
    outcome: dict[bytes, BaseException | None] = {}
    async with CommitLogWriter(store, "w", 1) as log:
        outcome[b"acked"] = await append_one(log, b"acked")
        started = clock.monotonic()
        outcome[b"stuck"] = await append_one(log, b"stuck")
        spent = clock.monotonic() - started
        outcome[b"after"] = await append_one(log, b"after")
    assert outcome[b"acked"] is None
    if stuck is None:  # the segment is in the log after all: the log goes on
        assert outcome[b"stuck"] is None, outcome[b"stuck"]
        assert outcome[b"after"] is None, outcome[b"after"]
    else:  # the log stopped at the plug (or at the unknown outcome)
        assert type(outcome[b"stuck"]) is stuck, outcome[b"stuck"]
        assert isinstance(outcome[b"after"], Unavailable)
    return outcome, spent


async def test_a_segment_whose_create_cannot_be_resolved_fails_within_the_deadline() -> None:
    """The create landed but every HEAD hangs: the create gives up within the resolution
    deadline (not minutes), the writer's plug collides with the landed segment, so the write
    is acknowledged after all and the log goes on; recovery reads every write."""
    clock = InstantClock()
    faulty = FaultyObjectStore(MemoryObjectStore(), clock=clock)
    faulty.lose_ack(Op.PUT, key=SEGMENT_1)
    outcome, spent = await acked_stuck_after(stuck_store(faulty, clock), clock, None)
    # The segment's create and the writer's plug (which collides at once): each at most the
    # deadline and the request running at it.
    assert spent <= WITHIN + 2 * TIMEOUT
    read = await recovered_rows(faulty.inner)
    check_outcomes(outcome, read)
    assert read == [b"acked", b"stuck", b"after"]  # The plug collided with the landed segment.


async def test_a_given_up_segment_that_lands_after_the_plug_changes_nothing() -> None:
    """The create gives up at its deadline, the writer plugs the number, and only then does
    the held PUT land: it collides with the plug, so the log still ends there and every
    acknowledged write (and nothing refused) is read back."""
    clock = InstantClock()
    held = Held(MemoryObjectStore(), clock)
    outcome, spent = await acked_stuck_after(stuck_store(held, clock), clock, Unavailable)
    assert spent <= WITHIN + 2 * TIMEOUT
    with pytest.raises(PreconditionFailed):
        await held.land()  # The plug holds the number: the late PUT is refused.
    read = await recovered_rows(held.inner)
    check_outcomes(outcome, read)
    assert read == [b"acked"]


async def test_a_given_up_segment_that_lands_before_recovery_is_read_once() -> None:
    """The held PUT lands after the writer gave up and failed to plug (its plug timed out
    too), before recovery fences: recovery reads it once, with every acknowledged write."""
    clock = InstantClock()
    held = Held(MemoryObjectStore(), clock)
    held.fail(Op.PUT, key=SEGMENT_1, times=None)  # The plug's PUTs are throttled too.
    outcome, _ = await acked_stuck_after(stuck_store(held, clock), clock, Indeterminate)
    assert await held.inner.head(SEGMENT_1) is None
    await held.land()
    read = await recovered_rows(held.inner)
    check_outcomes(outcome, read)
    assert read == [b"acked", b"stuck"]
