"""A tablet's positions in its workers' commit logs (§5.3): which logs its record lists for
recovery to replay, and from which segment of each.

A minor compaction moves the position forward (:mod:`~tabletstore.engine.compaction_runner`);
this module moves it when there is nothing to write out (:meth:`LogPositions.trim_logs`),
records a new log incarnation of the worker before the tablet takes writes logged there
(:meth:`LogPositions.hold_writes`, :meth:`LogPositions.add_log`), and clears the list once
every acknowledged write is in SSTables (a split, an unload).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from tabletstore.engine.tablet_core import TabletCore
from tabletstore.metadata.record import LogRef

__all__ = ["LogPositions"]


class LogPositions:
    """Keeps the logs a tablet's record lists in step with its worker's log."""

    def __init__(self, core: TabletCore, minor_compact: Callable[[], Awaitable[None]]) -> None:
        self._core = core
        self._minor_compact = minor_compact

    async def trim_logs(self) -> None:
        """Move this tablet's log position to the log's end (§5.3, §5.4: a minor compaction
        shrinks what recovery reads): minor-compact it; with nothing in memory, frozen or in
        flight, only rewrite its record to list the worker's log from its current segment
        (every write it has is in its SSTables: no other log holds one it lacks)."""
        core = self._core
        core.check_open()
        if len(core.state.memtable) or core.state.frozen or core.in_flight:
            await self._minor_compact()
            return
        async with core.compaction_lock, core.state_lock:
            core.check_open()
            state = core.state
            if core.in_flight or len(state.memtable) or state.frozen or core.log_pending:
                return  # a write came in meanwhile: the next round compacts
            ref = core.log.log_ref
            starts = {ref: core.log_start_now(ref)}
            record = state.record
            if record.logs == (ref,) and record.log_starts == starts:
                return
            new_record = replace(record, logs=(ref,), log_starts=starts).with_event(
                core.clock.time(),
                "log_position",
                f"{ref.worker_id}/{ref.incarnation}@{starts[ref]}",
            )
            await core.update_record(record, new_record)

    def hold_writes(self, failure: BaseException | None = None) -> None:
        """Refuse writes (Unavailable, naming ``failure``: why the worker's current log
        failed) until :meth:`add_log` records the worker's next log: a write logged in the
        next one before this tablet's record lists it would be lost in a crash."""
        self._core.log_pending = True
        self._core.log_failure = failure

    async def add_log(self, ref: LogRef, *, wait: float | None = None) -> None:
        """Record ``ref`` (the worker's new log incarnation) among the logs to replay, then
        take writes again. Raises if the record cannot be updated (Fenced: the tablet is no
        longer this worker's; Unavailable once refusals were retried ``wait`` seconds, None:
        the catalog's deadline); writes stay refused then. Raises Unavailable for a tablet
        that must be reloaded (:meth:`TabletCore.fail`): its worker reloads it, replaying the
        logs its record lists."""
        core = self._core
        core.check_open()
        async with core.compaction_lock, core.state_lock:
            record = core.state.record
            if ref not in record.logs:
                starts = {**record.log_starts, ref: core.log_start_now(ref)}
                new_record = replace(
                    record, logs=(*record.logs, ref), log_starts=starts
                ).with_event(core.clock.time(), "new_log", f"{ref.worker_id}/{ref.incarnation}")
                await core.update_record(record, new_record, wait=wait)
        core.log_pending = False
        core.log_failure = None

    async def forget_logs(self) -> None:
        """Clear the record's logs: every acknowledged write is in SSTables (after the flush of
        a split or an unload), so whoever loads the tablet next replays and fences nothing."""
        core = self._core
        async with core.compaction_lock, core.state_lock:
            record = core.state.record
            if not record.logs:
                return
            new_record = replace(record, logs=(), log_starts={}).with_event(
                core.clock.time(), "unloaded", "flushed; nothing to replay"
            )
            await core.update_record(record, new_record)
