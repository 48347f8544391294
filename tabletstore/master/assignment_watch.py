"""What tells the leading master that an assignment round has work to do (§5.2).

"The master keeps track of the set of live tablet servers, and the current assignment of
tablets to tablet servers" (§5.2), learning of changes from Chubby rather than polling it. A
full assignment round reads every claim and every METADATA row (O(N) in the tablets), so the
leader's periodic rounds must not run one while nothing it depends on has changed: a steady
cluster would pay O(N) of the master's CPU every ``interval`` for nothing, seconds of it at
100,000 tablets.

What a round depends on lives under three coordinator prefixes, watched here:

* ``claims/``: a tablet unclaimed (its worker's lease ended, an unload, a split's parent)
  needs a round; a new claim does not (a worker registers before it claims, and a split's
  children are claimed by the worker that splits), so only deletions count;
* ``servers/``: a worker that joined or left;
* ``schemas/``: a table created or deleted (its tablets' rows are written before its schema).

:meth:`AssignmentWatch.take` says whether a round is due: a change was seen since the last
take, a watch is not (yet, or any longer) established, or ``full_interval`` seconds went by
since the last due round (a safety net for what no watched key shows, such as a METADATA row
written by hand). Taking resets it before the round reads anything, so a change made during
the round makes the next one due. A round the master starts itself (after creating a table,
merging, a lease revoked by the failure detector) does not ask.

One watch per prefix, events only counted: O(changes) per round instead of O(N).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator, EventType

__all__ = ["WATCHED", "AssignmentWatch"]

log = logging.getLogger(__name__)

#: The coordinator prefixes whose changes make an assignment round due.
WATCHED: tuple[str, ...] = (paths.claims_prefix(), paths.SERVERS, paths.SCHEMAS)
#: The prefixes of which only deletions make a round due.
CLAIMS_ONLY_DELETES = frozenset({paths.claims_prefix()})
#: Seconds before a watch that failed is opened again.
RETRY_SECONDS = 1.0


class AssignmentWatch:
    """Watches :data:`WATCHED` and says when an assignment round is due (module docstring)."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        full_interval: float,
        now: Callable[[], float],
        prefixes: Sequence[str] = WATCHED,
    ) -> None:
        self._coord = coordinator
        self._full_interval = full_interval
        self._now = now
        self._prefixes = tuple(prefixes)
        #: A change not yet taken (True at first: nothing is known yet).
        self._changed = True
        self._established: set[str] = set()
        self._last_due = -float("inf")
        self._tasks: list[asyncio.Task[None]] = []
        #: Events seen, and rounds found not due (what the scale benchmark counts).
        self.events = 0
        self.skipped = 0

    async def start(self) -> None:
        """Open the watches (once) and wait until each is established or failed."""
        if self._tasks:
            return
        ready = [asyncio.Event() for _ in self._prefixes]
        self._tasks = [
            asyncio.create_task(self._follow(prefix, up), name=f"assignment watch {prefix}")
            for prefix, up in zip(self._prefixes, ready, strict=True)
        ]
        await asyncio.gather(*(up.wait() for up in ready))

    async def _follow(self, prefix: str, ready: asyncio.Event) -> None:
        while True:
            try:
                async with self._coord.watch_prefix(prefix) as watch:
                    self._established.add(prefix)
                    ready.set()
                    async for event in watch:
                        if prefix in CLAIMS_ONLY_DELETES and event.type is not EventType.DELETE:
                            continue
                        self.events += 1
                        self._changed = True
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the coordinator unreachable, the watch compacted
                log.info("assignment watch on %s failed (rounds run in full): %s", prefix, exc)
            # Whatever happened while it was not established is unknown: the next round runs.
            self._established.discard(prefix)
            self._changed = True
            ready.set()
            await asyncio.sleep(RETRY_SECONDS)

    def touch(self) -> None:
        """Make the next round due (a change learnt of otherwise: a lease revoked)."""
        self._changed = True

    def take(self) -> bool:
        """Whether a round is due now; the next call answers for what happens after this one."""
        now = self._now()
        due = (
            self._changed
            or len(self._established) < len(self._prefixes)
            or now - self._last_due >= self._full_interval
        )
        self._changed = False
        if due:
            self._last_due = now
        else:
            self.skipped += 1
        return due

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._established.clear()
        self._changed = True
