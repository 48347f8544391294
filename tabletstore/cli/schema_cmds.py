"""The table and column-family verbs, as Google's ``cbt`` spells them (§2, §3)::

    tabletstore ls [TABLE]                             tables, or a table's families and GC
    tabletstore createtable T [families=f1,f2:maxversions=2] [splits=k1,k2] [--history 24h]
                            [--changes 24h]
    tabletstore deletetable T
    tabletstore createfamily T F[:sum|min|max|hll] | deletefamily T F
    tabletstore setgcpolicy T F maxversions=N | maxage=30d | never | (P or P) and P

The argument syntax lives in :mod:`tabletstore.cli.cbtsyntax`.
"""

from __future__ import annotations

import click

from tabletstore.cli import cbtsyntax as cbt
from tabletstore.cli.context import OPTIONS_ARG, TABLE_ARG, echo_lines, failing, with_database
from tabletstore.cli.history_cmds import parse_table_window

__all__ = [
    "createfamily_cmd",
    "createtable_cmd",
    "deletefamily_cmd",
    "deletetable_cmd",
    "ls_cmd",
    "setgcpolicy_cmd",
]


@click.command("ls")
@click.argument("table", required=False)
def ls_cmd(table: str | None) -> None:
    """List tables, or a table's column families and their GC policies."""
    if table is None:
        echo_lines(with_database(lambda db: db.list_tables()))
        return
    schema = with_database(lambda db: db.describe_table(table))
    echo_lines(cbt.schema_lines(schema))


@click.command("createtable")
@TABLE_ARG
@OPTIONS_ARG
@click.option(
    "--history",
    default=None,
    help="Keep this much history (30m, 24h, 7d): any instant of it can be restored "
    "(tabletstore restore --as-of); off: none, whatever the database's default.",
)
@click.option(
    "--changes",
    default=None,
    help="Keep this much of the table's change stream (1h, 24h, 7d): tabletstore watch, "
    "table.read_changes.",
)
def createtable_cmd(
    table: str, options: tuple[str, ...], history: str | None, changes: str | None
) -> None:
    """Create a table: [families=f1,f2:maxversions=2,...] [splits=k1,k2,...].

    Quote a GC policy with spaces or || (cbt's syntax, see setgcpolicy)."""
    opts = failing(lambda: cbt.parse_kv_args(options, ("families", "splits")))
    families = failing(lambda: cbt.parse_families(opts["families"]) if "families" in opts else [])
    splits = [cbt.arg_bytes(k) for k in opts["splits"].split(",")] if "splits" in opts else []
    window = None if history is None else failing(lambda: parse_table_window(history))
    kept = None if changes is None else failing(lambda: cbt.parse_duration(changes))
    with_database(
        lambda db: db.create_table(table, families, split_keys=splits, history=window, changes=kept)
    )


@click.command("deletetable")
@TABLE_ARG
def deletetable_cmd(table: str) -> None:
    """Delete a table and all its data."""
    with_database(lambda db: db.delete_table(table))


@click.command("createfamily")
@TABLE_ARG
@click.argument("family")
def createfamily_cmd(table: str, family: str) -> None:
    """Create a column family (no GC policy; see setgcpolicy). FAMILY:TYPE with TYPE sum,
    min, max or hll creates an aggregate family (see addtocell)."""
    fam = failing(lambda: cbt.family_with_type(family))
    with_database(lambda db: db.create_family(table, fam))


@click.command("deletefamily")
@TABLE_ARG
@click.argument("family")
def deletefamily_cmd(table: str, family: str) -> None:
    """Delete a column family and every cell in it."""
    with_database(lambda db: db.delete_family(table, family))


@click.command("setgcpolicy")
@TABLE_ARG
@click.argument("family")
@click.argument("policy", nargs=-1, required=True)
def setgcpolicy_cmd(table: str, family: str, policy: tuple[str, ...]) -> None:
    """Set a family's GC policy: maxversions=N | maxage=D (ms,s,m,h,d) | never,
    combined with and/&& or or/||, with parentheses to mix them."""
    rule = failing(lambda: cbt.parse_gc_policy(policy))
    with_database(lambda db: db.set_gc_rule(table, family, rule))
