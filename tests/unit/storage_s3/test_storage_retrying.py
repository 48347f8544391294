"""RetryingObjectStore: backoff, give-up, list resumption, and ambiguous-create resolution."""

from __future__ import annotations

import pytest

from tabletstore.clock import ManualClock
from tabletstore.errors import (
    Corruption,
    Indeterminate,
    InvalidArgument,
    PreconditionFailed,
    Unavailable,
)
from tabletstore.storage_s3.base import Op, Throttled
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.storage_s3.retrying import RetryingObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore
from tabletstore.testing.store_conformance import collect, create_many


class RecordingClock(ManualClock):
    """Returns from sleep at once, advancing time and remembering the delay."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)


class Stack:
    """Retrying(Instrumented(Faulty(Memory))): faults below the counters, retries on top."""

    def __init__(self, max_attempts: int = 4, **options: float) -> None:
        self.memory = MemoryObjectStore()
        self.clock = RecordingClock()
        # Delays (a request answered slowly, or not before its timeout) pass on this clock.
        self.faulty = FaultyObjectStore(self.memory, clock=self.clock)
        self.counted = InstrumentedObjectStore(self.faulty)
        self.store = RetryingObjectStore(
            self.counted,
            clock=self.clock,
            max_attempts=max_attempts,
            base_delay=0.1,
            max_delay=1,
            **options,
        )

    def requests(self, op: Op) -> int:
        return self.counted.stats()[op].requests


async def test_transient_read_failures_are_retried() -> None:
    s = Stack()
    await s.memory.create("k", b"v")
    s.faulty.fail(Op.GET, times=2)
    assert await s.store.get("k") == b"v"
    assert s.requests(Op.GET) == 3
    assert s.store.retries == 2
    assert len(s.clock.sleeps) == 2


async def test_gives_up_after_max_attempts() -> None:
    s = Stack(max_attempts=3)
    s.faulty.fail(Op.HEAD, times=None)
    with pytest.raises(Unavailable):
        await s.store.head("k")
    assert s.requests(Op.HEAD) == 3
    assert len(s.clock.sleeps) == 2


async def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    s = Stack(max_attempts=8)
    s.faulty.fail(Op.GET, times=None)
    with pytest.raises(Unavailable):
        await s.store.get("k")
    caps = [min(1.0, 0.1 * 2**n) for n in range(7)]
    assert len(s.clock.sleeps) == 7
    assert all(0 <= d <= cap for d, cap in zip(s.clock.sleeps, caps, strict=True))
    assert len(set(s.clock.sleeps)) > 1  # Jittered, not fixed.


@pytest.mark.parametrize(
    "error", [Corruption("bad"), InvalidArgument("no"), PreconditionFailed("x")]
)
async def test_permanent_errors_are_not_retried(error: Exception) -> None:
    s = Stack()
    s.faulty.fail(Op.GET, exc=lambda: type(error)(str(error)))
    with pytest.raises(type(error)):
        await s.store.get("k")
    assert s.requests(Op.GET) == 1


async def test_indeterminate_deletes_are_retried() -> None:
    s = Stack()
    await s.memory.create("k", b"v")
    s.faulty.lose_ack(Op.DELETE)
    await s.store.delete("k")
    assert await s.memory.get("k") is None
    assert s.requests(Op.DELETE) == 2


async def test_delete_many_retries_with_the_same_keys() -> None:
    s = Stack()
    await create_many(s.memory, [(f"k{i}", b"v") for i in range(3)])
    s.faulty.fail(Op.DELETE)
    await s.store.delete_many(f"k{i}" for i in range(3))  # A generator, consumed once.
    assert await collect(s.memory, "") == []


async def test_listing_resumes_after_a_failed_page() -> None:
    s = Stack()
    keys = [f"k{i:05d}" for i in range(2500)]
    await create_many(s.memory, [(k, b"") for k in keys])
    s.faulty.fail(Op.LIST, nth=2)  # Fails when the second page is fetched.
    s.faulty.fail(Op.LIST, nth=4)
    assert [info.key for info in await collect(s.store, "")] == keys
    assert s.store.retries == 2


async def test_listing_resumes_from_the_callers_start_after() -> None:
    s = Stack()
    await create_many(s.memory, [(f"k{i}", b"") for i in range(5)])
    s.faulty.fail(Op.LIST)
    assert [info.key for info in await collect(s.store, "", start_after="k2")] == ["k3", "k4"]


# Ambiguous creates ----------------------------------------------------------------------------


async def test_create_whose_ack_was_lost_is_resolved_as_success() -> None:
    s = Stack()
    s.faulty.lose_ack()  # Applied, then Indeterminate.
    await s.store.create("k", b"ours")
    assert await s.memory.get("k") == b"ours"
    # One PUT, then a HEAD and a GET to see that our bytes landed; no second PUT.
    assert (s.requests(Op.PUT), s.requests(Op.HEAD), s.requests(Op.GET)) == (1, 1, 1)


async def test_create_that_did_not_land_is_sent_again() -> None:
    s = Stack()
    s.faulty.fail(Op.PUT, exc=lambda: Indeterminate("timed out"))  # Dropped, outcome unknown.
    await s.store.create("k", b"ours")
    assert await s.memory.get("k") == b"ours"
    assert (s.requests(Op.PUT), s.requests(Op.HEAD), s.requests(Op.GET)) == (2, 1, 0)


async def test_ambiguous_create_over_other_bytes_fails() -> None:
    s = Stack()
    await s.memory.create("k", b"them")
    s.faulty.fail(Op.PUT, exc=lambda: Indeterminate("timed out"))
    with pytest.raises(PreconditionFailed):
        await s.store.create("k", b"ours")
    assert await s.memory.get("k") == b"them"
    assert s.requests(Op.GET) == 1  # Same size: content compared.


async def test_ambiguous_create_over_an_object_of_another_size_needs_no_get() -> None:
    s = Stack()
    await s.memory.create("k", b"theirs!")
    s.faulty.fail(Op.PUT, exc=lambda: Unavailable("503"))
    with pytest.raises(PreconditionFailed):
        await s.store.create("k", b"ours")
    assert s.requests(Op.GET) == 0


async def test_retried_create_that_collides_with_our_own_object_succeeds() -> None:
    s = Stack(max_attempts=3)
    s.faulty.lose_ack(exc=lambda: Unavailable("connection reset"))
    s.faulty.fail(Op.HEAD, times=3)  # The resolution after the first try cannot read.
    await s.store.create("k", b"ours")
    assert await s.memory.get("k") == b"ours"
    assert s.requests(Op.PUT) == 2  # The retry met PreconditionFailed and was resolved.


async def test_retried_create_that_collides_with_other_bytes_fails() -> None:
    s = Stack(max_attempts=3)
    s.faulty.fail(Op.PUT, exc=lambda: Indeterminate("timed out"))
    s.faulty.fail(Op.HEAD, times=3)

    # Another writer's create lands between our two tries.
    original_create = s.faulty.create

    async def create_racing(key: str, data: bytes) -> None:
        if s.faulty.calls[Op.PUT] == 1:
            await s.memory.create(key, b"them")
        await original_create(key, data)

    s.faulty.create = create_racing  # type: ignore[method-assign]
    with pytest.raises(PreconditionFailed):
        await s.store.create("k", b"ours")
    assert await s.memory.get("k") == b"them"


async def test_unambiguous_collision_is_not_resolved() -> None:
    s = Stack()
    await s.memory.create("k", b"ours")
    with pytest.raises(PreconditionFailed):
        await s.store.create("k", b"ours")  # Same bytes, but nothing of ours was in flight.
    assert s.requests(Op.HEAD) == 0


async def test_create_that_never_gets_through() -> None:
    s = Stack(max_attempts=3)
    s.faulty.fail(Op.PUT, times=None)
    with pytest.raises(Unavailable) as info:
        await s.store.create("k", b"ours")
    assert not isinstance(info.value, Indeterminate)
    assert s.requests(Op.PUT) == 3


async def test_create_with_an_unknown_outcome_reports_indeterminate() -> None:
    s = Stack(max_attempts=3)
    s.faulty.fail(Op.PUT, exc=lambda: Indeterminate("timed out"))
    s.faulty.fail(Op.PUT, nth=2, times=None)  # Then only Unavailable...
    s.faulty.fail(Op.HEAD, times=None)  # ...and the object cannot be read to resolve it.
    with pytest.raises(Indeterminate):
        await s.store.create("k", b"ours")


# The resolution's deadline ---------------------------------------------------------------------
#: What the request timeout of a store too busy to answer costs each HEAD (a chaos run's S3 URL
#: sets read_timeout=4).
TIMEOUT = 4.0


def heads_time_out(s: Stack) -> None:
    """Every HEAD waits out its timeout, then fails as an S3 read timeout does."""
    s.faulty.delay(TIMEOUT, Op.HEAD, times=None)
    s.faulty.fail(Op.HEAD, times=None)


async def test_an_ambiguous_create_whose_heads_hang_gives_up_at_its_deadline() -> None:
    s = Stack(max_attempts=6, resolve_within=20.0)
    s.faulty.lose_ack()  # Our bytes landed, but the answer was lost...
    heads_time_out(s)  # ...and no HEAD can tell: every retry meets our own object (412).
    started = s.clock.monotonic()
    with pytest.raises(Indeterminate):
        await s.store.create("k", b"ours")
    spent = s.clock.monotonic() - started
    # The first attempt, the deadline, and at most the one request running at it.
    assert spent <= 20.0 + TIMEOUT
    assert s.requests(Op.HEAD) <= 20.0 / TIMEOUT + 1
    assert await s.memory.get("k") == b"ours"  # The outcome the caller was told may be.


async def test_creates_that_time_out_and_heads_that_hang_give_up_at_the_deadline() -> None:
    s = Stack(max_attempts=6, resolve_within=20.0)
    s.faulty.delay(TIMEOUT, Op.PUT, times=None)
    s.faulty.fail(Op.PUT, exc=lambda: Indeterminate("read timeout"), times=None)
    heads_time_out(s)
    started = s.clock.monotonic()
    with pytest.raises(Indeterminate):
        await s.store.create("k", b"ours")
    assert s.clock.monotonic() - started <= TIMEOUT + 20.0 + TIMEOUT
    assert s.requests(Op.PUT) + s.requests(Op.HEAD) <= 2 + 20.0 / TIMEOUT


async def test_a_throttled_create_out_of_time_is_unavailable_not_indeterminate() -> None:
    s = Stack(max_attempts=50, resolve_within=5.0)
    s.faulty.fail(Op.PUT, times=None)  # 503 SlowDown: certainly not applied.
    with pytest.raises(Unavailable) as info:
        await s.store.create("k", b"ours")
    assert not isinstance(info.value, Indeterminate)
    assert s.clock.monotonic() <= 5.0 + 1.0  # backoffs end at the deadline
    assert s.requests(Op.PUT) < 50


def throttled() -> Throttled:
    return Throttled("503 SlowDown (injected)")


async def test_a_throttled_create_is_sent_again_past_max_attempts_within_the_deadline() -> None:
    s = Stack(max_attempts=3, resolve_within=20.0)
    s.faulty.fail(Op.PUT, times=10, exc=throttled)  # refused ten times, never applied
    await s.store.create("k", b"ours")
    assert await s.memory.get("k") == b"ours"
    assert s.requests(Op.PUT) == 11
    assert s.requests(Op.HEAD) == 0  # a refusal needs no resolution
    assert s.clock.monotonic() <= 20.0


async def test_a_throttled_create_gives_up_at_the_deadline_as_unavailable() -> None:
    s = Stack(max_attempts=3, resolve_within=5.0)
    s.faulty.fail(Op.PUT, times=None, exc=throttled)
    with pytest.raises(Throttled):
        await s.store.create("k", b"ours")
    assert s.requests(Op.PUT) > 3  # the tries were bounded by time, not by max_attempts
    assert s.clock.monotonic() <= 5.0 + 1.0


async def test_a_collision_after_only_refusals_is_someone_elses_object() -> None:
    s = Stack(max_attempts=3)
    s.faulty.fail(Op.PUT, times=2, exc=throttled)
    await s.memory.create("k", b"theirs")
    with pytest.raises(PreconditionFailed):
        await s.store.create("k", b"ours")
    assert s.requests(Op.HEAD) == 0 and s.requests(Op.GET) == 0


async def test_throttles_mixed_with_ambiguous_failures_count_only_the_ambiguous() -> None:
    s = Stack(max_attempts=2, resolve_within=20.0)
    s.faulty.fail(Op.PUT, times=3, exc=throttled)
    s.faulty.fail(Op.PUT, nth=4, times=1)  # an Unavailable that may have been sent
    s.faulty.fail(Op.PUT, nth=5, times=3, exc=throttled)
    await s.store.create("k", b"ours")
    assert s.requests(Op.PUT) == 8


async def test_a_slow_resolution_within_the_deadline_still_succeeds() -> None:
    s = Stack(max_attempts=6, resolve_within=20.0)
    s.faulty.lose_ack()
    s.faulty.delay(TIMEOUT, Op.HEAD, times=None)  # Slow, but answered.
    s.faulty.delay(TIMEOUT, Op.GET, times=None)
    await s.store.create("k", b"ours")
    assert (s.requests(Op.PUT), s.requests(Op.HEAD), s.requests(Op.GET)) == (1, 1, 1)


async def test_idempotent_requests_have_no_deadline() -> None:
    s = Stack(max_attempts=6, resolve_within=1.0)
    await s.memory.create("k", b"v")
    s.faulty.delay(TIMEOUT, Op.GET, times=5)
    s.faulty.fail(Op.GET, times=5)
    assert await s.store.get("k") == b"v"  # retried past 1 s: only creates resolve
    assert s.requests(Op.GET) == 6


async def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(InvalidArgument):
        RetryingObjectStore(MemoryObjectStore(), max_attempts=0)
    with pytest.raises(InvalidArgument):
        RetryingObjectStore(MemoryObjectStore(), resolve_within=0)
    with pytest.raises(InvalidArgument):
        RetryingObjectStore(MemoryObjectStore(), base_delay=-1)
