"""Figure 2 of the Bigtable paper, "Writing to Bigtable", with the synchronous API.

The paper's C++::

    Table *T = OpenOrDie("/bigtable/web/webtable");
    RowMutation r1(T, "com.cnn.www");
    r1.Set("anchor:www.c-span.org", "CNN");
    r1.Delete("anchor:www.abc.com");
    Operation op;
    Apply(&op, &r1);

The mutations of one row are applied atomically (§2): a reader sees both or neither.

    python examples/figure2_write.py [--url file:///some/dir]
"""

from __future__ import annotations

import argparse
import tempfile

import tabletstore
from tabletstore import DeleteCells, NotFound, SetCell


def show(table, row: bytes, when: str) -> None:  # table: a sync table handle
    found = table.read_row(row, families=["anchor"])
    anchors = {c.qualifier.decode(): c.value.decode() for c in found.cells} if found else {}
    print(f"{when:<7} anchors of {row.decode()}: {anchors}")


def main(url: str) -> None:
    with tabletstore.connect(url) as db:
        try:
            db.describe_table("webtable")
        except NotFound:
            db.create_table("webtable", ["contents", "anchor"])
            print("created table 'webtable' (families contents, anchor)")
        table = db.table("webtable")
        row = b"com.cnn.www"
        # An older anchor for the example to delete.
        table.mutate_row(row, [SetCell("anchor", b"www.abc.com", b"CNN")])
        show(table, row, "before")

        # RowMutation r1(T, "com.cnn.www"); r1.Set(...); r1.Delete(...); Apply(&op, &r1);
        r1 = [
            SetCell("anchor", b"www.c-span.org", b"CNN"),
            DeleteCells("anchor", b"www.abc.com"),
        ]
        table.mutate_row(row, r1)
        print("applied: Set anchor:www.c-span.org = 'CNN', Delete anchor:www.abc.com (atomically)")
        show(table, row, "after")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database URL (default: a new temporary directory)")
    args = parser.parse_args()
    if args.url:
        main(args.url)
    else:
        with tempfile.TemporaryDirectory(prefix="tabletstore-example-") as tmp:
            main(f"file://{tmp}")
