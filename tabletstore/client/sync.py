"""The synchronous API: the asyncio API run on a background event loop
(docs/architecture/conventions.md convention 12).

The async client is the source of truth. :class:`Portal` owns one event loop in a daemon
thread; :class:`SyncProxy` wraps any object of the async API so that calling a coroutine
method blocks until it completes, an async-iterator method becomes a generator (pulled in
batches through the portal), and a method returning another async-API object returns it
wrapped. The names are therefore the same in both APIs, with no second hand-written copy.

Types. :class:`SyncClient` and :class:`SyncTable` name each method of :class:`AsyncClient`
and :class:`AsyncTable` once, built from it by :func:`blocking`, :func:`blocking_as`,
:func:`iterating` or :func:`returning`: the parameters are the async method's own (a ``ParamSpec``), the result its
awaited value, an iterator of its items, or the sync face of the object it returns. A name not
declared there (``Database.gc``, say) is still answered, untyped, by the proxy.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, cast

from tabletstore.client.client import AsyncClient
from tabletstore.client.table import AsyncTable

__all__ = [
    "Portal",
    "SyncClient",
    "SyncProxy",
    "SyncTable",
    "blocking",
    "blocking_as",
    "iterating",
    "returning",
]

T = TypeVar("T")
#: The async-API object a proxy wraps.
A_co = TypeVar("A_co", covariant=True)
A = TypeVar("A")
W = TypeVar("W")
P = ParamSpec("P")

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

    def call(self, coro: Coroutine[object, object, T]) -> T:
        """Run ``coro`` on the portal's loop and wait for its result. Refused from the loop's
        own thread (it would wait for itself) and once the portal is closed; ``coro`` is then
        closed, never run."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("the synchronous API cannot be used from its own event loop")
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise
        return future.result()

    def iterate(self, agen: AsyncIterator[T], batch: int = _PULL_BATCH) -> Iterator[T]:
        """Drive an async iterator from this thread, up to ``batch`` items per round trip
        (1 for a stream whose items should be seen as they come)."""

        async def pull() -> list[T]:
            out: list[T] = []
            async for item in _take(agen, batch):
                out.append(item)
            return out

        try:
            while True:
                items = self.call(pull())
                if not items:
                    return
                yield from items
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


class SyncProxy(Generic[A_co]):
    """The blocking face of one async-API object."""

    _target: A_co
    _portal: Portal

    def __init__(self, target: A_co, portal: Portal) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_portal", portal)

    @property
    def async_api(self) -> A_co:
        """The wrapped asyncio object."""
        return self._target

    def _wrap(self, value: object) -> object:
        module = type(value).__module__
        if module.startswith(_WRAP_MODULES) and not isinstance(value, BaseException):
            return SyncProxy(value, self._portal)
        return value

    def __getattr__(self, name: str) -> object:
        """Any other name of the async object, untyped (a subclass declares the typed ones)."""
        attr = getattr(self._target, name)
        if not callable(attr):
            return cast(object, attr)
        if inspect.isasyncgenfunction(attr):
            return lambda *a, **kw: self._portal.iterate(attr(*a, **kw))
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **kw: self._wrap(self._portal.call(attr(*a, **kw)))
        return _wrap_plain(self, attr)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(self._target, name, value)

    def __repr__(self) -> str:
        return f"<sync {self._target!r}>"

    def __dir__(self) -> list[str]:
        # The names a user can call are the async object's public ones (same names in both
        # APIs), plus this proxy's own.
        public = {n for n in dir(self._target) if not n.startswith("_")}
        return sorted(public | set(super().__dir__()))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if getattr(self._target, "close", None) is not None:
            # The subclass's own close (SyncDatabase's also stops the portal), else the proxy's.
            cast(Callable[[], object], self.close)()


def _wrap_plain(proxy: SyncProxy[object], fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*a: Any, **kw: Any) -> Any:
        result = fn(*a, **kw)
        if inspect.isawaitable(result):
            return proxy._wrap(proxy._portal.call(_coroutine(result)))
        if inspect.isasyncgen(result) or hasattr(result, "__anext__"):
            return proxy._portal.iterate(result)
        return proxy._wrap(result)

    return call


def _coroutine(aw: Awaitable[T]) -> Coroutine[Any, Any, T]:
    """``aw`` itself if it is a coroutine, else a coroutine awaiting it. Never a wrapper of a
    coroutine: a refused call (:meth:`Portal.call`) closes what it is given, and a coroutine
    wrapped in another one would be left unstarted ("never awaited") instead."""
    if isinstance(aw, Coroutine):
        return cast(Coroutine[Any, Any, T], aw)
    return _await(aw)


async def _await(aw: Awaitable[T]) -> T:
    return await aw


def _bound(proxy: SyncProxy[object], method: Callable[..., object]) -> Callable[..., Any]:
    """``method``'s namesake on the proxy's target: the target's own override, if any."""
    return cast(Callable[..., Any], getattr(proxy._target, method.__name__))


def blocking(
    method: Callable[Concatenate[A, P], Awaitable[T]],
) -> Callable[Concatenate[SyncProxy[object], P], T]:
    """The sync face of a coroutine method: same parameters, blocks for its result. It calls
    the target's method of that name, so a subclass's override (and, on a proxy whose target
    lacks it, AttributeError) is what the async API would give."""

    @functools.wraps(method)
    def call(self: SyncProxy[object], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return cast(T, self._portal.call(_coroutine(_bound(self, method)(*args, **kwargs))))

    return call


def blocking_as(
    method: Callable[Concatenate[A, P], Awaitable[T]], face: Callable[[T, Portal], W]
) -> Callable[Concatenate[SyncProxy[object], P], W]:
    """The sync face of a coroutine method whose result is an async-API object: blocks for
    it and returns that object's ``face``."""

    @functools.wraps(method)
    def call(self: SyncProxy[object], /, *args: P.args, **kwargs: P.kwargs) -> W:
        result = self._portal.call(_coroutine(_bound(self, method)(*args, **kwargs)))
        return face(cast(T, result), self._portal)

    return call


def iterating(
    method: Callable[Concatenate[A, P], AsyncIterator[T]], *, batch: int = _PULL_BATCH
) -> Callable[Concatenate[SyncProxy[object], P], Iterator[T]]:
    """The sync face of an async-iterator method: same parameters, a plain iterator (pulled
    in batches of up to ``batch`` items through the portal; 1 for a live stream)."""

    @functools.wraps(method)
    def call(self: SyncProxy[object], /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        agen = cast(AsyncIterator[T], _bound(self, method)(*args, **kwargs))
        return self._portal.iterate(agen, batch)

    return call


def returning(
    method: Callable[Concatenate[A, P], T], face: Callable[[T, Portal], W]
) -> Callable[Concatenate[SyncProxy[object], P], W]:
    """The sync face of a plain method returning an async-API object: that object's ``face``."""

    @functools.wraps(method)
    def call(self: SyncProxy[object], /, *args: P.args, **kwargs: P.kwargs) -> W:
        return face(cast(T, _bound(self, method)(*args, **kwargs)), self._portal)

    return call


class SyncTable(SyncProxy[AsyncTable]):
    """The blocking face of an :class:`AsyncTable`: the same methods, the same parameters."""

    mutate_row = blocking(AsyncTable.mutate_row)
    mutate_rows = blocking(AsyncTable.mutate_rows)
    check_and_mutate_row = blocking(AsyncTable.check_and_mutate_row)
    read_modify_write_row = blocking(AsyncTable.read_modify_write_row)
    read_row = blocking(AsyncTable.read_row)
    read_rows = iterating(AsyncTable.read_rows)
    read_rows_with_stats = iterating(AsyncTable.read_rows_with_stats)
    sample_row_keys = blocking(AsyncTable.sample_row_keys)
    snapshot = blocking(AsyncTable.snapshot)
    bulk_load = blocking(AsyncTable.bulk_load)
    change_partitions = blocking(AsyncTable.change_partitions)
    read_changes = iterating(AsyncTable.read_changes, batch=1)
    follow_changes = iterating(AsyncTable.follow_changes, batch=1)


class SyncClient(SyncProxy[AsyncClient]):
    """The blocking face of an :class:`AsyncClient`: the same methods, the same parameters."""

    create_table = blocking_as(AsyncClient.create_table, SyncTable)
    delete_table = blocking(AsyncClient.delete_table)
    set_admins = blocking(AsyncClient.set_admins)
    set_history = blocking(AsyncClient.set_history)
    set_changes = blocking(AsyncClient.set_changes)
    set_replica = blocking(AsyncClient.set_replica)
    history_default = blocking(AsyncClient.history_default)
    set_history_default = blocking(AsyncClient.set_history_default)
    list_tables = blocking(AsyncClient.list_tables)
    describe_table = blocking(AsyncClient.describe_table)
    create_family = blocking(AsyncClient.create_family)
    update_family = blocking(AsyncClient.update_family)
    set_gc_rule = blocking(AsyncClient.set_gc_rule)
    delete_family = blocking(AsyncClient.delete_family)
    add_locality_group = blocking(AsyncClient.add_locality_group)
    flush = blocking(AsyncClient.flush)
    compact = blocking(AsyncClient.compact)
    compact_tablets = blocking(AsyncClient.compact_tablets)
    snapshot = blocking(AsyncClient.snapshot)
    list_snapshots = blocking(AsyncClient.list_snapshots)
    delete_snapshot = blocking(AsyncClient.delete_snapshot)
    create_backup = blocking(AsyncClient.create_backup)
    list_backups = blocking(AsyncClient.list_backups)
    get_backup = blocking(AsyncClient.get_backup)
    update_backup = blocking(AsyncClient.update_backup)
    delete_backup = blocking(AsyncClient.delete_backup)
    copy_backup = blocking(AsyncClient.copy_backup)
    restore_table = blocking(AsyncClient.restore_table)
    clone_table = blocking(AsyncClient.clone_table)
    store_url = blocking(AsyncClient.store_url)
    bulk_load = blocking(AsyncClient.bulk_load)
    staging_url = blocking(AsyncClient.staging_url)
    table = returning(AsyncClient.table, SyncTable)
    close = blocking(AsyncClient.close)
    status = blocking(AsyncClient.status)
