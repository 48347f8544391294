"""Change streams (``client/change_stream.py``)::

    tabletstore changes TABLE [DURATION | off]          show or set a table's change retention
    tabletstore watch TABLE [--from INSTANT] [--until INSTANT] [--heartbeats]
                                                        print changes as they commit

``createtable T ... --changes 24h`` sets the retention at creation. ``watch`` follows every
partition of the table (and those that replace them after splits and merges) and prints one
line per cell of each committed mutation: commit time, row, order within the row, kind,
column, timestamp and value. It runs until interrupted, or until the low watermark passes
``--until``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import click

from tabletstore.cli import cbtsyntax as cbt
from tabletstore.cli.context import TABLE_ARG, failing, with_database
from tabletstore.cli.history_cmds import parse_instant, parse_window
from tabletstore.client.change_plan import Change, ChangePartition, Heartbeat, PartitionEnd, utc
from tabletstore.client.change_stream import ChangeItem
from tabletstore.embedded import SyncDatabase

__all__ = ["change_lines", "changes_cmd", "watch_cmd"]


@click.command("changes")
@TABLE_ARG
@click.argument("retention", required=False)
def changes_cmd(table: str, retention: str | None) -> None:
    """Show TABLE's change retention, or set it: a duration (1h, 24h, 7d) or off. Its change
    stream (tabletstore watch, table.read_changes) can be read that far back."""
    if retention is None:
        schema = with_database(lambda db: db.describe_table(table))
        shown = "off" if schema.changes is None else cbt.format_duration(schema.changes)
        click.echo(f"{table}: changes {shown}")
        return
    seconds = failing(lambda: parse_window(retention))
    with_database(lambda db: db.set_changes(table, seconds))
    shown = "off" if seconds is None else cbt.format_duration(seconds)
    click.echo(f"{table}: changes {shown}")


def change_lines(item: ChangeItem, *, heartbeats: bool = False) -> list[str]:
    """What ``watch`` prints for one item of a stream."""
    if isinstance(item, Change):
        when = utc(item.commit_time)
        row = cbt.printable_key(item.row)
        return [
            f"{when} {row} #{item.seq} {m.kind} {m.family}:{cbt.printable_key(m.qualifier)} "
            f"@{m.timestamp} {cbt.printable_key(m.value)}"
            for m in item.mods
        ]
    if isinstance(item, Heartbeat):
        return [f"# complete up to {utc(item.watermark)}"] if heartbeats else []
    return [f"# partition {item.partition} ended; now {_names(item)}"] if heartbeats else []


def _names(end: PartitionEnd) -> str:
    return ", ".join(str(p) for p, _ in end.successors)


@click.command("watch")
@TABLE_ARG
@click.option("--from", "since", default=None, help="Start here (ISO 8601; default: now).")
@click.option("--until", default=None, help="Stop once complete up to here (ISO 8601).")
@click.option("--heartbeats", is_flag=True, help="Also print the low watermark as it moves.")
def watch_cmd(table: str, since: str | None, until: str | None, heartbeats: bool) -> None:
    """Print TABLE's changes as they commit (a table with a change retention): one line per
    cell of each mutation, commit time, row, #order within the row, kind, family:qualifier,
    @timestamp, value."""
    start = None if since is None else failing(lambda: parse_instant(since))
    end = None if until is None else failing(lambda: parse_instant(until))

    def body(db: SyncDatabase) -> None:
        table_api = db.table(table).async_api
        stream: AsyncIterator[tuple[ChangePartition, ChangeItem]] = table_api.follow_changes(
            start_time=start, end_time=end
        )
        for _, item in db._portal.iterate(stream, 1):
            for line in change_lines(item, heartbeats=heartbeats):
                click.echo(line)

    with_database(body)
