"""The front door's budget of request bytes in flight, shared fairly among its callers.

gRPC receives a unary call's message whole before the handler runs, and the front door serves
up to ``max_concurrent_calls`` calls at once, each message up to ``max_message_bytes``: without
a bound, authenticated callers together could make it hold hundreds of such messages (tens of
GiB). :class:`RequestBudget` bounds the bytes of the requests of all calls in flight.

A call is charged when gRPC is about to receive its message -- after its token is checked, so
an unauthenticated call takes nothing (``token_check.py``) -- with the largest message it could
be (gRPC does not say a message's size before it is all received, and then it is buffered
already); once the message has arrived (its bytes reach the deserializer, before they are
decoded) the charge shrinks to the message's size, and the call keeps that until it has
finished. So the bytes held by requests never pass the capacity, and a stream of small calls
takes a reservation only for the moment its message takes to arrive.

Fairness: one caller (the token's principal) may hold at most ``share`` of the capacity (at
least one message), so a caller that sends large messages slowly, or many at once, holds only
its own part and the others' calls go on; callers waiting for room are served round robin,
each caller's calls first come first served. A call that gets no room within ``wait`` seconds
is refused with RESOURCE_EXHAUSTED naming the budget and its flag, before any of its message is
received (the request is never read: ``token_check.refusal``).

The budget is bookkeeping on the front door's event loop; :class:`BudgetAdmission` is the one
place that applies it to a call.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import grpc

from tabletstore.bigtable_api.token_check import refusal
from tabletstore.errors import InvalidArgument
from tabletstore.limits import format_size

__all__ = ["BudgetAdmission", "BudgetInterceptor", "Grant", "RequestBudget"]

#: The grant of the call being admitted, set in the call's task (whose context its request's
#: deserializer runs in); None elsewhere.
_GRANT: ContextVar[Grant | None] = ContextVar("tabletstore_front_door_grant", default=None)
#: Handlers whose charging copies an admission keeps (the registered methods: a few dozen;
#: handlers that interceptors make per call would only churn it, so it starts over when full).
_CHARGED_HANDLERS = 256


class Grant:
    """One call's charge in the budget: the reservation, then its message's size."""

    __slots__ = ("_budget", "charged", "principal")

    def __init__(self, budget: RequestBudget, principal: str, charged: int) -> None:
        self._budget = budget
        self.principal = principal
        self.charged = charged

    def received(self, size: int) -> None:
        """The message arrived: charge its ``size`` instead of the reservation."""
        self._budget._adjust(self, min(size, self.charged))

    def release(self, *_: object) -> None:
        """The call finished (however): return its bytes. Idempotent."""
        self._budget._adjust(self, 0)


class RequestBudget:
    """Request bytes the calls in flight may hold; per-principal shares, round-robin waiters.

    ``capacity``: bytes in all; ``reserve``: what a call is charged before its message arrives
    (the largest message); ``share``: the fraction of the capacity one principal may hold (at
    least ``reserve``); ``wait``: seconds a call waits for room before it is refused.
    """

    def __init__(self, capacity: int, reserve: int, *, share: float = 0.5, wait: float = 10.0):
        if reserve < 1 or capacity < reserve:
            raise InvalidArgument(
                f"the in-flight request budget ({format_size(capacity)}) must hold at least one "
                f"largest message ({format_size(reserve)})"
            )
        if not 0 < share <= 1:
            raise InvalidArgument(f"a principal's share must be in (0, 1], got {share}")
        if wait <= 0:
            raise InvalidArgument(f"the wait for request budget must be positive, got {wait}")
        self.capacity = capacity
        self.reserve = reserve
        self.wait = wait
        #: What one principal may hold.
        self.principal_cap = max(reserve, int(capacity * share))
        self.used = 0
        #: The largest ``used`` seen (for tests and benchmarks).
        self.peak = 0
        #: Calls refused for want of room.
        self.refused = 0
        self._held: Counter[str] = Counter()
        #: Waiting calls by principal; the dict's order is the round robin's.
        self._queues: dict[str, deque[asyncio.Future[Grant]]] = {}

    def held(self, principal: str) -> int:
        return self._held[principal]

    def _fits(self, principal: str) -> bool:
        return (
            self.used + self.reserve <= self.capacity
            and self._held[principal] + self.reserve <= self.principal_cap
        )

    def _take(self, principal: str) -> Grant:
        self.used += self.reserve
        self.peak = max(self.peak, self.used)
        self._held[principal] += self.reserve
        return Grant(self, principal, self.reserve)

    def try_acquire(self, principal: str) -> Grant | None:
        """A grant now if there is room and none of ``principal``'s calls waits before it."""
        if principal not in self._queues and self._fits(principal):
            return self._take(principal)
        return None

    async def acquire(self, principal: str) -> Grant | None:
        """A grant for one call of ``principal``; None if no room came within ``wait``."""
        grant = self.try_acquire(principal)
        if grant is not None:
            return grant
        waiter: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(principal, deque()).append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.wait)
        except TimeoutError:
            pass
        except BaseException:  # the call went away while it waited
            if waiter.done():
                waiter.result().release()
            else:
                waiter.cancel()
                self._forget(principal, waiter)
            raise
        if not waiter.done():
            waiter.cancel()
            self._forget(principal, waiter)
            self.refused += 1
            return None
        return waiter.result()

    def _forget(self, principal: str, waiter: asyncio.Future[Grant]) -> None:
        queue = self._queues.get(principal)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            pass
        if not queue:
            del self._queues[principal]

    def _adjust(self, grant: Grant, charge: int) -> None:
        delta = charge - grant.charged
        if not delta:
            return
        grant.charged = charge
        self.used += delta
        self._held[grant.principal] += delta
        if not self._held[grant.principal]:
            del self._held[grant.principal]
        if delta < 0 and self._queues:
            self._wake()

    def _wake(self) -> None:
        """Grant waiters while there is room: one call per principal in turn."""
        granted = True
        while granted and self._queues:
            granted = False
            for principal in list(self._queues):
                if not self._fits(principal):
                    continue
                queue = self._queues.pop(principal)
                waiter = queue.popleft()
                waiter.set_result(self._take(principal))
                granted = True
                if queue:
                    self._queues[principal] = queue  # to the end of the round

    def refusal_message(self, principal: str) -> str:
        held = self._held[principal]
        return (
            f"tabletstore front door: no room in its in-flight request bytes "
            f"({format_size(self.capacity)}, bigtable-api --max-inflight-bytes; one caller may "
            f"hold {format_size(self.principal_cap)}) within {self.wait:g}s: "
            f"{format_size(self.used)} are held by calls in flight, {format_size(held)} of them "
            f"by this caller's; retry with backoff"
        )


class BudgetAdmission:
    """Admits each authenticated call: a place among ``max_calls`` calls in flight, then its
    charge to a :class:`RequestBudget`; or refuses it unread.

    Called with the call's handler and principal before gRPC receives the message; it must run
    in the call's own task (a server interceptor does), whose end returns the call's place and
    bytes whatever happens to it -- finished, failed, or cancelled before its message arrived.
    The limit on calls is kept here rather than by gRPC (``maximum_concurrent_rpcs``) so that
    it counts admitted calls only: refusals of unauthenticated calls waiting in the tarpit
    (``tarpit.py``) take no caller's place. Over the limit a call is RESOURCE_EXHAUSTED."""

    def __init__(self, budget: RequestBudget, max_calls: int | None = None) -> None:
        self.budget = budget
        self.max_calls = max_calls
        #: Calls admitted and not yet finished (those waiting for budget included).
        self.active = 0
        #: handler -> the same handler with a deserializer that charges the call's grant.
        self._charged: dict[Any, Any] = {}

    def _leave(self, _: object = None) -> None:
        self.active -= 1

    async def __call__(self, handler: Any, principal: str) -> Any:
        if self.max_calls is not None and self.active >= self.max_calls:
            return refusal(
                handler,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"tabletstore front door: {self.active} calls in flight, its limit "
                f"(bigtable-api --max-concurrent-calls); retry with backoff",
            )
        budget = self.budget
        task = asyncio.current_task()
        self.active += 1
        try:
            grant = budget.try_acquire(principal) or await budget.acquire(principal)
        except BaseException:
            self._leave()
            raise
        if grant is None:
            self._leave()
            return refusal(
                handler, grpc.StatusCode.RESOURCE_EXHAUSTED, budget.refusal_message(principal)
            )
        if task is None:  # not in a call's task: nothing would return the place and bytes
            self._leave()
            grant.release()
            return handler
        task.add_done_callback(_Finished(self, grant))
        _GRANT.set(grant)
        charged = self._charged.get(handler)
        if charged is None:
            if len(self._charged) >= _CHARGED_HANDLERS:
                self._charged.clear()
            charged = self._charged[handler] = handler._replace(
                request_deserializer=_charging(handler.request_deserializer)
            )
        return charged


class _Finished:
    """A call's end: its place and its bytes come back (one done-callback for both)."""

    __slots__ = ("_admission", "_grant")

    def __init__(self, admission: BudgetAdmission, grant: Grant) -> None:
        self._admission = admission
        self._grant = grant

    def __call__(self, _: object) -> None:
        self._admission._leave()
        self._grant.release()


def _charging(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    """A deserializer that first charges the message's size to the call's grant (``_GRANT``:
    one deserializer per method serves every call; without a grant in the context the
    reservation stays whole until the call ends)."""

    def charge(data: bytes) -> Any:
        grant = _GRANT.get()
        if grant is not None:
            grant.received(len(data))
        return data if deserialize is None else deserialize(data)

    return charge


class BudgetInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The budget for a front door without tokens: all callers are one principal."""

    def __init__(self, admission: BudgetAdmission) -> None:
        self._admission = admission

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        return await self._admission(handler, "")
