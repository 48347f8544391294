"""bench/rpc_ratio.py's runs (one read benchmark on a fresh, cold table) do what they say on
an embedded target, so the harness cannot rot; never how fast."""

from __future__ import annotations

import uuid

import pytest

from bench.paper import BenchConfig
from bench.rpc_ratio import BENCHMARKS, _one, main
from bench.targets import open_target


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
async def test_each_benchmark_reads_every_row_of_its_own_table(name: str) -> None:
    cfg = BenchConfig(rows=120, mem_rows=40, block_cache_bytes=1 << 20, scale=1, concurrency=4)
    target = await open_target(f"memory://rpc-ratio-{uuid.uuid4().hex}")
    try:
        first = await _one(target, cfg, name, 0)
        second = await _one(target, cfg, name, 1)  # another table: cold again
    finally:
        await target.close()
    rows = cfg.mem_rows if BENCHMARKS[name][1] else cfg.rows
    for result in (first, second):
        assert (result.benchmark, result.values) == (name, rows)
        assert result.cost is not None


def test_repeat_must_be_positive() -> None:
    with pytest.raises(SystemExit, match="repeat"):
        main(["--repeat", "0"])
