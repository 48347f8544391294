"""How a caller reaches a service at an address: the Transport protocol (docs/architecture/design.md
§8).

Clients talk to tablet servers and the master talks to workers (paper §5, §5.2) through a
:class:`Transport`: the in-process one (``rpc/inprocess.py``, the embedded default: a call is a
method call) and the TCP one (``rpc/rpc_client.py`` ``TcpTransport``) carry the same calls. A call
names its :class:`Method`, the value ``rpc/services.py`` derives from a service's typed
Protocol (name, request and response types, unary or streaming); nobody spells a method name.
Callers do not use a transport directly either: they hold a typed stub
(``services.TABLET.client(transport, address)``) whose methods are the Protocol's.

What an error from a transport means (every transport keeps this; the client's retries rely
on it, docs/architecture/conventions.md convention 7):

- ``Unreachable``: the request was never sent (no connection, or it had already failed): safe
  to send again even when it is not idempotent.
- ``Indeterminate``: the request was sent and no answer came (the timeout passed, the
  connection was lost, the server stopped while running it): it may have been applied.
- any other error: the service's own answer. By the contract of the errors module, only
  ``Indeterminate`` may have been applied; a service that cannot tell (an internal error
  while handling a request) answers ``Indeterminate``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tabletstore.errors import Indeterminate, NotServing, Unimplemented

__all__ = [
    "Handler",
    "Handlers",
    "Method",
    "Transport",
    "call_handler",
    "stream_handler",
]

#: A unary handler (coroutine function) or a streaming handler (async generator function).
Handler = Callable[[Any], Awaitable[Any]] | Callable[[Any], AsyncIterator[Any]]
#: A service's dispatch table: method name to handler (``services.Service.handlers``).
Handlers = Mapping[str, Handler]


@dataclass(frozen=True, slots=True, eq=False)
class Method:
    """One method of a service, as ``rpc/services.py`` derives it from the service's Protocol.

    ``name`` is the wire's routing key (frames.py REQUEST); ``response`` is the annotation
    (a class, a union, or None) and ``response_types`` what an answer may be an instance of;
    for a streaming method these describe one item. Compared by identity: there is one
    ``Method`` per method of a service."""

    service: str
    name: str
    request: type
    response: Any
    response_types: tuple[type, ...]
    streaming: bool
    #: The protocol version that added the method (0: every version speaks it).
    since: int = 0

    def __repr__(self) -> str:
        return f"<{self.service}.{self.name}>"


class Transport(Protocol):
    """How a caller reaches the service at an address (errors: see the module docstring)."""

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (bounds the wire call; see below)
    ) -> Any:
        """One request, one response. ``timeout`` (None: the transport's default) bounds the
        call; when it passes the request is cancelled and the call raises Indeterminate if
        the request was sent, Unreachable if not."""
        ...

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        """One request, a stream of responses; ``timeout`` bounds the wait for each item."""
        ...

    async def close(self) -> None: ...


def lookup(handlers: Handlers, method: Method, address: str) -> Handler:
    """``method``'s handler in a dispatch table; Unimplemented if the table has none."""
    fn = handlers.get(method.name)
    if fn is None:
        raise Unimplemented(f"the service at {address} has no method {method!r}")
    return fn


async def _take_turn() -> None:
    """Give the event loop's other tasks a turn, as a network call would suspend.

    A request answered from the memtable or the block cache never suspends by itself, so
    without this a caller issuing requests in a loop (``bench.paper``'s drivers, an
    application's batch job) holds the event loop for its whole loop, starving every other task
    of the process: the worker's lease keep-alive, compactions, the commit log's flushes. The
    turn is taken on every call, not once per slice of time: with N callers on one loop each
    then does one request per turn, a strict round robin, so a request waits behind at most
    N - 1 others. A 0.1 ms slice let a caller do a few cached requests per turn, and a request
    that suspended waited behind N slices: measured on 2 cores with 32 callers, a turn per call
    cut cold random reads' p99 from 4.6 to 2.4 ms and in-memory reads' from 3.4 to 0.7 ms, for
    a few percent of their throughput (a yield is a few µs)."""
    await asyncio.sleep(0)


async def call_handler(
    handlers: Handlers | None,
    address: str,
    method: Method,
    request: Any,
    timeout: float | None,  # noqa: ASYNC109 (the Transport contract's per-call bound)
) -> Any:
    """Call ``method`` in this process, as a Transport does (no encoding): NotServing when
    nothing is served at ``address``, Indeterminate when ``timeout`` passes (it was running).

    It gives the event loop's other tasks a turn first, as a network call would
    (:func:`_take_turn`)."""
    await _take_turn()
    if handlers is None:
        raise NotServing(f"nothing is served at {address} (it may have stopped)")
    fn: Callable[[Any], Awaitable[Any]] = lookup(handlers, method, address)  # type: ignore[assignment]
    if timeout is None:
        return await fn(request)
    try:
        async with asyncio.timeout(timeout):
            return await fn(request)
    except TimeoutError:
        raise Indeterminate(
            f"{method!r} at {address} did not answer within {timeout} s; it may have been applied"
        ) from None


async def stream_handler(
    handlers: Handlers | None,
    address: str,
    method: Method,
    request: Any,
    timeout: float | None,  # noqa: ASYNC109 (the Transport contract's per-item bound)
) -> AsyncIterator[Any]:
    """Stream ``method`` in this process; ``timeout`` bounds the wait for each item. Gives other
    tasks a turn between items, as a network stream would (see :func:`call_handler`)."""
    await _take_turn()
    if handlers is None:
        raise NotServing(f"nothing is served at {address} (it may have stopped)")
    fn: Callable[[Any], AsyncIterator[Any]] = lookup(handlers, method, address)  # type: ignore[assignment]
    async with contextlib.aclosing(fn(request)) as items:  # type: ignore[type-var]
        if timeout is None:
            async for item in items:
                yield item
                await _take_turn()
            return
        it = aiter(items)
        while True:
            await _take_turn()
            try:
                async with asyncio.timeout(timeout):
                    item = await anext(it)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise Indeterminate(
                    f"stream {method!r} at {address}: no item within {timeout} s"
                ) from None
            yield item
