"""Batch benchmark: reading a snapshot straight from the bucket, and bulk load.

    python -m bench.batch [--rows 50000] [--cells-per-row 4] [--value-bytes 100]

On one embedded database (a local directory as the bucket), in one run:

* cells/s of ``tabletstore.batch`` reading a snapshot on one process, and on a
  ``distributed.LocalCluster`` of 2 worker processes (Dask), against the client's scan
  (``read_rows``) of the same table (target: the reader at least 5 times the scan per
  process), in wall-clock time and in CPU seconds of the process (the database is embedded
  in it: the scan's server side counts too); the scan's block cache is warm after its first
  run, the reader always reads from the bucket;
* the same, on a table whose snapshot holds deletion entries of every kind and two versions
  of every cell under a one-version GC rule (the reader's vectorised rules, against the
  client's scan);
* MB/s (raw cell bytes: row, family, qualifier, value) of a bulk load (the job's
  ``write_sstables``, its files cut at the table's tablet boundaries, plus ``bulk_load``,
  which adopts them as they are) against ``tabletstore import`` of the same rows from
  CSV (target: at least 10 times), and the same ratio in CPU seconds of the process (the
  database is embedded in it), which the other jobs of a shared machine disturb less.

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

import tabletstore
from bench import require_extra
from tabletstore import batch
from tabletstore.batch.engines import dask_dataframe
from tabletstore.cli import csv_cmds
from tabletstore.data.model import DeleteCells, DeleteRow, RowMutation
from tabletstore.data.schema import ColumnFamily, MaxVersionsRule

SPLITS = [b"row%08d" % i for i in (1, 2, 3)]


def make_data(rows: int, per_row: int, value_bytes: int) -> pa.Table:
    # Spread over the 4 tablets of SPLITS: row%08d of the quarter, then the row number.
    keys = [b"row%08d-%08d" % (4 * i // rows, i) for i in range(rows)]
    out_rows, quals, vals = [], [], []
    for i, key in enumerate(keys):
        for c in range(per_row):
            out_rows.append(key)
            quals.append(b"col%d" % c)
            vals.append((b"%08d" % (i * per_row + c)) * (value_bytes // 8))
    return pa.table(
        {
            "row": pa.array(out_rows, pa.binary()),
            "family": pa.array(["cf"] * len(out_rows)),
            "qualifier": pa.array(quals, pa.binary()),
            "value": pa.array(vals, pa.binary()),
        }
    )


def churn(db: Any, tmp: Path, data: pa.Table, rows: int, per_row: int) -> int:
    """Table ``churned``: the rows bulk-loaded twice (two timestamps) into a family that
    keeps one version, then every 10th row deleted, every 7th row's col1 deleted and every
    5th row's col2 deleted in its newer version only: entries the reader must mask or
    collect. Returns the entries stored (puts and deletion entries)."""
    db.create_table(
        "churned",
        [ColumnFamily(name="cf", gc_rule=MaxVersionsRule(max_versions=1))],
        split_keys=SPLITS,
    )
    n = data.num_rows
    for i, ts in enumerate((1_000_000, 2_000_000)):
        versioned = data.append_column("timestamp", pa.array([ts] * n, pa.int64()))
        batch.write_sstables(versioned, db.staging_url(f"churn{i}"))
        db.bulk_load("churned", db.staging_url(f"churn{i}"))
    keys = data.column("row").to_pylist()[::per_row]
    mutations: list[RowMutation] = []
    for i, key in enumerate(keys):
        if i % 10 == 0:
            mutations.append(RowMutation(key, (DeleteRow(),)))
        elif i % 7 == 0:
            mutations.append(RowMutation(key, (DeleteCells("cf", b"col1"),)))
        elif i % 5 == 0:
            mutations.append(RowMutation(key, (DeleteCells("cf", b"col2", 2_000_000, 2_000_001),)))
    table = db.table("churned")
    for start in range(0, len(mutations), 1000):
        table.mutate_rows(mutations[start : start + 1000])
    return 2 * n + len(mutations)


def raw_bytes(data: pa.Table) -> int:
    return (
        sum(len(v) for col in ("row", "qualifier", "value") for v in data.column(col).to_pylist())
        + 2 * data.num_rows
    )


def write_csv(data: pa.Table, path: Path, per_row: int) -> None:
    rows = data.column("row").to_pylist()
    vals = data.column("value").to_pylist()
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", *(f"cf:col{c}" for c in range(per_row))])
        for i in range(0, len(rows), per_row):
            w.writerow([rows[i].decode(), *(v.decode() for v in vals[i : i + per_row])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--cells-per-row", type=int, default=4)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3, help="read measurements (best is shown)")
    ap.add_argument(
        "--load-repeats", type=int, default=3, help="bulk load and import measurements (best)"
    )
    args = ap.parse_args()
    require_extra("batch", "python -m bench.batch")
    tmp = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    data = make_data(args.rows, args.cells_per_row, args.value_bytes)
    cells = data.num_rows
    mb = raw_bytes(data) / 1e6
    csv_path = tmp / "rows.csv"
    write_csv(data, csv_path, args.cells_per_row)
    db = tabletstore.connect(f"file://{tmp}/db")
    results: list[tuple[str, str, str]] = []
    try:
        # Bulk load (the job writes SSTables, then the table takes them) and tabletstore
        # import of the same rows, alternated ``--load-repeats`` times into fresh tables;
        # best of each.
        # The database runs in this process: its CPU seconds (all threads) are the work each
        # way took, a figure the other jobs on a shared machine disturb less than wall time.
        bulk_runs, import_runs = [], []
        bulk_cpu, import_cpu = [], []
        # Warm both paths on a sample of rows of every tablet first (module imports, thread
        # pools: not throughput).
        per_row, step = args.cells_per_row, max(1, args.rows // 100)
        sample = data.take(
            [r * per_row + c for r in range(0, args.rows, step) for c in range(per_row)]
        )
        db.create_table("warm", ["cf"], split_keys=SPLITS)
        batch.write_sstables(sample, db.staging_url("warm"), split_keys=SPLITS)
        db.bulk_load("warm", db.staging_url("warm"))
        write_csv(sample, tmp / "warm.csv", args.cells_per_row)
        csv_cmds.import_csv(db, "warm", tmp / "warm.csv", csv_cmds.import_plan(()))
        for r in range(args.load_repeats):
            db.create_table(f"bulk{r}", ["cf"], split_keys=SPLITS)
            db.create_table(f"imported{r}", ["cf"], split_keys=SPLITS)
            t0, c0 = time.perf_counter(), time.process_time()
            # Cut at the table's tablet boundaries, as a job partitions its output (HBase's
            # HFileOutputFormat2 by region): every file is adopted as it is.
            batch.write_sstables(data, db.staging_url(f"out{r}"), split_keys=SPLITS)
            db.bulk_load(f"bulk{r}", db.staging_url(f"out{r}"))
            bulk_runs.append(time.perf_counter() - t0)
            bulk_cpu.append(time.process_time() - c0)
            t0, c0 = time.perf_counter(), time.process_time()
            csv_cmds.import_csv(db, f"imported{r}", csv_path, csv_cmds.import_plan(()))
            import_runs.append(time.perf_counter() - t0)
            import_cpu.append(time.process_time() - c0)
            db.flush(f"imported{r}")  # untimed: no memtable flush left to overlap the next run
        bulk_s, import_s = min(bulk_runs), min(import_runs)
        results.append(("bulk load (write_sstables + bulk_load)", f"{mb / bulk_s:,.1f} MB/s", ""))
        results.append(
            ("tabletstore import (CSV, client mutations)", f"{mb / import_s:,.1f} MB/s", "")
        )
        results.append(("bulk load / import", f"{import_s / bulk_s:,.1f}x", "target >= 10x"))
        results.append(
            (
                "bulk load / import, CPU seconds",
                f"{min(import_cpu) / min(bulk_cpu):,.1f}x",
                f"{min(bulk_cpu):.2f} s against {min(import_cpu):.2f} s",
            )
        )

        # Reads of the same table: the client's scan and the snapshot reader, alternated
        # ``--repeats`` times (the machine is shared: the best of each is reported).
        snap = db.snapshot("imported0")
        store_url = db.store.url
        scan_runs, read_runs = [], []
        scan_cpu, read_cpu = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            scanned = sum(len(r.cells) for r in db.table("imported0").read_rows())
            scan_runs.append(time.perf_counter() - t0)
            scan_cpu.append(time.process_time() - c0)
            assert scanned == cells, (scanned, cells)
            t0, c0 = time.perf_counter(), time.process_time()
            read = batch.open_snapshot(store_url, snap.snapshot_id).read().num_rows
            read_runs.append(time.perf_counter() - t0)
            read_cpu.append(time.process_time() - c0)
            assert read == cells, (read, cells)
        scan_s, read_s = min(scan_runs), min(read_runs)
        churned = churn(db, tmp, data, args.rows, args.cells_per_row)
        churn_snap = db.snapshot("churned")
        churn_scan, churn_read = [], []
        churn_scan_cpu, churn_read_cpu = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            scanned = sum(len(r.cells) for r in db.table("churned").read_rows())
            churn_scan.append(time.perf_counter() - t0)
            churn_scan_cpu.append(time.process_time() - c0)
            t0, c0 = time.perf_counter(), time.process_time()
            read = batch.open_snapshot(store_url, churn_snap.snapshot_id).read().num_rows
            churn_read.append(time.perf_counter() - t0)
            churn_read_cpu.append(time.process_time() - c0)
            assert read == scanned, (read, scanned)
        churned_visible = read
        from distributed import Client, LocalCluster

        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
            ) as lc,
            Client(lc),
        ):
            # A fresh DataFrame per run (opening the snapshot is part of the job), each
            # partition counted where it is read.
            def count() -> int:
                df = dask_dataframe(store_url, snap.snapshot_id, max_split_bytes=1 << 20)
                return int(df.map_partitions(len, meta=(None, "int64")).compute().sum())

            count()  # warm the workers (imports) before timing
            dask_runs = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                dask_cells = count()
                dask_runs.append(time.perf_counter() - t0)
            dask_s = min(dask_runs)
        assert dask_cells == cells, (dask_cells, cells)
        results.append(("client scan (read_rows)", f"{cells / scan_s:,.0f} cells/s", ""))
        results.append(
            (
                "tabletstore.batch, 1 process",
                f"{cells / read_s:,.0f} cells/s",
                f"{scan_s / read_s:,.1f}x the scan (target >= 5x)",
            )
        )
        results.append(
            (
                "tabletstore.batch / scan, CPU seconds",
                f"{min(scan_cpu) / min(read_cpu):,.1f}x",
                f"{min(read_cpu):.2f} s against {min(scan_cpu):.2f} s",
            )
        )
        cs, cr = min(churn_scan), min(churn_read)
        results.append(
            (
                "client scan, deletions and a GC rule",
                f"{churned_visible / cs:,.0f} cells/s",
                f"{churned:,} entries stored, {churned_visible:,} visible",
            )
        )
        results.append(
            (
                "tabletstore.batch, 1 process, deletions and a GC rule",
                f"{churned_visible / cr:,.0f} cells/s",
                f"{cs / cr:,.1f}x the scan (target >= 5x)",
            )
        )
        results.append(
            (
                "tabletstore.batch / scan, deletions and a GC rule, CPU seconds",
                f"{min(churn_scan_cpu) / min(churn_read_cpu):,.1f}x",
                f"{min(churn_read_cpu):.2f} s against {min(churn_scan_cpu):.2f} s",
            )
        )
        results.append(
            (
                "tabletstore.batch on Dask, 2 workers",
                f"{cells / dask_s:,.0f} cells/s",
                f"{scan_s / dask_s:,.1f}x the scan",
            )
        )
    finally:
        db.close()
    print(f"{args.rows:,} rows, {cells:,} cells, {mb:,.1f} MB raw; {os.cpu_count()} cores")
    print()
    print("| what | rate | note |")
    print("|---|---|---|")
    for what, rate, note in results:
        print(f"| {what} | {rate} | {note} |")


if __name__ == "__main__":
    main()
