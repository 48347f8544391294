"""What the masters' garbage collection did during a chaos run, read from their logs.

The harness runs its masters with a short grace (``chaos_cluster.GC_GRACE``) so that compacted
SSTables, trimmed live logs and recovered logs are deleted while the faults go on (§5.2's
collector, ``master/gc.py``): a deletion of anything still needed then shows up as a lost write
or a verifier finding. That check means little if nothing was deleted, so the report says how
much was, and how often a master that started leading adopted the last leader's memory
(``master/gc_state.py``) — without which the master faults would keep collection from ever
completing a grace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CollectionSeen", "parse", "read"]

#: ``GarbageCollector.maybe_run``'s line for a collection that deleted something.
_DELETED = re.compile(r"garbage collection: listed \d+ objects \(\d+ bytes\), deleted (\d+) ")
#: ``GcMemory.adopt``'s line for a memory adopted.
_ADOPTED = "adopted collector state"
#: ``master_process``'s line for a lead begun (a master leads again after losing its lease,
#: with a new collector).
_LEADING = " is leading"


@dataclass(frozen=True, slots=True)
class CollectionSeen:
    """Collections that deleted objects, the objects, and the leads (a master's, from when it
    begins leading until it stops) that adopted the last leader's memory."""

    collections: int = 0
    deleted: int = 0
    adopted: int = 0
    leads: int = 0

    def __add__(self, other: CollectionSeen) -> CollectionSeen:
        return CollectionSeen(
            self.collections + other.collections,
            self.deleted + other.deleted,
            self.adopted + other.adopted,
            self.leads + other.leads,
        )

    def line(self) -> str:
        """One line of the run's summary."""
        return (
            f"garbage collection: {self.deleted} objects deleted in {self.collections} "
            f"collections; {self.adopted} of {self.leads} leads adopted the last leader's memory"
        )


def parse(lines: Iterable[str]) -> CollectionSeen:
    """What one master's log says."""
    collections = deleted = adopted = leads = 0
    for text in lines:
        found = _DELETED.search(text)
        if found is not None:
            collections += 1
            deleted += int(found.group(1))
        elif _ADOPTED in text:
            adopted += 1
        elif _LEADING in text:
            leads += 1
    return CollectionSeen(collections, deleted, adopted, leads)


def read(directory: Path) -> CollectionSeen:
    """Every master's log under ``directory`` (``master-<n>.log``), added up."""
    total = CollectionSeen()
    for path in sorted(directory.glob("master-*.log")):
        with path.open(encoding="utf-8", errors="replace") as lines:
            total += parse(lines)
    return total
