"""The in-process Coordinator: etcd's semantics in one Python process (embedded default, tests).

It keeps what etcd keeps — a sorted key space, one global revision, leases with attached keys,
an event history for watches from an older revision — so that the embedded mode and the unit
tests exercise the same contracts as a real cluster (``coordinator_conformance``).

Time comes from the injected :class:`~tabletstore.clock.Clock`: with a
:class:`~tabletstore.clock.ManualClock`, advancing past a lease's TTL without a keep-alive
expires it, deletes its keys in one revision, emits DELETE watch events and wakes
``wait_expired`` — no test sleeps. Expiry is checked at the start of every operation and by
one reaper task per open coordinator, so notifications arrive even when nobody writes.

A coordinator opened with ``leases_bound_to_process`` (the embedded database's, and only
when the process alone can reach it) grants leases that end only when revoked or when the
process does: no TTL deadline, ``safe_until()`` infinite (``coordination/lease.py`` gives the
argument). Every other lease keeps etcd's expiry rules.

State is shared by name: every ``memory://<name>`` opened in one process sees the same keys
for as long as the process lives (``memory://`` alone is private to one coordinator).
Every operation yields to the event loop once before it runs, as a network call would, so
concurrent compare-and-swap races interleave as they do against etcd; the operation itself
then runs without awaiting and is therefore atomic.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
from collections.abc import AsyncIterator, Sequence
from types import TracebackType

from sortedcontainers import SortedDict

from tabletstore.clock import Clock, SystemClock
from tabletstore.coordination.base import (
    Compare,
    Delete,
    DeleteResult,
    EventType,
    GetResult,
    KeyValue,
    Lease,
    Op,
    OpResult,
    Put,
    PutResult,
    TxnResult,
    WatchEvent,
    check_key,
    check_txn_ops,
)
from tabletstore.coordination.election import Election
from tabletstore.coordination.lease import LeaseBase, wait_event_or_sleep
from tabletstore.errors import Closed, Fenced, InvalidArgument, NotFound

__all__ = ["MemoryCoordinator", "MemoryLease", "MemoryState"]

#: Watch events kept for watches that start at an older revision (etcd: until compaction).
HISTORY_LIMIT = 100_000

_NAMED: dict[str, MemoryState] = {}


class _LeaseRecord:
    __slots__ = ("deadline", "keys", "lease")

    def __init__(self, lease: MemoryLease, deadline: float) -> None:
        self.lease = lease
        self.deadline = deadline
        self.keys: set[str] = set()


class MemoryState:
    """The key space, revision counter, leases and watch history of one memory coordinator.

    Every method is synchronous: callers hold the event loop, which makes each one atomic.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.revision = 1
        self._kvs: SortedDict[str, KeyValue] = SortedDict()
        self._leases: dict[int, _LeaseRecord] = {}
        #: No lease deadline is before this (see :meth:`expire_due`).
        self._earliest = math.inf
        self._lease_ids = itertools.count(0x1000)
        self._history: collections.deque[WatchEvent] = collections.deque()
        #: Every event with revision >= history_floor is still in ``_history``.
        self.history_floor = 1
        self._watches: set[MemoryWatch] = set()
        self.wake_events: set[asyncio.Event] = set()

    # -- reads

    def get(self, key: str) -> KeyValue | None:
        result: KeyValue | None = self._kvs.get(key)
        return result

    def range(self, prefix: str) -> list[KeyValue]:
        return [self._kvs[k] for k in self._range_keys(prefix)]

    def _range_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        for k in self._kvs.irange(minimum=prefix):
            if not k.startswith(prefix):
                break
            keys.append(k)
        return keys

    # -- leases

    def grant(
        self, ttl: float, safety_margin: float | None, *, bound_to_process: bool = False
    ) -> MemoryLease:
        self.expire_due()
        now = self.clock.monotonic()
        lease = MemoryLease(
            self, next(self._lease_ids), ttl, now, safety_margin, bound_to_process=bound_to_process
        )
        record = self._leases[lease.id] = _LeaseRecord(
            lease, math.inf if bound_to_process else now + ttl
        )
        self._earliest = min(self._earliest, record.deadline)
        for event in self.wake_events:
            event.set()
        return lease

    def refresh(self, lease_id: int) -> bool:
        self.expire_due()
        record = self._leases.get(lease_id)
        if record is None:
            return False
        if not record.lease.bound_to_process:
            record.deadline = self.clock.monotonic() + record.lease.ttl
            self._earliest = min(self._earliest, record.deadline)
        return True

    def revoke(self, lease_id: int) -> None:
        record = self._leases.get(lease_id)
        if record is not None:
            self._end_lease(record)

    def next_deadline(self) -> float | None:
        deadlines = (r.deadline for r in self._leases.values() if r.deadline != math.inf)
        return min(deadlines, default=None)

    def expire_due(self) -> None:
        """End every lease whose deadline has passed (etcd's lessor, run on demand)."""
        now = self.clock.monotonic()
        # Every request of an embedded worker checks its lease, so this runs per request:
        # nothing to scan before the earliest deadline (a bound never above the true one:
        # lowered whenever a deadline is set, recomputed by each scan).
        if now < self._earliest:
            return
        for record in [r for r in self._leases.values() if r.deadline <= now]:
            self._end_lease(record)
        self._earliest = min((r.deadline for r in self._leases.values()), default=math.inf)

    def _end_lease(self, record: _LeaseRecord) -> None:
        del self._leases[record.lease.id]
        if record.keys:
            revision = self.revision + 1
            events = [self._delete_key(key, revision) for key in sorted(record.keys)]
            self._commit(revision, events)
        record.lease._mark_gone()

    # -- writes

    def txn(
        self, compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op]
    ) -> TxnResult:
        self.expire_due()
        succeeded = all(c.holds(self._kvs.get(c.key)) for c in compares)
        ops = on_success if succeeded else on_failure
        check_txn_ops(ops)
        for op in ops:
            if isinstance(op, Put) and op.lease_id and op.lease_id not in self._leases:
                raise Fenced(f"lease {op.lease_id:x} not found (expired or revoked)")
        revision = self.revision + 1
        events: list[WatchEvent] = []
        results: list[OpResult] = []
        for op in ops:
            results.append(self._apply(op, revision, events))
        if events:
            self._commit(revision, events)
        return TxnResult(succeeded, tuple(results))

    def _apply(self, op: Op, revision: int, events: list[WatchEvent]) -> OpResult:
        if isinstance(op, Put):
            events.append(self._put_key(op, revision))
            return PutResult(revision)
        if isinstance(op, Delete):
            keys = (
                self._range_keys(op.key) if op.prefix else [op.key] if op.key in self._kvs else []
            )
            events.extend(self._delete_key(key, revision) for key in keys)
            return DeleteResult(len(keys))
        kvs = self.range(op.key) if op.prefix else [kv for kv in [self._kvs.get(op.key)] if kv]
        return GetResult(tuple(kvs))

    def _put_key(self, op: Put, revision: int) -> WatchEvent:
        prev = self._kvs.get(op.key)
        if prev is not None and prev.lease_id in self._leases:
            self._leases[prev.lease_id].keys.discard(op.key)
        kv = KeyValue(
            key=op.key,
            value=op.value,
            create_revision=prev.create_revision if prev else revision,
            mod_revision=revision,
            version=prev.version + 1 if prev else 1,
            lease_id=op.lease_id,
        )
        self._kvs[op.key] = kv
        if op.lease_id:
            self._leases[op.lease_id].keys.add(op.key)
        return WatchEvent(EventType.PUT, kv, prev)

    def _delete_key(self, key: str, revision: int) -> WatchEvent:
        prev: KeyValue = self._kvs.pop(key)
        if prev.lease_id in self._leases:
            self._leases[prev.lease_id].keys.discard(key)
        return WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, revision, 0, 0), prev)

    def _commit(self, revision: int, events: list[WatchEvent]) -> None:
        self.revision = revision
        for event in events:
            self._history.append(event)
            for watch in self._watches:
                watch.offer(event)
        while len(self._history) > HISTORY_LIMIT:
            self.history_floor = self._history.popleft().revision + 1

    # -- watches

    def register(self, watch: MemoryWatch, start_revision: int | None) -> None:
        """Replay history from ``start_revision`` and subscribe, with no gap in between."""
        if start_revision is not None:
            if start_revision < self.history_floor:
                raise NotFound(
                    f"revision {start_revision} has been compacted (oldest kept: "
                    f"{self.history_floor}); re-read the keys and watch from a newer revision"
                )
            for event in self._history:
                if event.revision >= start_revision:
                    watch.offer(event)
        self._watches.add(watch)

    def unregister(self, watch: MemoryWatch) -> None:
        self._watches.discard(watch)


class MemoryLease(LeaseBase):
    def __init__(
        self,
        state: MemoryState,
        lease_id: int,
        ttl: float,
        now: float,
        margin: float | None,
        *,
        bound_to_process: bool = False,
    ) -> None:
        super().__init__(
            lease_id,
            ttl,
            granted_at=now,
            clock=state.clock,
            safety_margin=margin,
            bound_to_process=bound_to_process,
        )
        self._state = state

    async def _send_keep_alive(self) -> bool:
        await asyncio.sleep(0)
        return self._state.refresh(self.id)

    async def _send_revoke(self) -> None:
        await asyncio.sleep(0)
        self._state.revoke(self.id)

    def _poll(self) -> None:
        self._state.expire_due()


_END = object()


class MemoryWatch:
    """A watch on a prefix of a :class:`MemoryState` (see ``base.Watch``)."""

    def __init__(
        self, coordinator: MemoryCoordinator, prefix: str, start_revision: int | None
    ) -> None:
        self._coordinator = coordinator
        self._prefix = prefix
        self._start_revision = start_revision
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._started = False
        self._closed = False

    def offer(self, event: WatchEvent) -> None:
        if event.kv.key.startswith(self._prefix):
            self._queue.put_nowait(event)

    async def __aenter__(self) -> MemoryWatch:
        if not self._started:
            self._coordinator._live()
            self._coordinator._state.register(self, self._start_revision)
            self._coordinator._watches.add(self)
            self._started = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        if not self._closed:
            await self.__aenter__()
            item = await self._queue.get()
            if item is not _END:
                assert isinstance(item, WatchEvent)
                return item
        if self._coordinator._closed:
            raise Closed(f"coordinator {self._coordinator.url} was closed")
        raise StopAsyncIteration

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._coordinator._state.unregister(self)
            self._coordinator._watches.discard(self)
            self._queue.put_nowait(_END)


class MemoryCoordinator:
    """In-process :class:`~tabletstore.coordination.base.Coordinator`."""

    def __init__(
        self,
        state: MemoryState | None = None,
        *,
        clock: Clock | None = None,
        url: str = "memory://",
        leases_bound_to_process: bool = False,
    ) -> None:
        if state is None:
            state = MemoryState(clock or SystemClock())
        elif clock is not None and clock is not state.clock:
            raise InvalidArgument(f"{url} is already open with a different clock")
        self._state = state
        self.url = url
        self._closed = False
        self._watches: set[MemoryWatch] = set()
        self._wake = asyncio.Event()
        self._reaper: asyncio.Task[None] | None = None
        #: Leases granted through this handle end only with the process or a revoke (module
        #: docstring): for a holder that alone can reach this coordinator (embedded.py).
        self._leases_bound_to_process = leases_bound_to_process

    @classmethod
    def open(
        cls, name: str, *, clock: Clock | None = None, leases_bound_to_process: bool = False
    ) -> MemoryCoordinator:
        """A coordinator on the state called ``name`` (``""``: a new private state)."""
        if not name:
            return cls(clock=clock, leases_bound_to_process=leases_bound_to_process)
        state = _NAMED.get(name)
        if state is None:
            state = _NAMED[name] = MemoryState(clock or SystemClock())
        return cls(
            state,
            clock=clock,
            url=f"memory://{name}",
            leases_bound_to_process=leases_bound_to_process,
        )

    @property
    def state(self) -> MemoryState:
        return self._state

    def _live(self) -> None:
        if self._closed:
            raise Closed(f"coordinator {self.url} was closed")

    async def _enter(self) -> None:
        """The start of every operation: the yield a network call would make, then reaping."""
        await asyncio.sleep(0)
        self._live()
        self._state.expire_due()

    def _ensure_reaper(self) -> None:
        if self._reaper is None:
            self._state.wake_events.add(self._wake)
            self._reaper = asyncio.create_task(self._reap(), name=f"reaper {self.url}")

    async def _reap(self) -> None:
        state = self._state
        while True:
            state.expire_due()
            deadline = state.next_deadline()
            self._wake.clear()
            wait = 3600.0 if deadline is None else deadline - state.clock.monotonic()
            await wait_event_or_sleep(self._wake, state.clock, wait)

    async def check(self) -> None:
        await self._enter()

    async def grant_lease(self, ttl: float, *, safety_margin: float | None = None) -> Lease:
        if not ttl > 0:
            raise InvalidArgument(f"lease ttl must be positive, got {ttl}")
        await self._enter()
        self._ensure_reaper()
        return self._state.grant(
            float(ttl), safety_margin, bound_to_process=self._leases_bound_to_process
        )

    async def revoke_lease(self, lease_id: int) -> None:
        await self._enter()
        self._state.revoke(lease_id)

    async def get(self, key: str) -> KeyValue | None:
        check_key(key)
        await self._enter()
        return self._state.get(key)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        await self._enter()
        return self._state.range(prefix)

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        op = Put(key, value, lease.id if lease is not None else 0)
        await self._enter()
        result = self._state.txn((), (op,), ())
        put_result = result.results[0]
        assert isinstance(put_result, PutResult)
        return put_result.revision

    async def delete(self, key: str) -> bool:
        op = Delete(key)
        await self._enter()
        result = self._state.txn((), (op,), ())
        deleted = result.results[0]
        assert isinstance(deleted, DeleteResult)
        return deleted.deleted > 0

    async def delete_prefix(self, prefix: str) -> int:
        await self._enter()
        if prefix == "":
            keys = [kv.key for kv in self._state.range("")]
            result = self._state.txn((), tuple(Delete(k) for k in keys), ())
            return len(keys)
        result = self._state.txn((), (Delete(prefix, prefix=True),), ())
        deleted = result.results[0]
        assert isinstance(deleted, DeleteResult)
        return deleted.deleted

    async def txn(
        self, compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op] = ()
    ) -> TxnResult:
        await self._enter()
        return self._state.txn(compares, on_success, on_failure)

    def watch_prefix(self, prefix: str, *, start_revision: int | None = None) -> MemoryWatch:
        if start_revision is not None and start_revision < 1:
            raise InvalidArgument(f"start_revision must be >= 1, got {start_revision}")
        return MemoryWatch(self, prefix, start_revision)

    def election(self, name: str) -> Election:
        return Election(self, name)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            await watch.close()
        self._state.wake_events.discard(self._wake)
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
