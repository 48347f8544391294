"""A worker's part in sorting dead workers' logs (§6: tablet servers sort the log in pieces).

The master publishes sort tasks under ``sorts/<worker>/<incarnation>/<first-segment>``
(:class:`tabletstore.master.log_recovery.WorkerSortExecutor`). Every live worker runs a
:class:`Sorter`: it polls that prefix, claims a task by creating
``sorters/<worker>/<incarnation>/<first-segment>`` attached to its own lease (create-only: one
claimant at a time), runs it (:func:`~tabletstore.commitlog.sorting.sort_task_by_number`, which
reads the plan from the bucket) and deletes the published key, which tells the master the task
is done. A failed task gets ``{"error": ...}`` written into the published key instead. A sorter
that dies mid-task loses its claim with its lease, and another worker takes the task over; a
task is idempotent, so the half-written runs of the dead one are harmless.

A task may name an ``owner``: the worker the master gives every tablet of the log to (owner
affinity). The other sorters leave it to that worker for :data:`OWNER_GRACE` seconds from when
they first saw it reserved for it, so the runs are written by the process that replays them
and read there from its memory or local disk (``commitlog.spill``: the log's records are read
once in the cluster, not twice). An owner that died meanwhile delays the task by that grace
at most: once the master notices (its lease gone) it re-reserves the task for the worker it
gives the log's tablets to now, whose sorter takes it at once (the others' grace starts again
for that owner). The owner claims every task reserved for it at
once, beyond its ``parallel`` loops (a log of many tasks is owned whole, up to
``MasterOptions.sort_owner_bytes``): its :class:`~tabletstore.commitlog.sorting.SharedSorts`
runs them on its cores, and a claimed task is not taken by another sorter once the grace is
over. Its claims go with its lease if it dies.

A point-in-time restore publishes its tasks the same way, with its scope as a fourth key
component (``paths.sort``): the sorter runs them against the restore's plan
(``SortPlan.scope``), never reserved for an owner.

A sorter runs up to ``parallel`` tasks at once (default 3): a dead worker's log is cut into
tasks of at most a few hundred segments, and with few live workers one task at a time each
would leave most of them waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from tabletstore.clock import monotonic
from tabletstore.commitlog.sorting import SharedSorts, sort_task_by_number
from tabletstore.coordination import paths
from tabletstore.coordination.base import (
    Coordinator,
    Delete,
    Lease,
    Put,
    absent,
    create_revision_is,
    mod_revision_is,
)
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["Sorter"]

log = logging.getLogger(__name__)

#: Seconds a sorter leaves a task reserved for another worker (its ``owner``) to that worker.
OWNER_GRACE = 2.0


class Sorter:
    """Takes sort tasks published in the coordinator and runs up to ``parallel`` of them at
    once."""

    def __init__(
        self,
        worker_id: str,
        store: ObjectStore,
        coordinator: Coordinator,
        lease: Lease,
        *,
        poll: float = 0.2,
        parallel: int = 3,
        shared: SharedSorts | None = None,
    ) -> None:
        """``shared``: the tasks this worker's loads are sorting (owner affinity), which a
        task taken here joins instead of reading the segments again."""
        if parallel < 1:
            raise InvalidArgument(f"a sorter runs at least 1 task at once, got {parallel}")
        self._parallel = parallel
        self.worker_id = worker_id
        self._store = store
        self._coord = coordinator
        self._lease = lease
        self._poll = poll
        self._shared = shared
        #: Tasks this sorter finished (for tests and status).
        self.done = 0
        #: (Published task key, its owner) -> when this sorter first saw it reserved for that
        #: other worker: a task re-reserved for a new owner (the first one died) gets a grace
        #: of its own.
        self._reserved_seen: dict[tuple[str, str], float] = {}
        #: Tasks reserved for this worker, claimed and running beside the loops.
        self._owned: set[str] = set()
        self._group: asyncio.TaskGroup | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Poll and run tasks, up to ``parallel`` at once, until ``stop`` is set or the lease
        ends. Each of the ``parallel`` loops claims its own task: two loops going for one task
        race on its claim key, and the loser moves on to the next task."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                for _ in range(self._parallel):
                    group.create_task(self._loop(stop))
        finally:
            self._group = None

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and not self._lease.expired:
            try:
                ran = await self.run_one()
            except TabletStoreError as exc:
                log.warning("sorter %s: %s", self.worker_id, exc)
                ran = False
            if not ran:
                try:
                    await asyncio.wait_for(stop.wait(), self._poll)
                except TimeoutError:
                    pass

    async def run_one(self) -> bool:
        """Claim and run one published task; False when there was none to take. Tasks
        reserved for this worker are all claimed, and run beside the loops (module
        docstring), when the sorter runs (:meth:`run`)."""
        published = await self._coord.get_prefix(paths.SORTS)
        owned = False
        now = monotonic()
        listed = {kv.key for kv in published}
        self._reserved_seen = {k: t for k, t in self._reserved_seen.items() if k[0] in listed}
        for kv in published:
            try:
                worker_id, incarnation, first, scope = paths.parse_sort_task(kv.key)
                task = json.loads(kv.value)
                if not isinstance(task, dict) or "error" in task:
                    continue  # failed: the master decides whether it runs again
            except (InvalidArgument, ValueError):
                continue  # not a task this version understands: leave it alone
            owner = task.get("owner")
            if owner is not None and owner != self.worker_id:
                seen = self._reserved_seen.setdefault((kv.key, str(owner)), now)
                if now - seen < OWNER_GRACE:
                    continue  # its owner sorts it (owner affinity), unless it is gone
            if kv.key in self._owned:
                continue  # running here already
            claim = paths.sorter(worker_id, incarnation, first, scope)
            # Only while the task is still published as listed: a task finished (and its claim
            # released) since the listing is not run again.
            result = await self._coord.txn(
                [absent(claim), mod_revision_is(kv.key, kv.mod_revision)],
                [Put(claim, self.worker_id.encode(), lease_id=self._lease.id)],
                [],
            )
            if not result.succeeded:
                continue  # another live sorter has it
            mine = await self._coord.get(claim)
            claimed = (kv.key, claim, None if mine is None else mine.create_revision)
            if owner == self.worker_id and self._group is not None:
                # Claimed now, so no other sorter takes it once the grace is over; run beside
                # the loops (SharedSorts bounds how many sort at once).
                self._owned.add(kv.key)
                self._group.create_task(
                    self._run_claimed(claimed, worker_id, incarnation, first, scope)
                )
                owned = True
                continue
            await self._run_claimed(claimed, worker_id, incarnation, first, scope)
            return True
        return owned

    async def _run_claimed(
        self,
        claimed: tuple[str, str, int | None],
        worker_id: str,
        incarnation: int,
        first: int,
        scope: str | None = None,
    ) -> None:
        """Run a task this sorter claimed, then release the claim."""
        key, claim, revision = claimed
        try:
            await self._run(key, worker_id, incarnation, first, scope)
        except TabletStoreError as exc:
            log.warning("sorter %s: %s", self.worker_id, exc)
        finally:
            self._owned.discard(key)
            if revision is not None:
                with contextlib.suppress(TabletStoreError):
                    await self._coord.txn(
                        [create_revision_is(claim, revision)], [Delete(claim)], []
                    )

    async def _run(
        self, key: str, worker_id: str, incarnation: int, first: int, scope: str | None
    ) -> None:
        try:
            # A restore's task (``scope``) is not this worker's to replay: its runs are not
            # kept in the worker's spill, which holds the runs of the tablets it recovers.
            manifest = await sort_task_by_number(
                self._store,
                worker_id,
                incarnation,
                first,
                shared=self._shared if scope is None else None,
                scope=scope,
            )
        except TabletStoreError as exc:
            log.error("sort task %s failed: %s", key, exc)
            await self._coord.put(key, json.dumps({"error": str(exc)}).encode())
            return
        self.done += 1
        log.info(
            "sorted %s/%s@%d: %d records into %d runs",
            worker_id,
            incarnation,
            first,
            manifest.records,
            len(manifest.runs),
        )
        await self._coord.delete(key)
