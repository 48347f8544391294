"""The gate between a worker's log switch and the tablets it opens (§5.3, §6).

A worker whose commit log failed continues under a new incarnation and records it in every
served tablet's record (``TabletServer._switch_log``); a tablet being opened records the
worker's current log in its own record. The two must not interleave: a tablet opened during a
switch could list only the old log and then write to the new one. Opening tablets among
themselves do not conflict, though, and after a worker dies its tablets are opened side by side
on one survivor (owner affinity, ``master.master``): each opening waits for a METADATA write, so
one at a time made the last of N tablets wait N of them. :class:`SwitchGate` lets any number
of openings through together (:meth:`shared`) and a switch alone (:meth:`exclusive`); a switch
that waits goes before openings that come after it, so loads never starve it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

__all__ = ["SwitchGate"]


class SwitchGate:
    """Shared by tablet openings, exclusive for a log switch (module docstring). Releases are
    synchronous, so a holder cancelled anywhere never leaves the counts wrong."""

    def __init__(self) -> None:
        self._shared = 0
        self._exclusive = False
        self._switches_waiting = 0
        self._changed = asyncio.Event()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self._changed.wait()

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        await self._until(lambda: not self._exclusive and not self._switches_waiting)
        self._shared += 1
        try:
            yield
        finally:
            self._shared -= 1
            self._wake()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        self._switches_waiting += 1
        try:
            await self._until(lambda: not self._exclusive and not self._shared)
        finally:
            self._switches_waiting -= 1
        self._exclusive = True
        try:
            yield
        finally:
            self._exclusive = False
            self._wake()

    @property
    def locked(self) -> bool:
        """Held by anyone (for tests and status)."""
        return self._exclusive or self._shared > 0
