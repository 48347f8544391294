"""A tablet's in-memory state and the pure functions that move it through compactions (§5.4).

:class:`TabletState` is an immutable snapshot swapped whole (docs/architecture/conventions.md
convention 5): the tablet's record, the memtable taking writes, the frozen memtables being written
out, and the opened SSTables per locality group. A compaction is three steps: the tablet freezes
what it will write (:func:`freeze`), does its I/O with no lock held (reading, merging and uploading
SSTables), then, under its state lock, applies the outcome to the state *of that moment* --
which may have moved on meanwhile (new writes in a new memtable, a new log listed by the
worker) -- with :func:`apply_minor`, :func:`apply_merge` or :func:`apply_major`. These take
plain values and return the next state (its record the one to commit), so what a compaction
does to the tablet is tested without I/O (mini-lsm's ``apply_compaction_result``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from tabletstore.engine.memtable import MemTable
from tabletstore.errors import PreconditionFailed
from tabletstore.metadata.record import LogRef, SSTableRef, TabletRecord
from tabletstore.sstable import SSTable

__all__ = [
    "AdoptedMajor",
    "MajorResult",
    "MergeResult",
    "MinorResult",
    "TabletState",
    "adoptable",
    "apply_adopted",
    "apply_major",
    "apply_merge",
    "apply_minor",
    "freeze",
    "redo_point",
]

#: A new SSTable: its record entry and the opened table.
Written = tuple[SSTableRef, SSTable]


@dataclass(frozen=True, slots=True)
class TabletState:
    """Everything a read needs, swapped whole."""

    record: TabletRecord
    memtable: MemTable
    #: Frozen memtables being written out, newest first.
    frozen: tuple[MemTable, ...]
    #: Opened SSTables per locality group, newest first (parallel to ``record.sstables``).
    sstables: Mapping[str, tuple[SSTable, ...]]


def freeze(state: TabletState) -> TabletState:
    """The memtable joins the frozen ones (newest first) and a fresh one takes writes; the
    state is unchanged when the memtable is empty. A minor compaction writes out every
    frozen memtable, those a failed earlier attempt left too."""
    if not len(state.memtable):
        return state
    return replace(state, memtable=MemTable(), frozen=(state.memtable, *state.frozen))


def redo_point(flushed: Iterable[MemTable], in_flight: Iterable[int]) -> int:
    """The redo point once ``flushed`` is in SSTables: their largest sequence number, or,
    when writes with the sequence numbers ``in_flight`` (the first of each) are logged but not
    yet in a memtable, just below the smallest of those (they may land in the next memtable,
    and replay must not skip them)."""
    redo = max((m.max_seq or 0 for m in flushed), default=0)
    pending = min(in_flight, default=None)
    return redo if pending is None else min(redo, pending - 1)


@dataclass(frozen=True, slots=True)
class MinorResult:
    """What a minor compaction wrote: ``flushed`` (the frozen memtables, newest first) as at
    most one new SSTable per locality group in ``written``."""

    flushed: tuple[MemTable, ...]
    written: Mapping[str, Written]
    #: :func:`redo_point` at freeze time.
    redo_seq: int
    #: The worker's log when the memtable froze: writes after the freeze went there (or to
    #: a log the worker moved to later), so it stays listed.
    log_at_freeze: LogRef
    #: The record's logs at freeze time: every write in them is in ``flushed`` or older.
    listed_at_freeze: tuple[LogRef, ...]
    #: The first segment of ``log_at_freeze`` that can hold a write not in ``flushed``
    #: (the log's segment mark at freeze, or an earlier one of a write then in flight).
    log_start: int = 0

    @property
    def cells(self) -> int:
        return sum(len(m) for m in self.flushed)


def apply_minor(state: TabletState, result: MinorResult, *, now: float) -> TabletState:
    """The state after a minor compaction (§5.4): each new SSTable goes in front of its group,
    the flushed memtables leave ``frozen`` (a memtable frozen since stays), the redo point
    moves forward, and the record lists the log at freeze plus every log added after the
    freeze -- each of those may hold writes past the redo point; the logs listed before the
    freeze hold none. The returned record is the one to commit."""
    record = state.record
    sstables = dict(record.sstables)
    opened = dict(state.sstables)
    for group, (ref, table) in result.written.items():
        sstables[group] = (ref, *sstables.get(group, ()))
        opened[group] = (table, *opened.get(group, ()))
    added = [r for r in record.logs if r not in result.listed_at_freeze]
    logs = tuple(dict.fromkeys((result.log_at_freeze, *added)))
    # Log positions (§5.3): the log at freeze is read from where unflushed writes may start;
    # a log added after the freeze keeps its own position.
    starts = {r: record.log_starts[r] for r in added if r in record.log_starts}
    if result.log_at_freeze not in added:
        starts[result.log_at_freeze] = result.log_start
    new_record = replace(
        record,
        sstables=sstables,
        redo_seq=max(record.redo_seq, result.redo_seq),
        logs=logs,
        log_starts=starts,
    ).with_event(now, "minor_compaction", f"{result.cells} cells")
    frozen = tuple(m for m in state.frozen if all(m is not f for f in result.flushed))
    return replace(state, record=new_record, frozen=frozen, sstables=opened)


@dataclass(frozen=True, slots=True)
class MergeResult:
    """What a merging (or, with ``major``, a group's major) compaction wrote: the SSTables
    ``inputs`` of ``group`` rewritten as ``output`` (None: nothing was left of them)."""

    group: str
    inputs: tuple[str, ...]
    output: Written | None
    major: bool = False


def apply_merge(state: TabletState, result: MergeResult, *, now: float) -> TabletState:
    """The state after a merging compaction (§5.4): the merged SSTable takes the place of its
    newest input, so everything newer than the inputs (a minor compaction's output since)
    stays in front of it and everything older behind it.

    REQUIRES: every input is still in the group, in the order read (checked under the
    tablet's compaction lock before the commit: one rewrite of a tablet runs at a time)."""
    record = state.record
    group = result.group
    pairs = list(zip(record.sstables.get(group, ()), state.sstables.get(group, ()), strict=True))
    at = next(i for i, (ref, _) in enumerate(pairs) if ref.key in result.inputs)
    kept = [(ref, t) for ref, t in pairs if ref.key not in result.inputs]
    new = [result.output] if result.output is not None else []
    pairs = kept[:at] + new + kept[at:]
    sstables = {**record.sstables, group: tuple(ref for ref, _ in pairs)}
    opened = {**state.sstables, group: tuple(t for _, t in pairs)}
    kind = "major_compaction" if result.major else "merging_compaction"
    detail = f"{group}: {len(result.inputs)} -> {len(new)}"
    new_record = replace(record, sstables=sstables).with_event(now, kind, detail)
    return replace(state, record=new_record, sstables=opened)


@dataclass(frozen=True, slots=True)
class MajorResult:
    """What a major compaction of the whole tablet wrote: the SSTables it ``read`` (keys per
    locality group, newest first: every SSTable the record listed when it began) rewritten as
    at most one per group in ``outputs``."""

    read: Mapping[str, tuple[str, ...]]
    outputs: Mapping[str, Written]


def apply_major(state: TabletState, result: MajorResult, *, now: float) -> TabletState:
    """The state after a major compaction (§5.4): in each group the output takes the place of
    every SSTable read, and the SSTables minor compactions added since (the rewrite runs with
    no lock held) stay in front of it.

    REQUIRES: :func:`adoptable` holds for ``state.record`` and ``result.read`` (no merging
    compaction since the read: one rewrite of a tablet runs at a time)."""
    inputs = sum(len(keys) for keys in result.read.values())
    detail = f"{inputs} -> {len(result.outputs)}"
    return _replace_read(state, result.read, result.outputs, now=now, detail=detail)


@dataclass(frozen=True, slots=True)
class AdoptedMajor:
    """A major compaction run away from the tablet's worker (a serverless function,
    ``master/remote_compaction.py``): it read the SSTables ``read`` (keys per locality group,
    newest first: every SSTable the tablet's record listed then) and wrote ``outputs``, at
    most one per group, which the worker adopts (:func:`apply_adopted`)."""

    read: Mapping[str, tuple[str, ...]]
    outputs: Mapping[str, Written]


def adoptable(record: TabletRecord, read: Mapping[str, tuple[str, ...]]) -> dict[str, int]:
    """Per locality group, how many SSTables the record holds *in front of* the ones ``read``
    (minor compactions and bulk loads since the read: they stay, newer than the output).
    Raises :class:`PreconditionFailed` unless every group of the record is exactly those
    newer SSTables followed by the ones read, in the same order: a merging or major
    compaction since the read replaced some of them, and adopting would bring back cells
    that compaction collected or drop an SSTable written since."""
    gone = {key for keys in read.values() for key in keys}
    newer: dict[str, int] = {}
    for group in sorted(set(record.sstables) | set(read)):
        keys = [r.key for r in record.sstables.get(group, ())]
        want = list(read.get(group, ()))
        n = len(keys) - len(want)
        if n < 0 or keys[n:] != want or gone.intersection(keys[:n]):
            raise PreconditionFailed(
                f"tablet {record.tablet_id}: its SSTables of locality group {group!r} changed "
                "since the compaction read them; its output is not adopted"
            )
        newer[group] = n
    return newer


def apply_adopted(state: TabletState, result: AdoptedMajor, *, now: float) -> TabletState:
    """The state after adopting a major compaction run elsewhere (§5.4): in each group the
    SSTables added since the read stay in front, the output takes the place of the ones read.
    The returned record is the one to commit.

    REQUIRES: :func:`adoptable` holds for ``state.record`` (the compaction lock held since)."""
    inputs = sum(len(keys) for keys in result.read.values())
    detail = f"{inputs} -> {len(result.outputs)} (run elsewhere)"
    return _replace_read(state, result.read, result.outputs, now=now, detail=detail)


def _replace_read(
    state: TabletState,
    read: Mapping[str, tuple[str, ...]],
    outputs: Mapping[str, Written],
    *,
    now: float,
    detail: str,
) -> TabletState:
    """``state`` with each group's SSTables ``read`` replaced by its output (if any), behind
    the ones added since; a major compaction's event recorded."""
    record = state.record
    newer = adoptable(record, read)
    sstables: dict[str, tuple[SSTableRef, ...]] = {}
    opened: dict[str, tuple[SSTable, ...]] = {}
    for group in sorted(set(newer) | set(outputs)):
        n = newer.get(group, 0)
        refs = record.sstables.get(group, ())[:n]
        tables = state.sstables.get(group, ())[:n]
        out = outputs.get(group)
        if out is not None:
            refs, tables = (*refs, out[0]), (*tables, out[1])
        if refs:
            sstables[group], opened[group] = refs, tables
    new_record = replace(record, sstables=sstables).with_event(now, "major_compaction", detail)
    return replace(state, record=new_record, sstables=opened)
