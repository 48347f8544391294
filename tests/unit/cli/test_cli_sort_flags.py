"""The worker's and master's sort settings on the command line: each flag reaches
the options the process runs with, bad values are refused by name, and the defaults are the
options' own. Also ``--rejoin/--no-rejoin``, which both take, and the master's METADATA
splits and garbage-collection grace."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tabletstore.master.master_process as master_process
import tabletstore.worker.worker_process as worker_process
from tabletstore.cli import main as cli
from tabletstore.cli import server_cmds
from tabletstore.options import MasterOptions, WorkerOptions


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Runs a verb's process body at once (no coordinator, no store) and keeps the options
    it was given."""
    got: dict[str, Any] = {}

    def serve(run: Callable[[Any, asyncio.Event], Awaitable[None]], *, store: str | None) -> None:
        asyncio.run(run(None, asyncio.Event()))  # type: ignore[arg-type]

    async def run_worker(coord: object, **kwargs: Any) -> None:
        got["worker"] = kwargs["options"]
        got["worker rejoin"] = kwargs["rejoin"]

    async def run_master(coord: object, options: MasterOptions, **kwargs: Any) -> None:
        got["master"] = options
        got["master rejoin"] = kwargs["rejoin"]
        got["master metadata splits"] = kwargs["metadata_splits"]

    monkeypatch.setattr(server_cmds, "_serve", serve)
    monkeypatch.setattr(worker_process, "run_worker", run_worker)
    monkeypatch.setattr(master_process, "run_master", run_master)
    return got


def test_worker_sort_flags_reach_its_options(captured: dict[str, Any], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.main, ["worker"])
    assert result.exit_code == 0, result.output
    default = captured["worker"]
    assert isinstance(default, WorkerOptions)
    assert (default.sort_processes, default.sort_spill_bytes) == (
        WorkerOptions().sort_processes,
        WorkerOptions().sort_spill_bytes,
    )
    argv = ["worker", "--sort-processes", "0", "--sort-memory-bytes", "1000"]
    argv += ["--sort-spill-bytes", "5000", "--sort-spill-dir", str(tmp_path)]
    result = CliRunner().invoke(cli.main, argv)
    assert result.exit_code == 0, result.output
    options = captured["worker"]
    assert (options.sort_processes, options.sort_memory_bytes) == (0, 1000)
    assert (options.sort_spill_bytes, options.sort_spill_dir) == (5000, str(tmp_path))
    bad = CliRunner().invoke(cli.main, ["worker", "--sort-processes", "-1"])
    assert bad.exit_code == 2 and "--sort-processes" in bad.output
    missing = CliRunner().invoke(cli.main, ["worker", "--sort-spill-dir", str(tmp_path / "no")])
    assert missing.exit_code == 2 and "--sort-spill-dir" in missing.output


def test_worker_compaction_memory_flag_reaches_its_options(captured: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli.main, ["worker"])
    assert result.exit_code == 0, result.output
    default = captured["worker"].compaction_memory_bytes
    assert default == WorkerOptions().compaction_memory_bytes
    result = CliRunner().invoke(cli.main, ["worker", "--compaction-memory-bytes", "4096"])
    assert result.exit_code == 0, result.output
    assert captured["worker"].compaction_memory_bytes == 4096
    bad = CliRunner().invoke(cli.main, ["worker", "--compaction-memory-bytes", "0"])
    assert bad.exit_code == 2 and "--compaction-memory-bytes" in bad.output


def test_master_sort_owner_bytes_flag_reaches_its_options(captured: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli.main, ["master"])
    assert result.exit_code == 0, result.output
    assert captured["master"].sort_owner_bytes == MasterOptions().sort_owner_bytes
    result = CliRunner().invoke(cli.main, ["master", "--sort-owner-bytes", "0"])
    assert result.exit_code == 0, result.output
    assert captured["master"].sort_owner_bytes == 0
    bad = CliRunner().invoke(cli.main, ["master", "--sort-owner-bytes", "-5"])
    assert bad.exit_code == 2 and "--sort-owner-bytes" in bad.output


def test_master_gc_grace_flag_reaches_its_options(captured: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli.main, ["master"])
    assert result.exit_code == 0, result.output
    assert captured["master"].gc_grace == MasterOptions().gc_grace == 3600.0
    result = CliRunner().invoke(cli.main, ["master", "--gc-grace", "300"])
    assert result.exit_code == 0, result.output
    assert captured["master"].gc_grace == 300.0
    bad = CliRunner().invoke(cli.main, ["master", "--gc-grace", "0"])
    assert bad.exit_code == 2 and "--gc-grace" in bad.output


def test_master_metadata_split_flags_reach_the_master(captured: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli.main, ["master"])
    assert result.exit_code == 0, result.output
    assert captured["master metadata splits"] == []
    argv = ["master", "--metadata-split-at", "q", "--metadata-split-at", "g"]
    result = CliRunner().invoke(cli.main, argv)
    assert result.exit_code == 0, result.output
    assert captured["master metadata splits"] == [b"g", b"q"]
    bad = CliRunner().invoke(cli.main, ["master", "--metadata-split-at", "a/b"])
    assert bad.exit_code == 2 and "--metadata-split-at" in bad.output, bad.output
    assert "table name 'a/b'" in bad.output


@pytest.mark.parametrize("verb", ["worker", "master"])
def test_a_process_rejoins_after_a_lost_lease_unless_told_not_to(
    captured: dict[str, Any], verb: str
) -> None:
    result = CliRunner().invoke(cli.main, [verb])
    assert result.exit_code == 0, result.output
    assert captured[f"{verb} rejoin"] is True
    result = CliRunner().invoke(cli.main, [verb, "--no-rejoin"])
    assert result.exit_code == 0, result.output
    assert captured[f"{verb} rejoin"] is False
