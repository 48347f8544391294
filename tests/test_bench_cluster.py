"""bench.cluster_target: the cluster benchmark target against real processes."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from bench.cluster_target import parse_cluster_spec, scrape_store_stats, split_keys
from bench.paper import BenchConfig, cluster_table, run_suite
from bench.targets import row_key
from tabletstore.cli import localstack
from tabletstore.errors import InvalidArgument
from tabletstore.storage_s3.base import Op


def test_parse_cluster_spec() -> None:
    assert parse_cluster_spec("cluster:4:file") == (4, "file")
    assert parse_cluster_spec("cluster:1:moto") == (1, "moto")
    for bad in ("cluster:0:file", "cluster:x:file", "cluster:2:s3", "cluster:2", "etcd:1:file"):
        with pytest.raises(InvalidArgument, match="cluster:N:file"):
            parse_cluster_spec(bad)


def test_split_keys_cut_the_key_space_evenly() -> None:
    assert split_keys(100, 4) == [row_key(25), row_key(50), row_key(75)]
    assert split_keys(3, 8) == [row_key(1), row_key(2)]  # never an empty tablet
    assert split_keys(100, 1) == []


def test_scrape_store_stats() -> None:
    text = (
        "# TYPE tabletstore_object_store_requests_total counter\n"
        'tabletstore_object_store_requests_total{op="PUT"} 7.0\n'
        'tabletstore_object_store_bytes_total{op="PUT"} 7000.0\n'
        'tabletstore_object_store_requests_total{op="GET_RANGE"} 3.0\n'
        'tabletstore_rpc_requests_total{method="read_row",outcome="ok"} 9.0\n'
    )
    stats = scrape_store_stats(text)
    assert (stats[Op.PUT].requests, stats[Op.PUT].bytes) == (7, 7000)
    assert stats[Op.GET_RANGE].requests == 3
    assert stats[Op.GET].requests == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_cluster_target_runs_every_benchmark_and_stops_its_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stacks: list[localstack.Stack] = []
    real_up = localstack.up

    def up(*args: Any, **kwargs: Any) -> localstack.Stack:
        stacks.append(real_up(*args, **kwargs))
        return stacks[-1]

    monkeypatch.setattr(localstack, "up", up)
    cfg = BenchConfig.scaled(0.0002, concurrency=4, batch=20)  # 200 rows, 20 in memory
    lines: list[str] = []
    results = await run_suite(cfg, ["cluster:2:file"], log=lines.append)
    assert {r.benchmark for r in results} == {
        "sequential writes",
        "random writes",
        "batched writes",
        "sequential reads",
        "random reads",
        "random reads (mem)",
        "scans",
    }
    assert all(r.target == "cluster:2:file" and r.values > 0 for r in results)
    writes = next(r for r in results if r.benchmark == "sequential writes")
    assert writes.cost is not None and writes.per_1000(Op.PUT)  # scraped from the workers
    table = cluster_table(results)
    assert "cluster:2:file total | per worker" in table
    # The stack (etcd, master, two workers; no moto with a file store) is stopped and removed.
    [stack] = stacks
    assert sorted(r.role for r in stack.processes) == ["etcd", "master", "worker-0", "worker-1"]
    assert not any(localstack.is_running(r) for r in stack.processes)
    assert not await asyncio.to_thread(os.path.exists, stack.dir)
