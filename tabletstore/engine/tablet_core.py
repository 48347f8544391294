"""What the parts of one served tablet share (:class:`~tabletstore.engine.tablet.Tablet`).

The tablet's collaborators (:mod:`~tabletstore.engine.write_path`,
:mod:`~tabletstore.engine.read_path`, :mod:`~tabletstore.engine.compaction_runner`,
:mod:`~tabletstore.engine.log_positions`, :mod:`~tabletstore.engine.snapshot_cut`,
:mod:`~tabletstore.engine.bulk_ingest`) each hold the one :class:`TabletCore` of their tablet:
its current state, its schema, the locks that order changes to its record, the writes in
flight, the flags that refuse writes, and what it talks to (the object store, the worker's
commit log, the catalog).

State is an immutable :class:`TabletState` replaced whole under :attr:`TabletCore.state_lock`;
readers take one reference and never lock. Its record is committed through a
:class:`TabletCatalog` with compare-on-epoch: a record update succeeds only while the tablet is
still this worker's at the epoch it loaded it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Protocol

from tabletstore.clock import Clock, micros
from tabletstore.data.schema import GcRule, LocalityGroup, TableSchema, counts_versions
from tabletstore.data.validation import check_not_promoting
from tabletstore.engine.state import TabletState
from tabletstore.errors import Indeterminate, NotServing, TabletStoreError, Unavailable
from tabletstore.keys import Cell, CellKind, cell_sort_key
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.options import TabletOptions
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["LogSink", "TabletCatalog", "TabletCore"]


class LogSink(Protocol):
    """What a tablet needs from its worker's commit log (§5.3)."""

    #: The log this worker appends to, recorded in the tablet's record while it serves it.
    log_ref: LogRef

    def allocate(self, n: int) -> int:
        """Reserve ``n`` consecutive sequence numbers; return the first."""
        ...

    def segment_mark(self) -> int:
        """The number of the next segment of :attr:`log_ref` to be cut: every record appended
        from now on lands in it or a later one (the tablet's position in the log, §5.3)."""
        ...

    def advance(self, seq: int) -> None:
        """Make every future allocation larger than ``seq`` (after loading a tablet)."""
        ...

    async def append(
        self,
        table_id: str,
        row: bytes,
        cells: Sequence[Cell],
        on_durable: Callable[[Sequence[Cell]], object] | None = None,
    ) -> None:
        """Durably log one row mutation; returns only once it is durable. ``on_durable(cells)``
        is called synchronously the moment it is, whatever became of the caller; a cancelled
        caller hears of its cancellation only once the record settled (durable or failed)."""
        ...

    async def append_many(
        self,
        table_id: str,
        rows: Sequence[tuple[bytes, Sequence[Cell]]],
        on_durable: Callable[[Sequence[Cell]], object] | None = None,
    ) -> list[TabletStoreError | None]:
        """Durably log many row mutations in one go (they share segments); returns once each
        is durable or has failed: per row, None (durable) or why it was not acknowledged. An
        exception means none of them was logged. ``on_durable`` gets a row's cells the
        moment its record is durable (as :meth:`append`)."""
        ...


class TabletCatalog(Protocol):
    """Where tablet records are committed: the catalog (the root tablet's record in the
    coordinator, every other one a row of METADATA)."""

    async def update(
        self, old: TabletRecord, new: TabletRecord, *, wait: float | None = None
    ) -> TabletRecord:
        """Replace ``old`` by ``new`` if the stored record still has ``old``'s epoch; raise
        :class:`~tabletstore.errors.Fenced` if it does not. Returns what was stored.
        ``wait``: how long refusals of the store of records are retried (None: its
        default), then Unavailable, nothing stored."""
        ...


class TabletCore:
    """The state, locks and dependencies every part of one served tablet shares."""

    def __init__(
        self,
        state: TabletState,
        schema: TableSchema,
        *,
        store: ObjectStore,
        log_sink: LogSink,
        catalog: TabletCatalog,
        clock: Clock,
        options: TabletOptions,
    ) -> None:
        #: The tablet now: record, memtables, opened SSTables. Swapped whole, never mutated
        #: (the memtable taking writes is the one thing in it that changes).
        self.state = state
        #: Swapped whole by :meth:`Tablet.set_schema`: caches keyed on it compare identity.
        self.schema = schema
        self.store = store
        self.log = log_sink
        self.catalog = catalog
        self.clock = clock
        self.options = options
        self.state_lock = asyncio.Lock()
        #: The newest timestamp this core or the tablet's earlier servers assigned to a
        #: write (:meth:`write_micros`); every record this core commits carries it.
        self.timestamp_floor = state.record.timestamp_floor
        # Only one compaction of a tablet runs at a time; it also serializes record commits.
        self.compaction_lock = asyncio.Lock()
        #: First seq -> count of mutations in flight (seqs taken, not yet in the memtable).
        self.in_flight: dict[int, int] = {}
        #: First seq -> (the log, its segment mark) when that write took its seqs: the write
        #: lands in that segment or a later one (log positions, :meth:`log_start_now`).
        self.in_flight_marks: dict[int, tuple[LogRef, int]] = {}
        #: Set while nothing is in flight (``in_flight`` empty): what a split or close awaits.
        self.idle = asyncio.Event()
        self.idle.set()
        #: Why writes are refused (a split or an unload under way), or None while they are not.
        self.writes_blocked: str | None = None
        #: The clock's monotonic time at which writes were last refused (``writes_blocked`` set).
        self.writes_blocked_at = 0.0
        #: Set while the worker's log moves to a new incarnation that this tablet's record does
        #: not list yet: a write logged there now could not be recovered (``hold_writes``).
        self.log_pending = False
        #: Why the worker's previous log failed, while ``log_pending``: named in the refusals,
        #: so a client that gives up retrying learns the cause (a full disk, say).
        self.log_failure: BaseException | None = None
        #: Set while a snapshot's cut holds writes (``hold_for_snapshot``): writes wait on it.
        self.snapshot_gate: asyncio.Event | None = None
        #: Sticky until the tablet is reloaded (:meth:`fail`): a background compaction's
        #: failure that retrying cannot mend, or a write whose record may or may not be in the
        #: log (:meth:`log_unsettled`).
        self.failed: BaseException | None = None
        #: Called (synchronously) when the tablet fails: its worker reloads it.
        self.on_failed: Callable[[], None] | None = None
        #: Why the background compaction is failing while it retries (transient: the store
        #: unreachable, say), or None: writes are refused only while the memtables held in
        #: memory exceed ``TabletOptions.memtable_limit_bytes`` (:meth:`check_writable`).
        self.flush_failure: BaseException | None = None
        self.closed = False

    @property
    def record(self) -> TabletRecord:
        return self.state.record

    def contains(self, row: bytes) -> bool:
        return self.state.record.contains(row)

    def check_serving(self) -> None:
        """Reads need only this: a failed background compaction loses nothing in memory."""
        if self.closed:
            raise NotServing(f"tablet {self.record.tablet_id} is not served here any more")

    def check_open(self) -> None:
        """Writes and compactions also need the tablet not failed (:meth:`fail`)."""
        self.check_serving()
        if self.failed is not None:
            raise Unavailable(
                f"tablet {self.record.tablet_id} must be reloaded ({self.failed}); its worker "
                "is reloading it, retry"
            )

    def fail(self, error: BaseException) -> None:
        """Refuse writes and compactions until the tablet is reloaded (its record and commit
        log hold every acknowledged write; reads go on), and tell the worker (``on_failed``),
        which reloads it. The first cause is kept."""
        if self.failed is None:
            self.failed = error
            if self.on_failed is not None and not self.closed:
                self.on_failed()

    def log_unsettled(self, error: Indeterminate) -> None:
        """A write of this tablet was answered ``error``: its record may be in the log while
        its cells are not in the memtable (engine/write_path.py), so the memtable no longer
        says what the log holds. The tablet takes no more writes and no compaction (whose redo
        point would pass the record for good): its worker closes it without a flush and loads
        it again once the log is settled, replaying it, and then the table holds the write
        exactly if the log does."""
        self.fail(error)

    def memtable_bytes(self) -> int:
        """The bytes of the memtables held in memory: the one taking writes and the frozen
        ones waiting to be written out."""
        state = self.state
        return state.memtable.approximate_size + sum(m.approximate_size for m in state.frozen)

    def check_writable(self) -> None:
        """Writes also need no split or unload under way, and a table not being promoted
        (``data.validation.check_not_promoting``: checked here, where a write joins the
        commit log, and not only when it arrived); refused ones were not applied, and
        NotServing sends the client to look the tablet up again (its children, its new owner)."""
        self.check_open()
        check_not_promoting(self.schema)
        if self.writes_blocked is not None:
            raise NotServing(
                f"tablet {self.record.tablet_id} is {self.writes_blocked}; look it up again"
            )
        if self.log_pending:
            cause = "" if self.log_failure is None else f" (its log failed: {self.log_failure})"
            raise Unavailable(
                f"tablet {self.record.tablet_id}: its worker is moving to a new commit log"
                f"{cause}; the write was not applied, retry"
            )
        if self.flush_failure is not None:
            held = self.memtable_bytes()
            if held >= self.options.memory_limit:
                raise Unavailable(
                    f"tablet {self.record.tablet_id} holds {held} bytes of memtables, its limit, "
                    f"and writing them out fails ({self.flush_failure}); the write was not "
                    "applied, retry"
                )

    def check_row(self, row: bytes) -> None:
        if not self.contains(row):
            raise NotServing(
                f"row {row[:64]!r} is outside tablet {self.record.tablet_id} "
                f"[{self.record.start_row[:64]!r}, {self.record.end_row!r})"
            )

    def gc_rules(self) -> dict[str, GcRule | None]:
        return {name: fam.gc_rule for name, fam in self.schema.families.items()}

    def unflushed_deletions(self, families: Collection[str] | None = None) -> list[Cell]:
        """The memtables' (live and frozen) deletion entries that can change a version count
        of ``families`` (default: all), in sort order: row deletions, and family and column
        deletions of a family whose GC rule counts versions. What a major compaction of the
        SSTables counts versions with (``engine.compaction``'s module docstring)."""
        state = self.state
        counted = {
            name
            for name, fam in self.schema.families.items()
            if counts_versions(fam.gc_rule) and (families is None or name in families)
        }
        if not counted:
            return []
        out = [
            cell
            for memtable in (state.memtable, *state.frozen)
            for cell in memtable.deletions()
            if cell.kind == CellKind.DELETE_ROW or cell.family in counted
        ]
        out.sort(key=cell_sort_key)
        return out

    def locality_group(self, group: str) -> LocalityGroup:
        """The schema's settings of ``group``; a group the schema no longer names (its
        SSTables not yet compacted away) is written with a locality group's defaults."""
        return self.schema.locality_groups.get(group) or LocalityGroup(name=group)

    def now_micros(self) -> int:
        return micros(self.clock.time())

    def write_micros(self) -> int:
        """The timestamp of a write that names none (§2: "real time in microseconds"): the
        clock's time, but never below one this tablet assigned before. A wall clock stepped
        back (an NTP step, an operator) would otherwise stamp a later write below an earlier
        one, and the read of the newest version would hide the acknowledged later write. The
        floor travels with the tablet in its record (each commit, so each flush, unload and
        split, carries it): a tablet moved to a worker whose clock is behind starts there.
        What a crash leaves in the log past the last commit is not in it: a tablet recovered
        onto a worker whose clock is behind is exposed as to any skew between workers' clocks
        (a client that needs an order across servers names its timestamps)."""
        now = max(micros(self.clock.time()), self.timestamp_floor)
        self.timestamp_floor = now
        return now

    def log_start_now(self, ref: LogRef) -> int:
        """The first segment of ``ref`` that can hold a write of this tablet not yet in its
        memtable: the log's segment mark now, or an earlier one taken by a write in flight
        (0 when a write in flight took its seqs under another log: it may land anywhere)."""
        if ref != self.log.log_ref:
            return 0
        start = self.log.segment_mark()
        for log_ref, mark in self.in_flight_marks.values():
            if log_ref != ref:
                return 0
            start = min(start, mark)
        return start

    # REQUIRES: self.compaction_lock held (nothing else changes the record meanwhile).
    async def commit(self, step: Callable[[TabletState], TabletState]) -> TabletState:
        """Apply ``step`` (a pure function of :mod:`tabletstore.engine.state`) to the state of
        now, commit its record through the catalog and swap the state in; return the state it
        replaced. Writes go on meanwhile: they add to the memtable, they never swap the state."""
        async with self.state_lock:
            state = self.state
            new = step(state)
            if new.record.timestamp_floor < self.timestamp_floor:
                new = replace(new, record=replace(new.record, timestamp_floor=self.timestamp_floor))
            try:
                stored = await self.catalog.update(state.record, new.record)
            except Indeterminate as exc:
                # The record may hold the change or not: memory no longer says which, and a
                # retry would commit against a record that may be stale. Reloading reads it.
                self.fail(exc)
                raise
            self.state = replace(new, record=stored)
            return state

    # REQUIRES: self.compaction_lock and self.state_lock held.
    async def update_record(
        self, record: TabletRecord, new_record: TabletRecord, *, wait: float | None = None
    ) -> None:
        """Commit ``new_record`` in place of ``record`` (the state's) and swap it in
        (``wait``: :meth:`TabletCatalog.update`)."""
        stored = await self.catalog.update(record, new_record, wait=wait)
        self.state = replace(self.state, record=stored)
