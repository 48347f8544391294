"""The soak benchmark (bench/soak.py): its pieces, and ``--quick`` end to end against real
processes, so it cannot rot; asserts what it counted and checked, never how fast."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.cluster_target import parse_cluster_spec
from bench.soak import (
    READ_METHODS,
    RPC_METRIC,
    WRITE_METHODS,
    Cumulative,
    Histogram,
    KeySpace,
    Ledger,
    Pacer,
    Recorder,
    SoakConfig,
    SoakRun,
    Traffic,
    check_value,
    histogram_buckets,
    lag_buckets,
    lag_quantiles,
    main,
    make_value,
    parse_rates,
    window_table,
)
from bench.targets import row_key
from tabletstore.cli import localstack
from tabletstore.ops.metrics import WorkerMetrics


def test_key_space_is_a_permutation_of_blocks_of_consecutive_keys() -> None:
    for rows, block in ((1, 1), (100, 10), (1000, 100), (999, 100), (7, 3)):
        space = KeySpace(rows, block)
        keys = [space.key(i) for i in range(space.size)]
        assert sorted(keys) == [row_key(i) for i in range(space.size)]
        for start in range(0, space.size, block):  # a batch: one run of consecutive keys
            run = keys[start : start + block]
            assert run == sorted(run) and int(run[-1]) - int(run[0]) == block - 1


def test_ledger_picks_only_acknowledged_rows_and_all_of_them() -> None:
    ledger = Ledger(KeySpace(1000, 10))
    rng = random.Random(3)
    assert ledger.pick(rng) is None
    first, second = ledger.block(), ledger.block()
    assert (first, second) == (0, 10)
    assert second is not None
    ledger.ack(second + 2, 3)  # rows 12, 13, 14
    ledger.ack(0, 1)  # row 0
    seen = {ledger.pick(rng) for _ in range(500)}
    assert seen == {0, 12, 13, 14}
    assert ledger.acked == 4
    while ledger.block() is not None:
        pass
    assert ledger._next_block == 100


def test_values_carry_their_key() -> None:
    value = make_value(b"k1", 100)
    assert len(value) == 100 and check_value(b"k1", value)
    assert not check_value(b"k2", value)
    assert not check_value(b"k1", value[:-1] + bytes([value[-1] ^ 1]))
    assert make_value(b"k1", 100) != value  # random bodies: incompressible


def test_histogram_quantiles_within_its_five_percent_buckets() -> None:
    hist = Histogram()
    for ms in range(1, 1001):
        hist.add(float(ms))
    assert 500 <= hist.quantile(0.5) <= 500 * 1.051
    assert 990 <= hist.quantile(0.99) <= 990 * 1.051
    other = Histogram()
    other.add(5000.0)
    hist.merge(other)
    assert hist.total == 1001
    assert hist.quantile(1.0) >= 5000
    assert Histogram().quantile(0.99) == 0.0


def test_cumulative_counters_keep_a_silent_or_exited_process_counts() -> None:
    counters = Cumulative()
    counters.update("w0", {"PUT": 10.0})
    counters.update("w1", {"PUT": 5.0, "GET": 2.0})
    assert counters.total() == {"PUT": 15.0, "GET": 2.0}
    counters.update("w0", {"PUT": 12.0})  # w1 did not answer (or exited): its counts stand
    assert counters.total() == {"PUT": 17.0, "GET": 2.0}


def test_config_rejects_nonsense() -> None:
    assert SoakConfig().rows == 10_000_000  # 10 GB of 1000-byte values
    for bad in (
        {"minutes": 0},
        {"workers": 0},
        {"value_bytes": 16},
        {"readers": -1},
        {"gc_grace": 10},
    ):
        with pytest.raises(ValueError):
            SoakConfig(**bad)
    with pytest.raises(ValueError, match="writer"):
        SoakConfig(batch_writers=0, single_writers=0)
    assert parse_cluster_spec("cluster:2:seaweedfs") == (2, "seaweedfs")


def test_rates_are_kind_equals_number_and_only_for_known_kinds() -> None:
    assert parse_rates(["read=100", "scan = 2.5"]) == {"read": 100.0, "scan": 2.5}
    for bad in (["read"], ["read=fast"], ["=3x"]):
        with pytest.raises(ValueError, match="KIND=N"):
            parse_rates(bad)
    with pytest.raises(ValueError, match="unknown kind 'reads'"):
        SoakConfig(rates={"reads": 10.0})
    for rate in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive"):
            SoakConfig(rates={"read": rate})


async def test_a_pacer_hands_out_slots_at_its_rate_and_past_ones_when_behind() -> None:
    pacer = Pacer(100.0)
    first = await pacer.slot()
    second = await pacer.slot()
    assert second - first == pytest.approx(0.01)
    assert time.perf_counter() >= second  # it waited for the slot
    await asyncio.sleep(0.2)  # a client 20 slots behind: no wait, the slot it missed
    third = await pacer.slot()
    assert third == pytest.approx(first + 0.02) and time.perf_counter() - third > 0.15


class SlowTable:
    """A table whose point reads take ``seconds`` and return the value a row was written with."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def read_row(self, key: bytes) -> SimpleNamespace:
        await asyncio.sleep(self.seconds)
        return SimpleNamespace(cells=[SimpleNamespace(value=make_value(key, 100))])


async def reads_timed(rates: dict[str, float]) -> list[float]:
    """Twelve point reads by one reader of a table that takes 50 ms a read: their latencies."""
    cfg = SoakConfig(readers=1, batch_writers=1, single_writers=0, scanners=0, rates=rates)
    ledger = Ledger(KeySpace(100, 10))
    ledger.ack(0, 10)
    rec = Recorder(time.monotonic())
    traffic = Traffic(SlowTable(0.05), cfg, ledger, rec)
    for _ in range(12):
        await traffic.read_one("read", ledger.pick(random.Random(1)) or 0)
    assert rec.lost == rec.wrong == 0
    return rec.now["read"].latencies


async def test_a_paced_read_is_timed_from_its_slot_so_queueing_shows() -> None:
    # Flat out, a read takes what the table takes: no latency builds up.
    closed = await reads_timed({})
    assert closed[-1] < closed[0] + 300
    # Asked for 100 a second from one reader that manages 20: each read starts later than
    # its slot, and the wait is in its latency (a closed loop would report 50 ms each).
    paced = await reads_timed({"read": 100.0})
    assert paced == sorted(paced) and paced[-1] > paced[0] + 300


def test_the_table_names_the_paced_kinds() -> None:
    cfg = SoakConfig(rates={"read": 100.0, "scan": 5.0})
    run = SoakRun(cfg, [], [], {}, {"cores": 2, "python": "3.11"})
    assert "paced (open loop, latency from each operation's slot): read 100/s, scan 5/s" in (
        window_table(run)
    )
    assert "paced" not in window_table(SoakRun(SoakConfig(), [], [], {}, {}))


def test_a_workers_loop_lag_is_read_from_its_metrics_per_bucket() -> None:
    metrics = WorkerMetrics("w-soak")
    for seconds in (0.0005, 0.0005, 0.003, 0.3):
        metrics.loop_lag.observe(seconds)
    buckets = lag_buckets(metrics.exposition().decode())
    assert buckets["0.001"] == 2 and buckets["0.005"] == 3 and buckets["+Inf"] == 4
    # Per-interval counts (not cumulative), summed over workers and samples.
    one = {"0.001": 2, "0.005": 1, "0.5": 1}
    assert lag_quantiles([one], 0.5) == (1.0, 500.0)
    assert lag_quantiles([one, {"0.001": 96}], 0.99) == (5.0, 500.0)
    assert lag_quantiles([one, {"0.001": 196}], 0.99) == (1.0, 500.0)
    assert lag_quantiles([one, {"+Inf": 1}], 1.0)[1] == float("inf")
    assert lag_quantiles([], 0.99) == (0.0, 0.0)


def test_a_workers_own_request_times_are_read_per_method() -> None:
    metrics = WorkerMetrics("w-soak")
    observed = [("mutate_rows", 0.002), ("mutate_tablets", 0.3), ("read_row", 0.0004)]
    for method, seconds in observed:
        metrics.rpc_latency.labels(method=method).observe(seconds)
    text = metrics.exposition().decode()
    writes = histogram_buckets(text, RPC_METRIC, WRITE_METHODS)
    assert writes["0.0025"] == 1 and writes["0.5"] == 2 and writes["+Inf"] == 2
    assert histogram_buckets(text, RPC_METRIC, READ_METHODS)["0.0005"] == 1
    # Every method at once without one.
    assert histogram_buckets(text, RPC_METRIC)["+Inf"] == 3


def test_the_table_shows_the_loop_lag_of_workers_and_clients() -> None:
    sample: dict[str, Any] = {
        "t": 10.0,
        "ops": {
            k: {"count": 0, "rows": 0, "histogram": {}} for k in ("batch", "write", "read", "scan")
        },
        "worker_loop_lag": {"0.001": 98, "0.002": 1, "0.2": 1},
        "commit_log_put": {"0.005": 980, "0.025": 19, "0.25": 1},
        "worker_write": {"0.005": 98, "0.05": 1, "1.0": 1},
        "worker_read": {"0.001": 990, "0.01": 10},
        "client_loop_lag": {"p99_ms": 3.0, "max_ms": 41.0, "histogram": {"0": 99, "100": 1}},
        "rss_mb": {"worker-0": 100.0},
        "collector_s": {"0": 0.05, "1": 0.01, "2": 0.3},
        "collector_processes": 2,
        "tablets": 2,
        "bytes_written": 0,
        "sstables_per_tablet": {"mean": 1.0, "max": 1},
        "s3_interval": {},
        "stored_bytes": {"total": 0},
        "load": [1.0, 1.0, 1.0],
    }
    table = window_table(SoakRun(SoakConfig(), [sample], [], {}, {}))
    assert "loop lag p99 / max ms, workers" in table
    row = table.splitlines()[2]
    assert "| 2 / 200 |" in row and "/ 41 |" in row
    assert "log PUT p99 / max ms" in table and "| 25 / 250 |" in row
    # The writes' and reads' p99 as the workers timed them.
    assert "in the workers: write / read p99 ms" in table and "| 50 / 1 |" in row
    # Time in the collector, per worker and second of the window, by generation.
    assert "| 2.5 / 0.5 / 15.0 |" in row


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_soak_runs_checks_every_read_and_stops_its_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stacks: list[localstack.Stack] = []
    real_up = localstack.up

    def up(*args: Any, **kwargs: Any) -> localstack.Stack:
        stacks.append(real_up(*args, **kwargs))
        return stacks[-1]

    monkeypatch.setattr(localstack, "up", up)
    out = tmp_path / "out"
    # Half a minute: about fifteen samples two seconds apart, three times the five asked below
    # (a sample on a loaded machine takes longer than its interval), every kind of traffic in
    # each; a longer run only adds samples of the same. Scans are paced (an open loop).
    argv = ["--quick", "--minutes", "0.5", "--gc-grace", "120", "--rate", "scan=5"]
    argv += ["--report-stalls", "0.5"]  # the workers' flag: they start with it
    assert main([*argv, "--out", str(out)]) == 0

    doc = json.loads((out / "soak.json").read_text())
    samples, summary = doc["samples"], doc["summary"]
    assert len(samples) >= 5
    for kind in ("batch", "write", "read", "scan"):
        assert summary["operations"][kind] > 0, kind
    assert summary["lost_writes"] == 0 and summary["wrong_values"] == 0
    verified = summary["verified"]
    assert verified["rows"] > 0 and verified["lost"] == 0 and verified["wrong"] == 0
    assert summary["rows_written"] > 0 and summary["processes_exited"] == []
    # The workers' own times of the writes and reads, from their RPC histograms.
    assert any(s["worker_write"] for s in samples) and any(s["worker_read"] for s in samples)
    last = samples[-1]
    assert last["tablets"] >= 4  # two per worker, pre-split
    assert set(last["rss_mb"]) >= {"etcd", "master", "worker-0", "worker-1"}
    assert all(mb > 0 for mb in last["rss_mb"].values())
    # Each worker's C heap, from its /metrics once its trimmer has read it (every 30 s).
    heaps = [s["heap_mb"] for s in samples if s["heap_mb"]]
    assert heaps and set(heaps[-1]) <= {"worker-0", "worker-1"}
    assert all(h["in_use"] > 0 for h in heaps[-1].values())
    # The workers' loop lag (every 50 ms each, so hundreds a sample) and this process's own.
    assert sum(sum(s["worker_loop_lag"].values()) for s in samples) > 100
    assert sum(sum(s["commit_log_put"].values()) for s in samples) > 10  # every group commit
    assert sum(sum(s["client_loop_lag"]["histogram"].values()) for s in samples) > 100
    assert summary["loop_lag_ms"]["workers"]["q4_p99"] > 0
    assert last["stored_bytes"]["logs"] > 0  # the commit logs, on disk
    assert sum(last["s3_requests"].values()) > 0  # scraped from the workers and the master
    assert last["collector_processes"] == 2 and sum(last["collector_s"].values()) > 0
    assert last["gc_deleted"] == {"objects": 0, "bytes": 0}  # scraped; nothing is 120 s old
    assert "garbage-collection grace 120 s" in (out / "soak.md").read_text()
    assert doc["config"]["rates"] == {"scan": 5.0}
    assert "latency from each operation's slot): scan 5/s" in (out / "soak.md").read_text()
    assert (out / "soak.png").stat().st_size > 0
    assert "| minutes | GB written |" in (out / "soak.md").read_text()
    assert (out / "logs" / "worker-0.log").exists()
    (out / "soak.png").unlink()
    assert main(["--redraw", str(out)]) == 0  # from the saved JSON alone
    assert (out / "soak.png").stat().st_size > 0
    # The stack is stopped, by pid, and its data removed.
    [stack] = stacks
    [master] = [r for r in stack.processes if r.role == "master"]
    assert master.argv[-2:] == ("--gc-grace", "120")
    workers = [r for r in stack.processes if r.role.startswith("worker-")]
    assert all("--report-stalls" in r.argv for r in workers)
    assert not any(localstack.is_running(r) for r in stack.processes)
    assert not Path(stack.dir).exists()


def test_the_saved_run_encodes_each_sample_once_and_reads_back_whole() -> None:
    run = SoakRun(SoakConfig.quick(), machine={"cores": 2})
    run.samples.append({"t": 10.0, "ops": {"read": {"count": 1}}})
    run.events.append({"t": 1.0, "event": "started"})
    assert json.loads(run.json_text()) == run.to_json()
    first = run._sample_texts[0]
    run.samples.append({"t": 20.0, "ops": {}})
    run.summary = {"lost_writes": 0}
    assert json.loads(run.json_text()) == run.to_json()
    assert run._sample_texts[0] is first, "not encoded again"
    assert json.loads(SoakRun(SoakConfig.quick()).json_text())["samples"] == []
