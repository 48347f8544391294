"""The §7 benchmark harness (bench/paper.py) runs end to end on a tiny config, so it cannot rot.

In process on memory://, SlateDB skipped; asserts what was done and reported, never how fast.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import cast

import pytest

from bench.paper import (
    BENCHMARKS,
    PAPER,
    BenchConfig,
    Request,
    Workloads,
    hashed,
    main,
    markdown,
    ranges,
    table,
)
from bench.targets import Target


def test_hash_is_a_permutation_and_ranges_cover_every_row() -> None:
    for rows in (1, 7, 100, 2_500, 50_000):
        assert sorted(hashed(i, rows) for i in range(rows)) == list(range(rows))
        parts = ranges(rows, 320)
        assert [i for r in parts for i in r] == list(range(rows))
        assert all(len(r) > 0 for r in parts)


def test_config_scales_the_papers_sizes_and_rejects_nonsense() -> None:
    cfg = BenchConfig.scaled(1 / 20)
    assert (cfg.rows, cfg.mem_rows) == (50_000, 5_000)
    assert cfg.block_cache_bytes == round(256 * 1024 * 1024 / 20)
    assert BenchConfig.scaled(1 / 20, concurrency=8).concurrency == 8
    with pytest.raises(ValueError, match="scale"):
        BenchConfig.scaled(0)
    with pytest.raises(ValueError, match="concurrency"):
        BenchConfig.scaled(0.01, concurrency=0)


def test_harness_runs_every_benchmark_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [
        "--scale", "0.0001",  # R = 100 rows, 10 in memory
        "--concurrency", "4",
        "--batch", "10",
        "--no-slatedb",
        "--target", f"memory://bench-smoke-{uuid.uuid4().hex}",
        "--dir", str(tmp_path / "work"),
        "--json", str(out),
        "--markdown", str(tmp_path / "bench.md"),
    ]  # fmt: skip
    png = tmp_path / "bench.png"
    try:
        import matplotlib  # noqa: F401

        argv += ["--png", str(png), "--latency-png", str(tmp_path / "latency.png")]
    except ImportError:
        png = None  # type: ignore[assignment]
    assert main(argv) == 0

    report = json.loads(out.read_text())
    by_name = {r["benchmark"]: r for r in report["results"]}
    assert set(by_name) == set(BENCHMARKS)
    for name, r in by_name.items():
        expected = 10 if name == "random reads (mem)" else 100
        assert r["values"] == expected, name
        assert r["target"] == "tabletstore"
        assert r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"] <= r["max_ms"]
        assert r["latency_histogram"]["percentiles_ms"][-1][0] == 100.0
        assert r["paper_1_server"] == PAPER.get(name, (None,))[0]
        assert set(r["s3_per_1000"]) == {"PUT", "GET", "HEAD", "LIST", "DELETE"}
    # Writes cost PUTs (commit log + minor compaction); reads from SSTables cost GETs; the
    # in-memory locality group is served without any object-store read.
    assert by_name["sequential writes"]["s3_per_1000"]["PUT"] > 0
    assert by_name["random reads"]["s3_per_1000"]["GET"] > 0
    assert by_name["random reads (mem)"]["s3_per_1000"]["GET"] == 0
    assert report["config"]["rows"] == 100
    assert "| random reads (mem) |" in (tmp_path / "bench.md").read_text()
    if png is not None:
        assert png.stat().st_size > 0
        assert (tmp_path / "latency.png").stat().st_size > 0


def test_only_runs_the_chosen_benchmarks_and_loads_what_a_read_needs(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [
        "--scale", "0.0001",
        "--concurrency", "4",
        "--no-slatedb",
        "--target", f"memory://bench-only-{uuid.uuid4().hex}",
        "--dir", str(tmp_path / "work"),
        "--json", str(out),
        "--only", "sequential writes",
        "--only", "random reads (mem)",
    ]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    by_name = {r["benchmark"]: r for r in report["results"]}
    assert set(by_name) == {"sequential writes", "random reads (mem)"}
    # The in-memory table was loaded (untimed) before its reads: every read found its row.
    assert by_name["random reads (mem)"]["values"] == 10
    assert by_name["sequential writes"]["values"] == 100
    with pytest.raises(ValueError, match="unknown benchmark"):
        BenchConfig.scaled(0.01, only=("sequential writes", "sorting"))


def test_per_row_requests_are_made_as_they_are_issued() -> None:
    """The harness holds no request per row in advance (at R = 50,000 those were 200,000
    objects the cyclic GC traversed, pausing the event loop the embedded database serves on)."""
    made: list[int] = []

    class Counting(Workloads):
        def _put(self, table: str, row: int) -> Request:
            made.append(row)
            return super()._put(table, row)

    w = Counting(cast(Target, None), BenchConfig.scaled(0.0025))
    units = w.sequential_writes("t") + w.random_writes("t")
    assert made == []
    first = next(iter(units[0]))
    assert made == [0] and callable(first)
    made.clear()
    units = w.sequential_writes("t") + w.random_writes("t")
    for unit in units:
        for _ in unit:
            pass
    rows = w.cfg.rows
    assert sorted(made) == sorted([*range(rows), *range(rows)])  # every row once per workload


def test_table_prints_ratio_against_slatedb() -> None:
    from bench.paper import BenchResult

    results = [
        BenchResult("scans", "tabletstore", 2000, 20, 1.0, 1.0, 2.0),
        BenchResult("scans", "slatedb", 1000, 20, 1.0, 1.0, 2.0),
    ]
    text = table(results)
    assert "scans" in text and "2.00" in text and "15,385" in text


def test_markdown_gives_slatedbs_cpu_per_value_beside_its_rate() -> None:
    """SlateDB's CPU per value (every thread of the process: its Rust runtime's too) is in
    the table, so a rate won on more cores reads as such."""
    from bench.paper import BenchResult, machine

    results = [
        BenchResult("random reads", "tabletstore", 1000, 1000, 0.05, 1.0, 2.0, cpu_seconds=0.05),
        BenchResult("random reads", "slatedb", 1000, 1000, 0.04, 1.0, 2.0, cpu_seconds=0.07),
    ]
    row = next(
        line
        for line in markdown(results, BenchConfig.scaled(0.0025), machine()).splitlines()
        if line.startswith("| random reads |")
    )
    # tabletstore 50 us/value at 20,000/s; SlateDB 25,000/s at 70 us/value; ratio 0.80.
    assert "| 50 | 25,000 | 2.0 | 70 | 0.80 |" in row, row


def test_growth_runs_every_benchmark_at_every_size_and_draws(tmp_path: Path) -> None:
    from bench.growth import GrowthPoint, growth_table, run_growth, svg_chart

    points = run_growth(0.0001, factors=(1, 2), workdir=str(tmp_path), concurrency=4, batch=10)
    assert {p.benchmark for p in points} == set(BENCHMARKS)
    assert sorted({p.rows for p in points}) == [100, 200]
    assert all(isinstance(p, GrowthPoint) and p.disk_bytes > 0 for p in points)
    report = growth_table(points)
    assert all(name in report for name in BENCHMARKS)
    svg = svg_chart(points, "test")
    assert svg.startswith("<svg") and svg.count("<polyline") >= 3 * len(BENCHMARKS)


def test_growth_scans_the_same_number_of_rows_at_every_size() -> None:
    from bench.paper import Workloads

    def lengths(cfg: BenchConfig) -> set[int]:
        return {len(r) for r in Workloads(cast(Target, None), cfg).scan_ranges()}

    assert lengths(BenchConfig.scaled(0.0075)) == {23, 24}  # 7,500 rows in 320 scans
    assert lengths(BenchConfig.scaled(0.12)) == {375}  # 16 times the rows, 16 times longer
    for scale in (0.0075, 0.03, 0.12):
        assert lengths(BenchConfig.scaled(scale, scan_rows=24)) <= {23, 24}
    with pytest.raises(ValueError, match="scan_rows"):
        BenchConfig.scaled(0.01, scan_rows=0)


def test_growth_counts_a_writes_minor_compaction_in_its_cpu() -> None:
    """At a small size every write is compacted after the phase, at a large one during it:
    the CPU per value counts both, as the requests do."""
    from bench.growth import GrowthPoint
    from bench.paper import BenchResult

    r = BenchResult("batched writes", "tabletstore", 1000, 10, 1.0, 1.0, 2.0, None, 0.5, 0.25)
    point = GrowthPoint.of(r, 1000, 1)
    assert (point.cpu_us, point.phase_cpu_us) == (750.0, 500.0)


def test_repeated_runs_give_medians_and_a_tls_ratio_table() -> None:
    from bench.paper import BenchResult, median_results, ratio_table

    def run(target: str, seconds: float, server_cpu: float) -> BenchResult:
        return BenchResult(
            "scans", target, 1000, 10, seconds, 1.0, 2.0, cpu_seconds=0.01,
            extra={"server_cpu_seconds": server_cpu},
        )  # fmt: skip

    runs = [
        run("cluster:1:file", 1.0, 0.02),
        run("cluster:1:file:tls", 2.0, 0.03),
        run("cluster:1:file", 0.5, 0.02),
        run("cluster:1:file:tls", 1.0, 0.03),
        run("cluster:1:file", 2.0, 0.02),
        run("cluster:1:file:tls", 4.0, 0.03),
    ]
    medians = {r.target: r.rate for r in median_results(runs)}
    assert medians == {"cluster:1:file": 1000.0, "cluster:1:file:tls": 500.0}
    text = ratio_table(runs)
    row = next(line for line in text.splitlines() if line.startswith("| scans"))
    # values/s of each run, the ratio of the medians, CPU per value (client + servers)
    assert "1,000 2,000 500" in row and "| 0.50 |" in row and "30, 40 | 1.33 |" in row
    with pytest.raises(SystemExit, match="cluster targets only"):
        main(["--repeat", "2", "--target", "memory://x", "--no-slatedb"])


def test_a_png_without_matplotlib_is_refused_before_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full run takes minutes before it draws: a missing matplotlib used to end it there,
    after the benchmarks and before the Markdown table was written."""
    import importlib.util

    import bench.paper

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    with pytest.raises(SystemExit) as exit_info:
        bench.paper._parse_args(["--png", "x.png"])
    assert exit_info.value.code == 2
    assert "--png needs matplotlib" in capsys.readouterr().err


def test_the_command_warms_its_process_up_after_the_engines_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``python -m bench.paper`` runs as a serving process does: warmed up (its start-up
    objects frozen out of the collector's reach) once the engine is imported, then main."""
    import sys

    import bench.paper as paper
    import tabletstore.ops.process_warmup as warmup

    calls: list[str] = []

    def warm_up_process() -> None:
        assert "tabletstore.embedded" in sys.modules
        calls.append("warm")

    def fake_main(argv: object = None) -> int:
        calls.append("main")
        return 0

    monkeypatch.setattr(warmup, "warm_up_process", warm_up_process)
    monkeypatch.setattr(paper, "main", fake_main)
    assert paper.entry([]) == 0
    assert calls == ["warm", "main"]
