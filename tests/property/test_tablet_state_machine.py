"""The tablet against a dict model: a hypothesis state machine (§2, §3, §5.3, §5.4).

A :class:`~tabletstore.engine.tablet.Tablet` is built directly (tests/tablet_harness.py: a real
commit log, a catalog over a MemoryCoordinator, a ManualClock, a tiny memtable threshold and
at most two SSTables per locality group, so minor and merging compactions run in the
background every few writes) and driven by random operations:

* writes: set cells with server or explicit timestamps (rewrites of one version included),
  delete cells over time ranges, delete a family, delete the row, mixed row mutations;
* single-row transactions: check-and-mutate (no predicate, or a qualifier-regex predicate)
  and read-modify-write (increment and append, including an increment of a non-counter,
  which must fail and change nothing);
* minor, merging and major compactions; advancing the clock (age-based GC);
* a crash: the tablet object is abandoned unflushed and the commit-log writer stopped where
  it is; a new worker incarnation takes the tablet (new epoch), fences the old logs and
  replays them past the redo point;
* GC rule changes: *tightening* a rule (lower max-versions or max-age) at any moment, and
  *any* change (relaxing, removing) right after a major compaction.

After every step, every row read with ``read_row`` and a full ``scan`` (and a range scan)
must equal the model (:class:`tests.tablet_harness.TabletModel`, whose docstring states the
semantics promised: deletions by sequence order, newest rewrite wins, GC at read time with the
current rule, and a major compaction physically applying deletions and GC at its moment). The
model's entries carry the tablet's sequence numbers, so a major compaction the tablet runs by
itself (a merge of every SSTable of a group, in the background too) is followed exactly: the
machine records which entries it read and which memtable deletions it counted with.

Why rules may only be *relaxed* after a major compaction: a merging compaction drops a cell
that its family's rule collects by age even as the newest version (that stays collected while
the rule stays or tightens, because ``now`` only grows), so after relaxing the rule such a cell
may or may not be readable again depending on which compactions ran; Cloud Bigtable documents
the same ("data that is eligible for garbage collection may still be read until it is
removed"). Compacting first makes the outcome exact.

The memory backend runs in the default suite (bounded examples); file and S3 (moto) run a
smaller number of shorter examples.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tabletstore.data.filters import ColumnQualifierRegex, FamilyNameRegex, RowFilter
from tabletstore.data.model import (
    AppendValue,
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    IncrementValue,
    Mutation,
    ReadModifyWriteRule,
    SetCell,
)
from tabletstore.data.query import RowRange
from tabletstore.data.schema import GcRule
from tabletstore.errors import InvalidArgument
from tabletstore.sstable import read_sstable_bytes
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore
from tests.tablet_harness import (
    DEFAULT_GC,
    SECOND,
    TabletHarness,
    TabletModel,
    make_schema,
)

T = TypeVar("T")

#: Which write of a race the current task applies (read when its seqs are allocated).
_WRITE: contextvars.ContextVar[int] = contextvars.ContextVar("write")

ROWS = [b"r0", b"r1", b"r2", b"r3", b"r4"]
FAMILIES = ["a", "b", "c"]
QUALIFIERS = [b"q0", b"q1"]

rows = st.sampled_from(ROWS)
families = st.sampled_from(FAMILIES)
qualifiers = st.sampled_from(QUALIFIERS)
#: None = server timestamp; otherwise seconds before now (explicit timestamps, which collide).
ts_choices = st.one_of(st.none(), st.integers(min_value=0, max_value=8))
values = st.one_of(
    st.binary(max_size=3), st.integers(-3, 3).map(lambda n: n.to_bytes(8, "big", signed=True))
)
#: Time-range bounds in seconds before now; None = unbounded.
bounds = st.one_of(st.none(), st.integers(min_value=0, max_value=9))


def cell_specs() -> st.SearchStrategy[tuple[str, bytes, int | None, bytes]]:
    return st.tuples(families, qualifiers, ts_choices, values)


mutation_specs = st.one_of(
    st.tuples(st.just("set"), cell_specs()),
    st.tuples(st.just("cells"), st.tuples(families, qualifiers, bounds, bounds)),
    st.tuples(st.just("family"), families),
    st.tuples(st.just("row"), st.none()),
)
rmw_specs = st.lists(
    st.one_of(
        st.tuples(st.just("inc"), families, qualifiers, st.integers(-5, 5)),
        st.tuples(st.just("append"), families, qualifiers, st.binary(min_size=1, max_size=2)),
    ),
    min_size=1,
    max_size=3,
)


@dataclass(frozen=True)
class Compacted:
    """A major compaction the tablet committed: the seqs of the entries it read (its input
    SSTables) and of the memtable deletion entries it counted with, its moment and rules, and
    the families it rewrote."""

    now: int
    rules: dict[str, GcRule | None]
    inputs: frozenset[int]
    masks: frozenset[int]
    families: frozenset[str]

    @classmethod
    def of(
        cls, work: functools.partial[Any], blobs: list[bytes], families: Iterable[str]
    ) -> Compacted:
        """From the rewrite the tablet built (``compaction.merge_sstables`` or
        ``rewrite_tablet``, with its keywords) and the inputs' bytes it was given."""
        kw = work.keywords
        bases = list(kw.get("seq_bases") or [0] * len(blobs))
        return cls(
            now=kw["now_micros"],
            rules=dict(kw["gc_rules"]),
            inputs=frozenset(
                c.seq
                for blob, base in zip(blobs, bases, strict=True)
                for c in read_sstable_bytes(blob, seq_base=base)
            ),
            masks=frozenset(m.seq for m in kw.get("masks", ())),
            families=frozenset(families),
        )


class TabletMachine(RuleBasedStateMachine):
    """Drives one tablet and the model side by side; subclasses choose the store."""

    make_store: Callable[[], ObjectStore] = MemoryObjectStore

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.store = self.make_store()
        self.h = TabletHarness(self.store)
        self.gc: dict[str, tuple[int, float] | None] = dict(DEFAULT_GC)
        self.model = TabletModel(self.h.schema)
        #: Major compactions the tablet committed, not yet applied to the model.
        self.compacted: list[Compacted] = []
        self.run(self.h.start())
        self._watch()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.run(self.h.close())
            self.run(self.store.close())
        finally:
            self.loop.close()

    @property
    def now(self) -> int:
        return self.h.now_micros()

    # ------------------------------------------------------------------ following the tablet

    def _sync_seq(self) -> None:
        """The model's next entries take the seqs the tablet's next write allocates."""
        assert self.h.log is not None
        self.model.seq = self.h.log.writer.next_seq - 1

    def _watch(self) -> None:
        """Record each major compaction a merge of every SSTable of a locality group makes
        (the tablet plans those itself, in the background too): which entries it read and
        counted, by their seqs, at which moment, with which rules."""
        tablet = self.h.tablet
        assert tablet is not None
        runner = tablet._compactions
        merge, run_merge = runner._merge_sstables, runner._run_merge
        read: dict[tuple[str, ...], Compacted] = {}

        def merge_spy(task: Any, record: Any) -> Any:
            work = merge(task, record)
            if not work.keywords["major"]:
                return work
            families = {
                n for n, f in tablet._core.schema.families.items() if f.locality_group == task.group
            }

            def merged(blobs: list[bytes], *args: Any, **kwargs: Any) -> Any:
                # Given its inputs (after the cut, with no lock held): what it reads.
                read[task.inputs] = Compacted.of(work, blobs, families)
                return work.func(blobs, *args, **kwargs)

            return functools.partial(merged, *work.args, **work.keywords)

        async def run_merge_spy(task: Any) -> None:
            await run_merge(task)
            compacted = read.pop(task.inputs, None)
            left = {r.key for r in tablet._core.record.sstables.get(task.group, ())}
            if compacted is not None and not left & set(task.inputs):
                self.compacted.append(compacted)

        runner._merge_sstables = merge_spy  # type: ignore[method-assign]
        runner._run_merge = run_merge_spy  # type: ignore[method-assign]

    def _catch_up(self) -> None:
        """Apply to the model the major compactions the tablet committed, in their order."""
        for c in self.compacted:
            self.model.compact_some(c.now, c.rules, c.inputs, c.masks, c.families)
        self.compacted.clear()

    def _ts(self, choice: int | None) -> int | None:
        return None if choice is None else self.now - choice * SECOND

    def _mutation(self, spec: tuple[str, Any]) -> Mutation:
        kind, arg = spec
        if kind == "set":
            f, q, ts, v = arg
            return SetCell(f, q, v, self._ts(ts))
        if kind == "cells":
            f, q, a, b = arg
            # Bounds are seconds before now: the larger offset is the older (start) bound.
            lo, hi = (a, b) if a is None or b is None or a >= b else (b, a)
            start = None if lo is None else self.now - lo * SECOND
            end = None if hi is None else self.now - hi * SECOND + 1
            if start is not None and end is not None and end < start:
                start, end = end, start
            return DeleteCells(f, q, start, end)
        if kind == "family":
            return DeleteFamily(arg)
        return DeleteRow()

    async def _apply(self, row: bytes, muts: list[Mutation]) -> None:
        assert self.h.tablet is not None
        now = self.now
        self._sync_seq()
        await self.h.tablet.apply(row, muts)
        self.model.apply(row, muts, now)
        await self.h.settle()
        self._catch_up()

    # ------------------------------------------------------------------ writes

    @rule(row=rows, cells=st.lists(cell_specs(), min_size=1, max_size=3))
    def set_cells(self, row: bytes, cells: list[tuple[str, bytes, int | None, bytes]]) -> None:
        muts: list[Mutation] = [SetCell(f, q, v, self._ts(ts)) for f, q, ts, v in cells]
        self.run(self._apply(row, muts))

    @rule(burst=st.lists(st.tuples(rows, cell_specs()), min_size=2, max_size=8))
    def write_burst(self, burst: list[tuple[bytes, tuple[str, bytes, int | None, bytes]]]) -> None:
        """Several single-cell row mutations (so data accumulates across compactions)."""
        for row, (f, q, ts, v) in burst:
            self.run(self._apply(row, [SetCell(f, q, v, self._ts(ts))]))

    @rule(row=rows, f=families, q=qualifiers, a=bounds, b=bounds)
    def delete_cells(self, row: bytes, f: str, q: bytes, a: int | None, b: int | None) -> None:
        self.run(self._apply(row, [self._mutation(("cells", (f, q, a, b)))]))

    @rule(row=rows, f=families)
    def delete_family(self, row: bytes, f: str) -> None:
        self.run(self._apply(row, [DeleteFamily(f)]))

    @rule(row=rows)
    def delete_row(self, row: bytes) -> None:
        self.run(self._apply(row, [DeleteRow()]))

    @rule(row=rows, specs=st.lists(mutation_specs, min_size=1, max_size=4))
    def mixed_row_mutation(self, row: bytes, specs: list[tuple[str, Any]]) -> None:
        self.run(self._apply(row, [self._mutation(s) for s in specs]))

    # ------------------------------------------------------------------ transactions

    @rule(
        row=rows,
        predicate=st.sampled_from(["none", "q0", "family-c"]),
        true_specs=st.lists(mutation_specs, max_size=2),
        false_specs=st.lists(mutation_specs, max_size=2),
    )
    def check_and_mutate(
        self,
        row: bytes,
        predicate: str,
        true_specs: list[tuple[str, Any]],
        false_specs: list[tuple[str, Any]],
    ) -> None:
        tablet = self.h.tablet
        assert tablet is not None
        pred: RowFilter | None = {
            "none": None,
            "q0": ColumnQualifierRegex(b"q0"),
            "family-c": FamilyNameRegex("c"),
        }[predicate]
        true_m = [self._mutation(s) for s in true_specs]
        false_m = [self._mutation(s) for s in false_specs]
        now = self.now
        current = self.model.visible(row, now)
        expected = any(
            predicate == "none"
            or (predicate == "q0" and c.qualifier == b"q0")
            or (predicate == "family-c" and c.family == "c")
            for c in current
        )
        self._sync_seq()
        matched = self.run(tablet.check_and_mutate(row, pred, true_m, false_m))
        assert matched == expected
        chosen = true_m if matched else false_m
        if chosen:
            self.model.apply(row, chosen, now)
        self.run(self.h.settle())
        self._catch_up()

    @rule(row=rows, specs=rmw_specs)
    def read_modify_write(self, row: bytes, specs: list[tuple[str, str, bytes, Any]]) -> None:
        tablet = self.h.tablet
        assert tablet is not None
        rules: list[ReadModifyWriteRule] = [
            IncrementValue(f, q, arg) if kind == "inc" else AppendValue(f, q, arg)
            for kind, f, q, arg in specs
        ]
        now = self.now
        self._sync_seq()
        try:
            expected = self.model.read_modify_write(row, rules, now)
        except InvalidArgument:
            with pytest.raises(InvalidArgument):
                self.run(tablet.read_modify_write(row, rules))
            return
        got = self.run(tablet.read_modify_write(row, rules))
        assert got == expected
        self.run(self.h.settle())
        self._catch_up()

    # ------------------------------------------------------------------ concurrency

    @rule(
        writes=st.lists(
            st.tuples(rows, st.lists(mutation_specs, min_size=1, max_size=2), st.integers(0, 6)),
            min_size=1,
            max_size=5,
        ),
        compaction=st.sampled_from(["minor", "merging", "major"]),
        delay=st.integers(min_value=0, max_value=12),
    )
    def writes_racing_a_compaction(
        self,
        writes: list[tuple[bytes, list[tuple[str, Any]], int]],
        compaction: str,
        delay: int,
    ) -> None:
        """Row mutations applied concurrently with a compaction that starts after ``delay``
        event-loop turns, so writes are logged, in flight or done when the memtable freezes.
        Each write also stalls a few turns between taking its sequence numbers and reaching
        the commit log, so a write with a smaller seq may still be in flight while later ones
        are in the frozen memtable (the redo point must stay below it; a crash rule later
        checks recovery). A major compaction applies GC at its freeze: the writes whose cells
        it flushed come before it in the model, the others after."""
        tablet, log = self.h.tablet, self.h.log
        assert tablet is not None and log is not None
        now = self.now
        batches = [(row, [self._mutation(s) for s in specs]) for row, specs, _ in writes]
        stalls = {i: stall for i, (_, _, stall) in enumerate(writes)}
        first_seq: dict[int, int] = {}
        flushed: set[int] = set()
        split = tablet._sstables.split_by_group

        def spy(memtables: Any) -> Any:
            flushed.update(c.seq for m in memtables for c in m.scan())
            return split(memtables)

        def on_allocate(first: int, n: int) -> None:
            first_seq[_WRITE.get()] = first

        async def one(i: int, row: bytes, muts: list[Mutation]) -> None:
            _WRITE.set(i)
            await tablet.apply(row, muts)

        async def stall(row: bytes, cells: Any) -> None:
            for _ in range(stalls[_WRITE.get()]):
                await asyncio.sleep(0)

        async def compact() -> None:
            for _ in range(delay):
                await asyncio.sleep(0)
            if compaction == "major":
                await tablet.major_compact()
            else:
                await tablet.minor_compact()
                if compaction == "merging":
                    await tablet.merge_if_needed()

        async def race() -> None:
            coros = [one(i, row, muts) for i, (row, muts) in enumerate(batches)]
            await asyncio.gather(compact(), *coros)

        runner = tablet._compactions
        rewrite = runner._rewrite_tablet
        majors: list[Compacted] = []

        def rewrite_spy(record: Any, keys: list[str]) -> Any:
            work = rewrite(record, keys)

            def rewritten(blobs: list[bytes], *args: Any, **kwargs: Any) -> Any:
                majors.append(Compacted.of(work, blobs, FAMILIES))
                return work.func(blobs, *args, **kwargs)

            return functools.partial(rewritten, *work.args, **work.keywords)

        saved = tablet._core.options
        # No background compaction during the race: the explicit one is the only flush.
        tablet._core.options = replace(saved, memtable_flush_bytes=1 << 40)
        tablet._sstables.split_by_group = spy  # type: ignore[method-assign]
        runner._rewrite_tablet = rewrite_spy  # type: ignore[method-assign]
        log.on_allocate = on_allocate
        log.before_append = stall
        try:
            self.run(race())
        finally:
            tablet._core.options = saved
            del tablet._sstables.split_by_group
            del runner._rewrite_tablet
            log.on_allocate = None
            log.before_append = None
        order = sorted(range(len(batches)), key=lambda i: first_seq[i])
        before = [i for i in order if first_seq[i] in flushed]
        event(f"race: {compaction} flushed {'some' if before else 'none'} of the writes")
        if self.h.tablet.record.redo_seq < max(flushed, default=0):
            event("race: redo point below a flushed write (a write was in flight at freeze)")
        # Every write in seq order; the major compaction then takes what it read (the writes
        # it flushed and everything older) and counts with the deletions it found in the
        # memtable (writes that landed after its flush).
        for i in order:
            self.model.apply(*batches[i], now, first_seq=first_seq[i])
        self.compacted.extend(majors)
        self.run(self.h.settle())
        self._catch_up()

    # ------------------------------------------------------------------ compactions, time

    @rule()
    def minor_compaction(self) -> None:
        assert self.h.tablet is not None
        self.run(self.h.tablet.minor_compact())

    @rule()
    def merging_compaction(self) -> None:
        assert self.h.tablet is not None
        self.run(self.h.tablet.minor_compact())
        self.run(self.h.tablet.merge_if_needed())
        self._catch_up()

    @rule()
    def major_compaction(self) -> None:
        assert self.h.tablet is not None
        self.run(self.h.tablet.major_compact())
        self._catch_up()
        self.model.major_compact(self.now)

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    def advance_clock(self, seconds: float) -> None:
        self.h.clock.advance(seconds)

    @rule()
    def crash_and_recover(self) -> None:
        self.run(self.h.recover())
        self._watch()

    # ------------------------------------------------------------------ schema

    def _set_gc(self) -> None:
        schema = make_schema(self.gc, name=self.h.schema.name)
        self.h.set_schema(schema)
        self.model.schema = schema

    @precondition(lambda self: any(self.gc[f] is not None for f in FAMILIES))
    @rule(f=families, which=st.sampled_from(["versions", "age"]))
    def tighten_gc_rule(self, f: str, which: str) -> None:
        params = self.gc[f]
        if params is None:
            return
        k, s = params
        self.gc[f] = (max(1, k - 1), s) if which == "versions" else (k, max(1.0, s - 1.5))
        self._set_gc()

    @rule(
        f=families,
        params=st.one_of(
            st.none(), st.tuples(st.integers(1, 4), st.sampled_from([2.0, 5.0, 10.0]))
        ),
    )
    def change_gc_rule_after_major(self, f: str, params: tuple[int, float] | None) -> None:
        self.major_compaction()
        self.gc[f] = params
        self._set_gc()

    # ------------------------------------------------------------------ the invariant

    @invariant()
    def reads_match_the_model(self) -> None:
        tablet = self.h.tablet
        assert tablet is not None
        now = self.now
        for row in ROWS:
            assert self.run(tablet.read_row(row)) == self.model.read_row(row, now), row
        assert self.run(self.h.scan_all()) == self.model.scan(now)
        got = self.run(self.h.scan_all(RowRange(b"r1", b"r3")))
        assert got == self.model.scan(now, b"r1", b"r3")


def _machine(make_store: Callable[[], ObjectStore]) -> type[TabletMachine]:
    return type("Machine", (TabletMachine,), {"make_store": staticmethod(make_store)})


_SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def test_tablet_matches_model_memory() -> None:
    run_state_machine_as_test(
        _machine(MemoryObjectStore),
        settings=settings(
            max_examples=int(os.environ.get("SM_EXAMPLES", "60")),
            stateful_step_count=40,
            **_SETTINGS,
        ),  # type: ignore[arg-type]
    )


def test_tablet_matches_model_file() -> None:
    from tabletstore.storage_s3.local import LocalObjectStore

    root = tempfile.mkdtemp(prefix="tablet-sm-")
    try:
        run_state_machine_as_test(
            _machine(lambda: LocalObjectStore(f"{root}/{uuid.uuid4().hex}")),
            settings=settings(max_examples=8, stateful_step_count=25, **_SETTINGS),  # type: ignore[arg-type]
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_tablet_matches_model_s3(s3_url: str) -> None:
    from tabletstore.storage_s3.s3 import S3ObjectStore

    def make() -> ObjectStore:
        # One bucket per test; every example gets its own prefix (and table and worker ids).
        base, _, query = s3_url.partition("?")
        return S3ObjectStore(f"{base}/{uuid.uuid4().hex}?{query}")

    run_state_machine_as_test(
        _machine(make),
        settings=settings(max_examples=4, stateful_step_count=20, **_SETTINGS),  # type: ignore[arg-type]
    )
