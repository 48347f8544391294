"""What a million operations cost: tabletstore on S3 and Fargate next to DynamoDB on-demand and a
Cloud Bigtable node, from a ``bench.paper`` run's measured requests and CPU per operation.

Run ``python -m bench.paper --json run.json`` first, then
``python -m bench.cost run.json [--markdown FILE]``.

tabletstore's cost of an operation is what it makes the cloud do, both measured by the
benchmark:

* **S3 requests**: the object-store requests per value of each benchmark (the instrumented
  store counts them, minor compactions included for writes), at S3 Standard's request prices.
  These counts do not depend on the machine's load, only on the sizes (a random read misses a
  block cache sized at ``--scale`` of a worker's, so it is the cold case).
* **Compute**: the CPU time per value (client and worker in one process for the embedded
  target, so an upper bound of the worker's share), as Fargate vCPU-seconds with the worker
  task's memory per vCPU. CPU time inflates on a loaded machine: read it from a quiet run.

DynamoDB on-demand bills request units: a write of an item up to 1 KB is one write request unit
(the benchmark's 1000-byte values, counted as one though the key and attribute names take such
an item just past 1 KB), a strongly consistent read of up to 4 KB one read request unit (an
eventually consistent read half), and a scan a read unit per 4 KB it reads. A Cloud Bigtable
node is billed by the hour whatever it serves: its cost per operation is the node-hour price over
what Google documents one SSD node serving (rows of 1 KB), so it is the cost at full utilisation,
the best case; a node running at a third of that costs three times as much per operation.

Storage is apart: a terabyte-month is $23.55 on S3 Standard, $250 on DynamoDB Standard and
$170 on Bigtable SSD at the prices below.

The prices (:data:`PRICES`) are list prices from the providers' published pages (AWS us-east-1,
Google Cloud us-central1); check them for your region.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PRICES", "Prices", "main", "markdown", "rows"]


@dataclass(frozen=True)
class Prices:
    """List prices in US dollars."""

    s3_put_per_1000: float = 0.005  # PUT, COPY, POST, LIST
    s3_get_per_1000: float = 0.0004  # GET, SELECT and every other request but DELETE
    fargate_vcpu_hour: float = 0.04048
    fargate_gb_hour: float = 0.004445
    #: The worker task's memory per vCPU (infra/terraform: 2 vCPU, 8 GB).
    worker_gb_per_vcpu: float = 4.0
    dynamodb_per_million_wru: float = 0.625
    dynamodb_per_million_rru: float = 0.125
    bigtable_node_hour: float = 0.65
    #: What one Bigtable SSD node serves, rows of 1 KB (Google's performance page).
    bigtable_node_reads_per_s: float = 17_000
    bigtable_node_writes_per_s: float = 14_000
    bigtable_node_scan_bytes_per_s: float = 220e6


PRICES = Prices()

#: What each benchmark is, for the other two services: (kind, rows per request).
_KIND = {
    "sequential writes": "write",
    "random writes": "write",
    "batched writes": "write",
    "sequential reads": "read",
    "random reads": "read",
    "random reads (mem)": "read",
    "scans": "scan",
}


@dataclass(frozen=True)
class CostRow:
    """Dollars per million operations of one benchmark."""

    benchmark: str
    puts_per_op: float
    gets_per_op: float
    s3: float
    compute: float
    dynamodb: float
    bigtable: float

    @property
    def tabletstore(self) -> float:
        return self.s3 + self.compute


def rows(
    results: Sequence[Mapping[str, Any]], value_size: int, p: Prices = PRICES
) -> list[CostRow]:
    """One :class:`CostRow` per tabletstore result of a ``bench.paper`` JSON's ``results``."""
    out = []
    for r in results:
        kind = _KIND.get(r["benchmark"])
        if r.get("target") != "tabletstore" or kind is None or not r.get("values"):
            continue
        per = r["s3_per_1000"]
        puts = (per["PUT"] + per["LIST"]) / 1000
        gets = (per["GET"] + per["HEAD"]) / 1000
        s3 = 1e6 * (puts * p.s3_put_per_1000 + gets * p.s3_get_per_1000) / 1000
        cpu_s = (r["cpu_seconds"] + r.get("after_cpu_seconds", 0.0)) / r["values"]
        compute = (
            1e6 * cpu_s / 3600 * (p.fargate_vcpu_hour + p.worker_gb_per_vcpu * p.fargate_gb_hour)
        )
        if kind == "write":
            dynamodb = math.ceil(value_size / 1000) * p.dynamodb_per_million_wru
            bigtable = 1e6 * p.bigtable_node_hour / 3600 / p.bigtable_node_writes_per_s
        elif kind == "read":
            dynamodb = math.ceil(value_size / 4096) * p.dynamodb_per_million_rru
            bigtable = 1e6 * p.bigtable_node_hour / 3600 / p.bigtable_node_reads_per_s
        else:  # a scanned row: its share of 4 KB read units and of a node's scan bandwidth
            dynamodb = value_size / 4096 * p.dynamodb_per_million_rru
            bigtable = 1e6 * p.bigtable_node_hour / 3600 / (p.bigtable_node_scan_bytes_per_s / 1000)
        out.append(CostRow(r["benchmark"], puts, gets, s3, compute, dynamodb, bigtable))
    return out


def markdown(cost: Sequence[CostRow], run: Mapping[str, Any]) -> str:
    """The cost table as the docs show it."""
    lines = [
        "| operation | S3 PUT + LIST, GET per operation | tabletstore: S3 | compute | total "
        "| DynamoDB on-demand | Bigtable node, fully used |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in cost:
        unit = " (per row)" if _KIND[c.benchmark] == "scan" else ""
        lines.append(
            f"| {c.benchmark}{unit} | {c.puts_per_op:.4f}, {c.gets_per_op:.4f} "
            f"| {c.s3:.3f} | {c.compute:.3f} | {c.tabletstore:.3f} "
            f"| {c.dynamodb:.3f} | {c.bigtable:.4f} |"
        )
    cfg, host = run.get("config", {}), run.get("machine", {})
    load = ", ".join(f"{x:.1f}" for x in host.get("load_average") or ())
    lines += [
        "",
        f"US dollars per million operations. From `bench.paper` with R = {cfg.get('rows', 0):,} "
        f"rows of {cfg.get('value_size', 0)} bytes, block cache "
        f"{cfg.get('block_cache_bytes', 0) / 2**20:.1f} MiB; CPU on {host.get('cpu', '?')}, "
        f"load average at the end {load}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run", help="a bench.paper --json file")
    parser.add_argument("--markdown", help="write the table here too")
    args = parser.parse_args(argv)
    try:
        with open(args.run) as f:
            run = json.load(f)
        cost = rows(run["results"], int(run["config"]["value_size"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(f"{args.run} is not a bench.paper --json file: {exc!r}")
    if not cost:
        parser.error(f"{args.run} has no tabletstore results")
    text = markdown(cost, run)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
