"""bench/cost.py: dollars per million operations from a bench.paper run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cost import PRICES, main, rows


def _result(name: str, put: float, get: float, cpu_us: float, target: str = "tabletstore") -> dict:
    return {
        "benchmark": name,
        "target": target,
        "values": 1000,
        "cpu_seconds": cpu_us / 1000,
        "after_cpu_seconds": 0.0,
        "s3_per_1000": {"PUT": put, "GET": get, "HEAD": 0.0, "LIST": 0.0, "DELETE": 0.0},
    }


def test_s3_requests_and_cpu_become_dollars() -> None:
    cost = {c.benchmark: c for c in rows(
        [
            _result("random writes", put=33.7, get=0.8, cpu_us=100),
            _result("random reads", put=0.0, get=815.6, cpu_us=80),
            _result("scans", put=0.0, get=15.6, cpu_us=12),
            _result("random reads", put=0.0, get=1.0, cpu_us=1, target="slatedb"),
        ],
        value_size=1000,
    )}  # fmt: skip
    assert set(cost) == {"random writes", "random reads", "scans"}  # tabletstore's only
    w = cost["random writes"]
    # 0.0337 PUTs per write at $0.005 per 1,000 = $0.1685 per million, plus the GETs.
    assert w.s3 == pytest.approx(0.0337 * 5 + 0.0008 * 0.4)
    # 100 µs of CPU = 100 vCPU-seconds per million at Fargate's vCPU and 4 GB per vCPU.
    assert w.compute == pytest.approx(100 / 3600 * (0.04048 + 4 * 0.004445))
    assert w.tabletstore == pytest.approx(w.s3 + w.compute)
    assert w.dynamodb == PRICES.dynamodb_per_million_wru
    assert w.bigtable == pytest.approx(1e6 * 0.65 / 3600 / 14_000)
    r = cost["random reads"]
    assert r.s3 == pytest.approx(0.8156 * 0.4)
    assert r.dynamodb == PRICES.dynamodb_per_million_rru
    # A scanned row is a quarter of a 4 KB read unit.
    assert cost["scans"].dynamodb == pytest.approx(1000 / 4096 * 0.125)


def test_the_command_prints_and_writes_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run.json"
    run.write_text(json.dumps({
        "config": {"rows": 100, "value_size": 1000, "block_cache_bytes": 2**20},
        "machine": {"cpu": "x", "load_average": [0.5, 0.5, 0.5]},
        "results": [_result("sequential writes", 33.2, 0.3, 109)],
    }))  # fmt: skip
    md = tmp_path / "cost.md"
    assert main([str(run), "--markdown", str(md)]) == 0
    assert "| sequential writes | 0.0332, 0.0003 |" in capsys.readouterr().out
    assert md.read_text().startswith("| operation |")


def test_a_file_that_is_not_a_run_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        main([str(bad)])
    assert exc.value.code == 2
