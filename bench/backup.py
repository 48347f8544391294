"""Backup, restore and clone benchmark: how fast a table leaves for another bucket and comes
back, next to boto3's managed transfers of the same bytes in the same run, how long a zero-copy
clone takes at two table sizes, and (``--pitr-mb``) a point-in-time restore.

    python -m bench.backup [--mb 32] [--repeats 3] [--database s3|file] [--markdown FILE]
                           [--docs docs/performance/index.md]
    python -m bench.backup --pitr-mb 1024 [--pitr-log-mb 128] [--markdown FILE] [--docs PAGE]

moto's S3 server runs in this process on a free loopback port (as in the tests: the same
machine, no network). An embedded database holds a table of ``--mb`` MB of 1000-byte random
values in 4 tablets, flushed and compacted. With ``--database s3`` (the default, a database
as deployed) every database lives in a bucket of that server, next to the backup location's
bucket; with ``--database file`` on local disk.

* **backup**: ``create_backup(T, to=s3://dst/...)``: the cut, then every SSTable the backup
  names copied to the other bucket with its checksum, and the manifest. Right after it, the
  same SSTables with boto3's managed transfer into a third bucket (16 at once, the copy's
  concurrency): ``copy`` from the database's bucket (s3), ``upload_file`` of its files (file).
* **restore**: ``restore_table(ID, NEW, source=s3://dst/...)`` into a second, empty embedded
  database: the SSTables copied in (between buckets of one endpoint by the server, CopyObject
  with its SHA-256; into a local directory read in ranged parts, 16 at once in the client's
  threads, each part written and hashed as it lands, each file synced once whole, all named
  and their directories synced once at the end), then the table created. Right after it,
  boto3's managed ``copy`` (s3) or ``download_file`` (file) of the same objects.
* Each of the two is timed ``--repeats`` times, the boto3 side right after ours each time:
  the table gives the medians and each run's ratio (the machine's load moves both sides).
* **clone**: ``clone_table`` of a table of ``--mb`` / 16 MB and of ``--mb`` MB: records only,
  so the time should not grow with the size.
* **point-in-time restore** (``--pitr-mb``, instead of the above): a table of that many MB with
  a one-hour history window, written and flushed, checkpointed more than the clock margin
  later (the master checkpoints a one-hour window every 15 minutes); then ``--pitr-log-mb``
  MB of overwrites of random rows, the instant, and an eighth as much again after it; then
  ``restore_as_of`` the instant (the log sorted in this process), timed, and a sample of the
  overwritten rows checked against the model. Reports the time, MB/s over the checkpoint's
  SSTables plus the log read, and how much log was read and replayed.

Throughput is the backup's SSTable bytes over the wall-clock time. Prints one table; asserts
nothing about speed (performance is never a test). ``--docs PAGE`` puts it in PAGE between the
markers of its mode (:data:`BEGIN`/:data:`END`, :data:`PITR_BEGIN`/:data:`PITR_END`:
docs/performance/index.md's "Backups, restores and clones").
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import replace_between
from tabletstore.client.mutate_rows import MutationsFailed
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.embedded import Database
from tabletstore.master.checkpoints import CLOCK_MARGIN
from tabletstore.options import TabletOptions
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.layout import TABLES

#: The markers around each mode's table in the docs page (``--docs``).
BEGIN, END = "<!-- bench.backup: begin -->", "<!-- bench.backup: end -->"
PITR_BEGIN = "<!-- bench.backup --pitr-mb: begin -->"
PITR_END = "<!-- bench.backup --pitr-mb: end -->"

REGION = "us-east-1"
THREADS = 16
VALUE = 1000


def _moto() -> tuple[Any, str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION=REGION
    )
    from tabletstore.cli.local_s3 import serialize_conditional_writes

    serialize_conditional_writes()  # create-only PUTs decided atomically, as S3 does
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def _s3(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION)


async def _fill(db: Database, table: str, mb: float) -> None:
    rows = max(1, int(mb * 1e6 / VALUE))
    splits = [b"row%09d" % (rows * i // 4) for i in range(1, 4)]
    await db.create_table(table, ["f"], split_keys=sorted(set(splits)))
    t = db.table(table)
    rng = random.Random(7)
    for start in range(0, rows, 500):
        batch = [
            RowMutation(b"row%09d" % i, (SetCell("f", b"q", rng.randbytes(VALUE)),))
            for i in range(start, min(rows, start + 500))
        ]
        await t.mutate_rows(batch)
    await db.compact(table)


async def _warm(url: str) -> None:
    """Import the S3 client and resolve credentials once, outside the timings (the boto3
    side's client is made before its timing too)."""
    store = open_store(url)
    try:
        await store.head("warm-up")
    finally:
        await store.close()


def _timed_pool(fn: Any, items: list[Any]) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(fn, items))
    return time.perf_counter() - start


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _managed_copy(
    s3: Any, source: str, prefix: str, keys: list[str], bucket: str, target: str
) -> float:
    """boto3's managed copy (``s3.copy``: CopyObject, or UploadPartCopy parts above 8 MB) of
    ``source``/``prefix``+key to ``bucket`` under ``target``/key; the seconds taken."""
    return _timed_pool(
        lambda k: s3.copy({"Bucket": source, "Key": prefix + k}, bucket, f"{target}/{k}"), keys
    )


def _bytes_under(s3: Any, bucket: str, prefix: str) -> int:
    """The bytes of the objects under ``prefix`` in ``bucket`` (what boto3's side copied)."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sum(o["Size"] for page in pages for o in page.get("Contents", ()))


async def run(mb: float, work: Path, repeats: int, database: str = "s3") -> list[Row]:
    """The backup, restore and clone rows (module docstring); ``database``: ``s3`` (the
    databases in buckets of the S3 server, compared with boto3's managed copy) or ``file``
    (on local disk, compared with boto3's managed upload and download)."""
    server, endpoint = _moto()
    s3 = _s3(endpoint)
    in_s3 = database == "s3"
    try:
        # moto keeps its buckets per process, not per server: each run gets its own.
        run_id = uuid.uuid4().hex[:8]
        src_b, dst_b, boto_b, restored_b = (f"{b}-{run_id}" for b in ("src", "dst", "boto", "rst"))
        for bucket in (src_b, dst_b, boto_b, restored_b):
            s3.create_bucket(Bucket=bucket)
        query = f"?endpoint_url={endpoint}&region={REGION}"
        dst = f"s3://{dst_b}/backups{query}"
        await _warm(dst)

        async def opened(name: str) -> Database:
            if not in_s3:
                return await Database.open(f"file://{work}/{name}")
            bucket = src_b if name == "src" else restored_b
            url = f"memory://bench-{uuid.uuid4().hex[:8]}-{name}"
            return await Database.open(url, store_url=f"s3://{bucket}/{name}{query}")

        rows: list[Row] = []
        ups: list[tuple[float, float]] = []  # (tabletstore MB/s, boto3 MB/s), one per repeat
        downs: list[tuple[float, float]] = []
        boto_sizes: list[int] = []  # the bytes boto3's side moved, backup then restore
        async with await opened("src") as db:
            await _fill(db, "t", mb)
            await _fill(db, "small", mb / 16)
            objects = Path(db.store.url.removeprefix("file://"))
            # Each repeat: a backup and boto3's transfer of its files, then a restore into an
            # empty database and boto3's transfer of the same objects, side by side.
            for i in range(repeats):
                start = time.perf_counter()
                backup = await db.create_backup("t", f"bench{i}", to=dst)
                took = time.perf_counter() - start
                size = backup.size_bytes / 1e6
                keys = backup.sstable_keys()
                if in_s3:
                    up = _managed_copy(s3, src_b, "src/", keys, boto_b, f"up{i}")
                else:
                    up = _timed_pool(
                        lambda k, i=i: s3.upload_file(str(objects / k), boto_b, f"up{i}/{k}"),
                        keys,
                    )
                boto_sizes.append(_bytes_under(s3, boto_b, f"up{i}/"))
                ups.append((size / took, size / up))
                async with await opened(f"restored{i}") as other:
                    start = time.perf_counter()
                    await other.restore_table(f"bench{i}", "r", source=dst)
                    took = time.perf_counter() - start
                    count = 0
                    async for _ in other.table("r").read_rows():
                        count += 1
                tables = [k for k in keys if k.startswith(TABLES)]
                if in_s3:
                    down = _managed_copy(s3, dst_b, "backups/", tables, boto_b, f"down{i}")
                    boto_sizes.append(_bytes_under(s3, boto_b, f"down{i}/"))
                else:
                    down_dir = work / f"download{i}"
                    down = _timed_pool(
                        lambda k, d=down_dir: (
                            (d / k).parent.mkdir(parents=True, exist_ok=True),
                            s3.download_file(dst_b, f"backups/{k}", str(d / k)),
                        ),
                        tables,
                    )
                    boto_sizes.append(
                        sum(f.stat().st_size for f in down_dir.rglob("*") if f.is_file())
                    )
                downs.append((size / took, size / down))
            clones = []
            for name in ("small", "t"):
                table_mb = (
                    sum(
                        r.size
                        for rec in await db.catalog.list_tablets((await db._info(name)).table_id)
                        for refs in rec.sstables.values()
                        for r in refs
                    )
                    / 1e6
                )
                start = time.perf_counter()
                await db.clone_table(name, f"{name}-clone")
                clones.append((table_mb, time.perf_counter() - start))
        up_name, down_name = ("copy", "copy") if in_s3 else ("upload_file", "download_file")
        for what, pairs, boto, moved in (
            (f"backup to another bucket ({size:.1f} MB, {len(keys)} SSTables)", ups, up_name, 0),
            (f"restore from that bucket ({size:.1f} MB, {count} rows)", downs, down_name, 1),
        ):
            ratios = ", ".join(f"{a / b:.2f}" for a, b in pairs)
            boto_mb = max(boto_sizes[moved::2]) / 1e6
            rows.append(
                (
                    what,
                    f"{_median([a for a, _ in pairs]):.1f} MB/s",
                    f"{_median([b for _, b in pairs]):.1f} MB/s ({boto}, {boto_mb:.1f} MB)",
                    f"{_median([a / b for a, b in pairs]):.2f}× ({ratios})",
                )
            )
        for table_mb, seconds in clones:
            rows.append((f"clone of a {table_mb:.1f} MB table", f"{seconds:.2f} s", "-", "-"))
        return rows
    finally:
        server.stop()


Row = tuple[str, str, str, str]
HOUR = 3600.0


async def _mutate(table: Any, batch: list[RowMutation]) -> None:
    """``mutate_rows``, the rows that failed (Unavailable on a loaded machine) sent again:
    each sets a cell at a fixed timestamp, so a retry is idempotent."""
    for _ in range(10):
        try:
            await table.mutate_rows(batch)
            return
        except MutationsFailed as exc:
            failed = {f.index for f in exc.failures}
            batch = [m for i, m in enumerate(batch) if i in failed]
    await table.mutate_rows(batch)


@dataclass(frozen=True)
class PitrResult:
    table_mb: float
    tablets: int
    window: float
    after_mb: float
    log_mb: float
    segments: int
    log_cells: int
    seconds: float
    rows: int


async def pitr(mb: float, log_mb: float, work: Path) -> PitrResult:
    """A table of ``mb`` MB with a one-hour history window, checkpointed; then ``log_mb`` MB of
    overwrites of random rows, the instant, and more overwrites after it; then the table
    restored as of the instant, and the rows overwritten checked against the model."""
    # The four tablets are not split further: a split under a load of 30 outlasted the
    # client's retry deadline, and the figure is the restore's, not the splits'.
    unsplit = TabletOptions(split_bytes=64 * 1024**3)
    async with await Database.open(f"file://{work}/pitr", tablet_options=unsplit) as db:
        rows = max(1, int(mb * 1e6 / VALUE))
        splits = sorted({b"row%09d" % (rows * i // 4) for i in range(1, 4)})
        await db.create_table("p", ["f"], split_keys=splits, history=HOUR)
        t = db.table("p")
        rng = random.Random(11)
        model: dict[bytes, bytes] = {}

        async def write(count: int, *, overwrite: bool) -> None:
            for first in range(0, count, 500):
                batch = []
                n = min(count, first + 500) - first
                # Distinct rows in a batch: a retried entry never lands after a later one.
                picked = rng.sample(range(rows), n) if overwrite else range(first, first + n)
                for i in picked:
                    row = b"row%09d" % i
                    value = rng.randbytes(VALUE)
                    if overwrite:
                        model[row] = value
                    batch.append(RowMutation(row, (SetCell("f", b"q", value, 1),)))
                await _mutate(t, batch)

        await write(rows, overwrite=False)
        await db.flush("p")
        # The load ends more than the clock margin before the checkpoint (with a one-hour
        # window the master checkpoints every 15 minutes): the restore then reads only the
        # log written after the checkpoint, as it does for a table written steadily.
        await asyncio.sleep(CLOCK_MARGIN + 5)
        (checkpoint,) = await db.checkpoint()
        table_mb = (
            sum(
                r.size for tab in checkpoint.tablets for refs in tab.sstables.values() for r in refs
            )
            / 1e6
        )
        after = max(1, int(log_mb * 1e6 / VALUE))
        await write(after, overwrite=True)
        instant = time.time()
        expected = dict(model)
        await write(max(1, after // 8), overwrite=True)  # after the instant: never restored
        start = time.perf_counter()
        report = await db.restore_as_of("p", instant, "p_then")
        seconds = time.perf_counter() - start
        restored = db.table("p_then")
        sample = random.Random(5).sample(sorted(expected), min(2000, len(expected)))
        for row in sample:
            value = expected[row]
            got = await restored.read_row(row)
            assert got is not None and got.cells[0].value == value, f"restored {row!r} differs"
        return PitrResult(
            table_mb=table_mb,
            tablets=report.tablets,
            window=HOUR,
            after_mb=after * VALUE / 1e6,
            log_mb=report.log_bytes / 1e6,
            segments=report.segments_read,
            log_cells=report.log_cells,
            seconds=seconds,
            rows=len(sample),
        )


def markdown(
    rows: list[Row], mb: float, repeats: int, database: str = "s3", start: str = ""
) -> str:
    lines = [
        "| operation | tabletstore | boto3 managed transfer, same objects | ratio: median (each run) |",
        "|---|---:|---:|---:|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
    ]
    where = (
        "databases and backup location in three buckets of one S3 endpoint"
        if database == "s3"
        else "databases on local disk (`file://`), backup location in a bucket"
    )
    lines.append("")
    lines.append(
        f"Table of {mb:g} MB of {VALUE}-byte values in 4 tablets; {where} (moto's S3 server in "
        f"process); {THREADS} objects in flight on both sides; medians of {repeats} runs, each "
        f"side right after the other; load average {start + ' at the start, ' if start else ''}"
        f"{_load()} at the end."
    )
    return "\n".join(lines)


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def pitr_markdown(result: PitrResult) -> str:
    r = result
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return "\n".join(
        [
            "| point-in-time restore | value |",
            "|---|---:|",
            f"| table at the checkpoint | {r.table_mb:.0f} MB ({r.tablets} tablets) |",
            f"| history window | {r.window / 3600:g} h |",
            f"| written after the checkpoint, up to the instant | {r.after_mb:.0f} MB |",
            f"| log read (segments of the span) | {r.log_mb:.0f} MB in {r.segments} segments |",
            f"| log cells replayed (after the cut, by the instant) | {r.log_cells} |",
            f"| restore time | {r.seconds:.1f} s |",
            f"| throughput (checkpoint + log read) | {(r.table_mb + r.log_mb) / r.seconds:.1f} MB/s |",
            "",
            f"Embedded database (`file://`), log sorted in process; restored table checked "
            f"equal to the model as of the instant on {r.rows} overwritten rows; load average at the end "
            f"{load}.",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.backup", description=__doc__)
    parser.add_argument("--mb", type=float, default=32.0, help="table size in MB (default 32)")
    parser.add_argument(
        "--database",
        choices=("s3", "file"),
        default="s3",
        help="where the databases live: s3 (buckets of the backup's S3 endpoint; boto3's "
        "managed copy beside) or file (local disk; boto3's managed upload and download beside)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="backups and restores timed (default 3)"
    )
    parser.add_argument(
        "--pitr-mb",
        type=float,
        default=0.0,
        help="instead: a point-in-time restore of a table of this many MB (e.g. 1024)",
    )
    parser.add_argument(
        "--pitr-log-mb",
        type=float,
        default=128.0,
        help="MB written after the checkpoint, up to the instant (default 128)",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument(
        "--docs", type=Path, default=None, help="put the table in this page, between its markers"
    )
    args = parser.parse_args(argv)
    if args.mb <= 0 or args.repeats < 1 or args.pitr_mb < 0 or args.pitr_log_mb < 0:
        parser.error("--mb and --pitr-log-mb must be > 0 and --repeats >= 1")
    begin, end = (PITR_BEGIN, PITR_END) if args.pitr_mb else (BEGIN, END)
    if args.docs is not None:  # checked before minutes of benchmark, not after
        page = args.docs.read_text() if args.docs.is_file() else ""
        if begin not in page or end not in page:
            parser.error(f"--docs {args.docs} has no {begin} ... {end} block")
    with tempfile.TemporaryDirectory(prefix=f"bench-backup-{uuid.uuid4().hex[:6]}-") as work:
        if args.pitr_mb:
            text = pitr_markdown(asyncio.run(pitr(args.pitr_mb, args.pitr_log_mb, Path(work))))
        else:
            start = _load()
            rows = asyncio.run(run(args.mb, Path(work), args.repeats, args.database))
            text = markdown(rows, args.mb, args.repeats, args.database, start)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    if args.docs is not None:
        replace_between(args.docs, begin, end, text + "\n")


if __name__ == "__main__":
    main()
