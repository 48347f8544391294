"""Recovery benchmark (§5.3, §6 "Commit-log implementation"): a dead worker's log of L MB over
T tablets, recovered by the direct replay (every new owner reads the whole log) and by the
sorted recovery with N sorter processes (``master.recovery.InProcessSortExecutor``).

For each (T, method): bytes read divided by the log's bytes, object-store requests, and
seconds until every tablet has its cells (all tablets recover at once, as the master's loads
go out concurrently). The log is written straight as segments (about 64 KiB each, as group
commit makes them under load) to a local-directory store, so the figures are those of the
recovery alone; a tablet's memtable inserts cost the same on both paths and are left out.

Sorters run in child processes; their reads are accounted from the plan (each task GETs its
segments, the plan and its manifest key once, and PUTs one run per range plus its manifest),
the tablets' reads by an instrumented store. The "owner sorts" rows run the sorters as asyncio
tasks of the process that replays the tablets (the embedded database, or a worker serving the
tablets it sorted): their runs stay in that process's memory (``sorting.IMMUTABLE``), and every
request of sorters and tablets alike goes through the one instrumented store.

    python -m bench.recovery [--log-mb 16] [--tablets 1,16,64] [--sorters 1,2,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tabletstore.commitlog import encode_record, encode_segment, fence, replay_cells
from tabletstore.commitlog.runs import SortManifest, SortPlan, SortTask, TabletRange
from tabletstore.commitlog.sorting import plan_sort, sorted_replay
from tabletstore.keys import Cell, CellKind
from tabletstore.master.recovery import InProcessSortExecutor
from tabletstore.storage_s3 import find_layer, open_store
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.layout import log_segment_key

WORKER, INCARNATION, TABLE = "dead", 1, "t"
SEGMENT_BYTES = 64 * 1024
VALUE_BYTES = 200


@dataclass(frozen=True)
class Result:
    tablets: int
    method: str
    sorters: int
    log_bytes: int
    bytes_read: int
    #: Of which bytes of log segments (the rest: sort plans, manifests and runs).
    log_bytes_read: int
    requests: int
    seconds: float
    #: Sorted recovery: seconds until every sort task was done, and the tasks.
    sort_seconds: float = 0.0
    tasks: int = 0

    @property
    def read_ratio(self) -> float:
        return self.bytes_read / self.log_bytes

    @property
    def log_read_ratio(self) -> float:
        return self.log_bytes_read / self.log_bytes


def tablet_ranges(tablets: int) -> list[TabletRange]:
    bounds: list[bytes | None] = [b"r%04d" % i for i in range(1, tablets)]
    out, start = [], b""
    for i, end in enumerate([*bounds, None]):
        out.append(TabletRange(TABLE, f"t{i:05d}", start, end))
        start = end or b""
    return out


async def write_log(store: ObjectStore, log_bytes: int, tablets: int) -> int:
    """Segments of random rows over ``tablets`` ranges until ``log_bytes``; returns the bytes."""
    rnd = random.Random(42)
    seq, segment, total = 1, 0, 0
    while total < log_bytes:
        frames, size = [], 0
        while size < SEGMENT_BYTES:
            row = b"r%04d-%08d" % (rnd.randrange(tablets), rnd.randrange(10**8))
            cell = Cell(row, "cf", b"q", seq, seq, CellKind.PUT, rnd.randbytes(VALUE_BYTES))
            frame = encode_record(TABLE, row, [cell])
            frames.append(frame)
            size += len(frame)
            seq += 1
        data = encode_segment(WORKER, INCARNATION, segment, frames)
        await store.create(log_segment_key(WORKER, INCARNATION, segment), data)
        segment += 1
        total += len(data)
    return total


def _stats(store: ObjectStore) -> tuple[int, int]:
    layer = find_layer(store, InstrumentedObjectStore)
    assert layer is not None
    s = layer.stats()
    return s.bytes_read, s.requests


async def direct(url: str, tablets: list[TabletRange]) -> tuple[float, int, int]:
    store = open_store(url, instrument=True)
    started = time.perf_counter()

    async def one(t: TabletRange) -> int:
        await fence(store, WORKER, INCARNATION)
        return sum(
            [
                1
                async for _ in replay_cells(
                    store, WORKER, INCARNATION, t.table_id, t.start_row, t.end_row, 0
                )
            ]
        )

    await asyncio.gather(*(one(t) for t in tablets))
    seconds = time.perf_counter() - started
    read, requests = _stats(store)
    await store.close()
    return seconds, read, requests


async def sorted_recovery(
    url: str, tablets: list[TabletRange], sorters: int, task_bytes: int, *, owner: bool = False
) -> tuple[float, int, int, SortPlan, float]:
    """``owner``: the sorters are tasks of the process that replays the tablets (the
    embedded database; a worker that sorts the tablets it then serves, §6): the runs they
    write are kept in memory and every request, theirs included, is counted by the store."""
    store = open_store(url, instrument=True)
    executor = (
        InProcessSortExecutor(store, parallel=sorters)
        if owner
        else InProcessSortExecutor(store, processes=sorters, store_url=url)
    )
    # Start the pool's processes before the clock: a long-lived master keeps its pool.
    await executor.warm()
    started = time.perf_counter()
    plan = await plan_sort(store, WORKER, INCARNATION, tablets, task_bytes=task_bytes)
    finished: list[float] = []

    async def sort(task: SortTask) -> SortManifest:
        manifest = await executor.run(plan, task)
        finished.append(time.perf_counter() - started)
        return manifest

    sorts = [asyncio.ensure_future(sort(task)) for task in plan.tasks]

    async def one(t: TabletRange) -> int:
        return sum(
            [
                1
                async for _ in sorted_replay(
                    store, plan, t.table_id, t.start_row, t.end_row, 0, wait=600.0
                )
            ]
        )

    await asyncio.gather(*(one(t) for t in tablets))
    seconds = time.perf_counter() - started
    manifests: list[SortManifest] = await asyncio.gather(*sorts)
    await executor.close()
    read, requests = _stats(store)
    await store.close()
    if owner:
        return seconds, read, requests, plan, max(finished)
    # The sorters' own requests (in child processes): see the module docstring.
    for task, manifest in zip(plan.tasks, manifests, strict=True):
        read += task.size
        requests += 2 + (task.stop - task.first) + len(manifest.runs) + 1
    return seconds, read, requests, plan, max(finished)


async def run(log_mb: float, tablet_counts: list[int], sorter_counts: list[int]) -> list[Result]:
    results: list[Result] = []
    log_bytes = int(log_mb * 1024 * 1024)
    task_bytes = max(SEGMENT_BYTES, log_bytes // 8)
    for t in tablet_counts:
        ranges = tablet_ranges(t)
        with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
            url = f"file://{tmp}/base"
            os.makedirs(f"{tmp}/base")
            seed = open_store(url)
            size = await write_log(seed, log_bytes, t)
            await seed.close()
            seconds, read, requests = await direct(url, ranges)
            results.append(Result(t, "direct replay", 0, size, read, read, requests, seconds))
            print(_row(results[-1]), flush=True)
            runs = [(n, False) for n in sorter_counts] + [(max(sorter_counts), True)]
            for n, owner in runs:
                # Each sorted run starts from the bare log: copy it so plans do not carry over.
                run_url = f"file://{tmp}/s{n}{'o' if owner else ''}"
                os.makedirs(run_url.removeprefix("file://"))
                src, dst = open_store(url), open_store(run_url)
                async for info in src.list("logs/"):
                    data = await src.get(info.key)
                    if data:
                        await dst.create(info.key, data)
                await src.close()
                await dst.close()
                seconds, read, requests, plan, sort_s = await sorted_recovery(
                    run_url, ranges, n, task_bytes, owner=owner
                )
                log_read = sum(task.size for task in plan.tasks)
                results.append(
                    Result(
                        t,
                        "sorted, owner sorts" if owner else "sorted",
                        n,
                        size,
                        read,
                        log_read,
                        requests,
                        seconds,
                        sort_s,
                        len(plan.tasks),
                    )
                )
                print(_row(results[-1]), flush=True)
    return results


HEADER = (
    "| tablets | method | sorters | log MB | log read / log | all read / log | requests "
    "| sort done s | seconds |"
)


def _row(r: Result) -> str:
    sorters = str(r.sorters) if r.sorters else "-"
    return (
        f"| {r.tablets} | {r.method} | {sorters} | {r.log_bytes / 2**20:.1f} | "
        f"{r.log_read_ratio:.2f} | {r.read_ratio:.2f} | {r.requests} | "
        f"{f'{r.sort_seconds:.2f}' if r.tasks else '-'} | {r.seconds:.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__)
    parser.add_argument("--log-mb", type=float, default=16.0)
    parser.add_argument("--tablets", default="1,16,64")
    parser.add_argument("--sorters", default="1,2,4,8")
    parser.add_argument("--json", type=Path, default=Path("bench-recovery.json"))
    args = parser.parse_args(argv)
    tablets = [int(x) for x in args.tablets.split(",")]
    sorters = [int(x) for x in args.sorters.split(",")]
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|---|")
    results = asyncio.run(run(args.log_mb, tablets, sorters))
    args.json.write_text(
        json.dumps(
            {
                "cpus": os.cpu_count(),
                "results": [
                    {**asdict(r), "read_ratio": r.read_ratio, "log_read_ratio": r.log_read_ratio}
                    for r in results
                ],
            },
            indent=2,
        )
    )
    print(f"saved {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
