"""A tablet built directly, without a worker, and a dict model of what it must return.

Used by the tablet state machine, the tablet fault tests and the unit tests. The harness wires
the real components a worker would (§5.3): an ObjectStore, a Catalog over a MemoryCoordinator
holding the tablet's record, a real :class:`CommitLogWriter` per worker incarnation, a
:class:`ManualClock` so age-based GC is deterministic, and small :class:`TabletOptions` so
minor and merging compactions happen after a few writes.

:class:`TabletModel` is the specification the engine is checked against; its docstring states
the semantics we promise.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tabletstore.clock import ManualClock, micros
from tabletstore.commitlog import CommitLogWriter, fence, replay_cells
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.model import (
    AppendValue,
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    IncrementValue,
    Mutation,
    ReadModifyWriteRule,
    Row,
    SetCell,
)
from tabletstore.data.model import (
    Cell as ApiCell,
)
from tabletstore.data.query import RowRange
from tabletstore.data.schema import (
    ColumnFamily,
    GcRule,
    IntersectionRule,
    LocalityGroup,
    MaxAgeRule,
    MaxVersionsRule,
    TableSchema,
    UnionRule,
)
from tabletstore.engine.compaction_budget import CompactionBudget
from tabletstore.engine.tablet import Tablet, TabletCatalog
from tabletstore.errors import Indeterminate, InvalidArgument, TabletStoreError, Unavailable
from tabletstore.keys import TS_MAX, Cell
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.options import TabletOptions
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore

SECOND = 1_000_000

#: Family -> (locality group, GC rule template). A template's parameters are
#: (max_versions, max_age_seconds); ``None`` parameters mean "no GC rule".
FAMILY_GROUPS = {"a": "hot", "b": "cold", "c": "cold"}


def gc_rule(family: str, params: tuple[int, float] | None) -> GcRule | None:
    """The GC rule of ``family`` for ``params``: ``a`` max-versions, ``b`` the union of
    max-versions and max-age, ``c`` their intersection. Lowering either parameter tightens
    the rule (collects a superset)."""
    if params is None:
        return None
    k, s = params
    if family == "a":
        return MaxVersionsRule(max_versions=k)
    members: list[GcRule] = [MaxVersionsRule(max_versions=k), MaxAgeRule(max_age_seconds=s)]
    if family == "b":
        return UnionRule(rules=members)
    return IntersectionRule(rules=members)


DEFAULT_GC: dict[str, tuple[int, float] | None] = {"a": (2, 5.0), "b": (3, 5.0), "c": (1, 4.0)}


def make_schema(
    gc: dict[str, tuple[int, float] | None] | None = None, name: str = "webtable"
) -> TableSchema:
    """Three families in two locality groups; ``hot`` is in memory."""
    params = DEFAULT_GC if gc is None else gc
    return TableSchema(
        name=name,
        families={
            f: ColumnFamily(name=f, locality_group=g, gc_rule=gc_rule(f, params.get(f)))
            for f, g in FAMILY_GROUPS.items()
        },
        locality_groups={
            "hot": LocalityGroup(name="hot", in_memory=True, block_size=1024),
            "cold": LocalityGroup(name="cold", compression="none", block_size=1024),
        },
    )


SMALL_OPTIONS = TabletOptions(memtable_flush_bytes=700, max_sstables_per_group=2)


class HarnessLog:
    """A worker's commit log as a tablet sees it (like ``worker.WorkerLog`` without the
    lease). ``before_append`` / ``after_append`` hooks let tests stall an append."""

    def __init__(self, writer: CommitLogWriter, log_ref: LogRef) -> None:
        self.writer = writer
        self.log_ref = log_ref
        self.before_append: Callable[[bytes, Sequence[Cell]], Awaitable[None]] | None = None
        self.on_allocate: Callable[[int, int], None] | None = None

    def allocate(self, n: int) -> int:
        first = self.writer.allocate(n)
        if self.on_allocate is not None:
            self.on_allocate(first, n)
        return first

    def advance(self, seq: int) -> None:
        self.writer.advance(seq)

    def segment_mark(self) -> int:
        return self.writer.next_segment

    async def append(
        self,
        table_id: str,
        row: bytes,
        cells: Sequence[Cell],
        on_durable: Callable[[Sequence[Cell]], object] | None = None,
    ) -> None:
        if self.before_append is not None:
            await self.before_append(row, cells)
        await self.writer.append(table_id, row, cells, on_durable)

    async def append_many(
        self,
        table_id: str,
        rows: Sequence[tuple[bytes, Sequence[Cell]]],
        on_durable: Callable[[Sequence[Cell]], object] | None = None,
    ) -> list[TabletStoreError | None]:
        if self.before_append is not None:
            for row, cells in rows:
                await self.before_append(row, cells)
        return await self.writer.append_many(table_id, rows, on_durable)


class LogGate:
    """An object store whose commit-log PUTs (keys naming ``worker_id``) wait at ``gate``
    while it is set to an Event that is not set yet; ``lose_acks`` of them store their object
    and then raise Indeterminate (a lost acknowledgement), ``fail_puts`` raise Unavailable
    without storing it; while ``fail_plugs`` is set, creating an empty object there (the
    writer's plug of a failed number) raises Unavailable. The rest passes through."""

    def __init__(self, inner: MemoryObjectStore, worker_id: str) -> None:
        self.inner = inner
        self.worker_id = worker_id
        self.gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()
        self.lose_acks = 0
        self.fail_puts = 0
        self.fail_plugs = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def create(self, key: str, data: bytes) -> None:
        if self.worker_id in key and not data and self.fail_plugs:
            raise Unavailable(f"injected: PUT {key} (a plug) failed")
        if self.worker_id in key and data:
            if self.gate is not None:
                self.waiting.set()
                await self.gate.wait()
            if self.lose_acks:
                self.lose_acks -= 1
                await self.inner.create(key, data)
                raise Indeterminate(f"injected: PUT {key} stored, its answer lost")
            if self.fail_puts:
                self.fail_puts -= 1
                raise Unavailable(f"injected: PUT {key} failed")
        await self.inner.create(key, data)


async def until(condition: Callable[[], bool], seconds: float = 60.0) -> None:
    """Wait (yielding to the loop) until ``condition()`` holds, at most ``seconds``."""
    end = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < end, f"not within {seconds} s"
        await asyncio.sleep(0.01)


class PutGate:
    """An object store whose PUTs of keys matching ``pattern`` (fnmatch) wait while the gate
    is shut (:meth:`shut`, :meth:`open`); ``waiting`` is set once one waits. The rest passes
    through."""

    def __init__(self, inner: ObjectStore, pattern: str) -> None:
        self.inner = inner
        self.pattern = pattern
        self._open = asyncio.Event()
        self._open.set()
        self.waiting = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def shut(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def create(self, key: str, data: bytes) -> None:
        if not self._open.is_set() and fnmatch.fnmatch(key, self.pattern):
            self.waiting.set()
            await self._open.wait()
        await self.inner.create(key, data)


@dataclass
class TabletHarness:
    """One tablet, its catalog and its worker's commit log, with crash and recovery."""

    store: ObjectStore
    clock: ManualClock = field(default_factory=ManualClock)
    options: TabletOptions = SMALL_OPTIONS
    schema: TableSchema = field(default_factory=make_schema)
    catalog_store: ObjectStore | None = None
    worker_id: str = field(default_factory=lambda: f"w{uuid.uuid4().hex[:10]}")
    incarnation: int = -1
    coordinator: MemoryCoordinator | None = None
    catalog: Catalog | None = None
    log: HarnessLog | None = None
    tablet: Tablet | None = None
    table_id: str = ""
    tablet_id: str = "t00000"
    #: Tablets abandoned by crash(); their tasks are cancelled by close().
    zombies: list[Tablet] = field(default_factory=list)
    #: Wraps the catalog handed to the tablet (fault tests make its updates fail).
    wrap_catalog: Callable[[Catalog], TabletCatalog] | None = None
    #: The worker's compaction budget the tablet shares (None: unbounded).
    compaction_budget: CompactionBudget | None = None

    async def start(self) -> Tablet:
        self.coordinator = MemoryCoordinator(clock=self.clock)
        self.catalog = Catalog(self.coordinator)
        self.table_id = Catalog.new_table_id(self.schema.name)
        record = TabletRecord(self.table_id, self.tablet_id, b"", None)
        await self.catalog.create_table(self.schema, [record])
        return await self._open()

    async def record(self) -> TabletRecord:
        assert self.catalog is not None
        return await self.catalog.get_tablet(self.table_id, self.tablet_id)

    async def _new_log(self) -> HarnessLog:
        self.incarnation += 1
        writer = CommitLogWriter(self.store, self.worker_id, self.incarnation, clock=self.clock)
        writer.start()
        self.log = HarnessLog(writer, LogRef(self.worker_id, self.incarnation))
        return self.log

    async def _open(self) -> Tablet:
        """Open a new log incarnation, take the tablet (new epoch), fence the logs its
        record lists and load it, replaying them (what ``TabletServer.load`` does)."""
        assert self.catalog is not None
        log = await self._new_log()
        record = await self.record()
        owned = await self.catalog.update(record, replace(record, epoch=record.epoch + 1))
        for ref in owned.logs:
            await fence(self.store, ref.worker_id, ref.incarnation)
        self.tablet = await Tablet.load(
            owned,
            self.schema,
            store=self.store,
            log_sink=log,
            catalog=self.wrap_catalog(self.catalog) if self.wrap_catalog else self.catalog,
            replay=self._replay,
            clock=self.clock,
            options=self.options,
            compaction_budget=self.compaction_budget,
        )
        return self.tablet

    async def _replay(self, record: TabletRecord) -> AsyncIterator[Cell]:
        assert self.log is not None
        for ref in record.logs:
            if ref == self.log.log_ref:
                continue
            async for cell in replay_cells(
                self.store,
                ref.worker_id,
                ref.incarnation,
                record.table_id,
                record.start_row,
                record.end_row,
                record.redo_seq,
                # From the tablet's log position (§5.3), as the workers read: every test
                # that crashes and recovers a tablet checks those positions too.
                start_segment=record.log_start(ref),
            ):
                yield cell

    async def settle(self) -> None:
        """Wait for the tablet's background compaction, if any (errors stay sticky)."""
        assert self.tablet is not None
        await self.tablet._compactions.background_done()

    async def crash(self) -> None:
        """The worker dies: nothing is flushed, the log writer stops where it is."""
        assert self.log is not None and self.tablet is not None
        await _cancel_writer(self.log.writer)
        self.zombies.append(self.tablet)
        self.tablet = None

    async def recover(self) -> Tablet:
        """A new incarnation of the worker loads the tablet again (§5.3)."""
        if self.tablet is not None:
            await self.crash()
        return await self._open()

    def set_schema(self, schema: TableSchema) -> None:
        self.schema = schema
        if self.tablet is not None:
            self.tablet.set_schema(schema)

    async def close(self) -> None:
        for t in [*self.zombies, *([self.tablet] if self.tablet else [])]:
            for task in (t._compactions.background, t._compactions.merging):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
        if self.log is not None:
            await _cancel_writer(self.log.writer)
        if self.coordinator is not None:
            await self.coordinator.close()

    # ------------------------------------------------------------------ reads for checks

    async def scan_all(self, row_range: RowRange | None = None) -> list[Row]:
        assert self.tablet is not None
        return [r async for r in self.tablet.scan(row_range or RowRange.all())]

    def now_micros(self) -> int:
        return micros(self.clock.time())


async def _cancel_writer(writer: CommitLogWriter) -> None:
    flusher = writer._flusher
    if flusher is not None and not flusher.done():
        flusher.cancel()
        with contextlib.suppress(BaseException):
            await flusher
    writer._flusher = None


# ---------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class Entry:
    """One applied mutation of one row: a put or a deletion, ordered by ``seq``."""

    seq: int
    kind: str  # "put" | "cells" | "family" | "row"
    family: str = ""
    qualifier: bytes = b""
    ts: int = 0
    value: bytes = b""
    start: int = 0
    end: int = TS_MAX


def model_is_garbage(rule: GcRule | None, index: int, ts: int, now: int) -> bool:
    """The GC rule semantics, written independently of ``schema.is_garbage``."""
    if rule is None:
        return False
    if isinstance(rule, MaxVersionsRule):
        return index + 1 > rule.max_versions
    if isinstance(rule, MaxAgeRule):
        return now - ts > rule.max_age_seconds * SECOND
    results = [model_is_garbage(r, index, ts, now) for r in rule.rules]
    return any(results) if isinstance(rule, UnionRule) else all(results)


class TabletModel:
    """What a tablet must return: a dict of rows, each a list of applied mutations.

    Semantics we promise (Bigtable §2, §3, §5.4 as tabletstore implements them):

    * Mutations are ordered by the order they were applied (their sequence numbers). A row
      mutation applies atomically and in order.
    * A deletion (``DeleteCells`` over ``[start, end)``, ``DeleteFamily``, ``DeleteRow``) masks
      the puts of its scope applied *before* it, whatever their timestamps; a put applied
      later is visible even with an older timestamp.
    * Two puts of the same (row, family, qualifier, timestamp) are one version: the later one
      wins (also when the later one is masked: then the version is gone).
    * Garbage collection is applied at read time: the visible versions of a column, newest
      timestamp first, are numbered 0, 1, ...; a version is hidden when its family's *current*
      GC rule collects (index, timestamp, now).
    * A major compaction *physically* applies deletions and GC at its moment: whatever was not
      visible then is gone for good (a later delete of a newer version does not bring back an
      older version that had been collected, and nor does relaxing the rule). A model major
      compaction therefore replaces every row by its visible puts. A merge of every SSTable
      of a locality group is a major compaction the tablet plans by itself: it collects what
      is not visible among the entries it read, counting versions with the memtables'
      deletion entries and without their puts (:meth:`compact_some`).
    * Minor and merging compactions, crashes and recovery change nothing a read can see. (They
      may drop cells that GC collects by age as the newest version; ``now`` only grows, so
      with an unchanged or *tightened* rule those cells stay invisible. Relaxing a rule is
      therefore only done right after a major compaction, which makes it deterministic.)
    """

    def __init__(self, schema: TableSchema) -> None:
        self.rows: dict[bytes, list[Entry]] = {}
        self.schema = schema
        self.seq = 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def apply(
        self, row: bytes, mutations: Sequence[Mutation], now: int, first_seq: int | None = None
    ) -> None:
        """Apply a row mutation; its entries take the seqs ``first_seq``, ``first_seq + 1``...
        (the tablet's, so that compactions can be told which entries they read) or, without
        it, the model's next ones."""
        if first_seq is not None:
            self.seq = first_seq - 1
        entries = self.rows.setdefault(row, [])
        for m in mutations:
            if isinstance(m, SetCell):
                ts = now if m.timestamp is None else m.timestamp
                entries.append(Entry(self._next(), "put", m.family, m.qualifier, ts, m.value))
            elif isinstance(m, DeleteCells):
                start = 0 if m.start is None else m.start
                end = TS_MAX if m.end is None else m.end
                entries.append(
                    Entry(self._next(), "cells", m.family, m.qualifier, start=start, end=end)
                )
            elif isinstance(m, DeleteFamily):
                entries.append(Entry(self._next(), "family", m.family))
            elif isinstance(m, DeleteRow):
                entries.append(Entry(self._next(), "row"))
            else:
                raise AssertionError(m)

    @staticmethod
    def _masks(d: Entry, p: Entry) -> bool:
        if d.seq < p.seq:
            return False
        if d.kind == "row":
            return True
        if d.kind == "family":
            return d.family == p.family
        if d.kind == "cells":
            return d.family == p.family and d.qualifier == p.qualifier and d.start <= p.ts < d.end
        return False

    def _visible_puts(
        self, entries: Sequence[Entry], now: int, rules: Mapping[str, GcRule | None]
    ) -> list[Entry]:
        deletions = [e for e in entries if e.kind != "put"]
        newest: dict[tuple[str, bytes, int], Entry] = {}
        for e in entries:
            if e.kind == "put":
                key = (e.family, e.qualifier, e.ts)
                if key not in newest or newest[key].seq < e.seq:
                    newest[key] = e
        live = [p for p in newest.values() if not any(self._masks(d, p) for d in deletions)]
        live.sort(key=lambda p: (p.family, p.qualifier, -p.ts))
        out: list[Entry] = []
        index = 0
        column: tuple[str, bytes] | None = None
        for p in live:
            if (p.family, p.qualifier) != column:
                column, index = (p.family, p.qualifier), 0
            if not model_is_garbage(rules.get(p.family), index, p.ts, now):
                out.append(p)
            index += 1
        return out

    def _rules(self) -> dict[str, GcRule | None]:
        return {name: f.gc_rule for name, f in self.schema.families.items()}

    def visible(self, row: bytes, now: int) -> list[ApiCell]:
        return [
            ApiCell(p.family, p.qualifier, p.ts, p.value)
            for p in self._visible_puts(self.rows.get(row, []), now, self._rules())
        ]

    def read_row(self, row: bytes, now: int) -> Row | None:
        cells = self.visible(row, now)
        return Row(row, cells) if cells else None

    def scan(self, now: int, start: bytes = b"", end: bytes | None = None) -> list[Row]:
        out = []
        for row in sorted(self.rows):
            if row >= start and (end is None or row < end):
                r = self.read_row(row, now)
                if r is not None:
                    out.append(r)
        return out

    def major_compact(self, now: int) -> None:
        """Physically apply deletions and GC: keep only what is visible now (each put keeps
        its seq)."""
        for row in list(self.rows):
            kept = self._visible_puts(self.rows[row], now, self._rules())
            if kept:
                self.rows[row] = kept
            else:
                del self.rows[row]

    def compact_some(
        self,
        now: int,
        rules: Mapping[str, GcRule | None],
        inputs: Collection[int],
        masks: Collection[int],
        families: Collection[str],
    ) -> None:
        """A major compaction of some of the tablet's sources, as the tablet runs one: the
        entries whose seqs are ``inputs`` (the SSTables it read) are compacted with the
        deletion entries ``masks`` (its memtables', counted but not read) under ``rules`` at
        ``now``; the puts of ``families`` among the inputs that are not visible in that view
        are gone for good, and with them their older rewrites (an earlier compaction may have
        dropped those from the sources already, so the view cannot hold them). Deletion
        entries stay: the memtable, and other locality groups, may still hold them."""
        scope = {*inputs, *masks}
        for row, entries in list(self.rows.items()):
            view = [e for e in entries if e.seq in scope]
            kept = {p.seq for p in self._visible_puts(view, now, rules)}
            gone = {
                (e.family, e.qualifier, e.ts): e.seq
                for e in sorted(view, key=lambda e: e.seq)
                if e.kind == "put" and e.seq in inputs and e.family in families
                if e.seq not in kept
            }
            self.rows[row] = [
                e
                for e in entries
                if not (
                    e.kind == "put"
                    and e.seq <= gone.get((e.family, e.qualifier, e.ts), -1)
                    and e.seq not in kept
                )
            ]

    def read_modify_write(self, row: bytes, rules: Sequence[ReadModifyWriteRule], now: int) -> Row:
        """The new cells; InvalidArgument (and nothing applied) for a bad increment."""
        current = self.visible(row, now)
        latest: dict[tuple[str, bytes], ApiCell] = {}
        for c in current:
            latest.setdefault((c.family, c.qualifier), c)
        written: dict[tuple[str, bytes], bytes] = {}
        for r in rules:
            col = (r.family, r.qualifier)
            base = (
                written[col] if col in written else (latest[col].value if col in latest else None)
            )
            if isinstance(r, AppendValue):
                written[col] = (base or b"") + r.value
            else:
                assert isinstance(r, IncrementValue)
                if base is None or base == b"":
                    n = 0
                elif len(base) != 8:
                    raise InvalidArgument("not a counter")
                else:
                    n = int.from_bytes(base, "big", signed=True)
                n = (n + r.amount + 2**63) % 2**64 - 2**63
                written[col] = n.to_bytes(8, "big", signed=True)
        muts: list[Mutation] = []
        for (f, q), v in written.items():
            ts = max(now, latest[(f, q)].timestamp) if (f, q) in latest else now
            muts.append(SetCell(f, q, v, ts))
        self.apply(row, muts, now)
        cells = [
            ApiCell(m.family, m.qualifier, m.timestamp or now, m.value)
            for m in muts
            if isinstance(m, SetCell)
        ]
        cells.sort(key=lambda c: (c.family, c.qualifier))
        return Row(row, cells)
