"""The verbs of backups, restores and zero-copy clones (docs/operations/backups.md)::

    tabletstore backup create T [--id ID] [--to s3://other-bucket/prefix] [--expire 7d]
    tabletstore backup list [T] [--at LOCATION]
    tabletstore backup describe ID [--at LOCATION]
    tabletstore backup update ID (--expire 30d | --never) [--at LOCATION]
    tabletstore backup delete ID [--at LOCATION]
    tabletstore backup copy ID --to LOCATION [--id NEW-ID] [--at LOCATION] [--expire D]
    tabletstore restore --backup ID NEW_TABLE [--from LOCATION] [--url OTHER_DATABASE]
    tabletstore clone T NEW_TABLE [--as-of INSTANT]

``--at``/``--from`` name a backup location (``s3://bucket/prefix``, ``file:///dir``) or
another database's store URL; without them a backup is in this database's bucket.
``restore --url`` restores into another database (from this one's bucket unless ``--from``).

``restore`` is the one verb for every kind of restore: :func:`restore_cmd` takes the
source as an option (``--backup``) and the table names as a variadic argument, and
dispatches on the option given, so a source that also names the table it reads (a
point-in-time restore's ``restore TABLE --as-of INSTANT NEW_TABLE``) is one more option and
one more branch, checking its own count of names.
"""

from __future__ import annotations

import time

import click

from tabletstore.cli import cbtsyntax as cbt
from tabletstore.cli.context import TABLE_ARG, Failure, failing, plural, with_database
from tabletstore.cli.history_cmds import restore_at
from tabletstore.clock import monotonic, wall_time
from tabletstore.metadata.backup import BackupManifest

__all__ = ["backup_group", "clone_cmd", "restore_cmd"]

_AT = click.option(
    "--at",
    "location",
    default=None,
    metavar="LOCATION",
    help="The backup location (s3://bucket/prefix, file:///dir) to act on; default: this "
    "database's bucket.",
)


def _when(t: float | None, never: str = "never") -> str:
    return never if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _expiry(text: str | None) -> float | None:
    """``--expire D`` as an instant (now + D); None without it."""
    if text is None:
        return None
    return wall_time() + failing(lambda: cbt.parse_duration(text))


def _line(m: BackupManifest) -> str:
    return (
        f"{m.backup_id}\t{m.table}\t{_when(m.created_at)}\t{m.state}\t"
        f"expires {_when(m.expires_at)}\t{m.size_bytes} bytes"
    )


@click.group("backup")
def backup_group() -> None:
    """Backups of tables: kept in the database's bucket, or copied to another location."""


@backup_group.command("create")
@TABLE_ARG
@click.option("--id", "backup_id", default=None, help="The backup's id (default: a fresh one).")
@click.option(
    "--to",
    default=None,
    metavar="LOCATION",
    help="Copy it to this location (s3://other-bucket/prefix) and keep it only there: it "
    "restores from there alone.",
)
@click.option("--expire", default=None, help="Expire after D (e.g. 7d): GC frees it then.")
def backup_create_cmd(
    table: str, backup_id: str | None, to: str | None, expire: str | None
) -> None:
    """Back up TABLE as of now; prints the backup's id."""
    expires_at = _expiry(expire)
    m = with_database(lambda db: db.create_backup(table, backup_id, expires_at=expires_at, to=to))
    click.echo(m.backup_id)
    where = f" in {to}" if to else ""
    click.echo(
        f"  table {m.table}: {plural(len(m.tablets), 'tablet')}, {m.size_bytes} bytes{where}, "
        f"expires {_when(m.expires_at)}",
        err=True,
    )


@backup_group.command("list")
@click.argument("table", required=False)
@_AT
def backup_list_cmd(table: str | None, location: str | None) -> None:
    """List backups (of TABLE, or of every table, deleted ones included), oldest first."""
    for m in with_database(lambda db: db.list_backups(table, location=location)):
        click.echo(_line(m))


@backup_group.command("describe")
@click.argument("backup_id")
@_AT
def backup_describe_cmd(backup_id: str, location: str | None) -> None:
    """Show a backup: its table, cut, state, expiry, size, tablets and SSTables."""
    m = with_database(lambda db: db.get_backup(backup_id, location=location))
    click.echo(f"backup      {m.backup_id} (manifest version {m.version})")
    click.echo(f"table       {m.table} ({m.table_id})")
    click.echo(f"taken       {_when(m.created_at)} from {m.source_url}")
    click.echo(f"state       {m.state}")
    click.echo(f"expires     {_when(m.expires_at)}")
    click.echo(f"size        {m.size_bytes} bytes in {plural(len(m.sstable_keys()), 'SSTable')}")
    if m.copied_from:
        click.echo(f"copied from {m.copied_from}")
    click.echo(f"families    {', '.join(sorted(m.schema.families)) or '(none)'}")
    for t in m.tablets:
        end = "end" if t.end_row is None else repr(t.end_row)
        click.echo(f"  tablet [{t.start_row!r}, {end}): {t.size} bytes")


@backup_group.command("update")
@click.argument("backup_id")
@click.option("--expire", default=None, help="Expire D from now (e.g. 30d).")
@click.option("--never", is_flag=True, help="Never expire.")
@_AT
def backup_update_cmd(
    backup_id: str, expire: str | None, never: bool, location: str | None
) -> None:
    """Change when a backup expires."""
    if (expire is None) == (not never):
        raise Failure("give exactly one of --expire D and --never")
    expires_at = None if never else _expiry(expire)
    m = with_database(
        lambda db: db.update_backup(backup_id, expires_at=expires_at, location=location)
    )
    click.echo(_line(m))


@backup_group.command("delete")
@click.argument("backup_id")
@_AT
def backup_delete_cmd(backup_id: str, location: str | None) -> None:
    """Delete a backup (tables restored from it keep their data)."""
    with_database(lambda db: db.delete_backup(backup_id, location=location))


@backup_group.command("copy")
@click.argument("backup_id")
@click.option("--to", required=True, metavar="LOCATION", help="Where to copy it.")
@click.option("--id", "new_id", default=None, help="The copy's id (default: the same).")
@click.option("--expire", default=None, help="The copy expires D from now (default: as is).")
@_AT
def backup_copy_cmd(
    backup_id: str, to: str, new_id: str | None, expire: str | None, location: str | None
) -> None:
    """Copy a backup to another location (another bucket, region or database)."""
    expires_at = _expiry(expire)
    m = with_database(
        lambda db: db.copy_backup(
            backup_id, to, new_id=new_id, source=location, expires_at=expires_at
        )
    )
    click.echo(_line(m))


@click.command("restore")
@click.argument("names", nargs=-1, required=True, metavar="[TABLE] NEW_TABLE")
@click.option("--backup", "backup_id", default=None, help="Restore this backup into NEW_TABLE.")
@click.option(
    "--as-of",
    "as_of",
    default=None,
    help="Rebuild TABLE as of this instant of its history window into NEW_TABLE, ISO 8601 with "
    "a time zone (2026-11-28T09:15:00Z).",
)
@click.option(
    "--from",
    "source",
    default=None,
    metavar="LOCATION",
    help="Where the backup is: a backup location or another database's store URL "
    "(default: this database's bucket).",
)
@click.option(
    "--url",
    "target",
    default=None,
    metavar="URL",
    help="Restore into this database instead (the backup is copied into its bucket).",
)
@click.option(
    "--sort-executor",
    "sort_executor",
    default=None,
    metavar="KIND",
    help="With --as-of on a cluster, where the retained log is sorted: workers (default: the "
    "live workers' sorters), local (this process's children) or lambda:<function-name>.",
)
def restore_cmd(
    names: tuple[str, ...],
    backup_id: str | None,
    as_of: str | None,
    source: str | None,
    target: str | None,
    sort_executor: str | None,
) -> None:
    """Restore backup ID into the new table NEW_TABLE (same schema and split points), or
    TABLE as of an instant of its history window into NEW_TABLE (--as-of)."""
    if (backup_id is None) == (as_of is None):
        raise Failure(
            "say what to restore, one of: --backup ID NEW_TABLE, or TABLE NEW_TABLE --as-of INSTANT"
        )
    if as_of is not None:
        if len(names) != 2:
            raise Failure(
                f"restore --as-of takes two names, TABLE and NEW_TABLE; got {' '.join(names)}"
            )
        if source is not None or target is not None:
            raise Failure("restore --as-of restores within this database: no --from or --url")
        restore_at(names[0], names[1], as_of, sort_executor=sort_executor)
        return
    if sort_executor is not None:
        raise Failure("--sort-executor is for restore --as-of (a backup's restore sorts no log)")
    assert backup_id is not None
    if len(names) != 1:
        raise Failure(f"restore --backup takes one name, the new table; got {' '.join(names)}")
    (new_table,) = names
    restore_backup(backup_id, new_table, source=source, target=target)


def restore_backup(
    backup_id: str, new_table: str, *, source: str | None, target: str | None
) -> None:
    """``restore --backup``: from this database's bucket, ``source``, into ``target``."""
    if target is not None and source is None:
        source = with_database(lambda db: db.store_url())
    info = with_database(
        lambda db: db.restore_table(backup_id, new_table, source=source), url=target
    )
    click.echo(f"restored backup {backup_id} into table {info.schema.name}")


@click.command("clone")
@TABLE_ARG
@click.argument("new_table")
@click.option(
    "--as-of",
    "as_of",
    default=None,
    help="Clone TABLE as of this instant of its history window, ISO 8601 with a time zone "
    "(2026-11-28T09:15:00Z): its checkpoint's SSTables are shared, the log after it replayed.",
)
def clone_cmd(table: str, new_table: str, as_of: str | None) -> None:
    """Create NEW_TABLE, a writable zero-copy clone of TABLE as of now (or --as-of)."""
    if as_of is not None:
        restore_at(table, new_table, as_of, zero_copy=True)
        return
    started = monotonic()
    info = with_database(lambda db: db.clone_table(table, new_table))
    took = monotonic() - started
    click.echo(f"cloned {table} into {info.schema.name} in {took:.2f} s")
