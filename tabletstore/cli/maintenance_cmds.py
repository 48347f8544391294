"""The maintenance verbs: compactions (§5.4) and one garbage collection (§5.2)::

    tabletstore flush T | compact T                    minor / major compaction (§5.4)
    tabletstore gc [--grace S] [--dry-run]             delete unreferenced objects (§5.2)
    tabletstore verify [TABLE] [--deep] [--json]       is the bucket whole? (exit 3 if not)
    tabletstore verify --backup ID [--at LOCATION] [--json]   is a backup whole?

On a terminal flush and compact show a progress bar on stderr.
"""

from __future__ import annotations

import asyncio
import json

import click

from tabletstore.cli.context import (
    TABLE_ARG,
    Failure,
    cli_context,
    on_cluster,
    plural,
    with_database,
)
from tabletstore.cli.progress import Unit, progress_bar
from tabletstore.client.client import CompactionProgress
from tabletstore.clock import SystemClock, wall_time
from tabletstore.embedded import SyncDatabase
from tabletstore.errors import TabletStoreError
from tabletstore.master.gc import collect
from tabletstore.master.gc_plan import DEFAULT_GRACE
from tabletstore.master.verify import verify, verify_backup
from tabletstore.master.verify_plan import VerifyReport
from tabletstore.storage_s3 import open_store

__all__ = ["FINDINGS_EXIT", "compact_cmd", "flush_cmd", "gc_cmd", "verify_cmd"]


@click.command("flush")
@TABLE_ARG
def flush_cmd(table: str) -> None:
    """Minor-compact every tablet of a table (memtables to SSTables, §5.4)."""
    with_database(lambda db: _compact(db, table, major=False))


@click.command("compact")
@TABLE_ARG
def compact_cmd(table: str) -> None:
    """Major-compact every tablet of a table (one SSTable, deletions dropped, §5.4)."""
    with_database(lambda db: _compact(db, table, major=True))


def _compact(db: SyncDatabase, table: str, *, major: bool) -> None:
    """Compact tablet by tablet with a bar: tablets for a flush; for a major compaction the
    SSTable bytes it reads and rewrites."""
    unit: Unit = "bytes" if major else "tablets"
    with progress_bar("compacting" if major else "flushing", unit=unit) as bar:

        def show(p: CompactionProgress) -> None:
            if major:
                bar.update(completed=p.bytes_done, total=max(p.bytes_total, p.bytes_done))
            else:
                bar.update(completed=p.tablets_done, total=max(p.tablets_total, p.tablets_done))
            bar.update(note=f"{p.tablets_done}/{p.tablets_total} tablets")

        db.compact_tablets(table, major=major, progress=show)


@click.command("gc")
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=DEFAULT_GRACE,
    show_default=True,
    help="Never delete an object younger than this many seconds.",
)
@click.option("--dry-run", is_flag=True, help="Only report what would be deleted.")
def gc_cmd(grace: float, dry_run: bool) -> None:
    """Delete objects nothing references: compacted-away SSTables, deleted tables' objects,
    commit logs no tablet needs (the master's garbage collection, §5.2, run once)."""
    if cli_context().url.startswith("etcd://"):
        report = on_cluster(
            lambda store, catalog, coordinator: collect(
                store, catalog, coordinator, clock=SystemClock(), grace=grace, dry_run=dry_run
            )
        )
    else:
        report = with_database(lambda db: db.gc(grace=grace, dry_run=dry_run))
    click.echo(report.summary())
    for reason, count in sorted(report.counts.items(), key=lambda rc: rc[0].name):
        size = report.bytes.get(reason, 0)
        click.echo(f"  {plural(count, 'object')} ({size} bytes): {reason.value}")
    for key in report.unknown:
        click.echo(f"  unrecognized: {key}")


#: Exit status of ``verify`` when it found damage (1 is "could not verify", 2 a usage error).
FINDINGS_EXIT = 3


@click.command("verify")
@click.argument("table", required=False)
@click.option("--deep", is_flag=True, help="Read every needed log segment whole (checksums).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--backup",
    "backup_id",
    default=None,
    metavar="ID",
    help="Verify this backup instead: it is ready and unexpired, and every SSTable its "
    "manifest names exists with its recorded size and checksum.",
)
@click.option(
    "--at",
    "location",
    default=None,
    metavar="LOCATION",
    help="Where the --backup is (s3://bucket/prefix, file:///dir); default: this database's "
    "bucket.",
)
def verify_cmd(
    table: str | None, deep: bool, as_json: bool, backup_id: str | None, location: str | None
) -> None:
    """Check that the bucket is whole: every object METADATA, the snapshots and the bulk-load
    parts reference exists with its recorded size, the tablets tile each table, each log a
    tablet needs has no missing or damaged segment. Lists orphans (left to gc). With --backup
    ID, check that backup: ready, not expired, and its objects (sizes, and the checksums a
    copied backup records). Exit 0 when whole, 3 with a report of the damage, 1 when it could
    not verify."""
    if backup_id is not None and table is not None:
        raise Failure(f"give TABLE or --backup ID, not both (got {table} and --backup {backup_id})")
    if location is not None and backup_id is None:
        raise Failure("--at names where a backup is: give --backup ID with it")
    if backup_id is not None:
        report = _verify_backup(backup_id, location)
    elif cli_context().url.startswith("etcd://"):
        report = on_cluster(
            lambda store, catalog, coordinator: verify(
                store, catalog, coordinator, clock=SystemClock(), table=table, deep=deep
            )
        )
    else:
        report = with_database(lambda db: db.verify(table, deep=deep))
    if as_json:
        click.echo(json.dumps(_report_json(report)))
    else:
        for line in report.lines():
            click.echo(line)
    if not report.ok:
        click.get_current_context().exit(FINDINGS_EXIT)


def _verify_backup(backup_id: str, location: str | None) -> VerifyReport:
    """``verify --backup``: in ``location`` (opened with this process's credentials, as the
    backup verbs do; no database is opened), or in the database's own bucket."""
    if location is not None:

        async def at_location() -> VerifyReport:
            store = open_store(location)
            try:
                return await verify_backup(store, backup_id, now=wall_time())
            finally:
                await store.close()

        try:
            return asyncio.run(at_location())
        except TabletStoreError as exc:
            raise Failure(str(exc)) from exc
    if cli_context().url.startswith("etcd://"):
        return on_cluster(
            lambda store, _catalog, _coordinator: verify_backup(store, backup_id, now=wall_time())
        )
    return with_database(lambda db: db.verify_backup(backup_id))


def _report_json(report: VerifyReport) -> dict[str, object]:
    return {
        "ok": report.ok,
        "findings": [
            {"kind": f.kind.name.lower(), "subject": f.subject, "detail": f.detail}
            for f in report.findings
        ],
        "orphans": list(report.orphans),
        "orphan_bytes": report.orphan_bytes,
        "tables": report.tables,
        "tablets": report.tablets,
        "objects_checked": report.objects_checked,
        "segments_checked": report.segments_checked,
    }
