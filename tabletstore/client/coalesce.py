"""Coalescing: concurrent point requests to one worker leave as one request.

Paper §5: clients talk to tablet servers directly, and §7's clients keep many single-row
requests in flight. Over TCP each request costs a frame, a task and a reply on both sides,
more than the read or the write itself when the data is in memory; so the cluster client
gathers the single-row reads and the single-row mutations its callers make in one event-loop
iteration, by worker, and sends each group as one request (the parts of one ``read_points``,
of one ``mutate_tablets``, a part per tablet), whose reply it hands back to each caller.

:class:`Coalescer` is that mechanism, knowing nothing of the messages: ``submit(key, item)``
waits for the item's own result; items of one key submitted in one loop iteration (up to
``max_items`` items and ``max_bytes`` of their sizes) go to ``send(key, items)`` together,
in submission order, which returns one result per item. What the callers see is what each
would have seen on its own:

- a result (or a per-item error, returned by ``send`` in the item's place: raised to that
  caller only);
- an error that fails the whole request (refused, not sent, no answer: ``Indeterminate``),
  raised to every caller of the group, each with its own copy;
- a caller cancelled before its group is sent takes its item out of it; a group whose
  callers were all cancelled after it was sent is cancelled too (the RPC layer tells the
  server, as it would for one call). A caller cancelled while its group is in flight learns
  nothing of its item's outcome, as with a call of its own cancelled mid-flight.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

K = TypeVar("K", bound=Hashable)
I = TypeVar("I")  # noqa: E741 (the item type)
R = TypeVar("R")


class _Group(Generic[I, R]):
    """The items of one key collected in one loop iteration, and their callers' futures."""

    __slots__ = ("bytes", "futures", "items", "live", "task")

    def __init__(self) -> None:
        self.items: list[I] = []
        self.futures: list[asyncio.Future[R]] = []
        self.bytes = 0
        self.live = 0  # callers still waiting
        self.task: asyncio.Task[None] | None = None

    def caller_gone(self, future: asyncio.Future[R]) -> None:
        if not future.cancelled():
            return
        self.live -= 1
        if self.live == 0 and self.task is not None:
            self.task.cancel()  # nobody waits for the answer: the RPC layer sends CANCEL


class Coalescer(Generic[K, I, R]):
    """Groups concurrent ``submit`` calls by key into one ``send`` per loop iteration (see the
    module docstring). ``size(item)`` counts against ``max_bytes``; an item larger than
    ``max_bytes`` goes alone."""

    def __init__(
        self,
        send: Callable[[K, list[I]], Awaitable[Sequence[R | BaseException]]],
        *,
        max_items: int = 256,
        max_bytes: int | None = None,
        size: Callable[[I], int] | None = None,
    ) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        self._send = send
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._size = size
        self._open: dict[K, _Group[I, R]] = {}
        self._flush_scheduled = False
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, key: K, item: I) -> R:
        """``item``'s result, sent with the other items of ``key`` submitted meanwhile."""
        loop = asyncio.get_running_loop()
        n = self._size(item) if self._size is not None else 0
        group = self._open.get(key)
        if group is not None and (
            len(group.items) >= self._max_items
            or (self._max_bytes is not None and group.bytes + n > self._max_bytes)
        ):
            del self._open[key]
            self._start(key, group)
            group = None
        if group is None:
            group = self._open[key] = _Group()
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
        future: asyncio.Future[R] = loop.create_future()
        group.items.append(item)
        group.futures.append(future)
        group.bytes += n
        group.live += 1
        future.add_done_callback(group.caller_gone)
        return await future

    @property
    def in_flight(self) -> int:
        """Groups sent and not answered yet."""
        return len(self._running)

    def _flush(self) -> None:
        self._flush_scheduled = False
        groups, self._open = self._open, {}
        for key, group in groups.items():
            self._start(key, group)

    def _start(self, key: K, group: _Group[I, R]) -> None:
        # Callers cancelled before the group left take their items out of it.
        kept = [(i, f) for i, f in zip(group.items, group.futures, strict=True) if not f.done()]
        if not kept:
            return
        task = asyncio.get_running_loop().create_task(
            self._run(key, [i for i, _ in kept], [f for _, f in kept])
        )
        group.task = task
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, key: K, items: list[I], futures: list[asyncio.Future[R]]) -> None:
        try:
            results = await self._send(key, items)
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()
            raise
        except BaseException as exc:  # the whole request failed: every caller gets it
            for future in futures:
                if not future.done():
                    future.set_exception(_own_copy(exc))
            if not isinstance(exc, Exception):
                raise
            return
        if len(results) != len(items):
            raise AssertionError(f"send returned {len(results)} results for {len(items)} items")
        for future, result in zip(futures, results, strict=True):
            if future.done():
                continue  # its caller was cancelled meanwhile
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


def _own_copy(exc: BaseException) -> BaseException:
    """A copy of ``exc`` for one caller (each raise adds to its exception's traceback)."""
    try:
        clone = copy.copy(exc)
    except Exception:  # a class whose constructor copy cannot call: share the original
        return exc
    clone.__cause__ = exc.__cause__
    clone.__context__ = exc.__context__
    return clone
