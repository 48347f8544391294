"""One read benchmark of :mod:`bench.paper`, embedded vs one worker over RPC, back to back.

``python -m bench.paper`` runs every benchmark once per target, targets one after another; on a
shared machine its RPC / embedded ratios of one benchmark vary several-fold between runs. This
measures only what a ratio needs, repeatably:

* both targets are opened once (``file://`` embedded, and ``cluster:1:file`` or ``--cluster``:
  one real worker process behind RPC), and the benchmark runs ``--repeat`` times on each, alternating
  (embedded, cluster, embedded, cluster, ...), so both sides see the same load;
* every run reads its own table, written (batched writes, untimed) and turned into SSTables
  just before, so each starts with a cold block cache as in ``bench.paper``;
* printed per run and as medians: values/s, the cluster/embedded ratio, object-store GETs per
  1,000 values (the worker's counters for the cluster), client and server CPU per value, and
  the load average.

Run ``python -m bench.rpc_ratio [--benchmark "sequential reads"] [--scale 0.01] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from collections.abc import Sequence

from bench.paper import BenchConfig, BenchResult, Workloads, drive, measure
from bench.targets import Target, open_target
from tabletstore.storage_s3.base import Op

__all__ = ["BENCHMARKS", "main", "run"]

#: The benchmarks this runs: name -> (workload method, whether its table is in memory).
BENCHMARKS = {
    "sequential reads": ("sequential_reads", False),
    "random reads": ("random_reads", False),
    "random reads (mem)": ("random_reads", True),
    "scans": ("scans", False),
}


async def _one(target: Target, cfg: BenchConfig, benchmark: str, run: int) -> BenchResult:
    method, in_memory = BENCHMARKS[benchmark]
    table = f"t{run}"
    rows = cfg.mem_rows if in_memory else cfg.rows
    await target.create(table, in_memory=in_memory)
    w = Workloads(target, cfg)
    await drive(w.batched_writes(table, rows), cfg.concurrency)  # untimed load
    await target.to_sstables([table])
    units = (
        getattr(w, method)(table, rows) if method == "random_reads" else getattr(w, method)(table)
    )
    pids = getattr(target, "_pids", [os.getpid()])
    print(f"  {target.name:<16} {benchmark} starts (pids {pids})", flush=True)
    return await measure(benchmark, target, units, cfg)


def _gets(r: BenchResult) -> float:
    return r.per_1000(Op.GET, Op.GET_RANGE) or 0.0


def _line(r: BenchResult) -> str:
    server = r.extra.get("server_cpu_seconds")
    server_us = f"{1e6 * server / r.values:6.0f}" if server is not None else "     -"
    return (
        f"  {r.target:<16} {r.rate:>9,.0f} values/s  GET/1000 {_gets(r):6.1f}  "
        f"read/value {(r.bytes_read_per_value() or 0) / 1024:5.1f} KiB  "
        f"client CPU {1e6 * r.cpu_seconds / r.values:5.0f} us  server CPU {server_us} us  "
        f"p50 {r.p50_ms:6.2f} ms  load {os.getloadavg()[0]:.2f}"
    )


async def run(
    cfg: BenchConfig,
    benchmark: str,
    repeat: int,
    workdir: str,
    cluster_spec: str = "cluster:1:file",
) -> tuple[list[BenchResult], list[BenchResult]]:
    """``repeat`` runs of ``benchmark`` on each target, alternating; (embedded, cluster)."""
    embedded = await open_target(
        f"file://{os.path.join(workdir, 'embedded')}", block_cache_bytes=cfg.block_cache_bytes
    )
    cluster: Target | None = None
    try:
        cluster = await open_target(
            cluster_spec,
            block_cache_bytes=cfg.block_cache_bytes,
            rows=cfg.rows,
            mem_rows=cfg.mem_rows,
        )
        out: tuple[list[BenchResult], list[BenchResult]] = ([], [])
        for i in range(repeat):
            for side, target in zip(out, (embedded, cluster), strict=True):
                result = await _one(target, cfg, benchmark, i)
                side.append(result)
                print(_line(result), flush=True)
        return out
    finally:
        await embedded.close()
        if cluster is not None:
            await cluster.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.rpc_ratio", description=__doc__.split("\n")[0]
    )
    p.add_argument("--benchmark", default="sequential reads", choices=sorted(BENCHMARKS))
    p.add_argument("--scale", type=float, default=0.01, help="data size vs the paper's")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--concurrency", type=int, help="requests in flight (default 32)")
    p.add_argument(
        "--cluster",
        default="cluster:1:file",
        help="the cluster side (cluster:1:moto: one worker on moto's S3 server; the embedded "
        "side stays on a directory, so only its GET counts compare)",
    )
    args = p.parse_args(argv)
    if args.repeat < 1:
        raise SystemExit(f"--repeat must be >= 1, not {args.repeat}")
    cfg = BenchConfig.scaled(args.scale, concurrency=args.concurrency)
    print(
        f"{args.benchmark}: R = {cfg.rows:,} rows, block cache {cfg.block_cache_bytes / 2**20:.1f} "
        f"MiB, {cfg.concurrency} in flight, {args.repeat} runs per side; "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    with tempfile.TemporaryDirectory(prefix="tabletstore-rpc-ratio-") as workdir:
        emb, clu = asyncio.run(run(cfg, args.benchmark, args.repeat, workdir, args.cluster))
    ratios = [c.rate / e.rate for e, c in zip(emb, clu, strict=True) if e.rate]
    for name, side in (("embedded", emb), (args.cluster, clu)):
        print(
            f"median {name:<16} {statistics.median(r.rate for r in side):>9,.0f} values/s  "
            f"GET/1000 {statistics.median(_gets(r) for r in side):6.1f}"
        )
    print(
        f"cluster / embedded: median {statistics.median(ratios):.2f} "
        f"(runs: {', '.join(f'{x:.2f}' for x in ratios)}); "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
