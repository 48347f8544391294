"""Garbage collection of bucket objects: the pure planner (§5.2, §5.4; docs/architecture/design.md
§6 rule 5, §9).

The paper's master "garbage-collects obsolete SSTables as a mark-and-sweep garbage collection
over the set of SSTables, where the roots are the METADATA table" (§5.4, §5.2). Here the sweep
covers every object in the bucket, and this module decides — from plain values, with no I/O —
which of a listing's objects may be deleted. :mod:`tabletstore.master.gc` gathers the inputs
(the listing first, then the marks) and executes the decision.

The roots (a :class:`LiveSet`):

* every SSTable key a tablet record lists (``TabletRecord.sstables``);
* every commit log ``(worker, incarnation)`` a tablet record lists (``TabletRecord.logs``: the
  logs that may still hold writes past the tablet's redo point — recovery not finished);
* the current incarnation of every live worker (its log is written to right now, even before
  any record lists it);
* the SSTables a snapshot manifest (batch jobs) names, while the manifest itself exists;
* the SSTables a backup manifest names (``backups/``, metadata/backup.py), in any state.

An SSTable is live while *any* record of *any* table names it: a restored table or a zero-copy
clone names its source's SSTables under the source's key prefix (master/backups.py), and those
stay as long as one of them is named, whichever table is deleted first.

The rules, object by object (each verdict carries a :class:`Reason`):

1. An object younger than ``grace`` is kept, whatever it is. This is what protects an SSTable
   between its upload and the METADATA commit that references it (a compaction uploads first,
   commits second): ``grace`` must be comfortably larger than any compaction's
   upload-to-commit time.
2. An SSTable is garbage once no record references it (compacted away, or its table deleted).
3. The segments of a commit log are garbage together, once no record lists the log, it is not
   a live worker's current incarnation, and its *newest* object is older than ``grace``. The
   sorted log (``recovery/<worker>/<incarnation>/...``: plan, task manifests and runs, see
   ``commitlog.runs``) follows the log it was sorted from, whole.
3a. A live worker's current log is trimmed from its start (``LiveSet.log_floors``, the least
   log position of the records that list it): its segments below that floor are garbage, as a
   prefix only — the newest segment is always kept, nothing is trimmed from a log with a fence
   or one no record lists, and the prefix stops at the first segment some other rule keeps
   (younger than ``grace``, or than the history retention of rule 7). See "Trimming a live
   log" below for why no recovery, restore or change stream can need a trimmed segment.
4. A fence (a zero-byte segment, docs/architecture/design.md §6 rule 4) is deleted only with its log
   and only once it is older than ``fence_grace`` as well (default one day). Deleting a fence
   reopens its segment number to a zombie writer of that log; the writer's lease check (fencing
   rule 1) already refuses such a write, and a fence kept a day longer makes that refusal not
   depend on clocks in any plausible pause. (SlateDB lost flushed writes when its collector
   deleted a fence object: slatedb#352, slatedb#1622.)
5. A snapshot manifest is kept while its table exists and its TTL (``expires_at``, if it
   has one) has not passed; it is garbage once the TTL passes, and after ``grace`` once the
   table is deleted. Its SSTables follow in a later round, once the manifest is gone.
6. A backup manifest (every version of it) is kept until its expiry (``expires_at`` of its
   newest version) passes, whether or not its table exists: a backup outlives its table. It
   is garbage once expired; its SSTables follow in a later round. A manifest that cannot be
   read (a newer format, a damaged object) keeps every SSTable in the bucket: what it pins
   is unknown.
7. History (``LiveSet.history``, the longest retention any table's history window or change
   retention needs, ``master/checkpoints.py``): a commit log that rule 3 would delete is kept
   while its newest object is younger than that: a point-in-time restore replays the log from
   a checkpoint up to the instant asked for, and a change stream reads it. The checkpoints themselves are snapshot manifests
   whose TTL covers the window (rule 5 keeps them and their SSTables).
8. A point-in-time restore's sorted log (``restores/<restore-id>/...``, the same plans,
   manifests and runs as ``recovery/`` under a root of its own) is scratch: the restore
   deletes it when it ends, and what a restore that died left is deleted together once its
   newest object is older than ``grace`` (a restore writing it still is younger).
9. A bulk-load part (``loads/``, metadata/load_part.py: what a tablet's part of a bulk load
   added, for point-in-time restores, which cannot replay a load from the log) is kept, and
   the SSTables it names with it, while it is younger than the history retention of rule 7
   (and than ``grace``); then it is garbage, and its SSTables follow in a later round unless
   something else names them. A part that cannot be read keeps every SSTable of its table.
10. A key that no layout parser recognizes is never deleted; the plan reports it.
11. The collector's own memory (``gc/since/<version>``, :mod:`tabletstore.master.gc_state`): the
    newest listed version is kept; an older one (a save that could not delete the version
    before it) is garbage.

Trimming a live log (rule 3a). A worker writes one log for all its tablets for as long as it
lives, and recovery reads it only from each tablet's log position (§5.3 redo points;
``TabletRecord.log_starts``): every segment below a tablet's position holds only writes its
SSTables hold. The floor of a log is the least position of every record that lists it, read
by the mark; a segment below it is needed by no recovery, because

* a record's position for a log never falls below what it was: each is a segment mark taken
  when it was committed, or lower only for a write then in flight (whose mark is at or above
  the position the record had when that write took its seqs), or 0 for a write in flight that
  took its seqs under the worker's previous log — and such a write was in flight, so counted,
  when the record first listed this log;
* a record that starts to list the log after the mark does so at the worker's segment mark
  (a load, ``engine/log_replay.py``), which is past every segment listed before the mark; a
  split's children are made from a flushed parent and list no log, nor does a merged tablet;
* a tablet that stopped listing the log (an unload or a split flushed it, ``forget_logs``;
  its table was deleted) has every write of it in SSTables;
* recovery plans the sort of a log only once its writer is gone, from a listing of records
  read after that; the mark reads the live workers before and again after the records, and
  trims only a log whose worker was live with that incarnation both times. So any such
  listing is read after the mark's, and its least position is at or above the floor.

The newest segment is never trimmed: fencing creates the number after the last segment it
lists, so a log with none left would be fenced below its writer's next segment. A log with a
fence is being given up (its writer switches incarnation) and is kept whole. A position is a
mark committed soon after it was taken; a segment deleted is older than ``grace``, so a record
committing a position below it would have taken ``grace`` to commit (the contract SSTables
already rely on). Point-in-time restores and change streams read a log from its first listed
segment and need only what rule 7 keeps; the verifier checks a log from the least position.

Dereference grace. ``grace`` counts from an object's creation. A reader that took a tablet's
state before a compaction may still read an SSTable that compaction replaced, however old the
SSTable is. A long-lived collector (the master) therefore passes ``since`` — when it first found
each key deletable by the rules above — and an object is then deleted only once it has been
found deletable for ``grace`` as well; the plan returns the updated map for the next round. A
one-shot collection (``since=None``) uses object age only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tabletstore.errors import InvalidArgument
from tabletstore.metadata.record import LogRef
from tabletstore.options import MasterOptions
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectInfo

__all__ = [
    "DEFAULT_FENCE_GRACE",
    "DEFAULT_GRACE",
    "GcPlan",
    "LiveSet",
    "Reason",
    "plan",
]

#: Default grace period in seconds: an object younger than this is never deleted
#: (:attr:`tabletstore.options.MasterOptions.gc_grace` says why it is an hour).
DEFAULT_GRACE = MasterOptions().gc_grace
#: Default age in seconds a fence must reach before it is deleted with its log (rule 4).
DEFAULT_FENCE_GRACE = 86400.0


class Reason(StrEnum):
    """Why an object is kept (``KEEP_*``) or deleted (``DELETE_*``)."""

    KEEP_REFERENCED = "referenced by a tablet record"
    KEEP_SNAPSHOT = "named by a kept snapshot manifest"
    KEEP_BACKUP = "named by a backup manifest"
    KEEP_BACKUP_MANIFEST = "backup manifest not expired"
    KEEP_LOG_NEEDED = "log listed by a tablet record (recovery not finished)"
    KEEP_LIVE_LOG = "current log of a live worker"
    KEEP_YOUNG = "younger than the grace period"
    KEEP_RECENTLY_UNREFERENCED = "unreferenced for less than the grace period"
    KEEP_FENCE = "fence younger than the fence grace period"
    KEEP_LIVE_TABLE_SNAPSHOT = "snapshot manifest of an existing table"
    KEEP_UNKNOWN = "key not recognized by the layout"
    KEEP_HISTORY = "log within a table's history window"
    KEEP_LOAD_PART = "bulk-load part within a table's history window"
    KEEP_HISTORY_LOAD = "named by a bulk-load part within a history window"
    KEEP_COLLECTOR_STATE = "the collector's newest saved state"
    DELETE_UNREFERENCED_SSTABLE = "SSTable no record references"
    DELETE_FINISHED_LOG = "log no tablet needs"
    DELETE_TRIMMED_LOG = "live log segment below every tablet's log position"
    DELETE_FINISHED_RECOVERY = "recovery run of a log no tablet needs"
    DELETE_RESTORE_SORT = "sorted log of a restore that ended"
    DELETE_DELETED_TABLE_SNAPSHOT = "snapshot manifest of a deleted table"
    DELETE_EXPIRED_SNAPSHOT = "snapshot manifest past its TTL"
    DELETE_EXPIRED_BACKUP = "backup manifest past its expiry"
    DELETE_OLD_LOAD_PART = "bulk-load part older than every history window"
    DELETE_OLD_COLLECTOR_STATE = "a collector state a newer one replaced"

    @property
    def deletes(self) -> bool:
        return self.name.startswith("DELETE_")


@dataclass(frozen=True, slots=True)
class LiveSet:
    """The roots of the mark: what METADATA and the coordinator say is in use."""

    #: Ids of tables that exist (have a schema).
    tables: frozenset[str] = frozenset()
    #: SSTable keys listed by any tablet record.
    sstables: frozenset[str] = frozenset()
    #: Commit logs listed by any tablet record.
    logs: frozenset[LogRef] = frozenset()
    #: Live worker id -> its current incarnation; None when unknown (keep all its logs).
    live_workers: Mapping[str, int | None] = field(default_factory=dict)
    #: Snapshot manifest key -> the SSTable keys it names; None when the manifest could not be
    #: read (then every SSTable of its table is kept while the manifest is).
    snapshots: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    #: Snapshot manifest key -> when its TTL passes (seconds since the epoch); absent: never.
    snapshot_expiry: Mapping[str, float] = field(default_factory=dict)
    #: Backup manifest key (any version) -> the SSTable keys it names; None when it could not
    #: be read (then every SSTable in the bucket is kept while it exists).
    backups: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    #: Backup manifest key -> when its backup expires (its newest version's); absent: never.
    backup_expiry: Mapping[str, float] = field(default_factory=dict)
    #: Seconds a commit log no tablet needs is still kept after its newest object (the
    #: longest retention of any table's history window; 0: none keeps history).
    history: float = 0.0
    #: Bulk-load part key -> the SSTable keys it names; None when it could not be read (then
    #: every SSTable of its table is kept while the part is).
    load_parts: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    #: A live worker's current log (live with that incarnation before and after the records
    #: were read) that some record lists -> the least log position of those records (rule
    #: 3a): its segments below it are garbage. A log not here is trimmed of nothing.
    log_floors: Mapping[LogRef, int] = field(default_factory=dict)

    def log_reason(self, ref: LogRef) -> Reason | None:
        """Why the log ``ref`` must be kept, or None if nothing needs it."""
        if ref in self.logs:
            return Reason.KEEP_LOG_NEEDED
        if ref.worker_id in self.live_workers:
            current = self.live_workers[ref.worker_id]
            if current is None or current == ref.incarnation:
                return Reason.KEEP_LIVE_LOG
        return None


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What to delete, and a count of objects per reason."""

    #: Keys to delete, in listing order.
    delete: tuple[str, ...]
    #: Bytes of the objects in ``delete``.
    delete_bytes: int
    #: Objects per reason (kept and deleted).
    counts: Mapping[Reason, int]
    #: Keys no layout parser recognizes (kept, reported).
    unknown: tuple[str, ...]
    #: Key -> when it was first seen unreferenced, for keys still kept only by a grace period;
    #: pass it as ``since`` to the next :func:`plan`.
    since: Mapping[str, float]
    #: The reason for every listed key.
    reasons: Mapping[str, Reason]
    #: Bytes of the listed objects per reason (kept and deleted): what history costs is
    #: ``bytes[Reason.KEEP_HISTORY]``.
    bytes: Mapping[Reason, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Group:
    """The listed objects of one commit log: its segments, fences and recovery runs."""

    segments: list[ObjectInfo] = field(default_factory=list)
    fences: list[ObjectInfo] = field(default_factory=list)
    runs: list[ObjectInfo] = field(default_factory=list)

    def newest(self) -> float:
        return max(o.last_modified for o in (*self.segments, *self.fences, *self.runs))


def plan(
    live: LiveSet,
    listed: Sequence[ObjectInfo],
    now: float,
    *,
    grace: float,
    fence_grace: float = DEFAULT_FENCE_GRACE,
    since: Mapping[str, float] | None = None,
) -> GcPlan:
    """Decide which of ``listed`` to delete (see the module docstring for the rules).

    REQUIRES: ``live`` was read *after* ``listed`` (see :mod:`tabletstore.master.gc`), so every
    listed object that anything references is in ``live``, or was committed after the mark
    and is then younger than ``grace``.
    """
    if grace < 0 or fence_grace < 0:
        raise InvalidArgument(f"grace periods must be >= 0, got {grace} and {fence_grace}")
    reasons: dict[str, Reason] = {}
    # First pass: snapshot manifests (they pin SSTables) and grouping of commit-log objects.
    groups: dict[LogRef, _Group] = {}
    others: list[tuple[ObjectInfo, layout.SSTableKey]] = []
    pinned: set[str] = set()
    pinned_tables: set[str] = set()
    backed_up: set[str] = set()
    loaded: set[str] = set()
    loaded_tables: set[str] = set()
    pin_everything = False
    restores: dict[str, list[ObjectInfo]] = {}
    states: dict[str, int] = {}
    for info in listed:
        kind = _classify(info.key)
        if isinstance(kind, int):
            states[info.key] = kind
        elif kind is None:
            reasons[info.key] = Reason.KEEP_UNKNOWN
        elif isinstance(kind, layout.SSTableKey):
            others.append((info, kind))
        elif isinstance(kind, layout.SnapshotKey):
            reasons[info.key] = _snapshot_reason(live, info, kind, now, grace)
            # Every listed manifest pins what it names, even one deleted in this round: its
            # SSTables go in a later round, after the manifest is gone.
            names = live.snapshots.get(info.key)
            if names is None:
                pinned_tables.add(kind.table_id)
            else:
                pinned |= names
        elif isinstance(kind, layout.LoadPartKey):
            keep = now - info.last_modified < max(live.history, grace)
            reasons[info.key] = Reason.KEEP_LOAD_PART if keep else Reason.DELETE_OLD_LOAD_PART
            # Pins even when deleted in this round, as a snapshot manifest does.
            names = live.load_parts.get(info.key)
            if names is None:
                loaded_tables.add(kind.table_id)
            else:
                loaded |= names
        elif isinstance(kind, layout.BackupKey):
            expires = live.backup_expiry.get(info.key)
            expired = expires is not None and now >= expires
            reasons[info.key] = (
                Reason.DELETE_EXPIRED_BACKUP if expired else Reason.KEEP_BACKUP_MANIFEST
            )
            # Pins even when deleted in this round, as a snapshot manifest does.
            names = live.backups.get(info.key)
            if names is None:
                pin_everything = True
            else:
                backed_up |= names
        elif isinstance(kind, layout.RecoveryKey) and kind.scope is not None:
            restores.setdefault(kind.scope, []).append(info)
        else:
            group = groups.setdefault(LogRef(kind.worker_id, kind.incarnation), _Group())
            if isinstance(kind, layout.RecoveryKey):
                group.runs.append(info)
            elif info.size == 0:
                group.fences.append(info)
            else:
                group.segments.append(info)
    for info, key in others:
        if info.key in live.sstables:
            reasons[info.key] = Reason.KEEP_REFERENCED
        elif info.key in pinned or key.table_id in pinned_tables:
            reasons[info.key] = Reason.KEEP_SNAPSHOT
        elif info.key in backed_up or pin_everything:
            reasons[info.key] = Reason.KEEP_BACKUP
        elif info.key in loaded or key.table_id in loaded_tables:
            reasons[info.key] = Reason.KEEP_HISTORY_LOAD
        else:
            reasons[info.key] = _aged(info, now, grace, Reason.DELETE_UNREFERENCED_SSTABLE)
    for ref, group in groups.items():
        reasons.update(_log_reasons(live, ref, group, now, grace, fence_grace))
    for scratch in restores.values():
        young = now - max(o.last_modified for o in scratch) < grace
        verdict = Reason.KEEP_YOUNG if young else Reason.DELETE_RESTORE_SORT
        reasons.update({o.key: verdict for o in scratch})
    newest_state = max(states.values(), default=0)
    for state_key, version in states.items():
        current = version == newest_state
        reasons[state_key] = (
            Reason.KEEP_COLLECTOR_STATE if current else Reason.DELETE_OLD_COLLECTOR_STATE
        )
    held = {} if since is None else _apply_since(listed, reasons, groups, now, grace, since)
    return _finish(listed, reasons, held)


_Parsed = (
    layout.SSTableKey
    | layout.LogSegmentKey
    | layout.RecoveryKey
    | layout.SnapshotKey
    | layout.BackupKey
    | layout.LoadPartKey
    | int  # a version of the collector's state
)


def _classify(key: str) -> _Parsed | None:
    """The parsed key, or None when no layout parser accepts it."""
    try:
        if key.startswith(layout.TABLES):
            return layout.parse_sstable_key(key)
        if key.startswith(layout.LOGS):
            return layout.parse_log_segment_key(key)
        if key.startswith((layout.RECOVERY, layout.RESTORES)):
            return layout.parse_recovery_key(key)
        if key.startswith(layout.SNAPSHOTS):
            return layout.parse_snapshot_key(key)
        if key.startswith(layout.BACKUPS):
            return layout.parse_backup_key(key)
        if key.startswith(layout.LOADS):
            return layout.parse_load_part_key(key)
        if key.startswith(layout.GC):
            return layout.parse_gc_state_key(key)
    except InvalidArgument:
        return None
    return None


def _aged(info: ObjectInfo, now: float, grace: float, verdict: Reason) -> Reason:
    """``verdict`` if the object is older than ``grace``, else KEEP_YOUNG."""
    return verdict if now - info.last_modified >= grace else Reason.KEEP_YOUNG


def _snapshot_reason(
    live: LiveSet, info: ObjectInfo, key: layout.SnapshotKey, now: float, grace: float
) -> Reason:
    expires = live.snapshot_expiry.get(info.key)
    if expires is not None and now >= expires:
        return Reason.DELETE_EXPIRED_SNAPSHOT
    if key.table_id in live.tables:
        return Reason.KEEP_LIVE_TABLE_SNAPSHOT
    return _aged(info, now, grace, Reason.DELETE_DELETED_TABLE_SNAPSHOT)


def _log_reasons(
    live: LiveSet, ref: LogRef, group: _Group, now: float, grace: float, fence_grace: float
) -> dict[str, Reason]:
    """One verdict for a whole commit log (rule 3), fences held longer (rule 4)."""
    needed = live.log_reason(ref)
    members = (*group.segments, *group.fences, *group.runs)
    if needed is not None:
        out = {o.key: needed for o in members}
        floor = live.log_floors.get(ref)
        if floor is not None and not group.fences:
            out.update(_trim(group.segments, floor, now, max(grace, live.history), grace))
        return out
    if now - group.newest() < grace:
        return {o.key: Reason.KEEP_YOUNG for o in members}
    if now - group.newest() < live.history:
        return {o.key: Reason.KEEP_HISTORY for o in members}
    out = {o.key: Reason.DELETE_FINISHED_LOG for o in group.segments}
    out.update({o.key: Reason.DELETE_FINISHED_RECOVERY for o in group.runs})
    for o in group.fences:
        young = now - o.last_modified < fence_grace
        out[o.key] = Reason.KEEP_FENCE if young else Reason.DELETE_FINISHED_LOG
    return out


def _trim(
    segments: Sequence[ObjectInfo], floor: int, now: float, keep_for: float, grace: float
) -> dict[str, Reason]:
    """Rule 3a: the live log's segments below ``floor`` and below its newest segment, from its
    first on, up to the first one younger than ``keep_for`` (the grace period or the history
    retention), which stops the trim and keeps the rest: the log stays whole from where it
    starts."""
    ordered = sorted(segments, key=lambda o: _segment_number(o.key))
    if not ordered:
        return {}
    cut = min(floor, _segment_number(ordered[-1].key))
    out: dict[str, Reason] = {}
    for o in ordered:
        if _segment_number(o.key) >= cut:
            break
        age = now - o.last_modified
        if age < keep_for:
            stop = Reason.KEEP_YOUNG if age < grace else Reason.KEEP_HISTORY
            for rest in ordered[ordered.index(o) :]:
                if _segment_number(rest.key) >= cut:
                    break
                out[rest.key] = stop
            break
        out[o.key] = Reason.DELETE_TRIMMED_LOG
    return out


def _segment_number(key: str) -> int:
    return layout.parse_log_segment_key(key).seq


def _apply_since(
    listed: Sequence[ObjectInfo],
    reasons: dict[str, Reason],
    groups: Mapping[LogRef, _Group],
    now: float,
    grace: float,
    since: Mapping[str, float],
) -> dict[str, float]:
    """Hold every deletable object until it has been seen deletable for ``grace`` (the
    dereference grace); return when each still-held object was first seen deletable."""
    trimmed = {k for k, r in reasons.items() if r is Reason.DELETE_TRIMMED_LOG}
    held: dict[str, float] = {}
    for info in listed:
        if reasons[info.key].deletes:
            first = since.get(info.key, now)
            if now - first < grace:
                held[info.key] = first
                reasons[info.key] = Reason.KEEP_RECENTLY_UNREFERENCED
    for group in groups.values():
        members = (*group.segments, *group.fences, *group.runs)
        if not any(o.key in held for o in members):
            continue
        if any(o.key in trimmed for o in group.segments):
            # A live log is trimmed as a prefix: from the first segment held on, all are.
            low = min(_segment_number(o.key) for o in group.segments if o.key in held)
            hold = [o for o in group.segments if _segment_number(o.key) >= low]
        else:
            # A finished log's segments go together: if any is held, all are (a log is
            # never left with a gap that recovery would stop at).
            hold = list(members)
        for o in hold:
            if reasons[o.key].deletes:
                held[o.key] = since.get(o.key, now)
                reasons[o.key] = Reason.KEEP_RECENTLY_UNREFERENCED
    return held


def _finish(
    listed: Sequence[ObjectInfo], reasons: dict[str, Reason], since: dict[str, float]
) -> GcPlan:
    delete = tuple(o.key for o in listed if reasons[o.key].deletes)
    sizes = {o.key: o.size for o in listed}
    per_reason: Counter[Reason] = Counter()
    for o in listed:
        per_reason[reasons[o.key]] += o.size
    return GcPlan(
        delete=delete,
        delete_bytes=sum(sizes[k] for k in delete),
        counts=dict(Counter(reasons[o.key] for o in listed)),
        unknown=tuple(o.key for o in listed if reasons[o.key] is Reason.KEEP_UNKNOWN),
        since=since,
        reasons=reasons,
        bytes=dict(per_reason),
    )
