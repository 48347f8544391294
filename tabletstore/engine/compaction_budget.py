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
in memory already, and holding them back would only stall writes.

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
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        """Hold ``nbytes`` (at most the whole budget) while the block runs; wait for room first
        behind every compaction already waiting."""
        charge = min(max(nbytes, 0), self.capacity)
        await self._acquire(charge)
        try:
            yield
        finally:
            self.held -= charge
            self._wake()

    async def _acquire(self, charge: int) -> None:
        if not self._waiters and self.held + charge <= self.capacity:
            self.held += charge
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (charge, granted)
        self._waiters.append(entry)
        try:
            await granted
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
