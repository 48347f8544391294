"""The row verbs, as Google's ``cbt`` spells them: writes and reads of rows (§2, §3)::

    tabletstore set T ROW fam:col=value[@micros] ...
    tabletstore addtocell T ROW fam:col=value[@micros] ...   (aggregate families)
    tabletstore deleterow T ROW | deletecolumn T ROW F Q
    tabletstore lookup T ROW [columns=..] [cells-per-column=N] [keys-only=true]
    tabletstore read T [start=R] [end=R] [prefix=P] [regex=RE] [count=N] [columns=..]
                       [cells-per-column=N] [keys-only=true] [reversed=true]
    tabletstore count T [prefix=P]

Keys, qualifiers and values are the arguments' bytes; rows print as cbt prints them
(:mod:`tabletstore.cli.cbtsyntax`).
"""

from __future__ import annotations

from typing import Any

import click

from tabletstore.cli import cbtsyntax as cbt
from tabletstore.cli.context import (
    OPTIONS_ARG,
    TABLE_ARG,
    echo_lines,
    failing,
    with_database,
)
from tabletstore.data.filters import CellsPerRowLimit, Chain, StripValue
from tabletstore.data.model import DeleteCells, DeleteRow
from tabletstore.embedded import SyncDatabase

__all__ = [
    "addtocell_cmd",
    "count_cmd",
    "deletecolumn_cmd",
    "deleterow_cmd",
    "lookup_cmd",
    "read_cmd",
    "set_cmd",
]


# -- writes ------------------------------------------------------------------------------------
@click.command("set")
@TABLE_ARG
@click.argument("row")
@click.argument("cells", nargs=-1, required=True)
def set_cmd(table: str, row: str, cells: tuple[str, ...]) -> None:
    """Set cells of one row atomically: family:column=value[@timestamp] ...

    The timestamp is microseconds since the epoch (default: now); if what follows the last
    @ is not an integer it is part of the value."""
    muts = failing(lambda: [cbt.parse_set_arg(c) for c in cells])
    with_database(lambda db: db.table(table).mutate_row(cbt.arg_bytes(row), muts))


@click.command("addtocell")
@TABLE_ARG
@click.argument("row")
@click.argument("cells", nargs=-1, required=True)
def addtocell_cmd(table: str, row: str, cells: tuple[str, ...]) -> None:
    """Add to aggregate cells of one row atomically: family:column=value[@timestamp] ...

    VALUE is an integer for sum, min and max families and a string for hll families; cells of
    one column and timestamp combine (the timestamp is microseconds, default now)."""

    def body(db: SyncDatabase) -> None:
        schema = db.describe_table(table)
        types = {n: f.value_type for n, f in schema.families.items()}
        muts = [
            cbt.parse_add_arg(c, types.get(c.partition(":")[0].partition("=")[0])) for c in cells
        ]
        db.table(table).mutate_row(cbt.arg_bytes(row), muts)

    with_database(body)


@click.command("deleterow")
@TABLE_ARG
@click.argument("row")
def deleterow_cmd(table: str, row: str) -> None:
    """Delete every cell of a row."""
    with_database(lambda db: db.table(table).mutate_row(cbt.arg_bytes(row), [DeleteRow()]))


@click.command("deletecolumn")
@TABLE_ARG
@click.argument("row")
@click.argument("family")
@click.argument("column")
def deletecolumn_cmd(table: str, row: str, family: str, column: str) -> None:
    """Delete every version of one column of a row."""
    mut = DeleteCells(family, cbt.arg_bytes(column))
    with_database(lambda db: db.table(table).mutate_row(cbt.arg_bytes(row), [mut]))


# -- reads -------------------------------------------------------------------------------------
_READ_KEYS = ("columns", "cells-per-column", "keys-only")


@click.command("lookup")
@TABLE_ARG
@click.argument("row")
@OPTIONS_ARG
def lookup_cmd(table: str, row: str, options: tuple[str, ...]) -> None:
    """Read one row: [columns=fam:qual,fam:,qual] [cells-per-column=N] [keys-only=true].

    Prints nothing when the row has no (matching) cells."""
    opts = failing(lambda: cbt.parse_kv_args(options, _READ_KEYS))
    _read(table, opts, keys=[cbt.arg_bytes(row)])


@click.command("read")
@TABLE_ARG
@OPTIONS_ARG
def read_cmd(table: str, options: tuple[str, ...]) -> None:
    """Read rows: [start=R] [end=R] [prefix=P] [regex=RE] [count=N] [columns=...]
    [cells-per-column=N] [keys-only=true] [reversed=true]. end is exclusive; regex matches
    whole keys; reversed reads in descending key order (count takes the highest keys)."""
    allowed = ("start", "end", "prefix", "regex", "count", "reversed", *_READ_KEYS)
    opts = failing(lambda: cbt.parse_kv_args(options, allowed))
    _read(table, opts)


def _read(table: str, opts: dict[str, str], keys: list[bytes] | None = None) -> None:
    def plan() -> dict[str, Any]:
        keys_only = cbt.parse_bool("keys-only", opts.get("keys-only", "false"))
        row_filter = cbt.read_filter(opts)
        if keys_only:
            row_filter = Chain([row_filter, StripValue()]) if row_filter else StripValue()
        kwargs: dict[str, Any] = {"filter": row_filter, "keys": keys}
        for key in ("start", "end", "prefix"):
            if key in opts:
                kwargs[key] = cbt.arg_bytes(opts[key])
        if "count" in opts:
            kwargs["limit"] = cbt.parse_count("count", opts["count"])
        if cbt.parse_bool("reversed", opts.get("reversed", "false")):
            kwargs["reverse"] = True
        return {"keys_only": keys_only, "kwargs": kwargs}

    p = failing(plan)

    def body(db: SyncDatabase) -> None:
        types = {n: f.value_type for n, f in db.describe_table(table).families.items()}
        for row in db.table(table).read_rows(**p["kwargs"]):
            if p["keys_only"]:
                click.echo(cbt.printable_key(row.key))
            else:
                echo_lines(cbt.format_row(row, types))

    with_database(body)


@click.command("count")
@TABLE_ARG
@OPTIONS_ARG
def count_cmd(table: str, options: tuple[str, ...]) -> None:
    """Count the rows of a table: [prefix=P]."""
    opts = failing(lambda: cbt.parse_kv_args(options, ("prefix",)))
    prefix = cbt.arg_bytes(opts["prefix"]) if "prefix" in opts else None
    # One stripped cell per row is all a count needs to cross the wire.
    cheap = Chain([CellsPerRowLimit(1), StripValue()])

    def body(db: SyncDatabase) -> int:
        return sum(1 for _ in db.table(table).read_rows(prefix=prefix, filter=cheap))

    click.echo(with_database(body))
