"""bench/latency.py: the tail out to the maximum, and an HDR histogram that decodes back."""

from __future__ import annotations

from pathlib import Path

import pytest
from hdrh.histogram import HdrHistogram

from bench.latency import draw, percentile, summarize


def test_percentile_is_nearest_rank() -> None:
    values = [float(i) for i in range(1, 1001)]  # 1..1000
    assert percentile(values, 0.50) == 500
    assert percentile(values, 0.99) == 990
    assert percentile(values, 0.999) == 999
    assert percentile(values, 1.0) == 1000
    assert percentile([], 0.99) == 0.0
    assert percentile([7.0], 0.999) == 7.0


def test_summary_reports_the_tail_a_p99_hides() -> None:
    # 997 fast requests and three slow ones: p99 sees none of them, p99.9 and max do.
    lat = [0.0001] * 997 + [0.3, 0.31, 0.312]
    s = summarize(reversed(lat))  # any order
    assert s.count == 1000
    assert s.p50_ms == pytest.approx(0.1)
    assert s.p99_ms == pytest.approx(0.1)
    assert s.p999_ms == pytest.approx(310.0)
    assert s.max_ms == pytest.approx(312.0)


def test_histogram_decodes_to_the_same_distribution() -> None:
    lat = [i / 1e5 for i in range(1, 2001)]  # 10 µs .. 20 ms
    s = summarize(lat)
    assert s.histogram is not None
    h = HdrHistogram.decode(s.histogram["hdr"])
    assert h.get_total_count() == 2000
    # 3 significant digits: within 0.1 % of the exact values.
    assert h.get_value_at_percentile(99.0) / 1000 == pytest.approx(s.p99_ms, rel=2e-3)
    assert h.get_max_value() / 1000 == pytest.approx(s.max_ms, rel=2e-3)
    ladder = s.histogram["percentiles_ms"]
    assert ladder[0][0] == 0 and ladder[-1][0] == 100.0
    assert [ms for _, ms in ladder] == sorted(ms for _, ms in ladder)


def test_no_requests_summarize_to_zero() -> None:
    s = summarize([])
    assert (s.count, s.p99_ms, s.max_ms, s.histogram) == (0, 0.0, 0.0, None)


def test_draw_plots_every_series(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "latency.png"
    a = summarize([0.001, 0.002, 0.05]).histogram
    b = summarize([0.0005] * 100).histogram
    assert a is not None and b is not None
    draw([("a", a), ("b", b)], str(out), "title")
    assert out.stat().st_size > 0
