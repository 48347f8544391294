"""``--processes N|auto`` and the worker group's per-process identities and ports
(``cli/supervisor.py``, ``cli/server_cmds.py``), and the cluster benchmark's ``NxP`` targets."""

from __future__ import annotations

import click
import pytest

from bench.cluster_target import parse_cluster_spec, processes_of
from tabletstore.cli.server_cmds import _group_member
from tabletstore.cli.supervisor import GroupPlace, Supervisor, cores, group_place, process_count
from tabletstore.errors import InvalidArgument


def test_process_count_is_a_positive_number_or_auto() -> None:
    assert process_count("3") == 3
    assert process_count("auto") == cores() >= 1
    for bad in ("0", "-1", "two", ""):
        with pytest.raises(click.BadParameter, match="positive number or 'auto'"):
            process_count(bad)
    with pytest.raises(ValueError, match="at least 1 process"):
        Supervisor(0, [])


def test_each_worker_of_a_group_has_its_own_identity_and_ports() -> None:
    first = GroupPlace(slot=1, start=0, ready_fd=9)
    assert _group_member(first, "host-a", 7000, 9100) == ("host-a-1", 7001, 9101)
    # 0 stays 0 (any free port); no id given stays random; a restart is a new worker.
    assert _group_member(first, None, 0, 0) == (None, 0, 0)
    assert _group_member(GroupPlace(1, 2, 9), "host-a", 0, None) == ("host-a-1-r2", 0, None)
    assert group_place(None, 0, None) is None
    assert group_place(0, 1, 5) == GroupPlace(0, 1, 5)


def test_cluster_targets_name_processes_per_worker() -> None:
    assert parse_cluster_spec("cluster:1x2:file") == (1, "file")
    assert processes_of("cluster:1x2:file:tls") == 2
    assert processes_of("cluster:3:moto") == 1
    for bad in ("cluster:x2:file", "cluster:1xa:file", "cluster:1x0:file"):
        with pytest.raises(InvalidArgument):
            parse_cluster_spec(bad)


def test_a_processes_pair_gets_a_ratio_table() -> None:
    from bench.paper import BenchResult, ratio_table

    def run(target: str, seconds: float, server_cpu: float) -> BenchResult:
        return BenchResult(
            "random reads", target, 1000, 1000, seconds, 1.0, 2.0, cpu_seconds=0.01,
            extra={"server_cpu_seconds": server_cpu},
        )  # fmt: skip

    runs = [run("cluster:1:file", 1.0, 0.03), run("cluster:1x2:file", 0.5, 0.04)]
    text = ratio_table(runs)
    assert "median 2 / 1 processes" in text
    row = next(line for line in text.splitlines() if line.startswith("| random reads"))
    assert "| 2.00 |" in row and "40, 50 | 1.25 |" in row


def test_a_worker_group_in_the_local_stack_is_scraped_process_by_process() -> None:
    from tabletstore.cli.localstack import ProcessRecord, Stack, prometheus_config

    group = ProcessRecord(
        "worker-0", 7, ("tabletstore",), 1, "127.0.0.1:7000", "/d/w.log",
        metrics_url="http://127.0.0.1:9100", processes=2,
    )  # fmt: skip
    stack = Stack("/d", "etcd://127.0.0.1:2379/ns", "", "tabletstore", False, (group,))
    config = prometheus_config(stack)
    assert "targets: ['127.0.0.1:9100']" in config and "process: worker-0.0" in config
    assert "targets: ['127.0.0.1:9101']" in config and "process: worker-0.1" in config
    assert Stack.from_json(stack.to_json()).processes[0].processes == 2
