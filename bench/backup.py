"""Backup, restore and clone benchmark: how fast a table leaves for another bucket and comes
back, next to boto3's managed transfers of the same bytes in the same run, and how long a
zero-copy clone takes at two table sizes.

    python -m bench.backup [--mb 32] [--markdown FILE]

An embedded database (``file://``, the objects on local disk) holds a table of ``--mb`` MB of
1000-byte random values in 4 tablets, flushed and compacted. moto's S3 server runs in this
process on a free loopback port (as in the tests: the same machine, no network).

* **backup**: ``create_backup(T, to=s3://dst/...)``: the cut, then every SSTable the backup
  names copied to the other bucket with its checksum, and the manifest. Next to it, boto3's
  managed ``upload_file`` of the same SSTable files (16 threads, the copy's concurrency) into
  a third bucket.
* **restore**: ``restore_table(ID, NEW, source=s3://dst/...)`` into a second, empty embedded
  database (every SSTable copied in and checked, then the table created). Next to it, boto3's
  managed ``download_file`` of the same objects (16 threads).
* **clone**: ``clone_table`` of a table of ``--mb`` / 16 MB and of ``--mb`` MB: records only,
  so the time should not grow with the size.

Throughput is the backup's SSTable bytes over the wall-clock time. Prints one table; asserts
nothing (performance is never a test).
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
from pathlib import Path
from typing import Any

from tabletstore.data.model import RowMutation, SetCell
from tabletstore.embedded import Database
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.layout import TABLES

REGION = "us-east-1"
THREADS = 16
VALUE = 1000


def _moto() -> tuple[Any, str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION=REGION
    )
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


async def run(mb: float, work: Path) -> list[tuple[str, str, str]]:
    server, endpoint = _moto()
    s3 = _s3(endpoint)
    try:
        for bucket in ("dst", "boto"):
            s3.create_bucket(Bucket=bucket)
        dst = f"s3://dst/backups?endpoint_url={endpoint}&region={REGION}"
        await _warm(dst)
        rows: list[tuple[str, str, str]] = []
        async with await Database.open(f"file://{work}/src") as db:
            await _fill(db, "t", mb)
            await _fill(db, "small", mb / 16)
            start = time.perf_counter()
            backup = await db.create_backup("t", "bench", to=dst)
            took = time.perf_counter() - start
            size = backup.size_bytes / 1e6
            objects = Path(db.store.url.removeprefix("file://"))
            keys = backup.sstable_keys()
            up = _timed_pool(lambda k: s3.upload_file(str(objects / k), "boto", k), keys)
            rows.append(
                (
                    f"backup to another bucket ({size:.1f} MB, {len(keys)} SSTables)",
                    f"{size / took:.1f} MB/s",
                    f"{size / up:.1f} MB/s (upload_file)",
                )
            )
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
        async with await Database.open(f"file://{work}/restored") as other:
            start = time.perf_counter()
            await other.restore_table("bench", "r", source=dst)
            took = time.perf_counter() - start
            count = 0
            async for _ in other.table("r").read_rows():
                count += 1
        down_dir = work / "download"
        down = _timed_pool(
            lambda k: (
                (down_dir / k).parent.mkdir(parents=True, exist_ok=True),
                s3.download_file("dst", f"backups/{k}", str(down_dir / k)),
            ),
            [k for k in keys if k.startswith(TABLES)],
        )
        rows.append(
            (
                f"restore from that bucket ({size:.1f} MB, {count} rows)",
                f"{size / took:.1f} MB/s",
                f"{size / down:.1f} MB/s (download_file)",
            )
        )
        for table_mb, seconds in clones:
            rows.append((f"clone of a {table_mb:.1f} MB table", f"{seconds:.2f} s", "-"))
        return rows
    finally:
        server.stop()


def markdown(rows: list[tuple[str, str, str]], mb: float) -> str:
    lines = [
        "| operation | tabletstore | boto3 managed transfer, same bytes |",
        "|---|---:|---:|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
    ]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines.append("")
    lines.append(
        f"Table of {mb:g} MB of {VALUE}-byte values in 4 tablets; moto's S3 server in process; "
        f"{THREADS} transfers in flight on both sides; load average at the end {load}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.backup", description=__doc__)
    parser.add_argument("--mb", type=float, default=32.0, help="table size in MB (default 32)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    if args.mb <= 0:
        parser.error("--mb must be > 0")
    with tempfile.TemporaryDirectory(prefix=f"bench-backup-{uuid.uuid4().hex[:6]}-") as work:
        rows = asyncio.run(run(args.mb, Path(work)))
    text = markdown(rows, args.mb)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
