"""SSTable benchmark: write throughput, point reads (cold and cached), scans, requests per read.

Prints medians over ``--repeats`` runs; asserts nothing. Examples::

    python bench/sstable_bench.py --store memory
    python bench/sstable_bench.py --store file --cells 200000
    python bench/sstable_bench.py --store s3 --url 's3://bucket/prefix?endpoint_url=http://127.0.0.1:9000'
    python bench/sstable_bench.py --store s3 --moto      # starts moto's S3 server on 127.0.0.1

"cold" point reads have no block cache (every read fetches and decodes one block); "cached"
reads hit a warm block cache. Reads run one at a time (latency-bound) and ``--concurrency`` at
a time (what a worker serving many clients sees).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from tabletstore.keys import Cell, CellKind
from tabletstore.sstable import BlockCache, SSTable, upload_sstable, write_sstable
from tabletstore.storage_s3 import find_layer, open_store
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore


def make_cells(n: int, per_row: int, value_size: int) -> list[Cell]:
    rng = random.Random(1)
    return [
        Cell(
            b"user%010d" % (i // per_row),
            "cf",
            b"field%d" % (i % per_row),
            1_700_000_000_000_000,
            i + 1,
            CellKind.PUT,
            rng.randbytes(value_size // 2) + b"x" * (value_size - value_size // 2),
        )
        for i in range(n)
    ]


def median_of(runs: list[float]) -> float:
    return statistics.median(runs)


async def timed(repeats: int, fn: Callable[[], Awaitable[float]]) -> float:
    """Median of ``fn``'s returned rate over ``repeats`` runs."""
    return median_of([await fn() for _ in range(repeats)])


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with a fresh bucket; yields an s3:// URL."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ[name] = value
    from tabletstore.cli.local_s3 import serialize_conditional_writes

    serialize_conditional_writes()  # create-only PUTs decided atomically, as S3 does
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="bench"
        )
        yield f"s3://bench/sstable?endpoint_url={endpoint}&region=us-east-1"
    finally:
        server.stop()


async def run(args: argparse.Namespace, url: str) -> None:
    store: ObjectStore = open_store(url, instrument=True)
    counter = find_layer(store, InstrumentedObjectStore)
    assert counter is not None
    cells = make_cells(args.cells, args.per_row, args.value_size)
    raw = sum(len(c.row) + len(c.family) + len(c.qualifier) + len(c.value) + 17 for c in cells)
    rows = sorted({c.row for c in cells})
    print(
        f"store={url.split('?')[0]}  cells={len(cells):,}  rows={len(rows):,}  "
        f"raw={raw / 1e6:.1f} MB  block_size={args.block_size}  compression={args.compression}"
    )

    writes = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        data, info = write_sstable(cells, compression=args.compression, block_size=args.block_size)
        writes.append(time.perf_counter() - t)
    w = median_of(writes)
    print(
        f"write:  {raw / w / 1e6:7.1f} MB/s raw in ({len(cells) / w:,.0f} cells/s), "
        f"{info.size / 1e6:.1f} MB out in {info.blocks} blocks, footer {info.tail_size / 1e3:.1f} KB"
    )

    key = f"bench/{time.time_ns()}.parquet"
    t = time.perf_counter()
    info = await upload_sstable(store, key, data, info)
    print(f"upload: {info.size / (time.perf_counter() - t) / 1e6:7.1f} MB/s")

    counter.reset()
    opens = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        await SSTable.open(store, key, size=info.size, tail_size=info.tail_size)
        opens.append(time.perf_counter() - t)
    print(
        f"open:   {median_of(opens) * 1e3:7.2f} ms, "
        f"{counter.stats().requests / args.repeats:.0f} request(s) per open"
    )

    rng = random.Random(2)
    sample = [rng.choice(rows) for _ in range(args.reads)]

    async def point_reads(table: SSTable, concurrency: int) -> float:
        t = time.perf_counter()
        if concurrency <= 1:
            for row in sample:
                await table.get_row(row)
        else:
            sem = asyncio.Semaphore(concurrency)

            async def one(row: bytes) -> None:
                async with sem:
                    await table.get_row(row)

            await asyncio.gather(*(one(r) for r in sample))
        return len(sample) / (time.perf_counter() - t)

    cold = await SSTable.open(store, key, size=info.size, tail_size=info.tail_size)
    counter.reset()
    rate = await timed(args.repeats, lambda: point_reads(cold, 1))
    per_read = counter.stats().requests / (args.repeats * len(sample))
    print(f"point reads cold:    {rate:9,.0f} reads/s (1 in flight), {per_read:.2f} requests/read")
    rate = await timed(args.repeats, lambda: point_reads(cold, args.concurrency))
    print(f"point reads cold:    {rate:9,.0f} reads/s ({args.concurrency} in flight)")

    cache = BlockCache(capacity_bytes=1 << 30)
    warm = await SSTable.open(store, key, size=info.size, block_cache=cache)
    async for _ in warm.scan():
        pass
    counter.reset()
    rate = await timed(args.repeats, lambda: point_reads(warm, 1))
    print(
        f"point reads cached:  {rate:9,.0f} reads/s (1 in flight), "
        f"{counter.stats().requests / (args.repeats * len(sample)):.2f} requests/read, "
        f"hit rate {cache.stats().hit_rate:.2f}"
    )

    absent = [b"absent%010d" % i for i in range(args.reads)]

    async def absent_reads() -> float:
        t = time.perf_counter()
        for row in absent:
            await cold.get_row(row)
        return len(absent) / (time.perf_counter() - t)

    counter.reset()
    rate = await timed(args.repeats, absent_reads)
    print(
        f"absent-row reads:    {rate:9,.0f} reads/s, "
        f"{counter.stats().requests / (args.repeats * len(absent)):.3f} requests/read (bloom)"
    )

    async def scan(table: SSTable) -> float:
        t = time.perf_counter()
        n = 0
        async for _ in table.scan():
            n += 1
        return n / (time.perf_counter() - t)

    counter.reset()
    rate = await timed(args.repeats, lambda: scan(cold))
    print(
        f"scan cold:           {rate:9,.0f} cells/s, "
        f"{counter.stats().requests / args.repeats:.0f} requests/scan"
    )
    rate = await timed(args.repeats, lambda: scan(warm))
    print(f"scan cached:         {rate:9,.0f} cells/s")

    resident = await SSTable.open(store, key, size=info.size)
    t = time.perf_counter()
    await resident.load_all()
    print(f"load_all:            {(time.perf_counter() - t) * 1e3:9.1f} ms")
    await store.delete(key)
    await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["memory", "file", "s3"], default="memory")
    parser.add_argument("--url", help="store URL (required for --store s3 unless --moto)")
    parser.add_argument("--moto", action="store_true", help="run moto's S3 server on loopback")
    parser.add_argument("--cells", type=int, default=100_000)
    parser.add_argument("--per-row", type=int, default=4)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--block-size", type=int, default=64 * 1024)
    parser.add_argument("--compression", default="zstd")
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    if args.store == "memory":
        asyncio.run(run(args, "memory://"))
    elif args.store == "file":
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(run(args, f"file://{tmp}"))
    elif args.moto:
        with moto_server() as url:
            asyncio.run(run(args, url))
    elif args.url:
        asyncio.run(run(args, args.url))
    else:
        parser.error("--store s3 needs --url s3://bucket/prefix?endpoint_url=... or --moto")


if __name__ == "__main__":
    main()
