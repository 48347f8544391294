"""Tablet merges: the master's pure planner (§5, §5.2).

"Tablets can be ... merged: two existing tablets are merged to form one larger tablet" (§5.2);
the master initiates merges. This module chooses them, from plain values, and builds the merged
tablet's record; :meth:`tabletstore.master.balancer.Balancer.merge_small` unloads the pair, commits
the merge through the catalog and assigns the result.

Which pairs. Two *adjacent* tablets of one table (the first's end row is the second's start
row) merge when each is below ``split_bytes // 8`` and together below ``split_bytes // 2``, so
a merged tablet is far from splitting again (no oscillation with :mod:`tabletstore.engine.split_key`),
and only once the pair has been small for ``merge_after`` seconds (the master remembers since
when), so tablets a user pre-split stay apart while they fill. A tablet still sharing SSTables
with a split sibling never merges: such an SSTable holds rows its sibling may since have
deleted and compacted away, which a merged range would bring back.

The merged record. Its SSTables are the union, per locality group, of the pair's (left's, then
right's). SSTable order within a group only matters between SSTables holding the same row, and
the pair's rows are disjoint (each owns its SSTables), so any order reads the same. Both were
unloaded with a flush that emptied their ``logs`` (nothing to replay); the master merges only
records in that state, so the merged one has no logs either and its redo point (the larger of
the two) only keeps future sequence numbers above every SSTable's.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tabletstore.engine.split_key import owns_its_sstables
from tabletstore.metadata.record import SSTableRef, TabletRecord

__all__ = ["MergePair", "merged_record", "plan_merges", "small_pairs"]


@dataclass(frozen=True, slots=True)
class MergePair:
    """Merge ``left`` and ``right`` (adjacent, left first) into one tablet."""

    left: TabletRecord
    right: TabletRecord

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.left.table_id, self.left.tablet_id, self.right.tablet_id)


def small_pairs(tablets: Sequence[TabletRecord], split_bytes: int) -> list[MergePair]:
    """Adjacent pairs of one table's tablets (in row order) that are small enough to merge."""
    small, combined = split_bytes // 8, split_bytes // 2
    ordered = sorted(tablets, key=lambda r: r.start_row)
    out: list[MergePair] = []
    for left, right in itertools.pairwise(ordered):
        if left.table_id != right.table_id or left.end_row != right.start_row:
            continue
        if left.size >= small or right.size >= small or left.size + right.size >= combined:
            continue
        if not (owns_its_sstables(left) and owns_its_sstables(right)):
            continue
        out.append(MergePair(left, right))
    return out


def plan_merges(
    candidates: Sequence[MergePair],
    small_since: Mapping[tuple[str, str, str], float],
    *,
    now: float,
    merge_after: float,
    limit: int = 1,
) -> list[MergePair]:
    """Up to ``limit`` pairs of ``candidates`` that have been small for ``merge_after`` seconds
    (``small_since``: when each pair was first seen small), smallest first, no tablet twice."""
    ripe = [p for p in candidates if now - small_since.get(p.key, now) >= merge_after]
    ripe.sort(key=lambda p: (p.left.size + p.right.size, p.left.start_row))
    chosen: list[MergePair] = []
    used: set[str] = set()
    for p in ripe:
        if len(chosen) >= limit:
            break
        if p.left.tablet_id in used or p.right.tablet_id in used:
            continue
        used.update((p.left.tablet_id, p.right.tablet_id))
        chosen.append(p)
    return chosen


def merged_record(pair: MergePair, *, tablet_id: str, at: float) -> TabletRecord:
    """The record of the tablet ``pair`` merges into (unassigned: no location)."""
    left, right = pair.left, pair.right
    groups: dict[str, tuple[SSTableRef, ...]] = {}
    for group in dict.fromkeys((*left.sstables, *right.sstables)):
        refs = (*left.sstables.get(group, ()), *right.sstables.get(group, ()))
        groups[group] = tuple({r.key: r for r in refs}.values())
    events = (*left.events, *right.events)[-16:]
    return TabletRecord(
        table_id=left.table_id,
        tablet_id=tablet_id,
        start_row=left.start_row,
        end_row=right.end_row,
        sstables=groups,
        redo_seq=max(left.redo_seq, right.redo_seq),
        logs=(),
        location=None,
        epoch=right.epoch,
        events=events,
        # Each side's marks name only rows it holds: together they name the merged rows'.
        bulk_loads=tuple(dict.fromkeys((*left.bulk_loads, *right.bulk_loads))),
        timestamp_floor=max(left.timestamp_floor, right.timestamp_floor),
    ).with_event(at, "merged", f"{left.tablet_id} + {right.tablet_id}")
