"""A batch job over the Webtable (the Bigtable paper's §2 and §8): count the anchors pointing
at each domain, with Dask, over a consistent snapshot read straight from the bucket.

Rows are pages keyed by reversed host name; ``anchor:<referring site>`` holds a link's text
(Figure 1). The job takes a snapshot (writes made afterwards are not counted), reads it on a
``distributed.LocalCluster`` of two worker processes -- which need the bucket only, not the
database -- and counts anchor cells per target domain.

    python examples/batch_anchor_count.py [--url file:///some/dir]
"""

from __future__ import annotations

import argparse
import random
import tempfile

import tabletstore
from tabletstore import SetCell
from tabletstore.batch.engines import dask_dataframe
from tabletstore.data.model import RowMutation
from tabletstore.extras import needs_extra

with needs_extra("batch", what="this example"):
    from distributed import Client, LocalCluster

DOMAINS = ["com.cnn.www", "com.example.www", "org.wikipedia.en", "uk.co.bbc.www"]
SITES = [f"site{i}.net" for i in range(40)]


def fill(db: tabletstore.SyncDatabase) -> dict[str, int]:
    """Pages of four domains, each linked from some sites; returns anchors per domain."""
    if "webtable" in db.list_tables():
        db.delete_table("webtable")  # the count below is of this run's pages
    db.create_table("webtable", ["contents", "anchor"], split_keys=[b"m", b"t"])
    t = db.table("webtable")
    rng = random.Random(8)
    expected: dict[str, int] = {}
    entries = []
    for domain in DOMAINS:
        for page in range(25):
            linking = rng.sample(SITES, rng.randint(0, 6))
            row = f"{domain}/page{page}".encode()
            muts = [SetCell("contents", b"", b"<html>...</html>")]
            muts += [SetCell("anchor", s.encode(), f"link from {s}".encode()) for s in linking]
            entries.append(RowMutation(row, tuple(muts)))
            expected[domain] = expected.get(domain, 0) + len(linking)
    t.mutate_rows(entries)
    return expected


def main(url: str) -> None:
    with tabletstore.connect(url) as db:
        expected = fill(db)
        snap = db.snapshot("webtable")
        # Written after the snapshot: not counted.
        db.table("webtable").mutate_row(
            b"com.cnn.www/late", [SetCell("anchor", b"late.org", b"too late")]
        )
        print(f"snapshot {snap.snapshot_id}: {len(snap.tablets)} tablets")
        with (
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
            Client(cluster),
        ):
            # The database's URL: the splits name its store, which is all the workers read.
            anchors = dask_dataframe(url, snap.snapshot_id, columns=["anchor"])
            domain = anchors["row"].map(
                lambda r: bytes(r).split(b"/")[0].decode(), meta=("row", "object")
            )
            counts = anchors.assign(domain=domain).groupby("domain").size().compute()
        for name in sorted(counts.index):
            print(f"{name:20} {counts[name]:3} anchors")
        assert dict(counts.items()) == {d: n for d, n in expected.items() if n}
        print("matches the anchors written before the snapshot")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="database URL (default: a temporary one)")
    args = parser.parse_args()
    main(args.url or f"file://{tempfile.mkdtemp(prefix='tabletstore-')}")
