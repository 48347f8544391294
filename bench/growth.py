"""How cost grows with the data: Figure 6's benchmarks at 1x, 4x and 16x one table size (§7).

Run ``python -m bench.paper --growth [--growth-base SCALE] [--json FILE] [--svg FILE]``.

The paper measures every benchmark at one size (1 GB per tablet server). A store whose costs
grow with the data (deeper merges, larger indexes, colder caches) looks fine at one size and
fails at ten, so this runs the whole :func:`bench.paper.run_suite` (embedded, on a local
directory) at ``base``, ``4 x base`` and ``16 x base`` of the paper's R, each in a fresh
directory with the block cache scaled like the data (the proportions of a default worker
holding the paper's 1 GB, see ``bench.paper``). The default ``base`` is 1/16, so the largest
run is the paper's full R = 1,000,000 rows, about 1 GB on disk (the printed disk figure is
measured, SSTables and logs after the run); ``--growth-base 0.0025`` is a quick run.

Per benchmark and size it reports CPU time per value (this process, all threads: robust on
a shared machine; a write's includes the minor compaction that turns it into SSTables, as its
requests do, whether that ran during the phase or right after it), object-store requests of every kind per 1,000 values and p99 latency, and
the largest/smallest ratio against the bounds (CPU and requests within 1.5x, p99 within
2x). ``--svg`` draws the three curves (a small hand-written SVG: no plotting dependency).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from bench.paper import BENCHMARKS, BenchConfig, BenchResult, run_suite
from tabletstore.storage_s3.base import Op

__all__ = ["FACTORS", "GrowthPoint", "growth_table", "run_growth", "svg_chart"]

#: Table sizes relative to the base.
FACTORS = (1, 4, 16)
#: the bounds on largest / smallest, per metric.
BOUNDS = {"cpu_us": 1.5, "s3_per_1000": 1.5, "p99_ms": 2.0}
_LABELS = {
    "cpu_us": "CPU us per value",
    "s3_per_1000": "S3 requests per 1,000 values",
    "p99_ms": "p99 latency, ms",
}


@dataclass(frozen=True)
class GrowthPoint:
    """One benchmark at one table size."""

    benchmark: str
    rows: int
    disk_bytes: int
    cpu_us: float
    s3_per_1000: float
    p99_ms: float
    values_per_second: float
    #: CPU per value of the timed phase alone (a write's compaction after it left out).
    phase_cpu_us: float = 0.0

    @classmethod
    def of(cls, r: BenchResult, rows: int, disk_bytes: int) -> GrowthPoint:
        return cls(
            benchmark=r.benchmark,
            rows=rows,
            disk_bytes=disk_bytes,
            # A write's minor compaction counts wherever it ran (see ``BenchResult``).
            cpu_us=1e6 * (r.cpu_seconds + r.after_cpu_seconds) / max(1, r.values),
            s3_per_1000=r.per_1000(*Op) or 0.0,
            p99_ms=r.p99_ms,
            values_per_second=r.rate,
            phase_cpu_us=1e6 * r.cpu_seconds / max(1, r.values),
        )


def disk_usage(path: str) -> int:
    """Bytes of the files under ``path``."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def run_growth(
    base: float,
    *,
    factors: Sequence[int] = FACTORS,
    workdir: str | None = None,
    log: Any = print,
    **overrides: Any,
) -> list[GrowthPoint]:
    """Run the suite at each ``base * factor`` of the paper's size; every point of every run.
    ``overrides`` go to :meth:`BenchConfig.scaled` (concurrency, batch, ...)."""
    points: list[GrowthPoint] = []
    # Scans of the smallest size's length at every size: a scan of R / 320 rows would time a
    # 16 times longer request at 16x, not the same request on more data.
    smallest = BenchConfig.scaled(min(1.0, base * min(factors)), **overrides)
    overrides.setdefault("scan_rows", None)
    if overrides["scan_rows"] is None:
        overrides["scan_rows"] = -(-smallest.rows // (10 * smallest.concurrency))
    top = workdir or tempfile.mkdtemp(prefix="tabletstore-growth-")
    try:
        for factor in factors:
            cfg = BenchConfig.scaled(min(1.0, base * factor), **overrides)
            where = os.path.join(os.path.abspath(top), f"x{factor}")
            log(
                f"growth x{factor}: R = {cfg.rows:,} rows, block cache {cfg.block_cache_bytes:,} B,"
                f" {cfg.scan_rows:,} rows per scan"
            )
            results = asyncio.run(run_suite(cfg, [f"file://{where}"], log=log))
            disk = disk_usage(where)
            points += [GrowthPoint.of(r, cfg.rows, disk) for r in results]
            shutil.rmtree(where, ignore_errors=True)
    finally:
        if workdir is None:
            shutil.rmtree(top, ignore_errors=True)
    return points


def _series(points: Sequence[GrowthPoint], name: str) -> list[GrowthPoint]:
    return sorted((p for p in points if p.benchmark == name), key=lambda p: p.rows)


def growth_table(points: Sequence[GrowthPoint]) -> str:
    """One line per benchmark and metric: the value at each size, largest/smallest, bound."""
    sizes = sorted({(p.rows, p.disk_bytes) for p in points})
    head = " ".join(f"{f'R={rows:,} ({disk / 2**20:,.0f} MiB)':>22}" for rows, disk in sizes)
    lines = [f"{'benchmark':<20} {'metric':<28} {head} {'growth':>7} {'bound':>6}"]
    for name in BENCHMARKS:
        series = _series(points, name)
        if not series:
            continue
        for metric, label in _LABELS.items():
            values = [float(getattr(p, metric)) for p in series]
            ratio = values[-1] / values[0] if values[0] else None
            bound = BOUNDS[metric]
            mark = "-" if ratio is None else f"{ratio:.2f}x" + (" " if ratio <= bound else "!")
            cells = " ".join(f"{v:>22,.1f}" for v in values)
            lines.append(f"{name:<20} {label:<28} {cells} {mark:>7} {bound:>5}x")
    return "\n".join(lines)


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def svg_chart(points: Sequence[GrowthPoint], title: str) -> str:
    """Three panels (CPU per value, requests per 1,000 values, p99) against table size, one
    line per benchmark, each normalized to its smallest size (1.0 = flat), so the growth
    bounds are horizontal lines."""
    panel_w, panel_h, pad = 300, 220, 45
    width, height = 3 * (panel_w + pad) + pad, panel_h + 2 * pad + 50
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{pad}" y="18" font-size="13">{escape(title)}</text>',
    ]
    sizes = sorted({p.rows for p in points})
    for i, (metric, label) in enumerate(_LABELS.items()):
        x0, y0 = pad + i * (panel_w + pad), pad
        ratios = [
            [float(getattr(p, metric)) / max(1e-9, float(getattr(s[0], metric))) for p in s]
            for name in BENCHMARKS
            if (s := _series(points, name))
        ]
        top = max([BOUNDS[metric] * 1.2, *(r for rs in ratios for r in rs)])

        def xy(k: int, ratio: float, x0: int = x0, y0: int = y0, top: float = top) -> str:
            x = x0 + (panel_w * k / max(1, len(sizes) - 1))
            y = y0 + panel_h - panel_h * min(ratio, top) / top
            return f"{x:.1f},{y:.1f}"

        out.append(
            f'<rect x="{x0}" y="{y0}" width="{panel_w}" height="{panel_h}" fill="none" '
            'stroke="#999"/>'
        )
        out.append(f'<text x="{x0}" y="{y0 - 6}">{escape(label)} (x smallest)</text>')
        out.append(f'<text x="{x0 + 4}" y="{y0 + 12}" fill="#666">{top:.1f}x</text>')
        for level, dash in ((1.0, "2,2"), (BOUNDS[metric], "6,3")):
            out.append(
                f'<polyline points="{xy(0, level)} {xy(len(sizes) - 1, level)}" fill="none" '
                f'stroke="#666" stroke-dasharray="{dash}"/>'
            )
        out.append(
            f'<text x="{x0 + panel_w - 70}" y="{xy(0, BOUNDS[metric]).split(",")[1]}" '
            f'dy="-3">bound {BOUNDS[metric]}x</text>'
        )
        for k, rows in enumerate(sizes):
            x = xy(k, 0).split(",")[0]
            out.append(
                f'<text x="{x}" y="{y0 + panel_h + 14}" text-anchor="middle">R={rows:,}</text>'
            )
        for j, rs in enumerate(ratios):
            pts = " ".join(xy(k, r) for k, r in enumerate(rs))
            out.append(
                f'<polyline points="{pts}" fill="none" stroke="{_COLORS[j % 7]}" stroke-width="2"/>'
            )
    for j, name in enumerate(n for n in BENCHMARKS if _series(points, n)):
        x = pad + (j % 4) * 200
        y = pad + panel_h + 40 + 18 * (j // 4)
        out.append(f'<rect x="{x}" y="{y - 9}" width="12" height="4" fill="{_COLORS[j % 7]}"/>')
        out.append(f'<text x="{x + 16}" y="{y - 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main_growth(
    base: float,
    *,
    json_path: str | None = None,
    svg_path: str | None = None,
    workdir: str | None = None,
    **overrides: Any,
) -> int:
    """``python -m bench.paper --growth``: run, print, and write the JSON and the chart."""
    started = time.perf_counter()
    points = run_growth(base, workdir=workdir, **overrides)
    print()
    print(growth_table(points))
    print(
        "\ngrowth = value at the largest size / at the smallest; '!' marks a bound exceeded; "
        f"total {time.perf_counter() - started:.0f} s; "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"base_scale": base, "points": [p.__dict__ for p in points]}, f, indent=2)
    if svg_path:
        biggest = max(points, key=lambda p: p.rows)
        title = (
            f"Cost vs table size: R = {', '.join(f'{r:,}' for r in sorted({p.rows for p in points}))}"
            f" rows (largest {biggest.disk_bytes / 2**20:,.0f} MiB on disk), {os.cpu_count()} cores"
        )
        with open(svg_path, "w") as f:
            f.write(svg_chart(points, title))
    return 0
