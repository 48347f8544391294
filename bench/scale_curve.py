"""The paper's Figure 6, right half: aggregate rate from 1 to 500 tablet servers, by model (§7).

Figure 6's right half is the aggregate number of 1000-byte values read or written per second
as the cluster grows from 1 to 500 tablet servers (random reads from memory x300 at 500
servers, random reads x100). One machine cannot run 500 workers' data paths, so this derives the
curve from what can be measured here:

* **one worker's rate, measured** on this machine: ``python -m bench.paper`` (its JSON,
  ``--paper-json``), per benchmark;
* **what N workers add on the data path, counted** by the scale benchmark's real location
  cache and METADATA code (``bench.scale``): a client's location miss costs one METADATA read
  (``--scale-json``: ``metadata_reads_per_miss``; a client walking rows in order misses once
  per 16 tablets, the prefetch), and every METADATA read lands on the worker serving that
  METADATA tablet. The master, etcd and the balancer are off the data path: clients never talk
  to the master (§5.1), and the scale benchmark's steady state costs each worker 0.6 etcd
  requests per second (lease keep-alives).

The model, per benchmark at N workers (the paper's setup, §7: N clients, about 1 GB read or
written per worker, ``R = N x 1,000,000`` values of 1000 bytes, tablets split at 128 MB):

* tablets ``T = N x ceil(1 GB / split size)``; METADATA tablets ``M = ceil(T x 1 KB / split
  size)`` (§5.1: a METADATA row holds about 1 KB);
* each client does ``R / N`` operations over all T tablets, so it misses ``T`` times (random
  access) or ``T / 16`` times (in order): METADATA reads per operation ``m = misses x
  reads_per_miss / (R / N)``;
* a METADATA read costs its worker one in-memory random read and 15 scanned rows (its
  prefetch): ``t_meta = 1 / r_mem + 15 / r_scan`` seconds;
* data operations spread evenly over the workers (the master places tablets by count; the
  benchmarks spread keys uniformly), so the busiest worker is one that also serves a METADATA
  tablet, and it spends ``1 / (N r1) + (m / M) t_meta`` seconds per operation of the cluster:
  **aggregate(N) = 1 / (1 / (N r1) + (m / M) t_meta)**, with ``r1`` the measured one-worker rate.

What it leaves out (docs/performance/scale.md says it next to the chart): the network (the
paper's random reads were bound by 64 KB block transfers over shared gigabit links; here each
worker's GETs go to S3, whose limits are per key prefix), other processes contending for CPU
and network (the paper's main loss from 1 to 50 servers), load that shifts during a run, and
S3's own request-rate limits. It is an upper bound set by the control paths, not a prediction.

    python -m bench.scale_curve --paper-json one-worker.json [--scale-json bench-scale.json]
        [--json curve.json] [--markdown curve.md] [--png curve.png]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.paper import PAPER, PAPER_ROWS, PAPER_SERVERS
from tabletstore.options import SPLIT_BYTES

__all__ = ["Curve", "aggregate", "curve", "main", "one_worker_rates"]

#: The cluster sizes of the curve (Figure 6's axis runs 1 to 500).
SERVERS = (1, 2, 5, 10, 25, 50, 100, 250, 500)
#: The benchmarks of Figure 6, and whether each walks rows in order (the location prefetch).
IN_ORDER: dict[str, bool] = {
    "random reads": False,
    "random reads (mem)": False,
    "random writes": False,
    "sequential reads": True,
    "sequential writes": True,
    "scans": True,
}
#: Bytes per worker in the paper's benchmarks (about 1 GB of 1000-byte values).
BYTES_PER_WORKER = PAPER_ROWS * 1000
#: Bytes of one METADATA row (§5.1: "approximately 1KB of data in memory").
METADATA_ROW_BYTES = 1024
#: Rows one METADATA read returns (client/location.py's prefetch).
PREFETCH_ROWS = 16


@dataclass(frozen=True, slots=True)
class Curve:
    """One benchmark's modelled aggregate rates, by cluster size."""

    benchmark: str
    one_worker: float
    servers: tuple[int, ...]
    aggregate: tuple[float, ...]
    #: METADATA reads per operation, and METADATA tablets, at each size.
    metadata_per_op: tuple[float, ...]
    metadata_tablets: tuple[int, ...]


def aggregate(
    n: int,
    r1: float,
    *,
    in_order: bool,
    r_mem: float,
    r_scan: float,
    reads_per_miss: float = 1.0,
    split_bytes: int = SPLIT_BYTES,
    metadata_per_worker: float = 0.0,
) -> tuple[float, float, int]:
    """(aggregate rate, METADATA reads per operation, METADATA tablets) at ``n`` workers
    whose one-worker rate is ``r1`` (module docstring). ``metadata_per_worker``: METADATA
    tablets per worker when METADATA is pre-split (the master's ``metadata_splits``); 0: as
    many as its size makes."""
    if n < 1 or r1 <= 0 or r_mem <= 0 or r_scan <= 0:
        raise ValueError(f"need n >= 1 and positive rates, got n={n}, {r1}, {r_mem}, {r_scan}")
    tablets = n * math.ceil(BYTES_PER_WORKER / split_bytes)
    metadata = max(
        1,
        math.ceil(tablets * METADATA_ROW_BYTES / split_bytes),
        math.ceil(n * metadata_per_worker),
    )
    ops_per_client = PAPER_ROWS  # R / N with R = N x 1,000,000
    misses = tablets / PREFETCH_ROWS if in_order else tablets
    per_op = misses * reads_per_miss / ops_per_client
    t_meta = 1 / r_mem + (PREFETCH_ROWS - 1) / r_scan
    busiest = 1 / (n * r1) + per_op / metadata * t_meta
    return 1 / busiest, per_op, metadata


def one_worker_rates(
    paper_json: Mapping[str, Any], target: str | None = None
) -> tuple[str, dict[str, float]]:
    """(target, values per second by benchmark) of one tabletstore worker from a bench.paper
    JSON: ``target``'s, or the first target (not SlateDB) with every benchmark of the curve."""
    by_target: dict[str, dict[str, float]] = {}
    for r in paper_json.get("results", []):
        if r.get("target") != "slatedb" and r["benchmark"] in IN_ORDER:
            rates = by_target.setdefault(str(r["target"]), {})
            rates.setdefault(r["benchmark"], float(r["values_per_second"]))
    for name, rates in by_target.items():
        if (target is None or name == target) and set(rates) >= set(IN_ORDER):
            return name, rates
    raise SystemExit(
        f"--paper-json has no target ({target or 'any'}) with a rate for each of {list(IN_ORDER)}"
    )


def curve(
    rates: Mapping[str, float],
    *,
    reads_per_miss: float = 1.0,
    servers: Sequence[int] = SERVERS,
    metadata_per_worker: float = 0.0,
) -> list[Curve]:
    """Every benchmark's curve from one worker's ``rates``."""
    out = []
    for name, in_order in IN_ORDER.items():
        points = [
            aggregate(
                n,
                rates[name],
                in_order=in_order,
                r_mem=rates["random reads (mem)"],
                r_scan=rates["scans"],
                reads_per_miss=reads_per_miss,
                metadata_per_worker=metadata_per_worker,
            )
            for n in servers
        ]
        out.append(
            Curve(
                name,
                rates[name],
                tuple(servers),
                tuple(p[0] for p in points),
                tuple(p[1] for p in points),
                tuple(p[2] for p in points),
            )
        )
    return out


def markdown(curves: Sequence[Curve]) -> str:
    """Aggregate values/s by cluster size, with the speed-up at the largest and the paper's."""
    servers = curves[0].servers
    head = (
        "| benchmark | 1 worker (measured) | "
        + " | ".join(f"{n} workers" for n in servers[1:])
        + f" | x at {servers[-1]} | paper: x at 500 |"
    )
    lines = [head, "|---|" + "---:|" * (len(servers) + 2)]
    for c in curves:
        paper = PAPER[c.benchmark]
        paper_x = paper[-1] * PAPER_SERVERS[-1] / paper[0]
        lines.append(
            f"| {c.benchmark} | {c.one_worker:,.0f} | "
            + " | ".join(f"{a:,.0f}" for a in c.aggregate[1:])
            + f" | {c.aggregate[-1] / c.one_worker:,.0f} | {paper_x:,.0f} |"
        )
    return "\n".join(lines)


def chart(curves: Sequence[Curve], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, c in enumerate(curves):
        color = f"C{i}"
        ax.plot(c.servers, c.aggregate, "o-", color=color, label=f"{c.benchmark} (model)")
        paper = PAPER[c.benchmark]
        ax.plot(
            PAPER_SERVERS,
            [p * n for p, n in zip(paper, PAPER_SERVERS, strict=True)],
            "x:",
            color=color,
            alpha=0.6,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("workers (tablet servers)")
    ax.set_ylabel("1000-byte values per second, aggregate")
    ax.set_title("Figure 6, right half: model from one measured worker (dotted x: the paper)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_curve", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--paper-json", type=Path, help="bench.paper --json")
    source.add_argument(
        "--rates",
        help="one worker's values/s given directly: 'random reads=13484,scans=97833,...' "
        "(every benchmark of the curve; e.g. a documented bench.paper run's)",
    )
    parser.add_argument("--target", help="the bench.paper target whose rates to use")
    parser.add_argument(
        "--scale-json",
        type=Path,
        help="bench.scale --json: METADATA reads per location miss (default 1.0)",
    )
    parser.add_argument(
        "--metadata-per-worker",
        type=float,
        default=0.0,
        help="METADATA tablets per worker (a pre-split METADATA); 0: by its size",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.paper_json is not None:
        target, rates = one_worker_rates(json.loads(args.paper_json.read_text()), args.target)
    else:
        target, rates = "--rates", _rates(args.rates)
    per_miss = 1.0
    if args.scale_json is not None:
        results = json.loads(args.scale_json.read_text())["results"]
        per_miss = max(r["clients"]["metadata_reads_per_miss"] for r in results)
    if args.metadata_per_worker < 0:
        raise SystemExit("--metadata-per-worker must be >= 0")
    curves = curve(rates, reads_per_miss=per_miss, metadata_per_worker=args.metadata_per_worker)
    text = markdown(curves)
    print(f"one worker: {target}\n{text}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "one_worker_target": target,
                    "metadata_reads_per_miss": per_miss,
                    "metadata_per_worker": args.metadata_per_worker,
                    "curves": [asdict(c) for c in curves],
                },
                indent=1,
            )
        )
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    if args.png is not None:
        chart(curves, args.png)
    return 0


def _rates(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"--rates: {part!r} is not NAME=VALUES_PER_SECOND") from None
    missing = sorted(set(IN_ORDER) - set(out))
    if missing or any(v <= 0 for v in out.values()):
        raise SystemExit(f"--rates needs a positive rate for each of {list(IN_ORDER)}")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
