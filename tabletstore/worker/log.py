"""The worker's commit log as its tablets see it (§5.3, §6): sequence numbers, durable appends
under the lease (fencing rule 1), the switch to a new incarnation after a failure, and reading
back the worker's own live log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from tabletstore.clock import Clock
from tabletstore.commitlog import CommitLogWriter, replay_cells
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

__all__ = ["WorkerLog"]


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

    async def append(self, table_id: str, row: bytes, cells: Sequence[Cell]) -> None:
        # Fencing rule 1: never acknowledge a write the lease may no longer cover.
        if self._lease.expired or self._clock.monotonic() >= self._lease.safe_until():
            raise Unavailable("this worker's lease is about to expire; not accepting writes")
        writer = self._writer
        try:
            await writer.append(table_id, row, cells)
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
            # the write may well take effect, so it must not be reported as refused.
            raise Indeterminate(
                "this worker's lease expired while the write was being logged; "
                "it may have been applied"
            )

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
            stop_segment=writer.durable_segments,
        ):
            yield cell
