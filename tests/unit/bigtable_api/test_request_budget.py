"""The front door's request budget as bookkeeping: shares, round robin, refusals, returns."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tabletstore.bigtable_api.request_budget import BudgetAdmission, RequestBudget
from tabletstore.errors import InvalidArgument


async def test_a_grant_shrinks_to_its_message_and_comes_back_once() -> None:
    budget = RequestBudget(400, 100)
    grant = budget.try_acquire("a")
    assert grant is not None and budget.used == 100
    grant.received(7)
    assert budget.used == 7 and budget.held("a") == 7
    grant.release()
    grant.release()
    assert budget.used == 0 and budget.held("a") == 0


async def test_one_principal_holds_at_most_its_share_and_others_still_get_in() -> None:
    budget = RequestBudget(400, 100, wait=0.2)
    mine = [budget.try_acquire("a"), budget.try_acquire("a")]
    assert all(mine) and budget.try_acquire("a") is None  # half of 400
    assert await budget.acquire("a") is None  # waited, then refused
    assert budget.refused == 1 and "--max-inflight-bytes" in budget.refusal_message("a")
    assert budget.try_acquire("b") is not None


async def test_waiters_are_served_round_robin_by_principal() -> None:
    budget = RequestBudget(200, 100, share=1.0, wait=5.0)
    held = [budget.try_acquire("a"), budget.try_acquire("a")]
    order: list[str] = []

    async def wait(who: str) -> None:
        grant = await budget.acquire(who)
        assert grant is not None
        order.append(who)

    tasks = [asyncio.create_task(wait(w)) for w in ("a", "a", "a", "b")]
    await asyncio.sleep(0)
    for grant in held:
        assert grant is not None
        grant.release()
    for _ in range(20):  # the grants reach their waiters through a few loop turns
        await asyncio.sleep(0)
    assert order == ["a", "b"]  # b's one call did not wait behind a's queue
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_waiter_that_goes_away_leaves_nothing_behind() -> None:
    budget = RequestBudget(100, 100, wait=5.0)
    first = budget.try_acquire("a")
    assert first is not None
    waiter = asyncio.create_task(budget.acquire("b"))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    first.release()
    assert budget.used == 0 and budget.try_acquire("c") is not None


def test_a_budget_smaller_than_one_message_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="at least one largest message"):
        RequestBudget(10, 100)


async def test_each_admitted_call_charges_its_own_message_through_one_shared_handler() -> None:
    """An admitted call's deserializer charges that call's grant (held in the call's task's
    context), so one charging handler per method serves every call: none is built per call."""
    budget = RequestBudget(1000, 100, share=1.0)
    admission = BudgetAdmission(budget, max_calls=10)
    method = grpc.unary_unary_rpc_method_handler(lambda r, c: None, request_deserializer=bytes)
    both_admitted, both_charged, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    handlers: list[object] = []
    charged: list[int] = []

    async def call(message: bytes) -> None:  # what gRPC does in each call's task
        handler = await admission(method, "a")
        handlers.append(handler)
        if len(handlers) == 2:
            both_admitted.set()
        await both_admitted.wait()
        handler.request_deserializer(message)
        charged.append(budget.used)
        if len(charged) == 2:
            both_charged.set()
        await release.wait()

    calls = [asyncio.ensure_future(call(b"x" * n)) for n in (7, 30)]
    await both_charged.wait()
    # Whichever deserialized first saw the other still reserved whole; then both shrank.
    assert sorted(charged) in ([37, 7 + 100], [37, 30 + 100])
    assert budget.used == 37 and admission.active == 2
    assert handlers[0] is handlers[1]
    release.set()
    await asyncio.gather(*calls)
    await asyncio.sleep(0)  # the tasks' done callbacks
    assert budget.used == 0 and admission.active == 0
