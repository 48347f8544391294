"""A tablet's row locks: every write to a row, and every read-modify-write of it, holds the
row's lock (§2: a row mutation is atomic). A lock exists only while someone holds or awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["RowLocks"]


class RowLocks:
    """The row locks of one tablet, created on first use and dropped with their last user."""

    def __init__(self) -> None:
        self.locks: dict[bytes, asyncio.Lock] = {}
        #: Holders and waiters per row: the lock is dropped when they are all gone.
        self.users: dict[bytes, int] = {}

    @contextlib.asynccontextmanager
    async def held(self, row: bytes) -> AsyncIterator[None]:
        rows = [row]
        await self.acquire(rows)
        try:
            yield
        finally:
            self.release(rows)

    async def acquire(self, rows: list[bytes]) -> None:
        """Take the row locks of ``rows`` (sorted, distinct), as :meth:`held` does for one;
        all or none of them are held when this returns or raises."""
        taken = 0
        try:
            for row in rows:
                lock = self.locks.get(row)
                if lock is None:
                    lock = self.locks[row] = asyncio.Lock()
                self.users[row] = self.users.get(row, 0) + 1
                try:
                    await lock.acquire()
                except BaseException:
                    self._drop_user(row)
                    raise
                taken += 1
        except BaseException:
            self.release(rows[:taken])
            raise

    def release(self, rows: list[bytes]) -> None:
        for row in rows:
            self.locks[row].release()
            self._drop_user(row)

    def _drop_user(self, row: bytes) -> None:
        users = self.users[row] - 1
        if users:
            self.users[row] = users
        else:
            del self.users[row]
            del self.locks[row]
