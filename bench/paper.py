"""The paper's Figure 6 (§7) on this machine, side by side with SlateDB, with the S3 cost.

Run ``python -m bench.paper [--quick] [--cluster] [--json FILE] [--png FILE] [--latency-png FILE]``;
``--growth`` runs the same benchmarks at three table sizes instead (``bench/growth.py``).

The benchmarks are the paper's six, as §7 defines them, plus batched writes:

* **sequential writes**: row keys ``0 .. R-1`` cut into ``10 * N`` equal ranges handed out to
  the ``N`` concurrent clients as each finishes its previous range (the paper's "central
  scheduler"); one 1000-byte random (uncompressible, distinct) value per row, one write request
  per row;
* **random writes**: the same, but operation ``i`` writes row ``hash(i) mod R``; the "hash" is
  a seeded random permutation of ``0 .. R-1`` (every row is written exactly once, so the random
  reads below find every row, and the order has no stride a block cache could exploit);
* **batched writes**: sequential keys, ``--batch`` rows per request (``mutate_rows`` /
  SlateDB ``WriteBatch``); not in the paper, measured because SlateDB's strength is batching;
* **sequential reads** / **random reads**: shadow the sequential / random writes, one read
  request per row, after a minor and a major compaction and a restart, so every read starts in
  SSTables with a cold block cache (the paper's reads go to GFS);
* **random reads (mem)**: random reads of a table whose locality group is in memory
  (``LocalityGroup(in_memory=True)``), with R/10 rows as in the paper (100 MB instead of 1 GB);
* **scans**: the sequential-read ranges, each read by one scan request; counted in values/s.

``N`` (``--concurrency``, default 32) asyncio tasks issue requests in parallel (the paper's
clients keep many requests in flight; group commit needs concurrent writers). Figures are
operations (values) per second per worker, and latency per request (p50, p99, p99.9, the
maximum, and an HDR histogram of every request: bench/latency.py).

**Scaling to this machine.** The paper's R gives about 1 GB per tablet server (R = 1,000,000
rows of 1000 bytes) and 100 MB for the in-memory benchmark, on servers with 1 GB of memory.
Here every size is multiplied by ``--scale`` (full run: 1/20, so R = 50,000 rows = 50 MB and
5,000 in-memory rows; ``--quick``: 1/400, R = 2,500). The block cache is the worker default
(256 MiB) multiplied by the same factor (12.8 MiB in the full run), so data and cache keep the
proportions of a default worker holding the paper's 1 GB: with the unscaled 256 MiB cache the
whole scaled data set would sit in the cache after the first pass and "random reads" would
measure memory, not the object store. ``--block-cache-bytes`` overrides it.

**Cost.** tabletstore's object store is wrapped in
:class:`~tabletstore.storage_s3.instrumented.InstrumentedObjectStore`, which counts requests the
way S3 bills them. Reported: PUT / GET (GET + ranged GET) / LIST / DELETE per 1,000 operations
and object bytes read per operation. A write's cost includes the minor compaction that turns it
into an SSTable (run untimed right after the write phase). SlateDB's requests are not counted.

**The cluster**. ``--cluster`` adds local clusters of worker processes
(:mod:`bench.cluster_target`): 1, 2 and 4 workers on a local directory and 1 worker on moto's S3
server (``--target cluster:N:file|moto`` picks one). Each table is pre-split into ``2N``
tablets; the printed extra table gives values/s in total and per worker (total / N, the
paper's unit) and the object-store requests summed from the workers' ``/metrics``. All the
processes run on this machine, so N workers share its cores with the benchmark client.

**The process.** ``python -m bench.paper`` warms its process up as the worker and the front
door warm theirs (:func:`tabletstore.warm_up_process`: what start-up loaded frozen out of the
cyclic collector's reach, its thresholds raised), as an application serving from the embedded
database should: both targets run in it, SlateDB too.

SlateDB runs the same operations with the same values in the same local directory (one database
per table; see :mod:`bench.slatedb_target`); the table prints tabletstore / SlateDB for each.
Targets run one after another, never at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import itertools
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.latency import draw as draw_latency
from bench.latency import summarize
from bench.targets import Target, open_target, row_key
from tabletstore.options import WorkerOptions
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.instrumented import StoreStats

__all__ = ["PAPER", "BenchConfig", "BenchResult", "main", "run_suite"]

#: Figure 6: 1000-byte values read/written per second per tablet server, by number of servers.
PAPER_SERVERS = (1, 50, 250, 500)
PAPER: dict[str, tuple[int, int, int, int]] = {
    "random reads": (1212, 593, 479, 241),
    "random reads (mem)": (10811, 8511, 8000, 6250),
    "random writes": (8850, 3745, 3425, 2000),
    "sequential reads": (4425, 2463, 2625, 2469),
    "sequential writes": (8547, 3623, 2451, 1905),
    "scans": (15385, 10526, 9524, 7843),
}
#: The paper's R per tablet server (about 1 GB of 1000-byte values).
PAPER_ROWS = 1_000_000
#: Order of the printed table (Figure 6's order, batched writes last).
BENCHMARKS = (
    "random reads",
    "random reads (mem)",
    "random writes",
    "sequential reads",
    "sequential writes",
    "scans",
    "batched writes",
)
_SEED = 20060601
FULL_SCALE = 1 / 20
QUICK_SCALE = 1 / 400


@dataclass(frozen=True)
class BenchConfig:
    """One run's sizes (see the module docstring for how they scale)."""

    rows: int
    mem_rows: int
    block_cache_bytes: int
    scale: float
    value_size: int = 1000
    concurrency: int = 32
    batch: int = 100
    #: SlateDB's WAL flush interval (e.g. "10ms"); None keeps SlateDB's default (100 ms).
    slatedb_flush_interval: str | None = None
    #: tabletstore's SSTable block size (None: 64 KiB, the paper's; §7 notes 8 KiB for random reads).
    block_size: int | None = None
    #: Write a cProfile of each timed phase here (``<target>-<benchmark>.prof``); slows runs.
    profile_dir: str | None = None
    #: Rows per scan request (None: R cut into 10 x concurrency scans). ``bench.growth`` fixes
    #: it at its smallest size's, so every size's scan p99 times the same request.
    scan_rows: int | None = None
    #: Run only these benchmarks (None: all). A read still loads (untimed) the table it reads:
    #: ``--only "sequential writes"`` profiles the write phase alone, at any ``--scale``.
    only: tuple[str, ...] | None = None

    @classmethod
    def scaled(cls, scale: float, **overrides: Any) -> BenchConfig:
        if not 0 < scale <= 1:
            raise ValueError(f"--scale must be in (0, 1], not {scale}")
        rows = max(100, round(PAPER_ROWS * scale))
        cfg = cls(
            rows=rows,
            mem_rows=max(10, rows // 10),
            block_cache_bytes=max(256 * 1024, round(WorkerOptions().block_cache_bytes * scale)),
            scale=scale,
        )
        return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})

    def __post_init__(self) -> None:
        for name in ("rows", "mem_rows", "value_size", "concurrency", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")
        if self.scan_rows is not None and self.scan_rows < 1:
            raise ValueError(f"scan_rows must be >= 1, not {self.scan_rows}")
        unknown = sorted(set(self.only or ()) - set(BENCHMARKS))
        if unknown:
            raise ValueError(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")

    def runs(self, benchmark: str) -> bool:
        """Whether ``benchmark`` is measured in this run (``only``)."""
        return self.only is None or benchmark in self.only


@dataclass
class BenchResult:
    """One benchmark on one target."""

    benchmark: str
    target: str
    values: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    #: Object-store requests by kind and bytes moved during the phase (None: not counted).
    cost: dict[str, dict[str, int]] | None = None
    #: CPU time of this process (all threads) during the phase: robust on a shared machine.
    cpu_seconds: float = 0.0
    #: CPU time of the untimed ``after`` step (a write's minor compaction), counted like its
    #: requests in ``cost``: at a small size every write is compacted there, at a large one
    #: most compactions run during the phase (``bench.growth`` adds both).
    after_cpu_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: The tail beyond p99 (bench/latency.py): p99.9, the slowest request, and the whole
    #: distribution as an HDR histogram with its percentile ladder.
    p999_ms: float = 0.0
    max_ms: float = 0.0
    latency_histogram: dict[str, Any] | None = None

    @property
    def rate(self) -> float:
        """Values per second."""
        return self.values / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_value_us(self) -> float | None:
        """Process CPU (every thread) per value, in microseconds."""
        return 1e6 * self.cpu_seconds / self.values if self.values else None

    def per_1000(self, *ops: Op) -> float | None:
        """Requests of the given kinds per 1,000 values."""
        if self.cost is None or not self.values:
            return None
        return 1000 * sum(self.cost[op.value]["requests"] for op in ops) / self.values

    def bytes_read_per_value(self) -> float | None:
        if self.cost is None or not self.values:
            return None
        got = self.cost[Op.GET.value]["bytes"] + self.cost[Op.GET_RANGE.value]["bytes"]
        return got / self.values

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["values_per_second"] = round(self.rate, 1)
        cpu = self.cpu_per_value_us
        out["cpu_us_per_value"] = None if cpu is None else round(cpu, 1)
        out["paper_1_server"] = PAPER.get(self.benchmark, (None,))[0]
        if self.cost is not None:
            out["s3_per_1000"] = {
                "PUT": self.per_1000(Op.PUT),
                "GET": self.per_1000(Op.GET, Op.GET_RANGE),
                "HEAD": self.per_1000(Op.HEAD),
                "LIST": self.per_1000(Op.LIST),
                "DELETE": self.per_1000(Op.DELETE),
            }
            out["bytes_read_per_value"] = self.bytes_read_per_value()
        return out


# ------------------------------------------------------------------------------ workloads

#: A request: does its I/O, returns how many values it read or wrote.
Request = Callable[[], Awaitable[int]]


@functools.cache
def _permutation(rows: int) -> tuple[int, ...]:
    order = list(range(rows))
    random.Random(_SEED + rows).shuffle(order)
    return tuple(order)


def hashed(i: int, rows: int) -> int:
    """Row of the i-th random operation: a seeded permutation of 0 .. rows-1."""
    return _permutation(rows)[i]


def ranges(n: int, parts: int) -> list[range]:
    """``0 .. n-1`` cut into ``parts`` near-equal consecutive ranges (none empty)."""
    parts = max(1, min(parts, n))
    bounds = [n * p // parts for p in range(parts + 1)]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


async def drive(
    units: Iterable[Iterable[Request]], concurrency: int
) -> tuple[int, float, list[float]]:
    """Run the units on ``concurrency`` tasks, each taking the next unit when it finishes one
    (the paper's central scheduler). Returns (values, seconds, per-request latencies in s)."""
    queue: Iterator[Iterable[Request]] = iter(units)
    latencies: list[float] = []
    total = 0
    clock = time.perf_counter

    async def client() -> None:
        nonlocal total
        for unit in queue:
            for request in unit:
                t0 = clock()
                n = await request()  # Not `total += await ...`: that reads total before.
                latencies.append(clock() - t0)
                total += n

    start = clock()
    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(client())
    return total, clock() - start, latencies


class Workloads:
    """Builds the request lists of every benchmark for one target (module docstring)."""

    def __init__(self, target: Target, cfg: BenchConfig) -> None:
        self.t = target
        self.cfg = cfg
        self.parts = 10 * cfg.concurrency
        self._rng = random.Random(_SEED)

    def _value(self) -> bytes:
        # Distinct and uncompressible, as in the paper. Not os.urandom: its getrandom call
        # releases the GIL, so while a compaction thread computes, every value waited for
        # the GIL back (up to a switch interval, 5 ms): 100 of them per batched write put
        # hundreds of ms of the benchmark's own waiting into the write latencies measured,
        # and only at sizes where compactions run during the phase.
        return self._rng.randbytes(self.cfg.value_size)

    def _put(self, table: str, row: int) -> Request:
        async def req() -> int:
            await self.t.put(table, row_key(row), self._value())
            return 1

        return req

    def _get(self, table: str, row: int) -> Request:
        async def req() -> int:
            value = await self.t.get(table, row_key(row))
            if value is None or len(value) != self.cfg.value_size:
                raise RuntimeError(
                    f"{self.t.name}: row {row} of {table} read back "
                    f"{'nothing' if value is None else f'{len(value)} bytes'}"
                )
            return 1

        return req

    def _put_batch(self, table: str, rows: range) -> Request:
        async def req() -> int:
            await self.t.put_batch(table, [(row_key(r), self._value()) for r in rows])
            return len(rows)

        return req

    def _scan(self, table: str, rows: range) -> Request:
        async def req() -> int:
            n = await self.t.scan(table, row_key(rows.start), row_key(rows.stop))
            if n != len(rows):
                raise RuntimeError(f"{self.t.name}: scan of {rows} returned {n} values")
            return n

        return req

    # The per-row workloads make each request as it is issued (``map``), not all up front: at
    # R = 50,000 the closures built in advance were 200,000 objects that every full collection
    # of the cyclic GC traversed, event-loop pauses of ~100 ms (the loop that also serves the
    # embedded database's writes) that the paper's clients, on other machines, never caused.

    def sequential_writes(self, table: str) -> list[Iterable[Request]]:
        put = functools.partial(self._put, table)
        return [map(put, r) for r in ranges(self.cfg.rows, self.parts)]

    def random_writes(self, table: str) -> list[Iterable[Request]]:
        n = self.cfg.rows
        return [
            map(functools.partial(self._put_hashed, table, n), r) for r in ranges(n, self.parts)
        ]

    def _put_hashed(self, table: str, rows: int, i: int) -> Request:
        return self._put(table, hashed(i, rows))

    def _get_hashed(self, table: str, rows: int, i: int) -> Request:
        return self._get(table, hashed(i, rows))

    def batched_writes(self, table: str, rows: int | None = None) -> list[list[Request]]:
        n = rows or self.cfg.rows
        b = self.cfg.batch
        return [[self._put_batch(table, range(s, min(n, s + b)))] for s in range(0, n, b)]

    def sequential_reads(self, table: str) -> list[Iterable[Request]]:
        get = functools.partial(self._get, table)
        return [map(get, r) for r in ranges(self.cfg.rows, self.parts)]

    def random_reads(self, table: str, rows: int) -> list[Iterable[Request]]:
        get = functools.partial(self._get_hashed, table, rows)
        return [map(get, r) for r in ranges(rows, self.parts)]

    def scans(self, table: str) -> list[list[Request]]:
        return [[self._scan(table, r)] for r in self.scan_ranges()]

    def scan_ranges(self) -> list[range]:
        """The rows of each scan request: R in 10 x concurrency parts, or of ``scan_rows``."""
        n, per = self.cfg.rows, self.cfg.scan_rows
        return ranges(n, self.parts if per is None else -(-n // per))


def _cost(before: StoreStats | None, after: StoreStats | None) -> dict[str, dict[str, int]] | None:
    if before is None or after is None:
        return None
    return (after - before).as_dict()


async def measure(
    name: str,
    target: Target,
    units: Iterable[Iterable[Request]],
    cfg: BenchConfig,
    *,
    after: Callable[[], Awaitable[None]] | None = None,
) -> BenchResult:
    """Time one benchmark; ``after`` (untimed, counted in the cost) is e.g. the minor
    compaction that makes the written values SSTables."""
    before = target.stats()
    profiler = None
    profile_dir = cfg.profile_dir
    if profile_dir:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    server_cpu = getattr(target, "server_cpu_seconds", None)
    server0 = server_cpu() if server_cpu is not None else 0.0
    cpu0 = time.process_time()
    values, seconds, lat = await drive(units, cfg.concurrency)
    cpu = time.process_time() - cpu0
    extra = {"server_cpu_seconds": server_cpu() - server0} if server_cpu is not None else {}
    if profiler is not None and profile_dir:
        profiler.disable()
        slug = name.replace(" ", "_").replace("(", "").replace(")", "")
        profiler.dump_stats(os.path.join(profile_dir, f"{target.name}-{slug}.prof"))
    after_cpu = 0.0
    if after is not None:
        cpu1 = time.process_time()
        await after()
        after_cpu = time.process_time() - cpu1
    latency = summarize(lat)
    return BenchResult(
        benchmark=name,
        target=target.name,
        values=values,
        requests=latency.count,
        seconds=seconds,
        p50_ms=latency.p50_ms,
        p99_ms=latency.p99_ms,
        cost=_cost(before, target.stats()),
        cpu_seconds=cpu,
        after_cpu_seconds=after_cpu,
        extra=extra,
        p999_ms=latency.p999_ms,
        max_ms=latency.max_ms,
        latency_histogram=latency.histogram,
    )


async def run_target(
    target: Target, cfg: BenchConfig, *, log: Callable[[str], None] = print
) -> list[BenchResult]:
    """Every benchmark on one target, in an order where each read shadows its write."""
    w = Workloads(target, cfg)
    results: list[BenchResult] = []

    def done(r: BenchResult) -> None:
        results.append(r)
        log(
            f"  {target.name:<12} {r.benchmark:<20} {r.rate:>10,.0f} values/s  "
            f"p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms  p99.9 {r.p999_ms:7.2f} ms  "
            f"max {r.max_ms:7.2f} ms  ({r.values:,} in {r.seconds:.1f} s)"
        )

    # The table each read benchmark reads, written by the write benchmark it shadows.
    reads = {
        "sequential reads": "seqw",
        "random reads": "randw",
        "random reads (mem)": "memt",
        "scans": "seqw",
    }
    read_tables = {table for name, table in reads.items() if cfg.runs(name)}
    writes = (
        ("sequential writes", "seqw", w.sequential_writes),
        ("random writes", "randw", w.random_writes),
        ("batched writes", "batchw", w.batched_writes),
    )
    for table, in_memory in (("seqw", False), ("randw", False), ("batchw", False), ("memt", True)):
        await target.create(table, in_memory=in_memory)
    for name, table, workload in writes:
        if cfg.runs(name):
            done(await measure(name, target, workload(table), cfg, after=_flusher(target, table)))
        elif table in read_tables:
            await drive(workload(table), cfg.concurrency)  # untimed load of a read's table
    if "memt" in read_tables:
        await drive(w.batched_writes("memt", cfg.mem_rows), cfg.concurrency)  # untimed load
    if not read_tables:
        return results
    t0 = time.perf_counter()
    await target.to_sstables([t for t in ("seqw", "randw", "memt") if t in read_tables])
    log(f"  {target.name:<12} compactions + restart {time.perf_counter() - t0:.1f} s")
    for name in ("sequential reads", "random reads", "random reads (mem)", "scans"):
        if not cfg.runs(name):
            continue
        if name == "scans":
            units = w.scans("seqw")
        elif name == "sequential reads":
            units = w.sequential_reads("seqw")
        else:
            table = reads[name]
            units = w.random_reads(table, cfg.rows if table == "randw" else cfg.mem_rows)
        done(await measure(name, target, units, cfg))
    return results


def _flusher(target: Target, table: str) -> Callable[[], Awaitable[None]]:
    """A write benchmark's untimed ``after`` step: the minor compaction of its table."""
    return lambda: target.flush(table)


async def run_suite(
    cfg: BenchConfig,
    specs: Sequence[str],
    *,
    log: Callable[[str], None] = print,
) -> list[BenchResult]:
    """Open each target in turn, run every benchmark on it, close it."""
    results: list[BenchResult] = []
    for spec in specs:
        log(f"target {spec}")
        target = await open_target(
            spec,
            block_cache_bytes=cfg.block_cache_bytes,
            block_size=cfg.block_size,
            slatedb_flush_interval=cfg.slatedb_flush_interval,
            rows=cfg.rows,
            mem_rows=cfg.mem_rows,
        )
        try:
            results.extend(await run_target(target, cfg, log=log))
        finally:
            await target.close()
    return results


# ------------------------------------------------------------------------------ reports


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def table(results: Sequence[BenchResult], main: str = "tabletstore") -> str:
    """The printed comparison: tabletstore vs its target (paper, 1 server) vs SlateDB."""
    by = {(r.target, r.benchmark): r for r in results}
    lines = [
        f"{'benchmark':<20} {'paper':>7} {main:>11} {'%paper':>7} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'p99.9':>7} {'max ms':>7} {'CPU us':>7} {'slatedb':>9} {'CPU us':>7} {'ratio':>6}"
        f"  {'S3/1000 ops: PUT':>16} {'GET':>6} {'LIST':>5}"
        f" {'DEL':>5} {'B read/op':>10}"
    ]
    for name in BENCHMARKS:
        r = by.get((main, name))
        if r is None:
            continue
        s = by.get(("slatedb", name))
        paper = PAPER.get(name, (None,))[0]
        lines.append(
            f"{name:<20} {_fmt(paper):>7} {r.rate:>11,.0f}"
            f" {_fmt(100 * r.rate / paper if paper else None, '.0f') + '%' if paper else '-':>7}"
            f" {r.p50_ms:>7.2f} {r.p99_ms:>7.2f} {r.p999_ms:>7.2f} {r.max_ms:>7.2f}"
            f" {_fmt(r.cpu_per_value_us):>7}"
            f" {_fmt(s.rate if s else None):>9} {_fmt(s.cpu_per_value_us if s else None):>7}"
            f" {_fmt(r.rate / s.rate if s and s.rate else None, '.2f'):>6}"
            f"  {_fmt(r.per_1000(Op.PUT), '.1f'):>16} {_fmt(r.per_1000(Op.GET, Op.GET_RANGE), '.1f'):>6}"
            f" {_fmt(r.per_1000(Op.LIST), '.1f'):>5} {_fmt(r.per_1000(Op.DELETE), '.1f'):>5}"
            f" {_fmt(r.bytes_read_per_value(), ',.0f'):>10}"
        )
    return "\n".join(lines)


#: The targets ``--cluster`` adds: 1, 2 and 4 workers on a local directory, 1 on moto.
CLUSTER_TARGETS = ("cluster:1:file", "cluster:2:file", "cluster:4:file", "cluster:1:moto")


def workers_of(target: str) -> int:
    """Workers behind a target's results: N for ``cluster:N:...``, else 1 (embedded)."""
    if target.startswith("cluster:"):
        return int(target.split(":")[1].split("x", 1)[0])
    return 1


def median_results(results: Sequence[BenchResult]) -> list[BenchResult]:
    """One result per (target, benchmark): the run with the median rate (``--repeat``)."""
    groups: dict[tuple[str, str], list[BenchResult]] = {}
    for r in results:
        groups.setdefault((r.target, r.benchmark), []).append(r)
    out = []
    for runs in groups.values():
        ranked = sorted(runs, key=lambda r: r.rate)
        out.append(ranked[(len(ranked) - 1) // 2])
    return out


def ratio_table(results: Sequence[BenchResult]) -> str:
    """For each target ``X:tls`` run next to ``X`` (the cost of TLS and authentication), and
    each ``cluster:NxP:...`` next to ``cluster:N:...`` (P processes per worker against one):
    values/s of every repeat, their medians and the ratio of the medians, and the CPU time per
    value of the client and the cluster's processes (robust on a loaded machine), a Markdown
    table."""
    from bench.cluster_target import processes_of

    targets = list(dict.fromkeys(r.target for r in results))
    pairs = [(t.removesuffix(":tls"), t, "TLS / plain") for t in targets if t.endswith(":tls")]
    for t in targets:
        if t.startswith("cluster:") and (p := processes_of(t)) > 1:
            head, count, tail = t.split(":", 2)
            pairs.append((f"{head}:{count.split('x', 1)[0]}:{tail}", t, f"{p} / 1 processes"))
    pairs = [(a, b, what) for a, b, what in pairs if a in targets]
    runs: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    for r in results:
        runs.setdefault((r.target, r.benchmark), []).append(r.rate)
        cpu = r.cpu_seconds + float(r.extra.get("server_cpu_seconds", 0.0))
        cpus.setdefault((r.target, r.benchmark), []).append(1e6 * cpu / max(1, r.values))
    lines = []
    for plain, other, what in pairs:
        short = what.split(" / ")[0]
        lines += [
            f"| benchmark | {plain} values/s (runs) | {other} values/s (runs) | median {what} "
            f"| CPU us/value {what.split(' / ')[1].removesuffix(' processes')}, {short} "
            f"(medians) | CPU {what} |",
            "|---|---|---|---:|---:|---:|",
        ]
        for name in BENCHMARKS:
            a, b = runs.get((plain, name)), runs.get((other, name))
            if not a or not b:
                continue
            ma, mb = _median(a), _median(b)
            ca, cb = _median(cpus[(plain, name)]), _median(cpus[(other, name)])
            lines.append(
                f"| {name} | {' '.join(f'{x:,.0f}' for x in a)} | "
                f"{' '.join(f'{x:,.0f}' for x in b)} | {_fmt(mb / ma if ma else None, '.2f')} "
                f"| {ca:,.0f}, {cb:,.0f} | {_fmt(cb / ca if ca else None, '.2f')} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def _median(xs: Sequence[float]) -> float:
    return sorted(xs)[(len(xs) - 1) // 2]


def cluster_table(results: Sequence[BenchResult]) -> str:
    """Values/s in total and per worker (total / N) for every tabletstore target, by benchmark,
    with the S3 requests (all kinds) per 1,000 values; a Markdown table."""
    targets = [t for t in dict.fromkeys(r.target for r in results) if t != "slatedb"]
    by = {(r.target, r.benchmark): r for r in results}
    head = " | ".join(f"{t} total | per worker | S3/1000" for t in targets)
    lines = [
        f"| benchmark | paper, 1 server | {head} |",
        "|---|---:|" + "---:|---:|---:|" * len(targets),
    ]
    for name in BENCHMARKS:
        cells = []
        for t in targets:
            r = by.get((t, name))
            if r is None:
                cells.append("- | - | -")
                continue
            s3 = r.per_1000(*Op)
            cells.append(f"{r.rate:,.0f} | {r.rate / workers_of(t):,.0f} | {_fmt(s3, '.1f')}")
        paper = PAPER.get(name, (None,))[0]
        lines.append(f"| {name} | {_fmt(paper)} | {' | '.join(cells)} |")
    return "\n".join(lines)


def markdown(results: Sequence[BenchResult], cfg: BenchConfig, host: dict[str, Any]) -> str:
    """The results as a Markdown table (as README.md and docs/performance/index.md show it)."""
    by = {(r.target, r.benchmark): r for r in results}
    out = [
        "| benchmark | paper, 1 server | tabletstore | % of paper | p50 ms | p99 ms | p99.9 ms "
        "| max ms | CPU µs/value | SlateDB | SlateDB p99 ms | SlateDB CPU µs/value "
        "| tabletstore / SlateDB | S3 PUT / GET / LIST / DELETE per 1,000 "
        "| bytes read per value |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name in BENCHMARKS:
        r = by.get(("tabletstore", name))
        if r is None:
            continue
        s = by.get(("slatedb", name))
        paper = PAPER.get(name, (None,))[0]
        cost = " / ".join(
            _fmt(r.per_1000(*ops), ".1f")
            for ops in ((Op.PUT,), (Op.GET, Op.GET_RANGE), (Op.LIST,), (Op.DELETE,))
        )
        out.append(
            f"| {name} | {_fmt(paper)} | {r.rate:,.0f} "
            f"| {_fmt(100 * r.rate / paper, '.0f') + '%' if paper else '-'} "
            f"| {r.p50_ms:.2f} | {r.p99_ms:.1f} | {r.p999_ms:.1f} | {r.max_ms:.1f} "
            f"| {_fmt(r.cpu_per_value_us)} "
            f"| {_fmt(s.rate if s else None)} | {_fmt(s.p99_ms if s else None, '.1f')} "
            f"| {_fmt(s.cpu_per_value_us if s else None)} "
            f"| {_fmt(r.rate / s.rate if s and s.rate else None, '.2f')} | {cost} "
            f"| {_fmt(r.bytes_read_per_value(), ',.0f')} |"
        )
    out.append("")
    out.append(
        f"R = {cfg.rows:,} rows of {cfg.value_size} bytes ({cfg.scale:g} of the paper's), "
        f"{cfg.mem_rows:,} rows in the in-memory table, block cache "
        f"{cfg.block_cache_bytes / 2**20:.1f} MiB, {cfg.concurrency} requests in flight, "
        f"batches of {cfg.batch}. Machine: {host['cpu']}, {host['cores']} cores, "
        f"Python {host['python']}, {host['system']}, load average at the end "
        f"{', '.join(f'{x:.1f}' for x in host['load_average'] or ())}."
    )
    return "\n".join(out) + "\n"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass  # Not Linux: platform's answer stands.
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def draw(results: Sequence[BenchResult], path: str, cfg: BenchConfig) -> None:
    """Grouped bars (log scale): the paper's 1-server figure, tabletstore, SlateDB."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r.target, r.benchmark): r.rate for r in results}
    names = [b for b in BENCHMARKS if any(k[1] == b for k in by)]
    series = [
        ("paper (1 server, 2006)", [float(PAPER[b][0]) if b in PAPER else 0.0 for b in names]),
        *(
            (t, [by.get((t, b), 0.0) for b in names])
            for t in dict.fromkeys(r.target for r in results)
        ),
    ]
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.8 / len(series)
    for k, (label, vals) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(names))]
        bars = ax.bar(xs, [v or float("nan") for v in vals], width, label=label)
        ax.bar_label(
            bars,
            labels=[f"{v:,.0f}" if v else "" for v in vals],
            fontsize=7,
            rotation=90,
            padding=2,
        )
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_yscale("log")
    top = max((v for _, vals in series for v in vals), default=1.0)
    ax.set_ylim(top=top * 4)  # room for the rotated labels above the tallest bar
    ax.set_ylabel("1000-byte values per second per worker")
    ax.set_title(
        f"Figure 6 on this machine: R = {cfg.rows:,} rows ({cfg.scale:g} of the paper's), "
        f"{cfg.concurrency} concurrent requests, {os.cpu_count()} cores"
    )
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.paper", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"scale {QUICK_SCALE:g}: under two minutes")
    p.add_argument("--scale", type=float, help=f"data size vs the paper's (full: {FULL_SCALE:g})")
    p.add_argument("--concurrency", type=int, help="requests in flight (default 32)")
    p.add_argument("--batch", type=int, help="rows per batched write (default 100)")
    p.add_argument("--block-cache-bytes", type=int, help="override the scaled block cache")
    p.add_argument("--block-size", type=int, help="tabletstore SSTable block size (default 64 KiB)")
    p.add_argument(
        "--target",
        action="append",
        help="tabletstore URL (file:///dir, memory://name, etcd://host:port/ns); repeatable; "
        "default: file:// in the work directory",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="also run local clusters (worker processes): " + ", ".join(CLUSTER_TARGETS),
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every target this many times, interleaved (A B A B ...); tables show the "
        "median run; X:tls next to X gets a TLS / plain table of medians, and cluster:NxP:... next to cluster:N:... a P / 1 processes one",
    )
    p.add_argument("--no-slatedb", action="store_true", help="skip SlateDB")
    p.add_argument(
        "--slatedb-flush-interval", help="SlateDB WAL flush_interval, e.g. 10ms (default 100ms)"
    )
    p.add_argument("--dir", help="work directory (default: a new temporary directory, removed)")
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--png", help="draw the chart here")
    p.add_argument(
        "--latency-png",
        help="draw latency by percentile (p50 to the maximum) of every benchmark here",
    )
    p.add_argument("--markdown", help="write the results as a Markdown table here")
    p.add_argument("--uvloop", action="store_true", help="run on uvloop")
    p.add_argument("--profile", metavar="DIR", help="cProfile each timed phase into DIR")
    p.add_argument(
        "--only",
        action="append",
        choices=BENCHMARKS,
        metavar="BENCHMARK",
        help="run only this benchmark (repeatable; a read loads its table untimed), "
        'e.g. --only "sequential writes"',
    )
    p.add_argument(
        "--growth",
        action="store_true",
        help="cost vs data size: the benchmarks at 1x, 4x, 16x --growth-base (bench/growth.py)",
    )
    p.add_argument(
        "--growth-base",
        type=float,
        default=1 / 16,
        help="smallest --growth size vs the paper's (default 1/16: the largest is 1 GB)",
    )
    p.add_argument("--svg", help="--growth: draw the chart here (e.g. docs/growth.svg)")
    args = p.parse_args(argv)
    for flag, wanted in (("--png", args.png), ("--latency-png", args.latency_png)):
        if wanted and importlib.util.find_spec("matplotlib") is None:
            # Checked now, not after the run: a full run takes minutes before it draws.
            p.error(
                f"{flag} needs matplotlib: pip install -e '.[bench]' (or pip install matplotlib)"
            )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.growth:
        from bench.growth import main_growth

        return main_growth(
            args.growth_base,
            json_path=args.json,
            svg_path=args.svg,
            workdir=args.dir,
            concurrency=args.concurrency,
            batch=args.batch,
            block_size=args.block_size,
        )
    scale = args.scale or (QUICK_SCALE if args.quick else FULL_SCALE)
    cfg = BenchConfig.scaled(
        scale,
        concurrency=args.concurrency,
        batch=args.batch,
        block_cache_bytes=args.block_cache_bytes,
        slatedb_flush_interval=args.slatedb_flush_interval,
        profile_dir=args.profile,
        block_size=args.block_size,
        only=tuple(args.only) if args.only else None,
    )
    if args.repeat < 1:
        raise SystemExit(f"--repeat must be >= 1, not {args.repeat}")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    workdir = args.dir or tempfile.mkdtemp(prefix="tabletstore-bench-")
    specs = list(args.target or [f"file://{os.path.join(os.path.abspath(workdir), 'tabletstore')}"])
    if args.cluster:
        specs += [t for t in CLUSTER_TARGETS if t not in specs]
    if args.repeat > 1 and not all(spec.startswith("cluster:") for spec in specs):
        raise SystemExit("--repeat needs cluster targets only (each run starts a new cluster)")
    if not args.no_slatedb and args.repeat == 1:
        from bench.slatedb_target import slatedb_available

        if slatedb_available():
            specs.append(f"slatedb://{os.path.join(os.path.abspath(workdir), 'slatedb')}")
        else:
            print("slatedb is not installed (pip install -e '.[bench]'): SlateDB skipped")
    print(
        f"R = {cfg.rows:,} rows x {cfg.value_size} B ({cfg.scale:g} of the paper's 1 GB per "
        f"server), in-memory table {cfg.mem_rows:,} rows, block cache "
        f"{cfg.block_cache_bytes / 2**20:.1f} MiB (worker default x scale), "
        f"{cfg.concurrency} requests in flight, batches of {cfg.batch}; work dir {workdir}"
    )
    started = time.perf_counter()
    try:
        if args.uvloop:
            import uvloop

            runs = uvloop.run(run_suite(cfg, specs * args.repeat))
        else:
            runs = asyncio.run(run_suite(cfg, specs * args.repeat))
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.perf_counter() - started
    results = median_results(runs)
    print()
    print(table(results))
    print(
        "\npaper = Figure 6, 1 tablet server; CPU us = process CPU (every thread) per value; "
        "ratio = tabletstore / SlateDB; S3 columns: object "
        "requests per 1,000 values (writes include their minor compaction); "
        f"total {elapsed:.0f} s"
    )
    if any(spec.startswith("cluster:") for spec in specs):
        print()
        print(cluster_table(results))
        print(
            "\nper worker = total / N workers (embedded: 1); S3/1000 = object-store requests of "
            "every kind per 1,000 values (cluster: summed from the workers' /metrics); "
            f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
    ratios = ratio_table(runs)
    if ratios:
        print()
        print(ratios)
        print(
            f"\n{args.repeat} interleaved run(s) per target; load average "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "config": asdict(cfg),
                    "machine": machine(),
                    "targets": specs,
                    "seconds": elapsed,
                    "paper_figure_6": {"servers": PAPER_SERVERS, **PAPER},
                    "results": [r.as_dict() for r in results],
                    "runs": [r.as_dict() for r in runs],
                },
                f,
                indent=2,
            )
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results, cfg, machine()))
    if args.png:
        draw(results, args.png, cfg)
    if args.latency_png:
        draw_latency(
            [
                (f"{r.target}: {r.benchmark}", r.latency_histogram)
                for r in results
                if r.latency_histogram
            ],
            args.latency_png,
            f"Latency by percentile: R = {cfg.rows:,} rows, {cfg.concurrency} concurrent requests",
        )
    return 0


def entry(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.paper``: the process warmed up as a serving process is
    (``ops/process_warmup.py``), after the engine's and SlateDB's imports, then :func:`main`.
    Not in :func:`main`: tests call it in their own process."""
    import tabletstore.embedded  # noqa: F401  (imported now, so the warm-up freezes it)
    from bench.slatedb_target import slatedb_available
    from tabletstore.ops.process_warmup import warm_up_process

    slatedb_available()  # imports SlateDB's binding where it is installed
    warm_up_process()
    return main(argv)


if __name__ == "__main__":
    sys.exit(entry())
