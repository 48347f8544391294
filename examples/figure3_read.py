"""Figure 3 of the Bigtable paper, "Reading from Bigtable", with the synchronous API.

The paper's C++::

    Scanner scanner(T);
    ScanStream *stream;
    stream = scanner.FetchColumnFamily("anchor");
    stream->SetReturnAllVersions();
    scanner.Lookup("com.cnn.www");
    for (; !stream->Done(); stream->Next()) {
      printf("%s %s %lld %s\\n",
             scanner.RowName(), stream->ColumnName(),
             stream->MicroTimestamp(), stream->Value());
    }

Here the scanner is ``read_rows`` restricted to the ``anchor`` family; every version is
returned unless a filter (such as ``CellsPerColumnLimit``) or the family's GC rule limits it.

    python examples/figure3_read.py [--url file:///some/dir]
"""

from __future__ import annotations

import argparse
import tempfile

import tabletstore
from tabletstore import NotFound, SetCell


def main(url: str) -> None:
    with tabletstore.connect(url) as db:
        try:
            db.describe_table("webtable")
        except NotFound:
            db.create_table("webtable", ["contents", "anchor"])
            print("created table 'webtable' (families contents, anchor)")
        table = db.table("webtable")
        # Anchors with several versions each (timestamps in microseconds).
        table.mutate_row(
            b"com.cnn.www",
            [
                SetCell("anchor", b"cnnsi.com", b"CNN", timestamp=9),
                SetCell("anchor", b"cnnsi.com", b"CNN News", timestamp=4),
                SetCell("anchor", b"my.look.ca", b"CNN.com", timestamp=8),
                SetCell("contents", b"", b"<html>...", timestamp=6),
            ],
        )
        print("scanning family 'anchor' of row com.cnn.www, all versions:")
        # scanner.FetchColumnFamily("anchor"); SetReturnAllVersions(); Lookup("com.cnn.www")
        for row in table.read_rows(keys=[b"com.cnn.www"], families=["anchor"]):
            for cell in row.cells:
                column = f"{cell.family}:{cell.qualifier.decode()}"
                print(row.key.decode(), column, cell.timestamp, cell.value.decode())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database URL (default: a new temporary directory)")
    args = parser.parse_args()
    if args.url:
        main(args.url)
    else:
        with tempfile.TemporaryDirectory(prefix="tabletstore-example-") as tmp:
            main(f"file://{tmp}")
