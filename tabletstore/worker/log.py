"""The worker's commit log as its tablets see it (§5.3, §6): sequence numbers, durable appends
under the lease (fencing rule 1), the switch to a new incarnation after a failure, reading
back the worker's own live log, and reading another worker's log for a tablet it recovers
(from the sorted runs when the master sorted that log, §6; else fenced and read whole)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence

from tabletstore.clock import Clock
from tabletstore.commitlog import CommitLogWriter, fence, replay_cells
from tabletstore.commitlog.runs import SortPlan
from tabletstore.commitlog.sorting import SharedSorts, load_plan, sorted_replay
from tabletstore.coordination.base import (
    Lease,
)
from tabletstore.errors import (
    Fenced,
    Indeterminate,
    TabletStoreError,
    Unavailable,
)
from tabletstore.keys import Cell
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["WorkerLog", "replay_logged"]


class WorkerLog:
    """The tablets' view of the worker's commit log: sequence numbers plus durable appends.

    The writer behind it changes when the log fails (a PUT failed for good, or recovery fenced
    it while this worker's lease lives): the worker continues under a new incarnation
    (:meth:`TabletServer._switch_log`), and ``on_failure`` tells it to."""

    def __init__(self, writer: CommitLogWriter, log_ref: LogRef, lease: Lease, clock: Clock):
        self._writer = writer
        self.log_ref = log_ref
        self._lease = lease
        self._clock = clock
        #: Called (synchronously) after an append found the writer failed.
        self.on_failure: Callable[[], None] | None = None

    @property
    def writer(self) -> CommitLogWriter:
        return self._writer

    def switch(self, writer: CommitLogWriter, log_ref: LogRef) -> None:
        """Append to ``writer`` from now on; sequence numbers go on increasing."""
        writer.advance(self._writer.next_seq - 1)
        self._writer = writer
        self.log_ref = log_ref

    def allocate(self, n: int) -> int:
        return self._writer.allocate(n)

    def advance(self, seq: int) -> None:
        self._writer.advance(seq)

    def segment_mark(self) -> int:
        return self._writer.next_segment

    async def append(
        self,
        table_id: str,
        row: bytes,
        cells: Sequence[Cell],
        on_durable: Callable[[Sequence[Cell]], object] | None = None,
    ) -> None:
        # Fencing rule 1: never acknowledge a write the lease may no longer cover.
        if self._lease.expired or self._clock.monotonic() >= self._lease.safe_until():
            raise Unavailable("this worker's lease is about to expire; not accepting writes")
        writer = self._writer
        try:
            await writer.append(table_id, row, cells, on_durable)
        except TabletStoreError as exc:
            if writer.failed is not None and writer is self._writer and self.on_failure:
                self.on_failure()
            if isinstance(exc, Fenced):
                # The write's segment collided with recovery's fence: certainly not logged.
                # This worker goes on under a new log, so the caller may simply retry.
                raise Unavailable(
                    f"the commit log was fenced before this write was logged ({exc}); "
                    "it was not applied, retry"
                ) from exc
            raise
        if self._lease.expired:
            # The record is durable in the log, and the tablet's next owner replays that log:
            # the write may well take effect, so it must not be reported as refused (nor
            # acknowledged: fencing rule 1). on_durable has put it in the memtable already,
            # which this worker no longer serves from (TabletServer.tablet refuses).
            raise Indeterminate(
                "this worker's lease expired while the write was being logged; "
                "it may have been applied"
            )

    async def append_many(
        self,
        table_id: str,
        rows: Sequence[tuple[bytes, Sequence[Cell]]],
        on_durable: Callable[[Sequence[Cell]], object] | None = None,
    ) -> list[TabletStoreError | None]:
        """Log many row mutations (:meth:`CommitLogWriter.append_many`), with the fencing
        rules of :meth:`append` applied to each row."""
        if self._lease.expired or self._clock.monotonic() >= self._lease.safe_until():
            raise Unavailable("this worker's lease is about to expire; not accepting writes")
        writer = self._writer
        results = await writer.append_many(table_id, rows, on_durable)
        failed = False
        for i, error in enumerate(results):
            if error is None:
                continue
            failed = True
            if isinstance(error, Fenced):
                fenced = Unavailable(
                    f"the commit log was fenced before this write was logged ({error}); "
                    "it was not applied, retry"
                )
                fenced.__cause__ = error
                results[i] = fenced
        if failed and writer.failed is not None and writer is self._writer and self.on_failure:
            self.on_failure()
        if self._lease.expired:
            for i, error in enumerate(results):
                if error is None:
                    results[i] = Indeterminate(
                        "this worker's lease expired while the write was being logged; "
                        "it may have been applied"
                    )
        return results

    async def barrier(self) -> None:
        """Wait until every append made before this call is durable or has failed (so its
        segment was stamped before this returns)."""
        await self._writer.barrier()

    async def replay_own(self, record: TabletRecord) -> AsyncIterator[Cell]:
        """The tablet's cells past its redo point in this worker's *current* log: a tablet it
        served before in this incarnation and now loads again (an unload whose flush failed
        or was cancelled). The log is live, so it is not fenced: every append made so far
        settles first, then exactly its durable prefix is read."""
        writer, ref = self._writer, self.log_ref
        await writer.barrier()
        async for cell in replay_cells(
            writer.store,
            ref.worker_id,
            ref.incarnation,
            record.table_id,
            record.start_row,
            record.end_row,
            record.redo_seq,
            start_segment=min(record.log_start(ref), writer.durable_segments),
            stop_segment=writer.durable_segments,
        ):
            yield cell


async def replay_logged(
    store: ObjectStore,
    ref: LogRef,
    record: TabletRecord,
    *,
    wait: float,
    direct: Callable[[LogRef, TabletRecord], AsyncIterator[Cell]] | None = None,
    reserved: Callable[[SortPlan], Awaitable[Collection[int]]] | None = None,
    shared: SharedSorts | None = None,
) -> AsyncIterator[Cell]:
    """The tablet's cells past its redo point in another worker's log ``ref``.

    When the master sorted that log (a plan exists, made after it fenced the log), only the
    runs overlapping the tablet are read, waiting at most ``wait`` seconds for their sort
    tasks (:func:`~tabletstore.commitlog.sorting.sorted_replay`); the tasks ``reserved``
    names (reserved for this worker: owner affinity) are sorted here at once, without waiting
    for a sorter to take them from the coordinator (or for a dead one's claim to end). Otherwise the log is fenced
    (docs/architecture/design.md §6 rule 4: its writer may be alive) and read whole, as the paper's
    §5.3 does before §6's sorting: a log nobody sorts (the embedded database's previous incarnation
    when no sorter runs, a worker's log a tablet left by a move) still recovers."""
    plan = await load_plan(store, ref.worker_id, ref.incarnation)
    if plan is not None:
        cells = sorted_replay(
            store,
            plan,
            record.table_id,
            record.start_row,
            record.end_row,
            record.redo_seq,
            wait=wait,
            run_here=() if reserved is None else await reserved(plan),
            shared=shared,
        )
    elif direct is not None:
        cells = direct(ref, record)  # the caller's own fenced read (worker.shared_log_reads)
    else:
        await fence(store, ref.worker_id, ref.incarnation, start=record.log_start(ref))
        cells = replay_cells(
            store,
            ref.worker_id,
            ref.incarnation,
            record.table_id,
            record.start_row,
            record.end_row,
            record.redo_seq,
            start_segment=record.log_start(ref),
        )
    async for cell in cells:
        yield cell
