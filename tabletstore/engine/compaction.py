"""Compactions (§5.4): the pure planner and the merge function.

* :func:`plan` looks at a tablet's record and decides which *merging* compactions bound the
  number of SSTables per locality group. It is a pure function of its inputs.
* :func:`plan_major` lists the *major* compactions: every group with more than one SSTable, or
  with any SSTable that may still hold deletion entries, is rewritten into one.
* :func:`merge_sstables` is the merge itself, a plain CPU-bound function of object bytes to
  object bytes, so the worker can run it in a process pool and serving never stalls (§5.4).

Which SSTables a merging compaction takes. A group's SSTables are ordered newest first. A merge
takes *consecutive* SSTables, so the order of sources stays intact (the merged table takes
their place, behind the newer ones and in front of the older ones), and keeps deletion
entries, which may still mask cells outside the merge. A merge that takes all of them is a
major compaction and drops deletion entries: nothing else remains for them to mask.

What a major compaction counts versions with. GC by version count (a ``MaxVersionsRule``)
numbers the *visible* versions of a column, and the tablet's memtables may hold deletion
entries newer than every SSTable: one that deletes a column's newest version makes the next one
the newest. Counted without it, that version could be dropped although no moment ever made it
garbage (an intersection of a version count and an age: too old, but the only version left). So
a major compaction the worker runs is given the memtables' deletion entries (``masks``): they
mask and they shift the count, and they are never written out (the memtable still holds them).
The memtables' puts are left out: a newer version only ever makes an older one more garbage, so
counting without them drops less, never more.

Of the windows that bring a group back to its limit, the planner takes the one that rewrites
the fewest bytes per SSTable it removes (a size-tiered choice). Always merging the newest
SSTables would rewrite the youngest merged table again at every flush, so a tablet's bytes
rewritten per byte written would grow in proportion to its size; the size-tiered choice
merges tables of similar size, so they grow with the logarithm of the size instead, which
keeps the CPU per written value nearly flat as tables grow.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from tabletstore.data.schema import GcRule, LocalityGroup, TableSchema
from tabletstore.engine.iterators import compact_cells, merge_sources
from tabletstore.errors import InvalidArgument
from tabletstore.keys import Cell, CellKind
from tabletstore.metadata.record import SSTableRef, TabletRecord
from tabletstore.options import TabletOptions
from tabletstore.sstable import (
    SSTableBuilder,
    SSTableExcerpt,
    SSTableInfo,
    iter_sstable_bytes,
    write_sstable,
)
from tabletstore.storage_s3 import layout

__all__ = [
    "CompactionTask",
    "GroupSettings",
    "check_outputs",
    "merge_sstables",
    "merge_window",
    "overlap_depth",
    "plan",
    "plan_major",
    "rewrite_tablet",
    "schema_rewrite",
]


@dataclass(frozen=True, slots=True)
class CompactionTask:
    """Rewrite the SSTables ``inputs`` (keys, newest first) of ``group`` into one."""

    group: str
    inputs: tuple[str, ...]
    major: bool


def plan(record: TabletRecord, options: TabletOptions) -> list[CompactionTask]:
    """Merging compactions that bring every group back to ``max_sstables_per_group``.

    A group of ``n > max`` SSTables is left alone while at most ``max`` of them may hold any
    one row (:func:`overlap_depth`) and ``n <= max_disjoint_sstables_per_group``: a read
    looks only into SSTables whose row range holds its row, so merging disjoint SSTables
    (sequential writes) would rewrite bytes for nothing. Otherwise one merge of at least
    ``n - max + 1`` consecutive ones brings the group back to ``max``: :func:`merge_window`
    picks them. Merging all of them is a major compaction (deletion entries can go).
    """
    tasks: list[CompactionTask] = []
    limit = max(1, options.max_sstables_per_group)
    cap = max(limit, options.max_disjoint_sstables_per_group)
    for group, refs in sorted(record.sstables.items()):
        if len(refs) <= limit or (len(refs) <= cap and overlap_depth(refs) <= limit):
            continue
        lo, hi = merge_window([r.size for r in refs], len(refs) - limit + 1)
        inputs = tuple(r.key for r in refs[lo:hi])
        tasks.append(CompactionTask(group, inputs, major=hi - lo == len(refs)))
    return tasks


def overlap_depth(refs: Iterable[SSTableRef]) -> int:
    """The most SSTables of ``refs`` whose row ranges ``[first_row, last_row]`` hold one row
    (SSTables without cells hold none)."""
    edges = sorted(
        edge
        for r in refs
        if r.cells
        for edge in ((r.first_row, 0), (r.last_row, 1))  # a start before an end at one row
    )
    depth = most = 0
    for _, end in edges:
        depth += -1 if end else 1
        most = max(most, depth)
    return most


def merge_window(sizes: Sequence[int], least: int) -> tuple[int, int]:
    """``(lo, hi)``: the consecutive SSTables ``[lo, hi)`` of a group (``sizes`` in bytes,
    newest first) to merge into one, at least ``least`` of them (``2 <= least <= len(sizes)``),
    rewriting the fewest bytes per SSTable removed (``sum / (hi - lo - 1)``); ties go to
    the newer window, then to the shorter one.

    REQUIRES: ``2 <= least <= len(sizes)``.
    """
    n = len(sizes)
    prefix = [0, *itertools.accumulate(max(0, s) for s in sizes)]
    best: tuple[Fraction, int, int] | None = None
    for width in range(least, n + 1):
        for lo in range(n - width + 1):
            cost = Fraction(prefix[lo + width] - prefix[lo], width - 1)
            if best is None or (cost, lo, width) < best:
                best = (cost, lo, width)
    assert best is not None, "merge_window needs at least two SSTables"
    return best[1], best[1] + best[2]


def plan_major(record: TabletRecord) -> list[CompactionTask]:
    """One major compaction per group that has any SSTable (a single SSTable is rewritten too:
    it may hold deletion entries or cells that GC has since collected)."""
    return [
        CompactionTask(group, tuple(r.key for r in refs), major=True)
        for group, refs in sorted(record.sstables.items())
        if refs
    ]


def merge_sstables(
    inputs: Sequence[bytes | SSTableExcerpt],
    *,
    gc_rules: Mapping[str, GcRule | None],
    now_micros: int,
    major: bool,
    compression: str,
    block_size: int,
    locality_group: str,
    families: Collection[str] | None = None,
    start_row: bytes = b"",
    end_row: bytes | None = None,
    seq_bases: Sequence[int] = (),
    masks: Sequence[Cell] = (),
) -> tuple[bytes, SSTableInfo]:
    """Merge SSTable objects (their bytes, newest first) into one SSTable object.

    A major merge applies deletions and GC and leaves only live values; a merging one keeps
    deletion entries and drops only what they mask within the inputs (see
    :func:`tabletstore.engine.iterators.compact_cells`). With ``families`` (the schema's), the cells
    and deletion entries of any other family -- a dropped one -- are left out; row deletions
    are kept. Only cells of rows in ``[start_row, end_row)`` -- the tablet's range -- are
    written: after a split (§5.2) both children reference their parent's SSTables, and a
    child's compaction must write out only its own rows. ``seq_bases``: each input's
    ``SSTableRef.seq_base`` (none: all 0). ``masks``: for a major merge, the deletion
    entries of the tablet's memtables, in sort order (module docstring). Pure CPU: safe to
    run in another process.
    """
    sources = _sources(inputs, seq_bases, start_row, end_row)
    merged: Iterable[Cell] = merge_sources(_with_masks(sources, masks, major=major))
    if families is not None:
        known = frozenset(families)
        merged = (c for c in merged if c.family in known or c.kind == CellKind.DELETE_ROW)
    out = compact_cells(merged, gc_rules=gc_rules, now_micros=now_micros, major=major)
    return write_sstable(
        out, compression=compression, block_size=block_size, locality_group=locality_group
    )


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """How one locality group's SSTables are written."""

    compression: str
    block_size: int


#: How a group the schema does not name is written: a locality group's defaults.
_DEFAULT_GROUP = GroupSettings(
    LocalityGroup(name="default").compression, LocalityGroup(name="default").block_size
)


def rewrite_tablet(
    inputs: Sequence[bytes | SSTableExcerpt],
    *,
    family_groups: Mapping[str, str],
    groups: Mapping[str, GroupSettings],
    gc_rules: Mapping[str, GcRule | None],
    now_micros: int,
    start_row: bytes = b"",
    end_row: bytes | None = None,
    seq_bases: Sequence[int] = (),
    masks: Sequence[Cell] = (),
) -> dict[str, tuple[bytes, SSTableInfo]]:
    """A full major compaction (§5.4): every SSTable of the tablet, of every locality group
    (``inputs``, newest first within each group; groups hold disjoint families, so their
    relative order does not matter), merged with deletions and GC applied, then written out
    as one SSTable per group of the *current* schema (``family_groups``).

    Rewriting all groups at once is what lets the schema change under the data: a family
    dropped (absent from ``family_groups``) loses its cells for good, so re-creating the name
    brings nothing back; a family moved to another locality group has its cells moved with it.
    Returns only groups that have cells. ``seq_bases`` and ``masks`` as
    :func:`merge_sstables`. Pure CPU: safe to run in another process.
    """
    sources = _sources(inputs, seq_bases, start_row, end_row)
    builders: dict[str, SSTableBuilder] = {}
    for cell in compact_cells(
        merge_sources(_with_masks(sources, masks, major=True)),
        gc_rules=gc_rules,
        now_micros=now_micros,
        major=True,
    ):
        group = family_groups.get(cell.family)
        if group is None:
            continue
        builder = builders.get(group)
        if builder is None:
            settings = groups.get(group, _DEFAULT_GROUP)
            builder = builders[group] = SSTableBuilder(
                compression=settings.compression,
                block_size=settings.block_size,
                locality_group=group,
            )
        builder.add(cell)
    return {group: builder.finish() for group, builder in builders.items()}


def check_outputs(record: TabletRecord, outputs: Mapping[str, SSTableRef]) -> None:
    """Refuse (InvalidArgument) outputs of a compaction run elsewhere that are not new
    SSTables of this tablet: each must lie under the tablet's own prefix, in its group's
    place (``layout.sstable_key``), and not be an SSTable the record lists already."""
    listed = {r.key for refs in record.sstables.values() for r in refs}
    for group, ref in outputs.items():
        prefix = f"{layout.tables_prefix(record.table_id, record.tablet_id)}{group}/"
        if not ref.key.startswith(prefix) or ref.key in listed or ref.size <= 0:
            raise InvalidArgument(
                f"tablet {record.tablet_id}: {ref.key!r} is not a new SSTable of its "
                f"locality group {group!r}"
            )


def schema_rewrite(
    inputs: Sequence[bytes | SSTableExcerpt],
    schema: TableSchema,
    *,
    now_micros: int,
    start_row: bytes = b"",
    end_row: bytes | None = None,
    seq_bases: Sequence[int] = (),
    masks: Sequence[Cell] = (),
) -> functools.partial[dict[str, tuple[bytes, SSTableInfo]]]:
    """:func:`rewrite_tablet` of ``inputs`` by ``schema`` (its families' locality groups and
    GC rules), as a call to run on a thread or in another process: the major compaction a
    worker runs (``Tablet.major_compact``) and one run elsewhere (``master.remote_compaction``)
    are the same rewrite. ``seq_bases`` and ``masks`` as :func:`merge_sstables` (a rewrite
    run elsewhere has no memtable to take masks from: ``Tablet.adopt_major`` checks for
    deletions it did not see)."""
    return functools.partial(
        rewrite_tablet,
        inputs,
        family_groups={name: f.locality_group for name, f in schema.families.items()},
        groups={
            name: GroupSettings(g.compression, g.block_size)
            for name, g in schema.locality_groups.items()
        },
        gc_rules={name: f.gc_rule for name, f in schema.families.items()},
        now_micros=now_micros,
        start_row=start_row,
        end_row=end_row,
        seq_bases=seq_bases,
        masks=masks,
    )


def _with_masks(
    sources: list[Iterator[Cell]], masks: Sequence[Cell], *, major: bool
) -> list[Iterable[Cell]]:
    """``sources`` and, for a major merge, the memtables' deletion entries ``masks`` (module
    docstring). A major merge writes no deletion entries, so the masks never reach its output;
    a merging one would write them, and it counts no versions, so it takes none."""
    if masks and not major:
        raise ValueError("only a major compaction counts versions with the memtables' deletions")
    if any(m.kind == CellKind.PUT or m.kind > CellKind.DELETE_ROW for m in masks):
        raise ValueError("a compaction's masks are deletion entries only")
    return [*sources, masks] if masks else list(sources)


def _sources(
    inputs: Sequence[bytes | SSTableExcerpt],
    seq_bases: Sequence[int],
    start_row: bytes,
    end_row: bytes | None,
) -> list[Iterator[Cell]]:
    """Each input's cells in the tablet's rows, its seq base added (an adopted bulk-load
    SSTable's cells get their seqs from its reference), decoded a block at a time as the merge
    consumes them: a compaction holds one decoded block per input, not every input's cells
    (the inputs' bytes are in memory already). Every footer is verified here, before the merge
    starts; a block that fails its checksum raises Corruption when the merge reaches it, and
    the compaction writes nothing."""
    bases = list(seq_bases) or [0] * len(inputs)
    if len(bases) != len(inputs):
        raise ValueError(f"{len(inputs)} compaction inputs but {len(bases)} seq bases")
    return [
        iter_sstable_bytes(blob, seq_base=base, start_row=start_row, end_row=end_row)
        for blob, base in zip(inputs, bases, strict=True)
    ]
