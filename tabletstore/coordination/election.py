"""Leader election over any Coordinator: the master lock of §4 and §5.2.

Bigtable's master takes a unique *master lock* in Chubby and gives up mastership when its
Chubby session expires (§5.2). Here every candidate creates its own key
``elections/<name>/<lease-id:016x>`` attached to its lease (a create-if-absent transaction);
the candidate whose key has the smallest ``create_revision`` is the leader. A candidate waits
for the keys older than its own to be deleted (resigned, or gone with their lease), so the
hand-over follows the queue order and no thundering herd re-campaigns (etcd's
``concurrency.Election`` works the same way). The leader's ``create_revision`` is its *term*:
a later leader always has a larger one, which makes it usable as a fencing epoch.

Written once against the :class:`~tabletstore.coordination.base.Coordinator` protocol so the
in-process and etcd coordinators share it.

Contracts:

* ``campaign`` returns only when this candidate's key is the oldest under the prefix; it
  raises :class:`~tabletstore.errors.Fenced` if the lease ends first, and deletes its key if
  it is cancelled.
* ``observe`` yields the current leader first, then every change of leader (``None`` while
  there is none); changes that happen while the observer is behind are coalesced.
* Neither gives up on a backend that is briefly unreachable (an etcd restart): a watch that
  fails (Unavailable after the coordinator's own retries, or NotFound when the history it
  would resume from was compacted) is opened again and the election's keys re-read, which is
  all either loop needs, since both decide from a fresh read and use the watch only to learn
  that something changed. A campaign goes on so until its lease expires (then Fenced).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING

from tabletstore.coordination import paths
from tabletstore.coordination.base import (
    Delete,
    EventType,
    Get,
    KeyValue,
    Lease,
    Put,
    Watch,
    absent,
    create_revision_is,
)
from tabletstore.errors import Fenced, InvalidArgument, NotFound, TabletStoreError, Unavailable

if TYPE_CHECKING:
    from tabletstore.coordination.base import Coordinator

__all__ = ["Election", "Observation"]

log = logging.getLogger(__name__)

#: Seconds between attempts to reopen an election's failed watch (doubling up to the second).
_REOPEN_PAUSE = (0.1, 1.0)


def _identity(kv: KeyValue | None) -> tuple[str, int, bytes] | None:
    return None if kv is None else (kv.key, kv.create_revision, kv.value)


class Election:
    """One named election. Each campaigning process uses its own Election object."""

    def __init__(self, coordinator: Coordinator, name: str) -> None:
        self._coordinator = coordinator
        self.name = name
        self.prefix = paths.election_prefix(name)
        #: This candidate's key once it has one (campaigning or leading).
        self._mine: KeyValue | None = None

    async def campaign(self, value: bytes, lease: Lease) -> KeyValue:
        """Block until this candidate leads; return its key (``create_revision`` = term)."""
        if not isinstance(value, bytes):
            raise InvalidArgument(f"an election value is bytes, got {type(value).__name__}")
        key = f"{self.prefix}{lease.id:016x}"
        try:
            self._mine = await self._enter(key, value, lease)
            pause = _REOPEN_PAUSE[0]
            while True:
                try:
                    leading = await self._wait_to_lead(key, lease)
                except (Unavailable, NotFound) as exc:
                    # The watch broke for longer than the coordinator retries, or its history
                    # was compacted: open a new one and re-read, while the lease lives.
                    if lease.expired:
                        raise Fenced(
                            f"lease {lease.id:x} ended while campaigning in {self.name!r}"
                        ) from exc
                    log.info("election %r: watch failed (%s); reopening", self.name, exc)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _REOPEN_PAUSE[1])
                    continue
                self._mine = leading
                return leading
        except BaseException:
            # Cancelled or failed: leave the queue so later candidates are not blocked by a
            # candidate that no longer waits.
            if self._mine is not None and not lease.expired:
                try:
                    await self._delete_mine()
                except TabletStoreError:
                    pass  # The key is attached to the lease, so it goes when the lease does.
            raise

    async def _enter(self, key: str, value: bytes, lease: Lease) -> KeyValue:
        put = Put(key, value, lease.id)
        result = await self._coordinator.txn([absent(key)], [put], [Get(key)])
        if not result.succeeded:
            # Campaigning again with the same lease: keep the queue position, update value.
            await self._coordinator.put(key, value, lease=lease)
        kv = await self._coordinator.get(key)
        if kv is None:
            raise Fenced(f"lease {lease.id:x} ended while entering election {self.name!r}")
        return kv

    async def _wait_to_lead(self, key: str, lease: Lease) -> KeyValue:
        async with self._coordinator.watch_prefix(self.prefix) as watch:
            while True:
                leading = await self._wait_turn(key, lease, watch)
                if leading is not None:
                    return leading

    async def _wait_turn(self, key: str, lease: Lease, watch: Watch) -> KeyValue | None:
        """Return our key if we lead now, else wait for the next deletion and return None."""
        kvs = await self._coordinator.get_prefix(self.prefix)
        mine = next((kv for kv in kvs if kv.key == key), None)
        if mine is None:
            raise Fenced(f"lease {lease.id:x} ended while campaigning in {self.name!r}")
        if all(kv.create_revision >= mine.create_revision for kv in kvs):
            return mine
        # The watch was opened before this read, so a deletion after it is never missed.
        async for event in watch:
            if event.type is EventType.DELETE:
                return None
        raise Fenced(f"the watch on election {self.name!r} ended")

    async def proclaim(self, value: bytes) -> KeyValue:
        """Change the leader's value without losing the term. Fenced if no longer leading."""
        mine = self._require_mine()
        put = Put(mine.key, value, mine.lease_id)
        result = await self._coordinator.txn(
            [create_revision_is(mine.key, mine.create_revision)], [put]
        )
        if not result.succeeded:
            raise Fenced(f"no longer a candidate in election {self.name!r}")
        kv = await self._coordinator.get(mine.key)
        if kv is None or kv.create_revision != mine.create_revision:
            raise Fenced(f"no longer a candidate in election {self.name!r}")
        self._mine = kv
        return kv

    async def resign(self) -> None:
        """Give up leadership (or leave the queue). Idempotent."""
        if self._mine is not None:
            await self._delete_mine()

    async def _delete_mine(self) -> None:
        mine = self._require_mine()
        self._mine = None
        await self._coordinator.txn(
            [create_revision_is(mine.key, mine.create_revision)], [Delete(mine.key)]
        )

    def _require_mine(self) -> KeyValue:
        if self._mine is None:
            raise InvalidArgument(f"not campaigning in election {self.name!r}")
        return self._mine

    async def leader(self) -> KeyValue | None:
        """The current leader's key (its ``value`` is what it campaigned with), or None."""
        kvs = await self._coordinator.get_prefix(self.prefix)
        return min(kvs, key=lambda kv: kv.create_revision, default=None)

    def observe(self) -> Observation:
        """Follow the leader: ``async with election.observe() as leaders: async for kv in ...``."""
        return Observation(self, self._coordinator)


class Observation:
    """An async iterator of leader changes; an async context manager owning a watch."""

    def __init__(self, election: Election, coordinator: Coordinator) -> None:
        self._election = election
        self._coordinator = coordinator
        self._watch = coordinator.watch_prefix(election.prefix)
        self._started = False
        self._last: tuple[str, int, bytes] | None = None

    async def __aenter__(self) -> Observation:
        await self._watch.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._watch.close()

    def __aiter__(self) -> AsyncIterator[KeyValue | None]:
        return self

    async def __anext__(self) -> KeyValue | None:
        if not self._started:
            await self._watch.__aenter__()
            self._started = True
            current = await self._election.leader()
            self._last = _identity(current)
            return current
        while True:
            try:
                await self._watch.__anext__()
            except (Unavailable, NotFound) as exc:
                # Changes may have been missed: watch afresh, then compare a fresh read.
                log.info(
                    "election %r: observer's watch failed (%s); reopening", self._election.name, exc
                )
                await self._watch.close()
                self._watch = self._coordinator.watch_prefix(self._election.prefix)
                await self._watch.__aenter__()
            current = await self._election.leader()
            if _identity(current) != self._last:
                self._last = _identity(current)
                return current
