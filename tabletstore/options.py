"""Settings: frozen dataclasses with documented defaults (docs/architecture/conventions.md
convention 8).

Settings are values; components (store, coordinator, clock, transport) are constructor
arguments, never settings. Each field says what it trades off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tabletstore.limits import MAX_FRAME, MiB

__all__ = [
    "FRONT_DOOR_INFLIGHT_BYTES",
    "FRONT_DOOR_MAX_CONCURRENT_CALLS",
    "IN_PROCESS_LEASE",
    "SPLIT_BYTES",
    "LeaseOptions",
    "MasterOptions",
    "RpcServerOptions",
    "TabletOptions",
    "WorkerOptions",
]

#: The tablet split size (§5: "tablets are approximately 100-200 MB in size by default"):
#: the one default that both the workers' split rule (:class:`TabletOptions`) and the
#: master's merge thresholds (:class:`MasterOptions`) read.
SPLIT_BYTES = 128 * 1024 * 1024

#: Calls the Bigtable front door serves at once (``bigtable-api --max-concurrent-calls``);
#: more are refused with RESOURCE_EXHAUSTED. Each holds at most one request message
#: (``limits.MAX_REQUEST_BYTES``) once its token passed; a call without one reads none.
FRONT_DOOR_MAX_CONCURRENT_CALLS = 256
#: Request bytes the calls in flight at the front door may hold together
#: (``bigtable-api --max-inflight-bytes``; ``bigtable_api/request_budget.py``): a call is
#: charged one largest message while its message arrives, then the message's size. Four
#: largest messages, one caller at most half of it; more waits, then RESOURCE_EXHAUSTED.
FRONT_DOOR_INFLIGHT_BYTES = 4 * MAX_FRAME


@dataclass(frozen=True, slots=True)
class LeaseOptions:
    """A process's coordinator lease (the Chubby session of §4; docs/architecture/design.md §6
    fencing rule 1). Masters and workers both hold one."""

    #: Seconds the lease lasts without a keep-alive: how soon others take over after the
    #: holder dies. Shorter means faster failover and more keep-alives.
    ttl: float = 5.0
    #: Seconds before the lease could expire at the coordinator that a worker stops
    #: acknowledging writes (fencing rule 1); it absorbs clock-rate differences and stalls of
    #: the keep-alive. None: ``ttl / 4``, at most 1 s (tests run with 2-3 s leases).
    safety_margin: float | None = None

    @property
    def margin(self) -> float:
        """The safety margin in force: :attr:`safety_margin`, or the one derived from ttl."""
        return min(1.0, self.ttl / 4) if self.safety_margin is None else self.safety_margin


#: The lease of a worker in the same process as everything it serves (embedded databases,
#: in-process test clusters): it cannot outlive the process, so a long TTL only spares
#: keep-alives and makes a stall of the event loop less likely to expire it. The embedded
#: database's coordinator moreover binds its leases to the process
#: (``coordination/lease.py``): there no stall, however long, can expire the lease.
IN_PROCESS_LEASE = LeaseOptions(ttl=60.0, safety_margin=5.0)


@dataclass(frozen=True, slots=True)
class RpcServerOptions:
    """The resource caps of a worker's or master's RPC server (``rpc/admission.py``): what a
    flood of connections, or of half-sent frames, can take from it. A connection over a cap
    is refused with an ERROR naming the cap; bytes over the budget make readers wait."""

    #: Connections open at once, in total. Each costs a file descriptor and a task; more are
    #: refused (the clients' pools open one per process and server).
    max_connections: int = 1024
    #: Connections open at once from one peer IP address: one host cannot take them all.
    max_connections_per_peer: int = 256
    #: Connections open at once that have not proven who they are (TLS without a client
    #: certificate, before their token is accepted): a gate of their own, apart from the
    #: authenticated ones' ``max_connections``.
    max_unauthenticated: int = 64
    #: Of those, from one peer IP address.
    max_unauthenticated_per_peer: int = 8
    #: Seconds a new connection has to send its hello and, without a client certificate, to
    #: have its token accepted; then it is closed. Nothing else it sends is read before.
    handshake_timeout: float = 10.0
    #: Seconds a connection with nothing in flight may stay silent before it is closed. Must be
    #: at least twice ``rpc.client.IDLE_REUSE`` (clients reconnect rather than reuse a
    #: connection idle that long, so a request never crosses the server's close).
    idle_timeout: float = 300.0
    #: Seconds a frame that has begun to arrive may go without a byte before the connection is
    #: closed (a half-sent frame holds the bytes of it that arrived meanwhile).
    stall_timeout: float = 30.0
    #: Bytes a second a frame must arrive at, averaged over windows of ``stall_timeout``
    #: seconds while the server reads it; a slower sender is closed.
    min_receive_rate: int = 64 * 1024
    #: Largest frame accepted (the hello advertises it): the request limit by default.
    max_frame: int = MAX_FRAME
    #: Bytes one connection may hold: the frame it is receiving plus the requests it sent that
    #: are still being handled. None: ``max_frame`` (one maximal request at a time).
    max_connection_bytes: int | None = None
    #: Bytes all connections may hold together, charged as they arrive; a connection is not
    #: read while they are all taken (first come, first served). At least ``max_frame``.
    max_buffered_bytes: int = 256 * MiB
    #: Requests in flight on one connection.
    max_in_flight: int = 4096

    @property
    def connection_bytes(self) -> int:
        """The per-connection byte cap in force."""
        return self.max_frame if self.max_connection_bytes is None else self.max_connection_bytes


@dataclass(frozen=True, slots=True)
class TabletOptions:
    """How one tablet buffers and compacts (§5.3, §5.4)."""

    #: Freeze the memtable and start a minor compaction past this many bytes. Larger means
    #: fewer, bigger SSTables and longer log replays after a crash.
    memtable_flush_bytes: int = 16 * 1024 * 1024
    #: Start a merging compaction when more SSTables than this of a locality group may hold
    #: one row (their row ranges overlap there): a point read looks into at most this many.
    #: Smaller means fewer GETs per read, more rewriting.
    max_sstables_per_group: int = 4
    #: Start one anyway when a group has more SSTables than this, however disjoint their row
    #: ranges (sequential writes flush disjoint SSTables): each costs an open, memory for its
    #: footer and a METADATA entry. At least ``max_sstables_per_group``.
    max_disjoint_sstables_per_group: int = 16
    #: Rows per write-batch bound for memtable inserts; bounds latency of one apply.
    max_row_mutations: int = 100_000
    #: Split a tablet past this many bytes of SSTables (§5; default :data:`SPLIT_BYTES`).
    split_bytes: int = SPLIT_BYTES
    #: While its background compaction fails and is retried (the store unreachable), a tablet
    #: refuses writes (Unavailable, naming the failure) once the memtables it holds in memory
    #: reach this many bytes. None: four times ``memtable_flush_bytes`` (HBase's blocking
    #: multiplier).
    memtable_limit_bytes: int | None = None

    @property
    def memory_limit(self) -> int:
        """The memtable bytes in force (``memtable_limit_bytes``)."""
        if self.memtable_limit_bytes is None:
            return 4 * self.memtable_flush_bytes
        return self.memtable_limit_bytes


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a tablet-server worker runs (§5.2, §6)."""

    #: The worker's lease: its tablets move this long after it dies (§5.2).
    lease: LeaseOptions = field(default_factory=LeaseOptions)
    #: The caps of its RPC server (connections, buffered bytes, timeouts).
    rpc: RpcServerOptions = field(default_factory=RpcServerOptions)
    #: Byte budget of the process-wide SSTable block cache (§6).
    block_cache_bytes: int = 256 * 1024 * 1024
    #: Rows in the scan cache of recently read rows (§6); 0 disables it.
    scan_cache_rows: int = 10_000
    #: Worker processes for merging and major compactions; 0 runs them in-process (embedded).
    #: More processes compact more tablets at once but each holds a copy of its inputs.
    compaction_processes: int = 0
    #: Steps of CPU priority (``nice``, 0-19) the compaction processes run below the worker:
    #: on a host with every core busy (a round of splits starts a major compaction per child)
    #: the requests the worker serves get the cores first. Merges and major compactions still
    #: take every idle cycle (and a share of the busy ones: nice 10 weighs a tenth of nice 0);
    #: under a load that leaves none they fall behind and SSTables per tablet grow. Minor
    #: compactions run in the worker itself, at its priority. Where Linux groups processes
    #: by session for scheduling (autogroup), they run in a session and group of their own at
    #: this nice value, so they are background work against every process on the host, not
    #: only against their worker (``process_pool.py``).
    compaction_nice: int = 10
    #: SSTable bytes the merging and major compactions running at once may read
    #: (``engine/compaction_budget.py``): each holds its inputs' bytes and its output's in memory
    #: while it runs (the cells stream through), so this bounds the worker's compaction
    #: memory: a round of splits no longer starts every child's rewrite at once. One larger than this runs alone.
    compaction_memory_bytes: int = 256 * 1024 * 1024
    #: Seconds a tablet waits after a split before it may split again (besides waiting for
    #: its first major compaction): bounds split storms when writes outpace compactions.
    split_cooldown: float = 5.0
    #: Splits this worker runs at once. Tablets written evenly reach the split size together;
    #: side by side, their splits contend for the CPU, the commit log and METADATA while their
    #: writes are refused, and each one's pause of writes grows with the others'.
    concurrent_splits: int = 1
    #: User tablets this worker replays at once (§5.3): a dead worker's tablets arrive
    #: together, and each replay is CPU on the event loop that the lease keep-alive shares.
    #: The root and METADATA tablets never wait for a slot (user tablets' loads need them).
    load_concurrency: int = 4
    #: Seconds a tablet's new owner waits for the sort tasks of a dead worker's log (§6)
    #: before reading the segments of the unfinished ones itself: longer waits for a slow
    #: sorter (each tablet then reads only its runs), shorter bounds how long a dead sorter
    #: holds recovery back (its few MB are then read by every tablet waiting on it).
    sort_wait: float = 10.0
    #: Processes the sort tasks reserved for this worker run in (owner affinity: it serves
    #: every tablet of a dead log and sorts all its tasks, §6), started at the first such task;
    #: 0 sorts them in the worker's event loop (one core). The worker fetches the segments and
    #: writes the runs itself, so it keeps them for its tablets' replay (below).
    sort_processes: int = 2
    #: Bytes of the runs this worker sorted that it keeps in memory for its own tablets'
    #: replay (``commitlog.spill``); past it they go to local disk.
    sort_memory_bytes: int = 64 * MiB
    #: Bytes of such runs it keeps in files of a private local directory once the memory is
    #: full (removed when the worker stops, a log's runs 2 minutes after their last use).
    #: Runs kept nowhere are read back from the store: an owned log larger than memory plus
    #: this is read about twice rather than once. 0: memory only.
    sort_spill_bytes: int = 1024 * MiB
    #: Where that directory is made; None: the system's temporary directory.
    sort_spill_dir: str | None = None
    #: Seconds between two checks of how far back each tablet's log position lies (§5.3,
    #: §5.4): a tablet whose position is ``log_trim_segments`` or more segments behind the log's
    #: end, or that still lists an older log, is minor-compacted (or, with nothing in memory,
    #: its record moved to the log's end), so a crash leaves a short log tail to sort and
    #: replay. None: only the memtable's size triggers minor compactions.
    log_trim_interval: float | None = 1.0
    #: How far (segments) a tablet's log position may lag before it is trimmed (each tablet
    #: at its own share of this and ``log_trim_bytes``, between half and all: tablets
    #: written evenly are not all flushed in one round, ``worker/log_trim.py``). Recovery
    #: reads the dead log's tail one GET per segment (§5.3): a tail of at most about this
    #: many segments (or ``log_trim_bytes``) plus one interval's worth is what a worker kill
    #: costs to sort. A lightly loaded worker writes one-write segments: this bound keeps
    #: its tail short. Under load it must not come long before ``log_trim_bytes``: a worker
    #: taking many small requests writes many small segments (30 a second of 45 KB), and a
    #: bound of 256 made its tablets flush every 8.5 s, a fraction of a MB each.
    log_trim_segments: int = 1024
    #: How far (bytes of log) a tablet's log position may lag before it is trimmed. Under
    #: load this bound comes first: a worker's T tablets written evenly each flush about
    #: this / T bytes per trim (``worker/log_trim.py``), and their memtables hold about this
    #: much between trims.
    log_trim_bytes: int = 64 * MiB
    #: Seconds between two checks of the C heap's free bytes (``worker/heap_trim.py``): glibc
    #: keeps what a compaction's or a read's short-lived values freed, so without trimming
    #: the process's RSS follows its largest moment, not what it holds. None: never trim.
    heap_trim_interval: float | None = 30.0
    #: Free heap bytes past which a check gives them back to the system (``malloc_trim``,
    #: which holds each allocator arena's lock while it walks it: tens to hundreds of ms for
    #: a heap of a GB, so not for a few MB).
    heap_trim_free_bytes: int = 128 * MiB
    #: Seconds a stopping worker may spend draining (flushing its tablets, releasing their
    #: claims, closing its log) before it abandons the rest: it logs the tablets it did not
    #: flush (their commit logs hold every acknowledged write, so recovery replays them) and
    #: stops with an error (the process exits non-zero). Bounds a stop whose object store or
    #: etcd is gone; below ECS's default 30 s between SIGTERM and SIGKILL.
    drain_deadline: float = 25.0
    #: Seconds the event loop may be held past a due timer before the worker logs where it is
    #: held (the loop thread's stack, ``ops/loop_lag.py``); None: no reports (the lag is
    #: measured on ``/metrics`` either way).
    report_stalls: float | None = None


@dataclass(frozen=True, slots=True)
class MasterOptions:
    """How the master process leads: its lease and rounds, balancing and merging tablets,
    garbage collection (§5, §5.2)."""

    #: The master's lease: a standby takes over this long after the leader dies (§5.2).
    lease: LeaseOptions = field(default_factory=LeaseOptions)
    #: The caps of its RPC server (connections, buffered bytes, timeouts).
    rpc: RpcServerOptions = field(default_factory=RpcServerOptions)
    #: Seconds between two rounds of assignment and balancing while leading.
    interval: float = 1.0
    #: Seconds between two assignment rounds that run although no claim, server or schema
    #: changed (tabletstore.master.assignment_watch): the safety net under the watches, and
    #: the one cost of a steady cluster's rounds that grows with it (O(tablets) per round).
    full_round_interval: float = 60.0
    #: Seconds between two garbage collections (tabletstore.master.gc); None: a sixth of
    #: ``gc_grace``, from 10 s to 10 minutes (``gc.interval_for``). A collection lists the
    #: whole bucket (a LIST request and master CPU per 1,000 objects), and nothing is deleted
    #: before it has been garbage for ``gc_grace``: collecting more often buys only requests.
    gc_interval: float | None = None
    #: Seconds an unreferenced object must have existed before it is deleted
    #: (tabletstore.master.gc_plan, rule 1). Compactions commit an uploaded SSTable within
    #: seconds; an hour leaves room for a slow coordinator.
    gc_grace: float = 3600.0

    #: Split keys one ``create_table`` may give (each makes a tablet to load at once): more
    #: are refused with InvalidArgument naming this setting. 0: no bound.
    max_split_keys: int = 100
    #: Tables one principal may administer (those it created, or is an admin of) before its
    #: next ``create_table`` is refused with InvalidArgument naming this setting; counted on
    #: a cluster with auth only (without it every caller is the same anonymous one), never for
    #: the cluster's own identities. 0: no bound.
    max_tables_per_principal: int = 100

    #: Tablet moves per balancing round at most, in a small cluster: a cluster of W workers
    #: makes up to ``max(max_moves, ceil(move_fraction * W))``, so that growing a large
    #: cluster converges in minutes, not hours. More levels load faster; each move makes the
    #: tablet briefly unavailable (unload with a flush, then load).
    max_moves: int = 2
    #: Moves per balancing round per live worker (see ``max_moves``).
    move_fraction: float = 0.1
    #: Moves one worker gives or takes in one balancing round at most: however many moves a
    #: round makes, each worker flushes and loads only a few tablets at once.
    max_moves_per_worker: int = 2
    #: Seconds between balancing rounds that moved something. Longer means calmer placement.
    balance_cooldown: float = 3.0
    #: Seconds after a balancing round that found nothing to move before the next one: each
    #: asks every worker for its tablets' loads (W requests, N tablets' statuses), so a
    #: balanced cluster is asked every this many seconds, not every ``interval``.
    balance_interval: float = 10.0
    #: Seconds a moved tablet stays put before it may move again (no ping-pong on noisy load).
    move_cooldown: float = 30.0
    #: Move only while the most loaded worker carries more than this times the least loaded
    #: one's load. Closer to 1 balances tighter and moves more.
    balance_ratio: float = 1.5
    #: Requests per second per tablet that count as no load: below it, request counts are
    #: noise and placement follows size alone.
    request_noise: float = 50.0
    #: The tablets' split size, from which merge thresholds derive: a pair merges when each is
    #: under split_bytes / 8 and both under split_bytes / 2 (tabletstore.master.tablet_merges).
    #: Must match the workers' :attr:`TabletOptions.split_bytes` (default :data:`SPLIT_BYTES`).
    split_bytes: int = SPLIT_BYTES
    #: Seconds a pair must stay small before it merges; None disables merges. Long by default
    #: so a table a user pre-split keeps its tablets while it fills.
    merge_after: float | None = 600.0
    #: Merges per master round at most.
    max_merges: int = 1
    #: Tablet loads the master keeps in flight to one worker at most; the loads of one level
    #: (root, METADATA, user tablets) are sent concurrently up to this bound.
    max_loads_per_worker: int = 16
    #: Seconds an assignment round waits for one level's loads before going on to the next
    #: level (a load still running goes on in the background and is counted as placed). The
    #: next level usually needs this one served, so this is how long one slow load may hold
    #: the others back: never longer.
    load_wait: float = 10.0
    #: Seconds the master lets one load run before giving up on it (the worker is told to
    #: cancel it, and the next round assigns the tablet again). A load replays the tablet's
    #: logs, which may legitimately take minutes after a crash; a load to a worker that leaves
    #: the servers directory (dead, or paused past its lease) is given up at once instead.
    load_timeout: float = 600.0
    #: Bytes of log segments per sort task when a dead worker's log is sorted for recovery
    #: (§6). Smaller means more tasks in parallel, more objects and requests.
    sort_task_bytes: int = 4 * 1024 * 1024
    #: Times the master runs one sort task before leaving it to the tablets' owners (who then
    #: read its segments directly): a task failing this often is damaged, not unlucky.
    sort_attempts: int = 3
    #: The largest dead log (bytes of segments to sort) whose tablets all go to one worker,
    #: which sorts every task of it on its cores and replays the runs from its memory and
    #: local disk, so the log is read once in the cluster (owner affinity, §6). A larger log
    #: is sorted by every worker at once and its tablets spread (each then reads its runs back
    #: from the store: about twice the log). Bounded by what a worker keeps of the runs it
    #: sorted (``WorkerOptions.sort_memory_bytes`` + ``sort_spill_bytes``, 1 GiB by default)
    #: and by the time one worker's cores take to sort it; 0: only a log sorted in one task
    #: has an owner.
    sort_owner_bytes: int = 512 * MiB
    #: Seconds between two probes of every worker's RPC address (§5.2; master/failure_detector):
    #: a worker whose address refuses connections ``probe_refusals`` times in a row is dead,
    #: and its lease is revoked so its tablets are recovered without waiting for the TTL.
    #: None turns the probes off (a network whose firewalls refuse the master's connections
    #: while clients still reach the workers).
    probe_interval: float | None = 0.25
    #: Refused probes in a row that prove a worker dead (a timeout never counts).
    probe_refusals: int = 2
    #: Seconds between two major compactions of every tablet (§5.4: deleted data is gone
    #: within a bounded time); None turns the cycle off.
    major_compaction_period: float | None = 86400.0
