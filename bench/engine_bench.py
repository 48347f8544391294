"""Tablet engine benchmark: the serving paths of one tablet (§5.3, §5.4), no worker, no RPC.

Prints, per store (memory, file): tablet applies/s one at a time and ``--concurrency`` at a
time (concurrent applies share commit-log PUTs: group commit), point reads/s from the memtable
and from SSTables with no block cache ("cold": every read fetches and decodes a block) and with
a warm one ("cached"), full-scan cells/s, and minor-compaction MB/s (memtable bytes and SSTable
bytes written per second). Asserts nothing. Examples::

    python bench/engine_bench.py
    python bench/engine_bench.py --stores file --rows 50000 --concurrency 256

The tablet is built the way a worker builds it: a real commit log (one incarnation), a catalog
over an in-process coordinator, tablet records with compare-on-epoch.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections.abc import Callable, Sequence

from tabletstore.commitlog import CommitLogWriter
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.model import SetCell
from tabletstore.data.query import RowRange
from tabletstore.data.schema import ColumnFamily, LocalityGroup, TableSchema
from tabletstore.engine.tablet import Tablet
from tabletstore.errors import TabletStoreError
from tabletstore.keys import Cell
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.options import TabletOptions
from tabletstore.sstable import BlockCache
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectStore

SCHEMA = TableSchema(
    name="bench",
    families={"cf": ColumnFamily(name="cf")},
    locality_groups={"default": LocalityGroup(name="default")},
)


class BenchLog:
    """The tablet's LogSink over one commit-log writer."""

    def __init__(self, writer: CommitLogWriter) -> None:
        self.writer = writer
        self.log_ref = LogRef(writer.worker_id, writer.incarnation)

    def allocate(self, n: int) -> int:
        return self.writer.allocate(n)

    def advance(self, seq: int) -> None:
        self.writer.advance(seq)

    def segment_mark(self) -> int:
        return self.writer.next_segment

    async def append(
        self,
        table_id: str,
        row: bytes,
        cells: Sequence[Cell],
        on_durable: Callable[[Sequence[Cell]], object] | None = None,
    ) -> None:
        await self.writer.append(table_id, row, cells, on_durable)

    async def append_many(
        self,
        table_id: str,
        rows: Sequence[tuple[bytes, Sequence[Cell]]],
        on_durable: Callable[[Sequence[Cell]], object] | None = None,
    ) -> list[TabletStoreError | None]:
        return await self.writer.append_many(table_id, rows, on_durable)


class Bench:
    def __init__(self, store: ObjectStore, args: argparse.Namespace) -> None:
        self.store = store
        self.args = args
        self.coord = MemoryCoordinator()
        self.catalog = Catalog(self.coord)
        self.writer = CommitLogWriter(store, "bench", 0)
        self.log = BenchLog(self.writer)
        self.table_id = ""

    async def open(self, block_cache: BlockCache | None) -> Tablet:
        rec = await self.catalog.get_tablet(self.table_id, "t0")
        return await Tablet.load(
            rec,
            SCHEMA,
            store=self.store,
            log_sink=self.log,
            catalog=self.catalog,
            options=TabletOptions(memtable_flush_bytes=1 << 40),
            block_cache=block_cache,
        )

    async def run(self) -> dict[str, str]:
        a = self.args
        self.writer.start()
        self.table_id = Catalog.new_table_id("bench")
        await self.catalog.create_table(SCHEMA, [TabletRecord(self.table_id, "t0", b"", None)])
        tablet = await self.open(None)
        rng = random.Random(7)
        rows = [b"user%010d" % i for i in range(a.rows)]
        # Half random, half repeated: values that compress about 2:1.
        half = a.value_size // 2
        values = {r: rng.randbytes(half) + b"x" * (a.value_size - half) for r in rows}
        out: dict[str, str] = {}

        # Applies, one at a time: each waits for its own commit-log PUT.
        n1 = min(a.rows, a.serial_applies)
        t = time.perf_counter()
        for row in rows[:n1]:
            await tablet.apply(row, [SetCell("cf", b"f0", values[row])])
        out["apply/s (one at a time)"] = rate(n1, t)

        # Applies, many at a time: group commit shares PUTs.
        t = time.perf_counter()
        sem = asyncio.Semaphore(a.concurrency)

        async def one(row: bytes) -> None:
            async with sem:
                await tablet.apply(row, [SetCell("cf", b"f1", values[row])])

        await asyncio.gather(*(one(r) for r in rows))
        out[f"apply/s ({a.concurrency} at a time)"] = rate(a.rows, t)
        segments = self.writer.stats.segments
        out["commit-log PUTs"] = f"{segments} for {n1 + a.rows} applies"

        sample = [rows[rng.randrange(a.rows)] for _ in range(a.reads)]
        t = time.perf_counter()
        for row in sample:
            await tablet.read_row(row)
        out["point read/s, memtable"] = rate(a.reads, t)

        # Minor compaction: the whole memtable to one SSTable.
        mem_bytes = tablet.state.memtable.approximate_size
        t = time.perf_counter()
        await tablet.minor_compact()
        dt = time.perf_counter() - t
        sst_bytes = tablet.record.size
        out["minor compaction"] = (
            f"{mem_bytes / dt / 1e6:,.1f} MB/s memtable, {sst_bytes / dt / 1e6:,.1f} MB/s SSTable "
            f"({sst_bytes / 1e6:.1f} MB in {dt:.2f} s)"
        )
        await tablet.close(flush=False)

        cold = await self.open(None)
        t = time.perf_counter()
        for row in sample:
            await cold.read_row(row)
        out["point read/s, SSTable cold"] = rate(a.reads, t)

        cache = BlockCache(256 * 1024 * 1024)
        cached = await self.open(cache)
        for row in sample:
            await cached.read_row(row)  # warm
        t = time.perf_counter()
        for row in sample:
            await cached.read_row(row)
        out["point read/s, SSTable cached"] = rate(a.reads, t)

        t = time.perf_counter()
        cells = 0
        async for r in cached.scan(RowRange.all()):
            cells += len(r.cells)
        out["scan cells/s"] = rate(cells, t)

        await self.writer.close()
        await self.coord.close()
        return out


def rate(n: int, started: float) -> str:
    dt = time.perf_counter() - started
    return f"{n / dt:,.0f}"


async def bench_store(kind: str, args: argparse.Namespace) -> dict[str, str]:
    if kind == "memory":
        store = open_store("memory://engine-bench")
        return await Bench(store, args).run()
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as root:
        store = open_store(f"file://{root}")
        try:
            return await Bench(store, args).run()
        finally:
            await store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stores", default="memory,file")
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--serial-applies", type=int, default=2_000)
    p.add_argument("--reads", type=int, default=5_000)
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=128)
    args = p.parse_args()
    for kind in args.stores.split(","):
        results = asyncio.run(bench_store(kind, args))
        print(f"== {kind} store: {args.rows} rows, {args.value_size}-byte values")
        for name, value in results.items():
            print(f"  {name:<34} {value}")


if __name__ == "__main__":
    main()
