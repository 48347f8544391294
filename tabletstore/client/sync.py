"""The synchronous API: the asyncio API run on a background event loop (STYLE.md 12).

The async client is the source of truth. :class:`Portal` owns one event loop in a daemon
thread; :class:`SyncProxy` wraps any object of the async API so that calling a coroutine
method blocks until it completes, an async-iterator method becomes a generator (pulled in
batches through the portal), and a method returning another async-API object returns it
wrapped. The names are therefore the same in both APIs, with no second hand-written copy.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["Portal", "SyncProxy"]

T = TypeVar("T")

#: Async-API objects whose results are wrapped again (matched by module prefix).
_WRAP_MODULES = ("tabletstore.client", "tabletstore.embedded")
_PULL_BATCH = 256


class Portal:
    """An event loop running in a daemon thread, and a way to run coroutines on it."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="tabletstore-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the portal's loop and wait for its result."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("the synchronous API cannot be used from its own event loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """Drive an async iterator from this thread, a batch of items per round trip."""

        async def pull() -> list[T]:
            out: list[T] = []
            async for item in _take(agen, _PULL_BATCH):
                out.append(item)
            return out

        try:
            while True:
                batch = self.call(pull())
                if not batch:
                    return
                yield from batch
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and not self._loop.is_closed():
                self.call(aclose())

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()


async def _take(agen: AsyncIterator[T], n: int) -> AsyncIterator[T]:
    for _ in range(n):
        try:
            yield await anext(agen)
        except StopAsyncIteration:
            return


class SyncProxy:
    """The blocking face of one async-API object."""

    def __init__(self, target: Any, portal: Portal) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_portal", portal)

    @property
    def async_api(self) -> Any:
        """The wrapped asyncio object."""
        return self._target

    def _wrap(self, value: Any) -> Any:
        module = type(value).__module__
        if module.startswith(_WRAP_MODULES) and not isinstance(value, BaseException):
            return SyncProxy(value, self._portal)
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr
        if inspect.isasyncgenfunction(attr):
            return lambda *a, **kw: self._portal.iterate(attr(*a, **kw))
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **kw: self._wrap(self._portal.call(attr(*a, **kw)))
        return _wrap_plain(self, attr)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __repr__(self) -> str:
        return f"<sync {self._target!r}>"

    def __dir__(self) -> list[str]:
        # The names a user can call are the async object's public ones (same names in both
        # APIs), plus this proxy's own.
        public = {n for n in dir(self._target) if not n.startswith("_")}
        return sorted(public | set(super().__dir__()))

    def __enter__(self) -> SyncProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        close = getattr(self._target, "close", None)
        if close is not None:
            self.close()


def _wrap_plain(proxy: SyncProxy, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*a: Any, **kw: Any) -> Any:
        result = fn(*a, **kw)
        if inspect.isawaitable(result):
            return proxy._wrap(proxy._portal.call(_await(result)))
        if inspect.isasyncgen(result) or hasattr(result, "__anext__"):
            return proxy._portal.iterate(result)
        return proxy._wrap(result)

    return call


async def _await(aw: Awaitable[T]) -> T:
    return await aw
