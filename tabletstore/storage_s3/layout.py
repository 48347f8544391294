"""Every object key in the bucket, in one module (docs/architecture/design.md §3).

Bigtable keeps SSTables and commit logs as GFS files (§4, §5.3); tabletstore keeps them as
immutable objects. Keys here are relative to the store's root (the bucket plus the prefix in
the store URL), so they never include that prefix::

    tables/<table-id>/<tablet-id>/<locality-group>/<sstable-id>.parquet
    tables/<table-id>/bulk/<locality-group>/<sstable-id>.parquet   (staged bulk-load files)
    logs/<worker-id>/<incarnation:020d>/<sequence:020d>.log
    recovery/<worker-id>/<incarnation:020d>/plan.json
    recovery/<worker-id>/<incarnation:020d>/<segment:020d>/done.json
    recovery/<worker-id>/<incarnation:020d>/<segment:020d>/<table-id>/<tablet-id>.run
    restores/<restore-id>/<worker-id>/<incarnation:020d>/...   (a restore's sorted log, as above)
    snapshots/<table-id>/<snapshot-id>.json
    backups/<backup-id>/<version:020d>.json            (a backup manifest, one object a version)
    loads/<table-id>/<part-id>.json                     (a bulk load's part, for history)
    gc/since/<version:020d>.json.gz                     (the master's collector's memory)
    staging/<principal>/<load-name>/...                (a principal's bulk-load input)
    probes/conditional-create/<nonce>                  (deleted at once; see below)

Numbers are zero-padded to 20 digits (enough for any unsigned 64-bit value), so listing a prefix
returns log segments, incarnations and recovery runs in numeric order: recovery lists a dead
worker's segments and fences it by creating the next number (docs/architecture/design.md §6).

Under ``recovery/`` (the sorted log, §6 and docs/architecture/design.md §7; formats in
``commitlog.runs``) a fenced log has one sort plan, and each sort task (named by its first segment)
one manifest, written last, and one run per tablet it found records of. The tablet's table id is
part of a run's key because tablet ids are unique only within their table.

Under ``restores/<restore-id>/`` a point-in-time restore (``master/pitr_restore.py``) sorts the
retained log with the same executors and the same keys below that root (its **scope**): a
restore reads segments of logs still being written or already recovered, so its plans and runs
never share a key with a recovery's. The restore deletes its scope when it ends; garbage
collection deletes a scope left by a restore that died (``master/gc_plan.py``).

Identifier components (table, tablet, locality group, SSTable, worker, snapshot ids) are
validated by :func:`check_component`: non-empty, at most 200 characters, no ``/``, no control
characters, not ``.`` or ``..``. Every builder has a parser that inverts it exactly; a key that
does not match raises :class:`~tabletstore.errors.InvalidArgument` naming the key.

A backup's manifest (``metadata/backup.py``) is rewritten (its state, its expiry) by creating
the next version, never by overwriting: a create-only PUT of version ``n + 1`` is a
compare-and-swap, and the newest version is the manifest. The same keys serve a backup
location outside any database (``s3://other-bucket/prefix``): its ``backups/`` and the
``tables/`` keys of the SSTables its backups name.

``staging/`` is where a principal puts the files of a bulk load (``batch.load_files``): the
master reads a load's input only from ``staging/<the caller>/<load-name>/`` of this bucket,
never from a location the caller names. A principal's name becomes one key component with
``/``, ``%`` and control characters percent-encoded. Garbage collection leaves ``staging/``
alone: the files are their writer's to delete (or a bucket lifecycle rule's).

``gc/since/`` holds the master's garbage collector's memory (``master/gc_state.py``): when it
first found each held object deletable, so that a new leader goes on from where the last one
stopped instead of waiting a whole grace period again. Each save creates the next version;
the newest version is the state, and the older ones are deleted by the master that wrote the
next.

``probes/`` holds the object an S3 store creates twice when it is opened, to check that the
server honours create-only PUTs (``storage_s3/s3.py``); it is deleted right after, and a
process that dies in between leaves one small object there that garbage collection keeps (it
is no layout key) and the Terraform bucket's lifecycle rule expires after a day.
"""

from __future__ import annotations

from typing import NamedTuple

from tabletstore.errors import InvalidArgument
from tabletstore.storage_s3.base import object_url

__all__ = [
    "BACKUPS",
    "GC",
    "LOADS",
    "LOGS",
    "PROBES",
    "RECOVERY",
    "RESTORES",
    "SNAPSHOTS",
    "STAGING",
    "TABLES",
    "BackupKey",
    "LoadPartKey",
    "LogSegmentKey",
    "RecoveryKey",
    "RecoveryRunKey",
    "SSTableKey",
    "SnapshotKey",
    "backup_key",
    "backup_prefix",
    "check_component",
    "conditional_create_probe_key",
    "gc_state_key",
    "gc_state_prefix",
    "load_part_key",
    "load_part_prefix",
    "log_prefix",
    "log_segment_key",
    "parse_backup_key",
    "parse_gc_state_key",
    "parse_load_part_key",
    "parse_log_segment_key",
    "parse_recovery_key",
    "parse_recovery_run_key",
    "parse_snapshot_key",
    "parse_sstable_key",
    "recovery_manifest_key",
    "recovery_plan_key",
    "recovery_prefix",
    "recovery_run_key",
    "restore_scope_prefix",
    "snapshot_key",
    "snapshot_prefix",
    "sstable_key",
    "staging_prefix",
    "staging_url",
    "tables_prefix",
]

TABLES = "tables/"
LOGS = "logs/"
RECOVERY = "recovery/"
RESTORES = "restores/"
SNAPSHOTS = "snapshots/"
BACKUPS = "backups/"
LOADS = "loads/"
GC = "gc/"
PROBES = "probes/"
STAGING = "staging/"

_SSTABLE_SUFFIX = ".parquet"
_LOG_SUFFIX = ".log"
_RUN_SUFFIX = ".run"
_SNAPSHOT_SUFFIX = ".json"
_GC_STATE_SUFFIX = ".json.gz"
_GC_STATE = f"{GC}since/"
_MAX_COMPONENT = 200
_NUMBER_WIDTH = 20
_MAX_NUMBER = 10**_NUMBER_WIDTH - 1


class SSTableKey(NamedTuple):
    table_id: str
    tablet_id: str
    locality_group: str
    sstable_id: str


class LogSegmentKey(NamedTuple):
    worker_id: str
    incarnation: int
    seq: int


class RecoveryRunKey(NamedTuple):
    worker_id: str
    incarnation: int
    segment: int
    table_id: str
    tablet_id: str
    #: The restore whose sorted log it is (``restores/<scope>/``); None: ``recovery/``.
    scope: str | None = None


class RecoveryKey(NamedTuple):
    """Any object of a sorted log, under ``recovery/`` or a restore's ``restores/<id>/``: a
    plan, a task manifest or a run."""

    worker_id: str
    incarnation: int
    #: "plan", "manifest" or "run".
    kind: str
    #: The task's first segment (None for a plan).
    segment: int | None = None
    table_id: str | None = None
    tablet_id: str | None = None
    #: The restore whose sorted log it is; None: a recovery's (``recovery/``).
    scope: str | None = None


class SnapshotKey(NamedTuple):
    table_id: str
    snapshot_id: str


class LoadPartKey(NamedTuple):
    table_id: str
    part_id: str


class BackupKey(NamedTuple):
    backup_id: str
    version: int


def check_component(what: str, value: str) -> str:
    """Return ``value`` if it can be one ``/``-separated part of a key; else InvalidArgument."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > _MAX_COMPONENT:
        raise InvalidArgument(f"{what} is longer than {_MAX_COMPONENT} characters: {value!r}")
    if "/" in value or value in (".", ".."):
        raise InvalidArgument(f"{what} may not contain '/' or be '.' or '..': {value!r}")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise InvalidArgument(f"{what} may not contain control characters: {value!r}")
    return value


def _number(what: str, value: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_NUMBER:
        raise InvalidArgument(f"{what} must be an integer in [0, {_MAX_NUMBER}], got {value!r}")
    return f"{value:0{_NUMBER_WIDTH}d}"


def _parse_number(what: str, text: str, key: str) -> int:
    if len(text) != _NUMBER_WIDTH or not text.isascii() or not text.isdigit():
        raise InvalidArgument(f"{what} in object key {key!r} is not a {_NUMBER_WIDTH}-digit number")
    return int(text)


def _split(key: str, root: str, parts: int, suffix: str, kind: str) -> list[str]:
    """The ``parts`` components of ``key`` after ``root``, the last stripped of ``suffix``."""
    if not key.startswith(root) or not key.endswith(suffix):
        raise InvalidArgument(f"object key {key!r} is not a {kind} key")
    components = key[len(root) : len(key) - len(suffix)].split("/")
    if len(components) != parts:
        raise InvalidArgument(f"object key {key!r} is not a {kind} key")
    return components


def conditional_create_probe_key(nonce: str) -> str:
    """``probes/conditional-create/<nonce>``: the S3 store's open-time fencing probe."""
    return f"{PROBES}conditional-create/{check_component('probe nonce', nonce)}"


# Bulk-load staging ---------------------------------------------------------------------------


def _principal_component(principal: str) -> str:
    """``principal`` as one key component: ``%``, ``/`` and control characters %-encoded."""
    if not isinstance(principal, str) or not principal:
        raise InvalidArgument(f"principal must be a non-empty string, got {principal!r}")
    out = "".join(
        f"%{ord(ch):02X}" if ch in "%/" or ord(ch) < 0x20 or ord(ch) == 0x7F else ch
        for ch in principal
    )
    if out in (".", ".."):
        out = out.replace(".", "%2E")
    return check_component("principal", out)


def staging_prefix(principal: str, load_name: str | None = None) -> str:
    """``staging/<principal>/`` or ``staging/<principal>/<load-name>/``: where ``principal``
    puts the files of its bulk loads."""
    prefix = f"{STAGING}{_principal_component(principal)}/"
    if load_name is None:
        return prefix
    return f"{prefix}{check_component('bulk-load name', load_name)}/"


def staging_url(store_url: str, principal: str, load_name: str) -> str:
    """The URL a job writes the files of load ``load_name`` of ``principal`` to, in the store
    opened from ``store_url`` (the database's bucket)."""
    return object_url(store_url, staging_prefix(principal, load_name).rstrip("/"))


# SSTables ------------------------------------------------------------------------------------


def tables_prefix(table_id: str | None = None, tablet_id: str | None = None) -> str:
    """``tables/``, ``tables/<table>/`` or ``tables/<table>/<tablet>/`` (for listing and GC)."""
    if table_id is None:
        if tablet_id is not None:
            raise InvalidArgument("tables_prefix: a tablet_id needs its table_id")
        return TABLES
    prefix = f"{TABLES}{check_component('table id', table_id)}/"
    if tablet_id is None:
        return prefix
    return f"{prefix}{check_component('tablet id', tablet_id)}/"


def sstable_key(table_id: str, tablet_id: str, locality_group: str, sstable_id: str) -> str:
    """Where one SSTable of one locality group of one tablet lives."""
    return (
        f"{tables_prefix(table_id, tablet_id)}"
        f"{check_component('locality group', locality_group)}/"
        f"{check_component('sstable id', sstable_id)}{_SSTABLE_SUFFIX}"
    )


def parse_sstable_key(key: str) -> SSTableKey:
    """The inverse of :func:`sstable_key`."""
    table_id, tablet_id, group, sstable_id = _split(key, TABLES, 4, _SSTABLE_SUFFIX, "SSTable")
    parsed = SSTableKey(table_id, tablet_id, group, sstable_id)
    if sstable_key(*parsed) != key:
        raise InvalidArgument(f"object key {key!r} is not a valid SSTable key")
    return parsed


# Commit log ----------------------------------------------------------------------------------


def log_prefix(worker_id: str | None = None, incarnation: int | None = None) -> str:
    """``logs/``, ``logs/<worker>/`` or ``logs/<worker>/<incarnation>/``.

    Listing ``log_prefix(worker, incarnation)`` returns that incarnation's segments in
    sequence order.
    """
    if worker_id is None:
        if incarnation is not None:
            raise InvalidArgument("log_prefix: an incarnation needs its worker_id")
        return LOGS
    prefix = f"{LOGS}{check_component('worker id', worker_id)}/"
    if incarnation is None:
        return prefix
    return f"{prefix}{_number('incarnation', incarnation)}/"


def log_segment_key(worker_id: str, incarnation: int, seq: int) -> str:
    """Where segment ``seq`` of one worker incarnation's commit log lives."""
    return f"{log_prefix(worker_id, incarnation)}{_number('log sequence', seq)}{_LOG_SUFFIX}"


def parse_log_segment_key(key: str) -> LogSegmentKey:
    """The inverse of :func:`log_segment_key`."""
    worker_id, incarnation, seq = _split(key, LOGS, 3, _LOG_SUFFIX, "log segment")
    check_component("worker id", worker_id)
    return LogSegmentKey(
        worker_id,
        _parse_number("incarnation", incarnation, key),
        _parse_number("log sequence", seq, key),
    )


# Recovery runs (the sorted per-tablet pieces of a dead worker's log, §6) --------------------


def restore_scope_prefix(scope: str) -> str:
    """``restores/<scope>/``: everything one point-in-time restore sorted."""
    return f"{RESTORES}{check_component('restore id', scope)}/"


def _sorted_root(scope: str | None) -> str:
    return RECOVERY if scope is None else restore_scope_prefix(scope)


def recovery_prefix(
    worker_id: str, incarnation: int, segment: int | None = None, scope: str | None = None
) -> str:
    """``recovery/<worker>/<incarnation>/`` or, with ``segment``, that segment's folder; with
    ``scope``, the same under ``restores/<scope>/`` (a restore's sorted log)."""
    prefix = (
        f"{_sorted_root(scope)}{check_component('worker id', worker_id)}/"
        f"{_number('incarnation', incarnation)}/"
    )
    if segment is None:
        return prefix
    return f"{prefix}{_number('log segment', segment)}/"


_PLAN_NAME = "plan.json"
_MANIFEST_NAME = "done.json"


def recovery_plan_key(worker_id: str, incarnation: int, scope: str | None = None) -> str:
    """Where the sort plan of one worker incarnation's fenced log lives (``scope``: of the
    part of the log a restore sorts)."""
    return f"{recovery_prefix(worker_id, incarnation, scope=scope)}{_PLAN_NAME}"


def recovery_manifest_key(
    worker_id: str, incarnation: int, segment: int, scope: str | None = None
) -> str:
    """Where the manifest of the sort task starting at log segment ``segment`` lives."""
    return f"{recovery_prefix(worker_id, incarnation, segment, scope)}{_MANIFEST_NAME}"


def recovery_run_key(
    worker_id: str,
    incarnation: int,
    segment: int,
    table_id: str,
    tablet_id: str,
    scope: str | None = None,
) -> str:
    """Where the sort task starting at log segment ``segment`` writes one tablet's records."""
    return (
        f"{recovery_prefix(worker_id, incarnation, segment, scope)}"
        f"{check_component('table id', table_id)}/"
        f"{check_component('tablet id', tablet_id)}{_RUN_SUFFIX}"
    )


def _scope_of(key: str) -> tuple[str, str | None]:
    """The root a sorted-log key is under and its scope (None: ``recovery/``)."""
    if key.startswith(RESTORES):
        scope = key[len(RESTORES) :].split("/", 1)[0]
        return restore_scope_prefix(scope), scope
    return RECOVERY, None


def parse_recovery_run_key(key: str) -> RecoveryRunKey:
    """The inverse of :func:`recovery_run_key`."""
    root, scope = _scope_of(key)
    worker_id, incarnation, segment, table_id, tablet_id = _split(
        key, root, 5, _RUN_SUFFIX, "recovery run"
    )
    parsed = RecoveryRunKey(
        worker_id,
        _parse_number("incarnation", incarnation, key),
        _parse_number("log segment", segment, key),
        table_id,
        tablet_id,
        scope,
    )
    if recovery_run_key(*parsed) != key:
        raise InvalidArgument(f"object key {key!r} is not a valid recovery run key")
    return parsed


def parse_recovery_key(key: str) -> RecoveryKey:
    """Any key of a sorted log, under ``recovery/`` or ``restores/<scope>/`` (plan, manifest
    or run); InvalidArgument for anything else."""
    root, scope = _scope_of(key)
    if key.endswith(_RUN_SUFFIX):
        run = parse_recovery_run_key(key)
        return RecoveryKey(
            run.worker_id,
            run.incarnation,
            "run",
            run.segment,
            run.table_id,
            run.tablet_id,
            run.scope,
        )
    if key.endswith("/" + _PLAN_NAME):
        worker_id, incarnation, _ = _split(key, root, 3, "", "recovery plan")
        parsed = RecoveryKey(
            worker_id, _parse_number("incarnation", incarnation, key), "plan", scope=scope
        )
        if recovery_plan_key(parsed.worker_id, parsed.incarnation, scope) != key:
            raise InvalidArgument(f"object key {key!r} is not a valid recovery plan key")
        return parsed
    if key.endswith("/" + _MANIFEST_NAME):
        worker_id, incarnation, segment, _ = _split(key, root, 4, "", "sort manifest")
        parsed = RecoveryKey(
            worker_id,
            _parse_number("incarnation", incarnation, key),
            "manifest",
            _parse_number("log segment", segment, key),
            scope=scope,
        )
        assert parsed.segment is not None
        if (
            recovery_manifest_key(parsed.worker_id, parsed.incarnation, parsed.segment, scope)
            != key
        ):
            raise InvalidArgument(f"object key {key!r} is not a valid sort manifest key")
        return parsed
    raise InvalidArgument(f"object key {key!r} is not a recovery key")


# Snapshot manifests (for batch jobs) ---------------------------------------------------------


def snapshot_prefix(table_id: str | None = None) -> str:
    """``snapshots/`` or ``snapshots/<table>/``."""
    if table_id is None:
        return SNAPSHOTS
    return f"{SNAPSHOTS}{check_component('table id', table_id)}/"


def snapshot_key(table_id: str, snapshot_id: str) -> str:
    """Where a snapshot manifest of one table lives."""
    return f"{snapshot_prefix(table_id)}{check_component('snapshot id', snapshot_id)}{_SNAPSHOT_SUFFIX}"


def load_part_prefix(table_id: str | None = None) -> str:
    """``loads/`` or ``loads/<table>/``: the parts of bulk loads (metadata/load_part.py)."""
    if table_id is None:
        return LOADS
    return f"{LOADS}{check_component('table id', table_id)}/"


def load_part_key(table_id: str, part_id: str) -> str:
    """Where one tablet's part of a bulk load into a table is recorded."""
    return f"{load_part_prefix(table_id)}{check_component('part id', part_id)}{_SNAPSHOT_SUFFIX}"


def parse_load_part_key(key: str) -> LoadPartKey:
    """The inverse of :func:`load_part_key`."""
    table_id, part_id = _split(key, LOADS, 2, _SNAPSHOT_SUFFIX, "bulk load part")
    parsed = LoadPartKey(table_id, part_id)
    if load_part_key(*parsed) != key:
        raise InvalidArgument(f"object key {key!r} is not a valid bulk load part key")
    return parsed


def parse_snapshot_key(key: str) -> SnapshotKey:
    """The inverse of :func:`snapshot_key`."""
    table_id, snapshot_id = _split(key, SNAPSHOTS, 2, _SNAPSHOT_SUFFIX, "snapshot")
    parsed = SnapshotKey(table_id, snapshot_id)
    if snapshot_key(*parsed) != key:
        raise InvalidArgument(f"object key {key!r} is not a valid snapshot key")
    return parsed


# Backup manifests ----------------------------------------------------------------------------


def backup_prefix(backup_id: str | None = None) -> str:
    """``backups/`` or ``backups/<backup>/`` (every version of one backup's manifest)."""
    if backup_id is None:
        return BACKUPS
    return f"{BACKUPS}{check_component('backup id', backup_id)}/"


def backup_key(backup_id: str, version: int) -> str:
    """Where version ``version`` of a backup's manifest lives."""
    return (
        f"{backup_prefix(backup_id)}{_number('backup manifest version', version)}{_SNAPSHOT_SUFFIX}"
    )


def parse_backup_key(key: str) -> BackupKey:
    """The inverse of :func:`backup_key`."""
    backup_id, version = _split(key, BACKUPS, 2, _SNAPSHOT_SUFFIX, "backup manifest")
    parsed = BackupKey(backup_id, _parse_number("backup manifest version", version, key))
    if backup_key(*parsed) != key:
        raise InvalidArgument(f"object key {key!r} is not a valid backup manifest key")
    return parsed


# The garbage collector's memory --------------------------------------------------------------


def gc_state_prefix() -> str:
    """``gc/since/``: every saved version of the master's collector state."""
    return _GC_STATE


def gc_state_key(version: int) -> str:
    """Where version ``version`` of the master's collector state lives (master/gc_state.py)."""
    return f"{_GC_STATE}{_number('collector state version', version)}{_GC_STATE_SUFFIX}"


def parse_gc_state_key(key: str) -> int:
    """The inverse of :func:`gc_state_key`: the version."""
    (version,) = _split(key, _GC_STATE, 1, _GC_STATE_SUFFIX, "collector state")
    return _parse_number("collector state version", version, key)
