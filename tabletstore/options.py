"""Settings: frozen dataclasses with documented defaults (STYLE.md convention 8).

Settings are values; components (store, coordinator, clock, transport) are constructor
arguments, never settings. Each field says what it trades off.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TabletOptions", "WorkerOptions"]


@dataclass(frozen=True, slots=True)
class TabletOptions:
    """How one tablet buffers and compacts (§5.3, §5.4)."""

    #: Freeze the memtable and start a minor compaction past this many bytes. Larger means
    #: fewer, bigger SSTables and longer log replays after a crash.
    memtable_flush_bytes: int = 16 * 1024 * 1024
    #: Start a merging compaction when a locality group has more SSTables than this. Smaller
    #: means fewer GETs per read, more rewriting.
    max_sstables_per_group: int = 4
    #: Rows per write-batch bound for memtable inserts; bounds latency of one apply.
    max_row_mutations: int = 100_000
    #: Split a tablet past this many bytes of SSTables (§5, default 128 MiB as the issue asks).
    split_bytes: int = 128 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a tablet-server worker runs (§5.2, §6)."""

    #: The worker's etcd lease TTL in seconds. Shorter means faster failover, more keep-alives.
    lease_ttl: float = 10.0
    #: Stop acknowledging writes this long before the lease could expire at etcd (fencing rule 1).
    lease_safety_margin: float = 2.0
    #: Byte budget of the process-wide SSTable block cache (§6).
    block_cache_bytes: int = 256 * 1024 * 1024
    #: Rows in the scan cache of recently read rows (§6); 0 disables it.
    scan_cache_rows: int = 10_000
    #: Worker processes for merging and major compactions; 0 runs them in-process (embedded).
    compaction_processes: int = 0
