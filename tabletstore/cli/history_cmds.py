"""History windows and point-in-time restore (``master/checkpoints.py``,
``master/pitr_restore.py``)::

    tabletstore history TABLE [DURATION | off | default]   show or set a table's history window
    tabletstore history --default [DURATION | off]         show or set the database's default
    tabletstore restore TABLE --as-of INSTANT NEW_TABLE   rebuild TABLE as of INSTANT
    tabletstore clone TABLE NEW_TABLE --as-of INSTANT     the same, sharing its SSTables

A table's ``off`` is its own setting, kept whatever the database's default
(``TableSchema.history`` ``HISTORY_OFF``); ``default`` ends its own setting, so the database's
default applies. ``createtable T ... --history 24h`` (or ``off``) sets the window at creation.
INSTANT is ISO 8601 with a time zone (``2026-11-28T09:15:00Z``, ``2026-11-28T10:15:00+01:00``).
"""

from __future__ import annotations

import datetime as dt
from typing import TypeVar

import click

from tabletstore.cli import cbtsyntax as cbt
from tabletstore.cli.context import Failure, cli_context, failing, on_cluster, with_database
from tabletstore.clock import SystemClock
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.data.schema import HISTORY_OFF
from tabletstore.embedded import SyncDatabase
from tabletstore.errors import InvalidArgument, Unavailable
from tabletstore.master.master_process import make_sort_executor
from tabletstore.master.pitr_restore import RestoreReport, restore_as_of
from tabletstore.metadata.catalog import Catalog
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["history_cmd", "parse_instant", "restore_at"]

T = TypeVar("T")


def parse_instant(text: str) -> float:
    """ISO 8601 with a time zone -> seconds since the epoch; InvalidArgument otherwise."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidArgument(
            f"bad instant {text!r}: expected ISO 8601 such as 2026-11-28T09:15:00Z"
        ) from exc
    if when.tzinfo is None:
        raise InvalidArgument(
            f"instant {text!r} has no time zone: add Z for UTC (2026-11-28T09:15:00Z) or an "
            "offset (+01:00)"
        )
    return when.timestamp()


_OFF = ("off", "none", "0")


def parse_window(text: str) -> float | None:
    """The database's default window: ``24h``, ``7d``... in seconds, or None for ``off``."""
    return None if text.lower() in _OFF else cbt.parse_duration(text)


def parse_table_window(text: str) -> float | None:
    """A table's window: ``24h``, ``7d``... in seconds; ``off``: ``HISTORY_OFF`` (no history
    whatever the database's default); ``default``: None (the database's default applies)."""
    if text.lower() == "default":
        return None
    return HISTORY_OFF if text.lower() in _OFF else cbt.parse_duration(text)


def _shown(seconds: float | None) -> str:
    return "off" if seconds is None or seconds == HISTORY_OFF else cbt.format_duration(seconds)


@click.command("history")
@click.argument("table", required=False, metavar="TABLE")
@click.argument("window", required=False)
@click.option(
    "--default",
    "default",
    is_flag=True,
    help="Show or set the database's default window instead (for tables without their own).",
)
def history_cmd(table: str | None, window: str | None, default: bool) -> None:
    """Show TABLE's history window, or set it: a duration (30m, 24h, 7d), off (no history,
    whatever the database's default) or default (the table's own setting ends: the database's
    default applies). With --default [DURATION | off], the database's default window, kept by
    every table without a setting of its own. Any instant of a window can be
    restored (tabletstore restore --as-of); the master takes the first checkpoint as it is set."""
    if default:
        if window is not None:
            raise Failure(f"history --default takes one window, got {table} {window}")
        if table is None:
            seconds = with_database(lambda db: db.history_default())
        else:
            seconds = failing(lambda: parse_window(table))
            with_database(lambda db: db.set_history_default(seconds))
        click.echo(f"default: history {_shown(seconds)}")
        return
    if table is None:
        raise Failure("name a table (history TABLE [DURATION | off | default]) or give --default")
    if window is not None:
        seconds = failing(lambda: parse_table_window(window))
        with_database(lambda db: db.set_history(table, seconds))

    def shown(db: SyncDatabase) -> str:
        own = db.describe_table(table).history
        if own == HISTORY_OFF:
            return "off (the table's own: the database's default does not apply)"
        if own is not None:
            return _shown(own)
        fallback = db.history_default()
        return "off" if fallback is None else f"{_shown(fallback)} (the database's default)"

    click.echo(f"{table}: history {with_database(shown)}")


def restore_at(
    table: str,
    new_table: str,
    as_of: str,
    *,
    zero_copy: bool = False,
    sort_executor: str | None = None,
) -> None:
    """``restore TABLE NEW_TABLE --as-of INSTANT`` (the command is ``backup_cmds.restore_cmd``):
    rebuild TABLE as it was at an instant of its history window into the new table NEW_TABLE
    (TABLE is only read). Writes acknowledged by then are in, writes begun after it are not.
    ``zero_copy``: ``clone TABLE NEW_TABLE --as-of INSTANT``, the same table sharing the
    checkpoint's SSTables. ``sort_executor``: where the retained log is sorted on a cluster
    (``workers``, the default: the live workers' sorters; ``local``; ``lambda:<function>``);
    an embedded database sorts it in this process."""
    instant = failing(lambda: parse_instant(as_of))
    obj = cli_context()
    report: RestoreReport
    if obj.url.startswith("etcd://"):
        kind = sort_executor or "workers"

        async def on(
            store: ObjectStore, catalog: Catalog, coordinator: Coordinator
        ) -> RestoreReport:
            if kind == "workers" and not await coordinator.get_prefix(paths.SERVERS):
                raise Unavailable(
                    "no live worker to sort the log: start one, or restore with "
                    "--sort-executor local"
                )
            executor = make_sort_executor(kind, store, store.url, coordinator)
            try:
                return await restore_as_of(
                    store,
                    catalog,
                    table=table,
                    instant=instant,
                    new_table=new_table,
                    clock=SystemClock(),
                    zero_copy=zero_copy,
                    executor=executor,
                )
            finally:
                await executor.close()

        report = on_cluster(on)
    else:
        if sort_executor not in (None, "local"):
            raise Failure(
                f"--sort-executor {sort_executor} needs a cluster (--url etcd://...): an "
                "embedded database sorts the log in this process"
            )
        if zero_copy:
            report = with_database(lambda db: db.clone_as_of(table, instant, new_table))
        else:
            report = with_database(lambda db: db.restore_as_of(table, instant, new_table))
    click.echo(report.summary())
