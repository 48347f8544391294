"""Recovery benchmark (§5.3, §6 "Commit-log implementation"): a dead worker's log of L MB over
T tablets, recovered by the direct replay (every new owner reads the whole log) and by the
sorted recovery with N sorter processes (``master.log_recovery.InProcessSortExecutor``).

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
request of sorters and tablets alike goes through the one instrumented store. The "owner
sorts (pool processes)" rows (N in the sorters column) are a worker that owns a dead log of several tasks (§6; owner
affinity up to ``MasterOptions.sort_owner_bytes``): its ``SharedSorts`` runs every task at
once, decoding and encoding in a pool of N processes, while it fetches the segments and writes
the runs itself, keeping them as a worker does (``commitlog.spill``: in memory up to
``--spill-memory-mb``, then in local files up to ``--spill-disk-mb``; the worker's defaults);
its tablets' replays join those sorts, as a worker's loads do (``worker.log.replay_logged``
with the tasks reserved for it). The "local / log" column is what the replays read back from
that spill (local memory or disk, not the store).

    python -m bench.recovery [--log-mb 16] [--tablets 1,16,64] [--sorters 1,2,4,8] [--no-direct]
        [--spill-memory-mb 64] [--spill-disk-mb 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tabletstore.commitlog import encode_record, encode_segment, fence, replay_cells
from tabletstore.commitlog.runs import SortManifest, SortPlan, SortTask, TabletRange
from tabletstore.commitlog.sorting import ReplayStats, SharedSorts, plan_sort, sorted_replay
from tabletstore.commitlog.spill import RunSpill
from tabletstore.keys import Cell, CellKind
from tabletstore.limits import MiB
from tabletstore.master.log_recovery import InProcessSortExecutor
from tabletstore.options import WorkerOptions
from tabletstore.process_pool import process_pool
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
    #: Bytes of runs the replays read from the owner's spill (memory or local disk).
    local_bytes: int = 0

    @property
    def read_ratio(self) -> float:
        return self.bytes_read / self.log_bytes

    @property
    def log_read_ratio(self) -> float:
        return self.log_bytes_read / self.log_bytes

    @property
    def local_ratio(self) -> float:
        return self.local_bytes / self.log_bytes


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

    # Fenced once: 64 new owners fencing at once collide on the fence's create until one
    # gives up (each reads the log whole either way).
    await fence(store, WORKER, INCARNATION)

    async def one(t: TabletRange) -> int:
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


async def owner_pool_recovery(
    url: str,
    tablets: list[TabletRange],
    processes: int,
    task_bytes: int,
    spill: RunSpill,
) -> tuple[float, int, int, SortPlan, float, int]:
    """A worker that owns the log sorts every task in a pool of ``processes`` processes while
    its tablets replay (each load runs the reserved tasks through the worker's SharedSorts,
    which keeps the runs in ``spill``). Also returns the bytes read back from the spill."""
    store = open_store(url, instrument=True)
    pool = process_pool(processes)
    loop = asyncio.get_running_loop()
    # Start the pool's processes before the clock: a worker keeps its pool once made.
    await asyncio.gather(*(loop.run_in_executor(pool, os.getpid) for _ in range(processes)))
    shared = SharedSorts(cpu=lambda: pool, parallel=processes + 1, spill=spill)
    stats = ReplayStats()
    started = time.perf_counter()
    plan = await plan_sort(store, WORKER, INCARNATION, tablets, task_bytes=task_bytes)
    reserved = {t.first for t in plan.tasks}
    sort_done = asyncio.ensure_future(
        asyncio.gather(*(shared.run(store, plan, t) for t in plan.tasks))
    )

    async def one(t: TabletRange) -> int:
        return sum(
            [
                1
                async for _ in sorted_replay(
                    store,
                    plan,
                    t.table_id,
                    t.start_row,
                    t.end_row,
                    0,
                    wait=600.0,
                    run_here=reserved,
                    shared=shared,
                    stats=stats,
                )
            ]
        )

    sorted_at: list[float] = []
    sort_done.add_done_callback(lambda _: sorted_at.append(time.perf_counter() - started))
    await asyncio.gather(*(one(t) for t in tablets))
    seconds = time.perf_counter() - started
    await sort_done
    pool.shutdown(wait=True)
    spill.close()
    read, requests = _stats(store)
    await store.close()
    return seconds, read, requests, plan, sorted_at[0], stats.local_bytes


async def run(
    log_mb: float,
    tablet_counts: list[int],
    sorter_counts: list[int],
    *,
    direct_too: bool = True,
    spill_memory: int | None = None,
    spill_disk: int | None = None,
    modes: Sequence[str] = ("sorted", "owner", "pool"),
) -> list[Result]:
    """``spill_memory``/``spill_disk``: the owner's budgets for the runs it keeps (bytes;
    None: the worker's defaults)."""
    defaults = WorkerOptions()
    memory = defaults.sort_memory_bytes if spill_memory is None else spill_memory
    disk = defaults.sort_spill_bytes if spill_disk is None else spill_disk
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
            if direct_too:
                seconds, read, requests = await direct(url, ranges)
                results.append(Result(t, "direct replay", 0, size, read, read, requests, seconds))
                print(_row(results[-1]), flush=True)
            runs = [(n, "sorted") for n in sorter_counts if "sorted" in modes]
            runs += [(max(sorter_counts), "owner")] if "owner" in modes else []
            runs += [(n, "pool") for n in sorter_counts if "pool" in modes]
            for n, mode in runs:
                # Each sorted run starts from the bare log: copy it so plans do not carry over.
                run_url = f"file://{tmp}/s{n}{mode}"
                os.makedirs(run_url.removeprefix("file://"))
                src, dst = open_store(url), open_store(run_url)
                async for info in src.list("logs/"):
                    data = await src.get(info.key)
                    if data:
                        await dst.create(info.key, data)
                await src.close()
                await dst.close()
                local = 0
                if mode == "pool":
                    spill = RunSpill(memory_bytes=memory, disk_bytes=disk, directory=tmp)
                    seconds, read, requests, plan, sort_s, local = await owner_pool_recovery(
                        run_url, ranges, n, task_bytes, spill
                    )
                else:
                    seconds, read, requests, plan, sort_s = await sorted_recovery(
                        run_url, ranges, n, task_bytes, owner=mode == "owner"
                    )
                log_read = sum(task.size for task in plan.tasks)
                results.append(
                    Result(
                        t,
                        METHODS[mode],
                        n,
                        size,
                        read,
                        log_read,
                        requests,
                        seconds,
                        sort_s,
                        len(plan.tasks),
                        local,
                    )
                )
                print(_row(results[-1]), flush=True)
    return results


METHODS = {
    "sorted": "sorted",
    "owner": "sorted, owner sorts",
    "pool": "sorted, owner sorts (pool processes)",
}

HEADER = (
    "| tablets | method | sorters | log MB | log read / log | all read / log | requests "
    "| local / log | sort done s | seconds |"
)


def _row(r: Result) -> str:
    sorters = str(r.sorters) if r.sorters else "-"
    return (
        f"| {r.tablets} | {r.method} | {sorters} | {r.log_bytes / 2**20:.1f} | "
        f"{r.log_read_ratio:.2f} | {r.read_ratio:.2f} | {r.requests} | {r.local_ratio:.2f} | "
        f"{f'{r.sort_seconds:.2f}' if r.tasks else '-'} | {r.seconds:.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__)
    parser.add_argument("--log-mb", type=float, default=16.0)
    parser.add_argument("--tablets", default="1,16,64")
    parser.add_argument("--sorters", default="1,2,4,8")
    parser.add_argument("--json", type=Path, default=Path("bench-recovery.json"))
    parser.add_argument(
        "--no-direct", action="store_true", help="leave out the direct replay (T reads of the log)"
    )
    parser.add_argument(
        "--spill-memory-mb",
        type=float,
        default=None,
        help="memory the owner keeps its runs in (default: WorkerOptions.sort_memory_bytes)",
    )
    parser.add_argument(
        "--spill-disk-mb",
        type=float,
        default=None,
        help="local disk it keeps them on past that (default: WorkerOptions.sort_spill_bytes)",
    )
    parser.add_argument(
        "--modes",
        default="sorted,owner,pool",
        help="which sorted methods to run: sorted, owner, pool (comma-separated)",
    )
    args = parser.parse_args(argv)
    tablets = [int(x) for x in args.tablets.split(",")]
    sorters = [int(x) for x in args.sorters.split(",")]
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|---|---|")
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - METHODS.keys()
    if unknown:
        parser.error(f"unknown --modes {sorted(unknown)}; known: {sorted(METHODS)}")
    results = asyncio.run(
        run(
            args.log_mb,
            tablets,
            sorters,
            direct_too=not args.no_direct,
            spill_memory=None if args.spill_memory_mb is None else int(args.spill_memory_mb * MiB),
            spill_disk=None if args.spill_disk_mb is None else int(args.spill_disk_mb * MiB),
            modes=modes,
        )
    )
    args.json.write_text(
        json.dumps(
            {
                "cpus": os.cpu_count(),
                "results": [
                    {
                        **asdict(r),
                        "read_ratio": r.read_ratio,
                        "log_read_ratio": r.log_read_ratio,
                        "local_ratio": r.local_ratio,
                    }
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
