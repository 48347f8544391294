"""The verbs batch jobs use (§8): consistent snapshots to read, bulk loads to write::

    tabletstore snapshot create T [--ttl D] | snapshot list [T] | snapshot delete ID
    tabletstore bulkload T URL [--load-id ID]

A job opens a snapshot with ``tabletstore.batch.open_snapshot``; ``bulkload`` commits the
SSTables a job wrote (``tabletstore.batch``).
"""

from __future__ import annotations

import time

import click

from tabletstore.cli import cbtsyntax as cbt
from tabletstore.cli.context import TABLE_ARG, failing, plural, with_database

__all__ = ["bulkload_cmd", "snapshot_group"]


@click.group("snapshot")
def snapshot_group() -> None:
    """Consistent snapshots of tables for batch jobs (tabletstore.batch, §8)."""


@snapshot_group.command("create")
@TABLE_ARG
@click.option("--ttl", default=None, help="Expire after D (ms,s,m,h,d): GC may delete it then.")
def snapshot_create_cmd(table: str, ttl: str | None) -> None:
    """Take a snapshot of TABLE; prints its id (what batch jobs open)."""
    seconds = None if ttl is None else failing(lambda: cbt.parse_duration(ttl))
    m = with_database(lambda db: db.snapshot(table, ttl=seconds))
    click.echo(m.snapshot_id)
    click.echo(
        f"  table {m.table}: {plural(len(m.tablets), 'tablet')}, {plural(m.cells, 'SSTable cell')}"
        + ("" if m.expires_at is None else f", expires in {ttl}"),
        err=True,
    )


@snapshot_group.command("list")
@click.argument("table", required=False)
def snapshot_list_cmd(table: str | None) -> None:
    """List snapshots (of TABLE, or of every table), oldest first."""
    manifests = with_database(lambda db: db.list_snapshots(table))
    for m in manifests:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(m.created_at))
        expires = (
            "never"
            if m.expires_at is None
            else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(m.expires_at))
        )
        click.echo(
            f"{m.snapshot_id}\t{m.table}\t{when}\texpires {expires}\t{len(m.tablets)} tablets"
        )


@snapshot_group.command("delete")
@click.argument("snapshot_id")
def snapshot_delete_cmd(snapshot_id: str) -> None:
    """Delete a snapshot (GC then frees what only it kept)."""
    with_database(lambda db: db.delete_snapshot(snapshot_id))


@click.command("bulkload")
@TABLE_ARG
@click.argument("url")
@click.option(
    "--load-id",
    default=None,
    help="Name of this load (default: a hash of the files' contents). A load that is done "
    "loads nothing again; an interrupted one loads only what is left.",
)
def bulkload_cmd(table: str, url: str, load_id: str | None) -> None:
    """Load the SSTables a job wrote to its staging area LOAD-NAME (URL: the load's name,
    or the staging URL the client's staging_url(LOAD-NAME) gives: staging/<you>/LOAD-NAME/
    of the database's bucket; nothing else is read) into TABLE: all checked first, then
    committed atomically per tablet. Safe to run again."""
    tablets, cells = with_database(lambda db: db.bulk_load(table, url, load_id=load_id))
    if not cells:
        which = f"load {load_id!r}" if load_id else "the load of these files"
        click.echo(f"nothing to load: {which} into {table} is done already")
    else:
        click.echo(f"loaded {plural(cells, 'cell')} into {plural(tablets, 'tablet')}")
