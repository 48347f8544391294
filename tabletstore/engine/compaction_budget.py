"""The worker's budget of compaction input held in memory at once (§5.4, §6).

A merging or major compaction fetches its input SSTables whole, decodes and merges them, and
holds its output until it is stored: a few times its input's bytes, for as long as it runs.
A worker's tablets compact independently, so without a bound the worker's memory at a given
moment is the sum over every tablet compacting then, and it grows with the tablets' sizes.
The C allocator keeps much of such a peak after it is freed, so the resident size of a worker
ratchets up with each larger peak.

:class:`CompactionBudget` bounds the SSTable bytes of the compactions running at once (their
input, as METADATA records it). A compaction holds its input's bytes from before its fetch
until its result is committed; one larger than the whole budget holds all of it, so it runs
alone rather than never. Waiters are served first come, first served, so a large compaction is
not starved by small ones. Minor compactions are not held: they write out memtables that are
in memory already, and holding them back would only stall writes. A waiter may give up when an
event is set (``hold``'s ``unless``): a tablet about to split or move stops waiting for room
for work its successors redo anyway.

Used from one event loop (no locks beyond asyncio's).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

from tabletstore.errors import InvalidArgument

__all__ = ["CompactionBudget"]


class CompactionBudget:
    """A first-come, first-served budget of ``capacity_bytes`` of compaction input."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise InvalidArgument(
                f"the compaction memory budget must be positive, got {capacity_bytes} bytes"
            )
        self.capacity = capacity_bytes
        #: Bytes held by the compactions running now.
        self.held = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Compactions waiting for room."""
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def hold(
        self, nbytes: int, *, unless: asyncio.Event | None = None
    ) -> AsyncIterator[bool]:
        """Hold ``nbytes`` (at most the whole budget) while the block runs; wait for room first
        behind every compaction already waiting. Yields True once held; False, holding nothing,
        if ``unless`` is set (or becomes set) before the room is granted."""
        charge = min(max(nbytes, 0), self.capacity)
        if not await self._acquire(charge, unless):
            yield False
            return
        try:
            yield True
        finally:
            self.held -= charge
            self._wake()

    async def _acquire(self, charge: int, unless: asyncio.Event | None) -> bool:
        if unless is not None and unless.is_set():
            return False
        if not self._waiters and self.held + charge <= self.capacity:
            self.held += charge
            return True
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (charge, granted)
        self._waiters.append(entry)
        try:
            if unless is None:
                await granted
                return True
            given_up = asyncio.ensure_future(unless.wait())
            try:
                await asyncio.wait((granted, given_up), return_when=asyncio.FIRST_COMPLETED)
            finally:
                given_up.cancel()
            if granted.done():  # granted, even if given up at the same moment: the room is ours
                return True
            granted.cancel()
            self._waiters.remove(entry)
            self._wake()  # a smaller waiter behind it may fit now
            return False
        except BaseException:
            if granted.done() and not granted.cancelled():
                # Granted as it was cancelled: give the bytes back to the next in line.
                self.held -= charge
            else:
                with contextlib.suppress(ValueError):  # _wake may have dropped it already
                    self._waiters.remove(entry)
            self._wake()
            raise

    def _wake(self) -> None:
        while self._waiters:
            charge, granted = self._waiters[0]
            if granted.done():  # cancelled while queued (removed by its _acquire)
                self._waiters.popleft()
                continue
            if self.held + charge > self.capacity:
                return
            self._waiters.popleft()
            self.held += charge
            granted.set_result(None)
