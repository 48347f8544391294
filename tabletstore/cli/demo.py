"""The Webtable demo: the paper's running example (§2, Figure 1) written and read back.

``tabletstore demo`` calls :func:`run`. Rows are web pages keyed by URL with the host's labels
reversed (``www.cnn.com/world`` → ``com.cnn.www/world``), so "pages in the same domain are
grouped together into contiguous rows" (§2) and one prefix scan reads a whole domain. The
``contents`` family keeps the page at its crawl times and only the three most recent versions
(§2 "Timestamps"); ``anchor`` holds, per referring site, the text of its link to the page;
``language`` the page's language; ``stats`` a counter, to show a read-modify-write (§3).

Figure 1 exactly: row ``com.cnn.www`` has ``contents:`` at t3, t5 and t6, ``anchor:cnnsi.com``
= "CNN" at t9 and ``anchor:my.look.ca`` = "CNN.com" at t8. Its timestamps are written as those
small integers (microseconds), so every run writes the same cells: running the demo again on
the same database reuses the table and changes nothing but the counter.
"""

from __future__ import annotations

import datetime
import struct
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from tabletstore.cli.context import with_database
from tabletstore.data.filters import Chain, ColumnQualifierRegex, FamilyNameRegex
from tabletstore.data.model import Cell, IncrementValue, Row, RowMutation, SetCell
from tabletstore.data.schema import ColumnFamily, MaxVersionsRule
from tabletstore.embedded import SyncDatabase
from tabletstore.errors import NotFound

__all__ = [
    "FAMILIES",
    "PAGES",
    "TABLE",
    "Page",
    "demo_cmd",
    "ensure_table",
    "row_key",
    "run",
    "write_pages",
]

TABLE = "webtable"
#: The families of the Webtable; contents keeps three versions (§2).
FAMILIES = (
    ColumnFamily(name="contents", gc_rule=MaxVersionsRule(max_versions=3)),
    ColumnFamily(name="anchor"),
    ColumnFamily(name="language"),
    ColumnFamily(name="stats"),
)


@dataclass(frozen=True, slots=True)
class Page:
    """A crawled page: its URL, contents at crawl times, language and incoming anchors."""

    url: str
    contents: tuple[tuple[int, str], ...]
    language: str
    #: (referring site, anchor text, timestamp).
    anchors: tuple[tuple[str, str, int], ...] = ()


PAGES = (
    Page(
        "www.cnn.com",
        ((3, "<html>CNN, first crawl"), (5, "<html>CNN, second crawl"), (6, "<html>CNN, latest")),
        "EN",
        (("cnnsi.com", "CNN", 9), ("my.look.ca", "CNN.com", 8)),
    ),
    Page("www.cnn.com/world", ((7, "<html>CNN World"),), "EN", (("www.c-span.org", "World", 7),)),
    Page("money.cnn.com", ((4, "<html>CNN Money"),), "EN", (("www.cnn.com", "Markets", 6),)),
    Page("www.cnnsi.com", ((5, "<html>Sports Illustrated"),), "EN", (("www.cnn.com", "SI", 6),)),
    Page("my.look.ca", ((2, "<html>Look!"),), "EN"),
    Page("maps.google.com/index.html", ((8, "<html>Maps"),), "EN", (("www.cnn.com", "map", 9),)),
    Page("www.lemonde.fr", ((6, "<html>Le Monde"),), "FR", (("www.cnn.com", "Le Monde", 7),)),
)


def row_key(url: str) -> bytes:
    """``maps.google.com/index.html`` → ``com.google.maps/index.html`` (§2)."""
    host, slash, path = url.partition("/")
    return (".".join(reversed(host.split("."))) + slash + path).encode()


def page_mutation(page: Page) -> RowMutation:
    """Every cell of a page, with explicit timestamps (so writing it twice changes nothing)."""
    cells = [SetCell("contents", b"", html.encode(), ts) for ts, html in page.contents]
    cells.append(SetCell("language", b"", page.language.encode(), page.contents[-1][0]))
    cells += [
        SetCell("anchor", site.encode(), text.encode(), ts) for site, text, ts in page.anchors
    ]
    return RowMutation(row_key(page.url), tuple(cells))


def ensure_table(db: SyncDatabase, name: str = TABLE) -> Any:
    """The Webtable, created if missing; an existing table gets any family it lacks."""
    try:
        schema = db.describe_table(name)
    except NotFound:
        return db.create_table(name, FAMILIES)
    for fam in FAMILIES:
        if fam.name not in schema.families:
            db.create_family(name, fam)
    return db.table(name)


def write_pages(table: Any, pages: tuple[Page, ...] = PAGES) -> list[RowMutation]:
    """Write the pages in one batch (each row atomically, §3) and return what was written."""
    entries = [page_mutation(p) for p in pages]
    table.mutate_rows(entries)
    return entries


def _ts(ts: int) -> str:
    # Figure 1's timestamps are small integers; real ones are microseconds since the epoch.
    if ts < 1_000_000:
        return f"t{ts}"
    return datetime.datetime.fromtimestamp(ts / 1e6).strftime("%Y-%m-%d %H:%M:%S")


def _value(c: Cell) -> str:
    if c.family == "stats" and len(c.value) == 8:  # counters are 64-bit big-endian (§3)
        return str(struct.unpack(">q", c.value)[0])
    return c.value.decode(errors="backslashreplace")


def _text(data: bytes) -> str:
    return data.decode(errors="backslashreplace")


def _cells_table(title: str, rows: list[tuple[bytes, Cell]], caption: str = "") -> Table:
    t = Table(title=title, caption=caption or None, title_justify="left", title_style="bold")
    t.add_column("row key", style="cyan", no_wrap=True)
    t.add_column("column", style="magenta", no_wrap=True)
    t.add_column("timestamp", justify="right", style="green")
    t.add_column("value")
    for key, c in rows:
        t.add_row(_text(key), f"{c.family}:{_text(c.qualifier)}", _ts(c.timestamp), _value(c))
    return t


def _written_table(table_name: str, entries: list[RowMutation]) -> Table:
    t = Table(
        title=f"Wrote {len(entries)} pages to '{table_name}' (one mutate_rows batch)",
        title_justify="left",
        title_style="bold",
    )
    t.add_column("page URL")
    t.add_column("row key (host reversed)", style="cyan", no_wrap=True)
    t.add_column("cells", justify="right")
    for page, e in zip(PAGES, entries, strict=True):
        t.add_row(page.url, _text(e.row), str(len(e.mutations)))
    return t


def _flatten(rows: list[Row]) -> list[tuple[bytes, Cell]]:
    return [(r.key, c) for r in rows for c in r.cells]


def run(db: SyncDatabase, console: Console, table_name: str = TABLE) -> int:
    """Write the Webtable and print what was written and read back; returns the counter."""
    console.print(
        Panel.fit(
            "[bold]Webtable[/] — Bigtable (OSDI 2006) §2, Figure 1\n"
            "row keys are URLs with reversed host names; contents keeps 3 versions",
            title="tabletstore demo",
        )
    )
    table = ensure_table(db, table_name)
    entries = write_pages(table)
    console.print(_written_table(table_name, entries))

    row: Row | None = table.read_row(b"com.cnn.www")
    found = _flatten([row] if row else [])
    console.print(_cells_table("read_row(b'com.cnn.www')  — Figure 1", found))

    scanned: list[Row] = list(table.read_rows(prefix=b"com.cnn."))
    scan = Table(
        title="read_rows(prefix=b'com.cnn.')  — one domain, contiguous rows",
        title_justify="left",
        title_style="bold",
    )
    scan.add_column("row key", style="cyan")
    scan.add_column("cells", justify="right")
    scan.add_column("latest contents")
    for r in scanned:
        latest = (r.latest("contents", b"") or b"").decode(errors="backslashreplace")
        scan.add_row(r.key.decode(errors="backslashreplace"), str(len(r.cells)), latest)
    console.print(scan)

    contents_only = Chain([FamilyNameRegex("contents"), ColumnQualifierRegex(b"")])
    versions: Row | None = table.read_row(b"com.cnn.www", filter=contents_only)
    console.print(
        _cells_table(
            "Versions of contents: in com.cnn.www, newest first",
            _flatten([versions] if versions else []),
        )
    )

    anchors: list[Row] = list(table.read_rows(filter=FamilyNameRegex("anchor")))
    console.print(
        _cells_table(
            "Anchors only: read_rows(filter=FamilyNameRegex('anchor'))",
            _flatten(anchors),
            "who links to each page, and how",
        )
    )

    counted: Row = table.read_modify_write_row(
        b"com.cnn.www", [IncrementValue("stats", b"demo_runs", 1)]
    )
    value = counted.latest("stats", b"demo_runs") or bytes(8)
    runs = int(struct.unpack(">q", value)[0])
    console.print(
        f"[bold]Counter[/]: read_modify_write_row(IncrementValue('stats', b'demo_runs', 1))"
        f" → [bold green]{runs}[/]\n  atomic on the row (§3); it grows on every run"
    )
    return runs


@click.command("demo")
@click.option("--table", default=TABLE, show_default=True, help="Table to use.")
def demo_cmd(table: str) -> None:
    """Write the paper's Webtable (Figure 1) and print what is read back."""
    console = Console(highlight=False)
    with_database(lambda db: run(db, console, table))
