"""A tablet's write path (§5.3): validate, take the row lock, allocate sequence numbers,
append to the worker's commit log (group commit; acknowledged only once durable), insert into
the memtable; and the single-row transactions of §3 (check-and-mutate, read-modify-write).

Sequence numbers are taken before the commit-log append and cells reach the memtable only
after it: the writes in between are *in flight* (:attr:`TabletCore.in_flight`), which is what
the redo point of a minor compaction, a snapshot's cut and a split wait for or account for.

The log is authoritative: a record that became durable is in the memtable, whatever became of
its caller, so the table, a replay of the log and the change stream (which reads the log's
segments) agree. The contract, with the commit log (:mod:`tabletstore.commitlog.writer`):

* The cells go into the memtable in the log's ``on_durable`` callback, the moment the record is
  durable, not when the caller resumes: a caller cancelled meanwhile (an RPC whose client timed
  out or hung up) or told the outcome is unknown afterwards (its worker's lease expired while
  it was logged: fencing rule 1 forbids acknowledging it) still leaves the write in the table.
* A queued record cannot be withdrawn, so a cancelled caller waits until its record settled,
  row lock and in-flight entry held, and only then hears of the cancellation: the next writer
  of the row (a read-modify-write) reads it, and a minor compaction's redo point cannot pass
  it while it is not in the memtable yet.
* A record that may or may not be durable (the writer could not settle a failed PUT) is
  reported ``Indeterminate``, never acknowledged, and is not in the memtable. The tablet then
  stops taking writes (:meth:`TabletCore.log_unsettled`), and its worker closes it without a
  flush and loads it again, replaying the log: the table holds the write exactly if the log
  does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tabletstore.data.filters import RowFilter
from tabletstore.data.model import Cell as ApiCell
from tabletstore.data.model import Mutation, ReadModifyWriteRule, Row, SetCell
from tabletstore.data.schema import TableSchema
from tabletstore.data.validation import (
    check_mutation_size,
    validate_rmw_rules,
    validate_row_mutation,
)
from tabletstore.engine.cells import apply_rmw_rule, to_cells
from tabletstore.engine.read_path import ReadPath, filter_row, regex_cost_compiled
from tabletstore.engine.row_locks import RowLocks
from tabletstore.engine.tablet_core import TabletCore
from tabletstore.errors import Indeterminate, TabletStoreError
from tabletstore.keys import Cell

__all__ = ["ROOM_POLL", "WritePath"]

#: Seconds between two looks of a write waiting for room (:meth:`WritePath._make_room`) at
#: the flush it waits for.
ROOM_POLL = 0.02


class WritePath:
    """Applies one tablet's row mutations."""

    def __init__(
        self,
        core: TabletCore,
        reads: ReadPath,
        *,
        spawn_flush: Callable[[], None],
        flushing: Callable[[], asyncio.Task[None] | None],
    ) -> None:
        self._core = core
        self._reads = reads
        #: Starts a background minor compaction once the memtable is full.
        self._spawn_flush = spawn_flush
        #: The background compaction running, to wait for (None: none runs).
        self._flushing = flushing
        self.row_locks = RowLocks()
        # Bound once: every write takes and releases row locks.
        self._lock_rows = self.row_locks.acquire
        self._unlock_rows = self.row_locks.release
        self._value_types_cache: tuple[TableSchema, dict[str, str | None]] | None = None
        # Bound once: every write hands it to the log.
        self._insert_durable = self._insert

    def _insert(self, cells: Sequence[Cell]) -> None:
        """The log's ``on_durable``: the cells go into the memtable current when their record
        is durable (module docstring), whatever became of the writing task."""
        self._core.state.memtable.add(cells)

    def _value_types(self) -> dict[str, str | None]:
        # Every write asks: built once per schema (set_schema swaps the schema whole).
        schema = self._core.schema
        cached = self._value_types_cache
        if cached is None or cached[0] is not schema:
            types: dict[str, str | None] = {
                n: f.value_type for n, f in schema.families.items() if f.value_type
            }
            cached = (schema, types)
            self._value_types_cache = cached
        return cached[1]

    async def _make_room(self) -> None:
        """Wait while the memtables held reach ``TabletOptions.memtable_limit_bytes`` and a
        background minor compaction is writing them out (LevelDB's MakeRoomForWrite): the
        memtable must not outgrow memory while its flush is slow (a slow store, or an encoding
        thread starved by a busy event loop). Not once that compaction fails (it then retries
        in the background): :meth:`TabletCore.check_writable` refuses the write instead,
        naming the failure."""
        core = self._core
        while (
            core.memtable_bytes() >= core.options.memory_limit
            and core.flush_failure is None
            and core.failed is None
            and core.writes_blocked is None
            and not core.closed
        ):
            running = self._flushing()
            if running is None:
                self._spawn_flush()
                running = self._flushing()
                if running is None:
                    return  # none can start (the tablet is closing): check_writable decides
            held = core.memtable_bytes()
            # Polled: a failing flush does not end, it retries (and sets flush_failure).
            await asyncio.wait({running}, timeout=ROOM_POLL)
            if running.done() and core.memtable_bytes() >= held:
                return  # it ended and wrote nothing out: check_writable decides

    async def apply(
        self, row: bytes, mutations: Sequence[Mutation], *, identity: str | None = None
    ) -> None:
        """Apply one row mutation atomically (§2). Acknowledged only once logged durably."""
        core = self._core
        await self._make_room()
        core.check_writable()
        core.check_row(row)
        validate_row_mutation(core.schema, row, mutations, identity)
        rows = [row]  # acquire, not held(): no context-manager generator per write
        await self._lock_rows(rows)
        try:
            await self._apply_locked(row, mutations)
        finally:
            self._unlock_rows(rows)

    # REQUIRES: the row lock of ``row`` held.
    async def _apply_locked(self, row: bytes, mutations: Sequence[Mutation]) -> None:
        core = self._core
        # A snapshot's cut is being taken (hold_for_snapshot): wait, briefly, before taking a
        # sequence number, so this write falls on the far side of the cut.
        while core.snapshot_gate is not None:
            await core.snapshot_gate.wait()
        # Checked again with the row lock held: a split or unload may have started while this
        # write waited for it. No await from here to the in-flight entry, so a quiescing
        # tablet sees every write it lets through.
        core.check_writable()
        log = core.log
        first = log.allocate(len(mutations))
        core.in_flight_marks[first] = (log.log_ref, log.segment_mark())
        try:
            cells = to_cells(row, mutations, first, core.write_micros(), self._value_types())
        except BaseException:
            del core.in_flight_marks[first]
            raise
        core.in_flight[first] = len(cells)
        core.idle.clear()
        try:
            # Into the memtable current when the record is durable (module docstring).
            await log.append(core.state.record.table_id, row, cells, self._insert_durable)
        except Indeterminate as exc:
            core.log_unsettled(exc)
            raise
        finally:
            del core.in_flight[first]
            del core.in_flight_marks[first]
            if not core.in_flight:
                core.idle.set()
        if core.state.memtable.approximate_size >= core.options.memtable_flush_bytes:
            self._spawn_flush()

    async def apply_many(
        self, entries: Sequence[tuple[bytes, Sequence[Mutation]]], *, identity: str | None = None
    ) -> list[TabletStoreError | None]:
        """Apply many row mutations, each atomically on its own (§2, §3 batches), as one
        commit-log append: the rows' records share segments, and each row is acknowledged (None
        in its place of the result) only once its record is durable; an entry that failed has
        its error there instead. Entries of the same row apply in their order (rising sequence
        numbers). An exception means no entry was applied (nothing was logged)."""
        core = self._core
        out: list[TabletStoreError | None] = [None] * len(entries)
        await self._make_room()
        core.check_writable()
        valid: list[int] = []
        for i, (row, mutations) in enumerate(entries):
            try:
                core.check_row(row)
                validate_row_mutation(core.schema, row, mutations, identity)
            except TabletStoreError as exc:
                out[i] = exc
                continue
            valid.append(i)
        if not valid:
            return out
        # Sorted: two batches take their common rows' locks in the same order, so neither
        # waits on the other in a cycle (single-row writers hold one lock only).
        rows = sorted({entries[i][0] for i in valid})
        await self._lock_rows(rows)
        try:
            await self._apply_many_locked(entries, valid, out)
        finally:
            self._unlock_rows(rows)
        return out

    # REQUIRES: the row locks of every valid entry's row held.
    async def _apply_many_locked(
        self,
        entries: Sequence[tuple[bytes, Sequence[Mutation]]],
        valid: list[int],
        out: list[TabletStoreError | None],
    ) -> None:
        core = self._core
        while core.snapshot_gate is not None:  # as in _apply_locked
            await core.snapshot_gate.wait()
        # No await from this check to the in-flight entries (as in _apply_locked).
        core.check_writable()
        now = core.write_micros()
        value_types = self._value_types()
        log = core.log
        logged: list[tuple[int, int, list[Cell]]] = []  # (entry, first seq, cells)
        for i in valid:
            row, mutations = entries[i]
            first = log.allocate(len(mutations))
            try:
                cells = to_cells(row, mutations, first, now, value_types)
            except TabletStoreError as exc:
                out[i] = exc
                continue
            logged.append((i, first, cells))
        if not logged:
            return
        # The log position a minor compaction records must stay at or below the segment
        # these records land in (TabletCore.log_start_now): no await since allocate, so the
        # mark now is the mark at allocation.
        mark = (log.log_ref, log.segment_mark())
        for _, first, cells in logged:
            core.in_flight[first] = len(cells)
            core.in_flight_marks[first] = mark
        core.idle.clear()
        try:
            results = await log.append_many(
                core.state.record.table_id,
                [(entries[i][0], cells) for i, _, cells in logged],
                self._insert_durable,
            )
            for (i, _, _), error in zip(logged, results, strict=True):
                if error is not None:
                    out[i] = error
                    if isinstance(error, Indeterminate):
                        core.log_unsettled(error)
        finally:
            for _, first, _ in logged:
                del core.in_flight[first]
                del core.in_flight_marks[first]
            if not core.in_flight:
                core.idle.set()
        if core.state.memtable.approximate_size >= core.options.memtable_flush_bytes:
            self._spawn_flush()

    async def check_and_mutate(
        self,
        row: bytes,
        predicate: RowFilter | None,
        true_mutations: Sequence[Mutation],
        false_mutations: Sequence[Mutation],
        *,
        identity: str | None = None,
    ) -> bool:
        """Single-row transaction (§3): apply ``true_mutations`` if the predicate filter yields
        any cell of the row (or, with no predicate, if the row has any cell), else
        ``false_mutations``. Returns whether the predicate matched."""
        core = self._core
        await self._make_room()
        core.check_writable()
        core.check_row(row)
        for muts in (true_mutations, false_mutations):
            if muts:
                validate_row_mutation(core.schema, row, muts, identity)
        cost = await regex_cost_compiled(predicate)
        async with self.row_locks.held(row):
            current = await self._reads.read_row_cells(row, self._reads.readable(identity))
            cells = current
            if predicate is not None:
                cells = await filter_row(predicate, cost, row, current)
            matched = bool(cells)
            chosen = true_mutations if matched else false_mutations
            if chosen:
                await self._apply_locked(row, chosen)
        return matched

    async def read_modify_write(
        self, row: bytes, rules: Sequence[ReadModifyWriteRule], *, identity: str | None = None
    ) -> Row:
        """Single-row read-modify-write (§3): append or increment; returns the new cells."""
        core = self._core
        await self._make_room()
        core.check_writable()
        core.check_row(row)
        validate_rmw_rules(core.schema, row, rules, identity)
        async with self.row_locks.held(row):
            current = await self._reads.read_row_cells(row, None)
            latest: dict[tuple[str, bytes], bytes] = {}
            for c in current:
                latest.setdefault((c.family, c.qualifier), c.value)
            written: dict[tuple[str, bytes], bytes] = {}
            for rule in rules:
                col = (rule.family, rule.qualifier)
                base = written.get(col, latest.get(col))
                written[col] = apply_rmw_rule(rule, base)
            # Whole milliseconds: a Cloud Bigtable client stamps its writes with the front
            # door's clock truncated to the millisecond, and a write acknowledged after this
            # one must not get an older timestamp and be hidden behind it (seq breaks ties).
            now = core.now_micros() // 1000 * 1000
            newest: dict[tuple[str, bytes], int] = {}
            for c in current:
                newest.setdefault((c.family, c.qualifier), c.timestamp)
            # The result must be the column's newest version even when an existing version
            # carries a client timestamp in the future: write at max(now, newest).
            muts: list[Mutation] = [
                SetCell(f, q, v, max(now, newest.get((f, q), now))) for (f, q), v in written.items()
            ]
            # Appends can grow a row mutation past what one request could carry: refuse it
            # like a write of the same cells (the result row crosses the wire in one reply).
            check_mutation_size(row, muts)
            await self._apply_locked(row, muts)
            out = [
                ApiCell(m.family, m.qualifier, m.timestamp or now, m.value)
                for m in muts
                if isinstance(m, SetCell)
            ]
        out.sort(key=lambda c: (c.family, c.qualifier))
        return Row(row, out)
