"""Tablet assignment: the master's pure planner (§5.2).

"The master keeps track of the set of live tablet servers, and the current assignment of
tablets to tablet servers, including which tablets are unassigned. Whenever a tablet is
unassigned, and a tablet server with sufficient room for the tablet is available, the master
assigns the tablet by sending a tablet load request to the tablet server." (§5.2)

:func:`plan` takes plain values and returns decisions; the master gathers the inputs and
executes the outputs (docs/architecture/conventions.md convention 4).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Assignment", "TabletLoad", "plan"]


@dataclass(frozen=True, slots=True)
class TabletLoad:
    """What the planner knows about one tablet."""

    table_id: str
    tablet_id: str
    #: The worker holding its claim, or None when unassigned.
    worker: str | None
    size: int = 0
    requests: int = 0
    #: Whether balancing may move it (False: METADATA tablets, tablets moved recently).
    movable: bool = True


@dataclass(frozen=True, slots=True)
class Assignment:
    """Load ``tablet_id`` on ``worker`` (after ``source`` unloaded it, when moving)."""

    table_id: str
    tablet_id: str
    worker: str
    source: str | None = None


def _weight(t: TabletLoad) -> int:
    # Size dominates; request load breaks ties and spreads hot small tablets.
    return t.size + 1024 * t.requests + 1


def plan(
    workers: Sequence[str],
    tablets: Sequence[TabletLoad],
    *,
    balance: bool = False,
    max_moves: int = 2,
    ratio: float = 1.0,
    max_moves_per_worker: int | None = None,
) -> list[Assignment]:
    """Assign every unassigned tablet to the least-loaded live worker; with ``balance``, also
    move up to ``max_moves`` tablets from the most- to the least-loaded worker while the most
    loaded one carries more than ``ratio`` times the least loaded one's load and a move
    narrows the gap (throttled, so serving is never disrupted wholesale; a ``ratio`` above 1
    leaves small imbalances alone instead of chasing noise). ``max_moves_per_worker`` (None:
    no bound) caps the moves one worker gives or takes in the plan, so that a plan of many
    moves spreads them over many workers: each moves a few tablets at once, however many
    the cluster moves."""
    if not workers:
        return []
    live = sorted(set(workers))
    load: dict[str, int] = {w: 0 for w in live}
    owned: dict[str, list[TabletLoad]] = {w: [] for w in live}
    unassigned: list[TabletLoad] = []
    for t in tablets:
        if t.worker in load:
            load[t.worker] += _weight(t)
            owned[t.worker].append(t)
        else:
            unassigned.append(t)
    out: list[Assignment] = []
    # The least-loaded worker from a heap of (load, worker): O(log W) per tablet, so a round
    # placing U tablets on W workers costs O(N + U log U + U log W), never U x W.
    heap = [(load[w], w) for w in live]
    heapq.heapify(heap)
    for t in sorted(unassigned, key=lambda t: (-_weight(t), t.table_id, t.tablet_id)):
        least, target = heap[0]
        load[target] = least + _weight(t)
        heapq.heapreplace(heap, (load[target], target))
        out.append(Assignment(t.table_id, t.tablet_id, target))
    if balance:
        out.extend(_moves(load, owned, max_moves, ratio, max_moves_per_worker))
    return out


def _moves(
    load: dict[str, int],
    owned: Mapping[str, list[TabletLoad]],
    max_moves: int,
    ratio: float,
    per_worker: int | None,
) -> list[Assignment]:
    """The moves, one at a time from the most to the least loaded worker that may still give
    or take one: O(W + tablets of the busiest worker) per move."""
    moves: list[Assignment] = []
    moved: set[tuple[str, str]] = set()
    busy: dict[str, int] = dict.fromkeys(load, 0)  # moves given or taken, by worker
    for _ in range(max_moves):
        free = [w for w in load if per_worker is None or busy[w] < per_worker]
        if len(free) < 2:
            break
        hot = max(free, key=lambda w: (load[w], w))
        cold = min(free, key=lambda w: (load[w], w))
        gap = load[hot] - load[cold]
        candidates = [
            t
            for t in owned[hot]
            if t.movable and (t.table_id, t.tablet_id) not in moved and _weight(t) * 2 <= gap
        ]
        if hot == cold or not candidates or load[hot] <= ratio * load[cold]:
            break
        t = max(candidates, key=lambda t: (_weight(t), t.tablet_id))
        moved.add((t.table_id, t.tablet_id))
        load[hot] -= _weight(t)
        load[cold] += _weight(t)
        busy[hot] += 1
        busy[cold] += 1
        moves.append(Assignment(t.table_id, t.tablet_id, cold, source=hot))
    return moves
