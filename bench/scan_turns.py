"""Scans beside point reads: what a scan's read slice costs the scans and buys the readers.

A scan over data in the block cache or the memtable never suspends on its own; it gives the
event loop's other tasks a turn once a slice of computing has gone by
(``engine.read_path.READ_SLICE_SECONDS``). A longer slice costs the scan fewer yields; every
point read that arrives meanwhile waits for the slice of each scan ahead of it. This bench runs
``--scanners`` tasks scanning ``--scan-rows`` rows at a time and ``--readers`` tasks reading
single rows, on one embedded database (``file://``, warm block cache), for ``--seconds`` per
setting, every setting of ``--slice-ms`` once per repeat, interleaved (A B C A B C ...), so the
ratios come from one run on one machine load::

    python -m bench.scan_turns --slice-ms 10 --slice-ms 1 --slice-ms 0.1 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.latency import summarize
from bench.targets import TabletstoreTarget, row_key
from tabletstore.engine import read_path

TABLE = "scanturns"


@dataclass(frozen=True)
class Outcome:
    """One setting's phase: scans and point reads, throughput and latency."""

    slice_ms: float
    scan_rows_per_s: float
    scan_p50_ms: float
    scan_p99_ms: float
    read_per_s: float
    read_p50_ms: float
    read_p99_ms: float
    read_p999_ms: float


async def _phase(target: TabletstoreTarget, args: argparse.Namespace, slice_ms: float) -> Outcome:
    read_path.READ_SLICE_SECONDS = slice_ms / 1000
    stop = time.perf_counter() + args.seconds
    scans: list[float] = []
    reads: list[float] = []
    scanned = 0
    rng = random.Random(1)

    async def scanner() -> None:
        nonlocal scanned
        while time.perf_counter() < stop:
            first = rng.randrange(0, args.rows - args.scan_rows)
            t0 = time.perf_counter()
            scanned += await target.scan(TABLE, row_key(first), row_key(first + args.scan_rows))
            scans.append(time.perf_counter() - t0)

    async def reader() -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await target.get(TABLE, row_key(rng.randrange(args.rows)))
            reads.append(time.perf_counter() - t0)

    await asyncio.gather(
        *(scanner() for _ in range(args.scanners)), *(reader() for _ in range(args.readers))
    )
    s, r = summarize(scans), summarize(reads)
    return Outcome(
        slice_ms,
        scanned / args.seconds,
        s.p50_ms,
        s.p99_ms,
        len(reads) / args.seconds,
        r.p50_ms,
        r.p99_ms,
        r.p999_ms,
    )


async def run(args: argparse.Namespace) -> list[Outcome]:
    with tempfile.TemporaryDirectory() as d:
        target = TabletstoreTarget(f"file://{d}", block_cache_bytes=256 << 20)
        await target.open()
        try:
            await target.create(TABLE)
            value = os.urandom(args.value_size)
            for start in range(0, args.rows, 500):
                stop = min(args.rows, start + 500)
                await target.put_batch(TABLE, [(row_key(i), value) for i in range(start, stop)])
            await target.to_sstables([TABLE])
            await target.scan(TABLE, row_key(0), row_key(args.rows))  # warm the block cache
            out = []
            for _ in range(args.repeat):
                for slice_ms in args.slice_ms:
                    out.append(await _phase(target, args, slice_ms))
            return out
        finally:
            await target.close()


def report(outcomes: Sequence[Outcome]) -> str:
    """The median of each setting's repeats, and the ratio to the first setting."""
    settings = list(dict.fromkeys(o.slice_ms for o in outcomes))
    cols = (
        "scan_rows_per_s",
        "scan_p50_ms",
        "scan_p99_ms",
        "read_per_s",
        "read_p50_ms",
        "read_p99_ms",
        "read_p999_ms",
    )
    lines = ["| slice ms | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    base: dict[str, float] = {}
    for s in settings:
        runs = [o for o in outcomes if o.slice_ms == s]
        med = {c: statistics.median(getattr(o, c) for o in runs) for c in cols}
        base = base or med
        cells = [f"{med[c]:,.2f} ({med[c] / base[c]:.2f}x)" if base[c] else "-" for c in cols]
        lines.append(f"| {s:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scan_turns", description=__doc__)
    p.add_argument("--slice-ms", type=float, action="append", help="repeatable (default 10 1)")
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--value-size", type=int, default=1000)
    p.add_argument("--scan-rows", type=int, default=2_000)
    p.add_argument("--scanners", type=int, default=4)
    p.add_argument("--readers", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    args.slice_ms = args.slice_ms or [10.0, 1.0]
    outcomes = asyncio.run(run(args))
    for o in outcomes:
        print(o)
    print(report(outcomes))
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
