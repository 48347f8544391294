"""A fault-injecting ObjectStore wrapper for tests (never used by production code).

Tests program it with small rules, each matching an :class:`~tabletstore.storage_s3.base.Op`
kind and an ``fnmatch`` pattern over the key, and firing on the ``nth`` matching call and the
``times - 1`` matching calls after it (``times=None``: every one from the ``nth`` on)::

    faulty = FaultyObjectStore(MemoryObjectStore(), clock=clock)
    faulty.fail(Op.PUT, nth=3)                         # the 3rd PUT raises Unavailable
    faulty.fail(Op.GET, key="tables/*", exc=Corruption("bad disk"), times=None)
    faulty.delay(0.5, Op.GET_RANGE)                    # latency, through the clock
    faulty.lose_ack(key="logs/*")                      # PUT applied, caller gets Indeterminate
    faulty.corrupt(key="*.parquet")                    # reads return one flipped byte

Every rule that matches a call counts it (``seen``), whether or not an earlier rule fails it;
then the actions of the rules that fire are applied in rule order:

* ``delay`` sleeps (through the injected clock, else ``asyncio.sleep``) and goes on;
* ``fail`` raises without touching the inner store - for a PUT that is a dropped write whose
  caller is told it failed (Unavailable by default; pass ``exc=Indeterminate(...)`` for a PUT
  dropped with an unknown outcome);
* ``lose_ack`` (PUT and DELETE) applies the call to the inner store, then raises (Indeterminate
  by default): the write happened but its acknowledgement was lost;
* ``corrupt`` (GET, GET_RANGE) flips every bit of the middle byte of a non-empty result.

A staged create (storage_s3/local.py) is a PUT when ``publish`` publishes it: one call
matching if any of its keys does (``fail`` publishes none of them, ``lose_ack`` all). A
server-side copy (``copy_from``) is the PUT of the object it creates.

A LIST rule is evaluated once per page of up to 1,000 objects (when the listing starts and
before its 1,001st, 2,001st... object), so ``fail(Op.LIST, nth=2)`` breaks a long listing in
the middle. ``delete_many`` is one DELETE call that matches if any of its keys does.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from tabletstore.clock import Clock
from tabletstore.errors import Indeterminate, InvalidArgument, Unavailable
from tabletstore.storage_s3.base import (
    S3_BATCH,
    ObjectInfo,
    ObjectStore,
    Op,
    copies_from,
    copying_layer,
    staging_layer,
)

if TYPE_CHECKING:
    from tabletstore.storage_s3.local import Staged, Staging

__all__ = ["Action", "FaultyObjectStore", "Rule"]

#: An exception to raise, or a factory making a fresh one per firing (cleaner tracebacks).
ErrorSpec = BaseException | Callable[[], BaseException]


class Action(Enum):
    FAIL = "fail"
    DELAY = "delay"
    LOSE_ACK = "lose_ack"
    CORRUPT = "corrupt"


@dataclass(slots=True)
class Rule:
    """One programmed fault. ``seen`` and ``fired`` count matching calls and firings."""

    action: Action
    ops: frozenset[Op]
    key: str = "*"
    nth: int = 1
    times: int | None = 1
    error: ErrorSpec | None = None
    seconds: float = 0.0
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.nth < 1 or (self.times is not None and self.times < 1) or self.seconds < 0:
            raise InvalidArgument(
                f"fault rule needs nth >= 1, times >= 1 or None, seconds >= 0: {self!r}"
            )

    def matches(self, op: Op, keys: Iterable[str]) -> bool:
        return op in self.ops and any(fnmatch.fnmatchcase(k, self.key) for k in keys)

    def fire(self) -> bool:
        """Count one matching call; True if the rule fires on it."""
        self.seen += 1
        if self.seen < self.nth or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True

    def make_error(self) -> BaseException:
        spec = self.error
        if spec is None:
            default = Indeterminate if self.action is Action.LOSE_ACK else Unavailable
            return default(f"injected fault ({self.action.value} on {sorted(self.ops)})")
        return spec if isinstance(spec, BaseException) else spec()


def _ops(op: Op | Iterable[Op] | None) -> frozenset[Op]:
    if op is None:
        return frozenset(Op)
    if isinstance(op, Op):
        return frozenset({op})
    return frozenset(op)


def _flip(data: bytes) -> bytes:
    if not data:
        return data
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


#: Inside the class, ``list`` names its method, not the builtin.
_Keys = list[str]


class FaultyObjectStore:
    """An ObjectStore that injects programmed faults into calls to ``inner``."""

    def __init__(self, inner: ObjectStore, *, clock: Clock | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self._clock = clock
        self.rules: list[Rule] = []
        #: Calls seen per op kind (LIST: pages), whether or not a fault fired.
        self.calls: Counter[Op] = Counter()

    # Programming --------------------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    def fail(
        self,
        op: Op | Iterable[Op] | None = None,
        *,
        key: str = "*",
        nth: int = 1,
        times: int | None = 1,
        exc: ErrorSpec | None = None,
    ) -> Rule:
        """Raise ``exc`` (default Unavailable) instead of forwarding matching calls."""
        return self.add(Rule(Action.FAIL, _ops(op), key, nth, times, exc))

    def delay(
        self,
        seconds: float,
        op: Op | Iterable[Op] | None = None,
        *,
        key: str = "*",
        nth: int = 1,
        times: int | None = None,
    ) -> Rule:
        """Sleep ``seconds`` before forwarding matching calls."""
        return self.add(Rule(Action.DELAY, _ops(op), key, nth, times, seconds=seconds))

    def lose_ack(
        self,
        op: Op | Iterable[Op] = Op.PUT,
        *,
        key: str = "*",
        nth: int = 1,
        times: int | None = 1,
        exc: ErrorSpec | None = None,
    ) -> Rule:
        """Apply matching PUTs (or DELETEs), then raise ``exc`` (default Indeterminate)."""
        ops = _ops(op)
        if not ops <= {Op.PUT, Op.DELETE}:
            raise InvalidArgument("lose_ack applies to PUT and DELETE only")
        return self.add(Rule(Action.LOSE_ACK, ops, key, nth, times, exc))

    def corrupt(self, *, key: str = "*", nth: int = 1, times: int | None = None) -> Rule:
        """Flip a byte in what matching GET / GET_RANGE calls return."""
        return self.add(Rule(Action.CORRUPT, frozenset({Op.GET, Op.GET_RANGE}), key, nth, times))

    # Injection ----------------------------------------------------------------------------

    async def _before(self, op: Op, keys: Iterable[str]) -> list[Rule]:
        """Apply delays and failures; return the rules to apply after the inner call."""
        self.calls[op] += 1
        keys = list(keys)
        # Every matching rule counts the call, even when an earlier one fails it.
        firing = [rule for rule in self.rules if rule.matches(op, keys) and rule.fire()]
        after: list[Rule] = []
        for rule in firing:
            if rule.action is Action.DELAY:
                await self._sleep(rule.seconds)
            elif rule.action is Action.FAIL:
                raise rule.make_error()
            else:
                after.append(rule)
        return after

    async def _sleep(self, seconds: float) -> None:
        if self._clock is not None:
            await self._clock.sleep(seconds)
        else:
            await asyncio.sleep(seconds)

    @staticmethod
    def _after_write(after: list[Rule]) -> None:
        for rule in after:
            if rule.action is Action.LOSE_ACK:
                raise rule.make_error()

    @staticmethod
    def _after_read(after: list[Rule], data: bytes | None) -> bytes | None:
        for rule in after:
            if rule.action is Action.CORRUPT and data is not None:
                data = _flip(data)
        return data

    # ObjectStore ----------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        after = await self._before(Op.GET, [key])
        return self._after_read(after, await self.inner.get(key))

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        after = await self._before(Op.GET_RANGE, [key])
        return self._after_read(after, await self.inner.get_range(key, offset, length))

    async def head(self, key: str) -> ObjectInfo | None:
        await self._before(Op.HEAD, [key])
        return await self.inner.head(key)

    async def create(self, key: str, data: bytes) -> None:
        after = await self._before(Op.PUT, [key])
        await self.inner.create(key, data)
        self._after_write(after)

    async def delete(self, key: str) -> None:
        after = await self._before(Op.DELETE, [key])
        await self.inner.delete(key)
        self._after_write(after)

    async def delete_many(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        after = await self._before(Op.DELETE, batch)
        await self.inner.delete_many(batch)
        self._after_write(after)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        await self._before(Op.LIST, [prefix])
        yielded = 0
        async for info in self.inner.list(prefix, start_after=start_after):
            if yielded and yielded % S3_BATCH == 0:
                await self._before(Op.LIST, [prefix])
            yielded += 1
            yield info

    # Staged creates (storage_s3/local.py): a publish is the PUT of each object it publishes.

    async def stage_open(self, key: str) -> Staging:
        return await staging_layer(self.url, self.inner).stage_open(key)

    async def publish(self, staged: Sequence[Staged]) -> _Keys:
        batch = list(staged)
        after = await self._before(Op.PUT, [s.key for s in batch])
        existed = await staging_layer(self.url, self.inner).publish(batch)
        self._after_write(after)
        return existed

    # Server-side copies: each is the PUT of the object it creates.

    def copies_from(self, source: ObjectStore) -> bool:
        return copies_from(self.inner, source)

    async def copy_from(self, source: ObjectStore, key: str) -> str | None:
        after = await self._before(Op.PUT, [key])
        got = await copying_layer(self.url, self.inner).copy_from(source, key)
        self._after_write(after)
        return got

    async def discard(self, staged: Iterable[Staged]) -> None:
        await staging_layer(self.url, self.inner).discard(staged)

    async def sweep_staged(self, prefixes: Iterable[str]) -> int:
        return await staging_layer(self.url, self.inner).sweep_staged(prefixes)

    async def check(self) -> None:
        check = getattr(self.inner, "check", None)
        if check is not None:
            await check()

    async def close(self) -> None:
        await self.inner.close()
