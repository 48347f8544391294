"""``tabletstore import`` and ``tabletstore export``: a table to and from a CSV file::

    tabletstore import T FILE.csv [batch-size=500] [column-family=F]
                       [timestamp=now|value-encoded] [encoding=text|base64]
    tabletstore export T FILE.csv|- [prefix=P] [start=R] [end=R] [encoding=text|base64]

The CSV form (header, records, encodings) lives in :mod:`tabletstore.cli.tablecsv`; these
verbs parse their options, stream the file and show a progress bar on a terminal.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import click

from tabletstore.cli import cbtsyntax as cbt
from tabletstore.cli import tablecsv
from tabletstore.cli.context import (
    OPTIONS_ARG,
    TABLE_ARG,
    Failure,
    failing,
    plural,
    with_database,
)
from tabletstore.cli.progress import progress_bar
from tabletstore.client.client import MutationsFailed
from tabletstore.data.filters import CellsPerColumnLimit, Chain, StripValue
from tabletstore.data.model import RowMutation
from tabletstore.data.schema import TableSchema
from tabletstore.embedded import SyncDatabase
from tabletstore.errors import InvalidArgument

__all__ = ["ImportPlan", "ImportStats", "export_cmd", "import_cmd", "import_csv", "import_plan"]

#: Failed rows of an import printed one by one before the rest are only counted.
_MAX_REPORTED_FAILURES = 20


def _encoding(opts: dict[str, str]) -> tablecsv.Encoding:
    value = opts.get("encoding", "text")
    if value not in tablecsv.ENCODINGS:
        raise InvalidArgument(f"encoding={value!r}: expected text or base64")
    return value


@dataclass
class ImportPlan:
    """An import's options, parsed (:func:`import_plan`)."""

    batch_size: int
    column_family: str | None
    value_encoded: bool
    encoding: tablecsv.Encoding


def import_plan(options: tuple[str, ...]) -> ImportPlan:
    """Parse import's ``key=value`` options; InvalidArgument names a bad one."""
    keys = ("batch-size", "column-family", "timestamp", "encoding")
    opts = cbt.parse_kv_args(options, keys)
    ts = opts.get("timestamp", "now")
    if ts not in ("now", "value-encoded"):
        raise InvalidArgument(f"timestamp={ts!r}: expected now or value-encoded")
    return ImportPlan(
        batch_size=cbt.parse_count("batch-size", opts.get("batch-size", "500")),
        column_family=opts.get("column-family"),
        value_encoded=ts == "value-encoded",
        encoding=_encoding(opts),
    )


@click.command("import")
@TABLE_ARG
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@OPTIONS_ARG
def import_cmd(table: str, file: Path, options: tuple[str, ...]) -> None:
    """Write the rows of a CSV file: header row,family:column,... then one record per row.

    [batch-size=500] rows per batch; [column-family=F] when the header holds bare
    qualifiers (cbt's form); [timestamp=now|value-encoded] (value@micros);
    [encoding=text|base64]. An empty field writes no cell. Rows that fail are listed and
    the exit status is 1; the other rows are written."""
    plan = failing(lambda: import_plan(options))
    if not file.is_file():
        raise Failure(f"cannot read {str(file)!r}: no such file")
    stats = with_database(lambda db: import_csv(db, table, file, plan))
    click.echo(
        f"imported {plural(stats.rows, 'row')} ({plural(stats.cells, 'cell')}) into {table!r}"
    )
    if stats.failures:
        for line in stats.failures[:_MAX_REPORTED_FAILURES]:
            click.echo(f"tabletstore: {line}", err=True)
        hidden = len(stats.failures) - _MAX_REPORTED_FAILURES
        if hidden > 0:
            click.echo(f"tabletstore: ... and {hidden} more failed rows", err=True)
        raise Failure(f"{plural(len(stats.failures), 'row')} of {str(file)!r} not imported")


@dataclass
class ImportStats:
    """What an import wrote, and the records it did not."""

    rows: int = 0
    cells: int = 0
    #: One line per record that was not written: file:line: row: why.
    failures: list[str] = field(default_factory=list)


def import_csv(db: SyncDatabase, name: str, file: Path, plan: ImportPlan) -> ImportStats:
    """Write the records of the CSV ``file`` into table ``name``, batch by batch; a record
    that fails is counted in the result, not raised."""
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
    plan: ImportPlan,
    file: Path,
    on_batch: Callable[[ImportStats], object],
) -> ImportStats:
    """Parse the header, then write the records in batches of ``plan.batch_size`` rows."""
    head: list[list[str]] = [next(reader, [])]
    if tablecsv.header_length(head[0], plan.column_family) == 2:
        head.append(next(reader, []))
    columns = tablecsv.header_columns(head, plan.column_family)
    for col in columns:
        if col is not None and col[0] not in schema.families:
            raise InvalidArgument(f"table {schema.name!r} has no column family {col[0]!r}")
    stats = ImportStats()
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
    table: Any, batch: list[tuple[int, RowMutation]], stats: ImportStats, file: Path
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


@click.command("export")
@TABLE_ARG
@click.argument("file")
@OPTIONS_ARG
def export_cmd(table: str, file: str, options: tuple[str, ...]) -> None:
    """Write a table's newest values to a CSV file (- for stdout), in the form import reads:
    [prefix=P] [start=R] [end=R] [encoding=text|base64]. Binary row keys or values need
    encoding=base64; empty values are not written (an empty field means no cell)."""
    allowed = ("prefix", "start", "end", "encoding")
    opts = failing(lambda: cbt.parse_kv_args(options, allowed))
    encoding = failing(lambda: _encoding(opts))
    selection: dict[str, bytes] = {
        k: cbt.arg_bytes(opts[k]) for k in ("prefix", "start", "end") if k in opts
    }
    out: IO[str]
    if file == "-":
        out = sys.stdout
        count = with_database(lambda db: _export(db.table(table), out, selection, encoding))
    else:
        partial = Path(file + ".partial")
        try:
            with open(partial, "w", encoding="utf-8", newline="") as out:
                count = with_database(lambda db: _export(db.table(table), out, selection, encoding))
            os.replace(partial, file)
        except OSError as exc:
            raise Failure(f"cannot write {file!r}: {exc.strerror}") from exc
        finally:
            partial.unlink(missing_ok=True)
        click.echo(f"exported {plural(count, 'row')} of {table!r} to {file}", err=True)


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
