"""The Webtable of the Bigtable paper (§2, Figure 1) with the synchronous API.

Rows are web pages keyed by URL with the host name reversed, so pages of one domain sit in
contiguous rows; ``contents:`` holds the page at each crawl time (timestamps), and the
``anchor`` family one column per referring site holding the link's text.

    python examples/webtable.py [--url file:///some/dir]
"""

from __future__ import annotations

import argparse
import tempfile

import tabletstore
from tabletstore import ColumnFamily, FamilyNameRegex, MaxVersionsRule, NotFound, SetCell


def reversed_host(url: str) -> bytes:
    """``www.cnn.com/world`` → ``com.cnn.www/world`` (§2)."""
    host, slash, path = url.partition("/")
    return (".".join(reversed(host.split("."))) + slash + path).encode()


def main(url: str) -> None:
    with tabletstore.connect(url) as db:
        try:
            db.describe_table("webtable")
            print("table 'webtable' exists: reusing it")
        except NotFound:
            # Keep only the three newest versions of every page (§2 "Timestamps").
            contents = ColumnFamily(name="contents", gc_rule=MaxVersionsRule(max_versions=3))
            db.create_table("webtable", [contents, "anchor"])
            print("created table 'webtable' with families contents (3 versions) and anchor")
        table = db.table("webtable")

        # Figure 1: contents at t3, t5, t6; anchors at t9 and t8. Timestamps are microseconds;
        # the paper's t3..t9 are written as 3..9 so every run writes the same cells.
        row = reversed_host("www.cnn.com")
        table.mutate_row(
            row,
            [
                SetCell("contents", b"", b"<html>... (t3)", timestamp=3),
                SetCell("contents", b"", b"<html>... (t5)", timestamp=5),
                SetCell("contents", b"", b"<html>... (t6)", timestamp=6),
                SetCell("anchor", b"cnnsi.com", b"CNN", timestamp=9),
                SetCell("anchor", b"my.look.ca", b"CNN.com", timestamp=8),
            ],
        )
        for page, html in [
            ("www.cnn.com/world", b"<html>World"),
            ("money.cnn.com", b"<html>Money"),
            ("maps.google.com/index.html", b"<html>Maps"),
        ]:
            table.mutate_row(reversed_host(page), [SetCell("contents", b"", html, timestamp=4)])
        print(f"wrote Figure 1's row {row.decode()!r} and 3 more pages\n")

        print(f"read_row({row!r}):")
        for cell in table.read_row(row).cells:
            column = f"{cell.family}:{cell.qualifier.decode()}"
            print(f"  {column:<20} t{cell.timestamp:<3} {cell.value.decode()!r}")

        print("\nread_rows(prefix=b'com.cnn.'): every page of cnn.com, in key order")
        for r in table.read_rows(prefix=b"com.cnn."):
            print(f"  {r.key.decode():<22} contents = {r.latest('contents', b'').decode()!r}")

        print("\nanchors only (filter=FamilyNameRegex('anchor')):")
        for r in table.read_rows(filter=FamilyNameRegex("anchor")):
            for cell in r.cells:
                print(f"  {cell.qualifier.decode()} links to {r.key.decode()} as {cell.value!r}")

        # A fourth crawl: the GC rule keeps only the three newest versions.
        table.mutate_row(row, [SetCell("contents", b"", b"<html>... (t7)", timestamp=7)])
        versions = [c.timestamp for c in table.read_row(row).cells_of("contents", b"")]
        print(f"\nafter a crawl at t7, contents: keeps versions {versions} (max 3 versions)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database URL (default: a new temporary directory)")
    args = parser.parse_args()
    if args.url:
        main(args.url)
    else:
        with tempfile.TemporaryDirectory(prefix="tabletstore-example-") as tmp:
            main(f"file://{tmp}")
