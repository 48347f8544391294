"""The aggregate-rate model of Figure 6's right half (bench/scale_curve.py): its terms follow
the counts it is given, never a timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.paper import PAPER_ROWS
from bench.scale_curve import IN_ORDER, aggregate, curve, main

RATES = {name: 1000.0 * (i + 1) for i, name in enumerate(IN_ORDER)}


def test_one_worker_is_its_measured_rate_and_metadata_grows_with_the_tablets() -> None:
    rate, per_op, metadata = aggregate(1, 5000.0, in_order=False, r_mem=20000.0, r_scan=50000.0)
    assert rate == pytest.approx(5000.0, rel=1e-3)
    # 500 workers hold 4,000 tablets of 128 MB: one METADATA tablet (1 KB rows), and a client
    # doing its 1,000,000 operations at random misses each tablet once.
    rate, per_op, metadata = aggregate(500, 5000.0, in_order=False, r_mem=20000.0, r_scan=5e4)
    assert metadata == 1
    assert per_op == pytest.approx(4000 / PAPER_ROWS)
    t_meta = 1 / 20000 + 15 / 5e4
    assert rate == pytest.approx(1 / (1 / (500 * 5000) + per_op * t_meta))
    assert rate < 500 * 5000
    # In row order the prefetch answers 15 lookups of 16.
    _, in_order, _ = aggregate(500, 5000.0, in_order=True, r_mem=20000.0, r_scan=5e4)
    assert in_order == pytest.approx(per_op / 16)


def test_one_metadata_tablet_caps_the_aggregate_and_a_pre_split_one_lifts_it() -> None:
    """Every client's misses land on the METADATA tablets' workers: with one METADATA
    tablet its worker's share grows with N (more tablets per client), so the curve peaks;
    with METADATA pre-split one tablet per ten workers it keeps rising to 500."""
    alone = {c.benchmark: c for c in curve(RATES)}["random reads (mem)"]
    assert alone.aggregate[0] == pytest.approx(alone.one_worker, rel=1e-3)
    assert set(alone.metadata_tablets) == {1}
    assert max(alone.aggregate) > alone.aggregate[-1]
    split = {c.benchmark: c for c in curve(RATES, metadata_per_worker=0.1)}["random reads (mem)"]
    assert split.metadata_tablets[-1] == 50
    assert list(split.aggregate) == sorted(split.aggregate)
    assert split.aggregate[-1] > alone.aggregate[-1]


def test_main_reads_a_paper_run_and_writes_the_table(tmp_path: Path) -> None:
    paper = tmp_path / "paper.json"
    results = [
        {"target": "tabletstore", "benchmark": name, "values_per_second": rate}
        for name, rate in RATES.items()
    ]
    paper.write_text(json.dumps({"results": results}))
    out, md = tmp_path / "curve.json", tmp_path / "curve.md"
    assert main(["--paper-json", str(paper), "--json", str(out), "--markdown", str(md)]) == 0
    assert len(json.loads(out.read_text())["curves"]) == len(IN_ORDER)
    assert "random reads (mem)" in md.read_text()
    paper.write_text(json.dumps({"results": results[:2]}))
    with pytest.raises(SystemExit, match="no target"):
        main(["--paper-json", str(paper)])


def test_rates_can_be_given_directly(tmp_path: Path) -> None:
    md = tmp_path / "curve.md"
    given = ",".join(f"{name}={rate:g}" for name, rate in RATES.items())
    assert main(["--rates", given, "--markdown", str(md)]) == 0
    assert "scans" in md.read_text()
    with pytest.raises(SystemExit, match="NAME=VALUES_PER_SECOND"):
        main(["--rates", "scans"])
    with pytest.raises(SystemExit, match="a positive rate for each"):
        main(["--rates", "scans=5"])
