"""Latency of one benchmark phase: its percentiles out to the maximum, and an HDR histogram.

A serving store is judged by its tail, not its median: a p99 forty times the p50 is what users
of a latency-sensitive table notice first. Every benchmark therefore reports p50, p99, p99.9
and the maximum, exact (from the sorted latencies of every request of the phase), and keeps the
whole distribution as an HDR histogram (HdrHistogram's compressed V2 encoding, base64, in
microseconds with 3 significant digits): ``hdrh.histogram.HdrHistogram.decode`` (Python), the
Java and Go HdrHistogram libraries and HdrHistogram's online plotter read it back. Beside it, the
JSON has the percentile ladder (the value at 50 %, 75 %, 87.5 %, ... halving the distance to
100 % each step), which is what :func:`draw` plots and what a reader can compare by eye.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LatencySummary", "draw", "percentile", "summarize"]

#: The histogram's range in microseconds (1 µs to 1 hour) and precision.
_LOWEST_US = 1
_HIGHEST_US = 3_600_000_000
_SIGNIFICANT_DIGITS = 3
#: Steps of the percentile ladder per halving of the distance to 100 %.
_TICKS_PER_HALF = 1


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The value at quantile ``q`` (0..1) of already sorted values, nearest rank; 0 if empty."""
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


@dataclass(frozen=True)
class LatencySummary:
    """A phase's latencies, in milliseconds."""

    count: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    #: The HDR histogram and the percentile ladder (module docstring); None for no requests.
    histogram: dict[str, Any] | None


def summarize(latencies: Sequence[float]) -> LatencySummary:
    """Summarize per-request latencies given in seconds (any order)."""
    lat = sorted(latencies)
    if not lat:
        return LatencySummary(0, 0.0, 0.0, 0.0, 0.0, None)
    return LatencySummary(
        count=len(lat),
        p50_ms=1000 * percentile(lat, 0.50),
        p99_ms=1000 * percentile(lat, 0.99),
        p999_ms=1000 * percentile(lat, 0.999),
        max_ms=1000 * lat[-1],
        histogram=_histogram(lat),
    )


def _histogram(lat: Sequence[float]) -> dict[str, Any]:
    from hdrh.histogram import HdrHistogram

    h = HdrHistogram(_LOWEST_US, _HIGHEST_US, _SIGNIFICANT_DIGITS)
    for seconds in lat:
        h.record_value(min(_HIGHEST_US, max(_LOWEST_US, round(seconds * 1e6))))
    ladder = [
        [round(step.percentile_level_iterated_to, 6), step.value_iterated_to / 1000]
        for step in h.get_percentile_iterator(_TICKS_PER_HALF)
    ]
    return {
        "unit": "us",
        "significant_digits": _SIGNIFICANT_DIGITS,
        "hdr": h.encode().decode("ascii"),
        "percentiles_ms": ladder,
    }


def draw(series: Sequence[tuple[str, dict[str, Any]]], path: str, title: str) -> None:
    """Latency by percentile (HdrHistogram's plot: the x axis is 1 / (1 - percentile), so
    99 %, 99.9 % and 99.99 % are equally spaced), one line per ``(label, histogram)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5))
    for label, hist in series:
        points = [(p, ms) for p, ms in hist["percentiles_ms"] if p < 100.0]
        if not points:
            continue
        xs = [1 / (1 - p / 100) for p, _ in points]
        ax.plot(xs, [max(ms, 1e-3) for _, ms in points], label=label, linewidth=1.2)
    ticks = [50.0, 90.0, 99.0, 99.9, 99.99, 99.999]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([1 / (1 - p / 100) for p in ticks], [f"{p:g}%" for p in ticks])
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency, ms")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
