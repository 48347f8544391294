"""The front door's remembered token answers: one lookup per token per ``recheck`` seconds, and
a revoked token refused at the latest ``recheck`` seconds after its revocation (time is a
ManualClock's, so the bound is checked exactly, not raced)."""

from __future__ import annotations

import asyncio

import pytest

from tabletstore.bigtable_api.token_check import TOKEN_RECHECK, RememberedTokens
from tabletstore.clock import ManualClock
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.coordination.tokens import TokenStore
from tabletstore.errors import PermissionDenied, Unavailable
from tabletstore.security import Principal


class Counting:
    """A verifier over a TokenStore that counts its lookups (each one coordinator read)."""

    def __init__(self, store: TokenStore) -> None:
        self.store = store
        self.reads = 0

    async def verify(self, token: str) -> Principal:
        self.reads += 1
        return await self.store.verify(token)


@pytest.fixture
def store() -> TokenStore:
    return TokenStore(MemoryCoordinator())


async def test_a_good_answer_serves_calls_for_recheck_seconds(store: TokenStore) -> None:
    clock = ManualClock()
    verifier = Counting(store)
    tokens = RememberedTokens(verifier, clock=clock)
    token = await store.create("alice")
    for _ in range(50):
        assert (await tokens.verify(token)).name == "alice"
    assert verifier.reads == 1
    clock.advance(TOKEN_RECHECK - 0.001)
    await tokens.verify(token)
    assert verifier.reads == 1
    clock.advance(0.001)
    await tokens.verify(token)
    assert verifier.reads == 2


async def test_a_revoked_token_is_refused_within_the_bound(store: TokenStore) -> None:
    clock = ManualClock()
    tokens = RememberedTokens(store, clock=clock)
    token = await store.create("alice")
    assert (await tokens.verify(token)).name == "alice"  # looked up at time 0
    await store.revoke("alice")  # revoked at once: the worst case for the bound
    clock.advance(TOKEN_RECHECK)
    with pytest.raises(PermissionDenied, match="unknown or was revoked"):
        await tokens.verify(token)
    # And it stays refused: a refusal is never remembered as good.
    with pytest.raises(PermissionDenied):
        await tokens.verify(token)


async def test_a_lookup_that_started_before_the_revocation_counts_from_its_start() -> None:
    """The answer's age is measured from when its lookup began, so a slow lookup that read the
    token just before its revocation does not stretch the bound."""
    clock = ManualClock()
    gate, began = asyncio.Event(), asyncio.Event()
    revoked = False

    class Slow:
        async def verify(self, token: str) -> Principal:
            good = not revoked  # the coordinator's answer, read when the lookup starts
            began.set()
            await gate.wait()
            if not good:
                raise PermissionDenied("the bearer token is unknown or was revoked")
            return Principal("alice", "client", "token")

    tokens = RememberedTokens(Slow(), clock=clock)
    call = asyncio.ensure_future(tokens.verify("tst_a"))
    await began.wait()
    revoked = True
    clock.advance(1.5)  # the answer arrives 1.5 s into the lookup, after the revocation
    gate.set()
    assert (await call).name == "alice"
    clock.advance(TOKEN_RECHECK - 1.5)  # recheck seconds after the lookup began
    with pytest.raises(PermissionDenied):
        await tokens.verify("tst_a")


async def test_refusals_are_not_remembered(store: TokenStore) -> None:
    verifier = Counting(store)
    tokens = RememberedTokens(verifier, clock=ManualClock())
    for _ in range(3):
        with pytest.raises(PermissionDenied):
            await tokens.verify("tst_no-such-token")
    assert verifier.reads == 3


async def test_concurrent_calls_share_one_lookup_and_a_leaver_does_not_cancel_it() -> None:
    gate = asyncio.Event()
    reads = 0

    class Gated:
        async def verify(self, token: str) -> Principal:
            nonlocal reads
            reads += 1
            await gate.wait()
            return Principal("alice", "client", "token")

    tokens = RememberedTokens(Gated(), clock=ManualClock())
    calls = [asyncio.ensure_future(tokens.verify("tst_a")) for _ in range(5)]
    await asyncio.sleep(0)
    calls[0].cancel()  # a caller that goes away while the lookup is under way
    await asyncio.sleep(0)
    gate.set()
    names = [(await c).name for c in calls[1:]]
    assert names == ["alice"] * 4
    assert calls[0].cancelled()
    assert reads == 1


async def test_a_coordinator_failure_is_the_calls_answer_and_drops_the_good_one() -> None:
    clock = ManualClock()
    failing = False
    reads = 0

    class Flaky:
        async def verify(self, token: str) -> Principal:
            nonlocal reads
            reads += 1
            if failing:
                raise Unavailable("etcd is unreachable")
            return Principal("alice", "client", "token")

    tokens = RememberedTokens(Flaky(), clock=clock)
    await tokens.verify("tst_a")
    clock.advance(TOKEN_RECHECK)
    failing = True
    with pytest.raises(Unavailable):
        await tokens.verify("tst_a")
    with pytest.raises(Unavailable):  # not served from the old answer meanwhile
        await tokens.verify("tst_a")
    assert reads == 3


async def test_the_oldest_answers_go_when_full(store: TokenStore) -> None:
    verifier = Counting(store)
    tokens = RememberedTokens(verifier, clock=ManualClock(), capacity=4)
    made = [await store.create(f"user{i}") for i in range(5)]
    for token in made:
        await tokens.verify(token)
    assert verifier.reads == 5
    await tokens.verify(made[-1])  # kept
    assert verifier.reads == 5
    await tokens.verify(made[0])  # forgotten when the fifth came
    assert verifier.reads == 6


def test_a_negative_recheck_is_refused(store: TokenStore) -> None:
    with pytest.raises(ValueError, match="recheck"):
        RememberedTokens(store, recheck=-1)
