"""Settings: each default lives in one place and every reader refers to it."""

from __future__ import annotations

from click.testing import CliRunner

from tabletstore.cli.main import main
from tabletstore.master import gc, gc_plan
from tabletstore.options import (
    IN_PROCESS_LEASE,
    SPLIT_BYTES,
    LeaseOptions,
    MasterOptions,
    TabletOptions,
    WorkerOptions,
)


def test_one_lease_default_for_masters_and_workers() -> None:
    assert WorkerOptions().lease == MasterOptions().lease == LeaseOptions()
    assert LeaseOptions().ttl == 5.0


def test_lease_margin_is_derived_from_the_ttl_unless_given() -> None:
    assert LeaseOptions(ttl=5.0).margin == 1.0
    assert LeaseOptions(ttl=2.0).margin == 0.5
    assert LeaseOptions(ttl=5.0, safety_margin=0.25).margin == 0.25
    assert IN_PROCESS_LEASE.margin == 5.0


def test_one_split_size_for_the_split_rule_and_the_merge_thresholds() -> None:
    assert TabletOptions().split_bytes == MasterOptions().split_bytes == SPLIT_BYTES


def test_gc_defaults_are_the_master_options() -> None:
    assert MasterOptions().gc_interval is None  # derived from the grace
    assert gc.interval_for(MasterOptions().gc_grace) == 600.0
    assert gc.interval_for(300.0) == 50.0 and gc.interval_for(5.0) == 10.0
    assert gc_plan.DEFAULT_GRACE == MasterOptions().gc_grace


def test_cli_defaults_are_the_options_defaults() -> None:
    for verb in ("master", "worker"):
        out = " ".join(
            CliRunner().invoke(main, [verb, "--help"], terminal_width=200).output.split()
        )
        assert f"[default: {LeaseOptions().ttl};" in out
        assert f"[default: {SPLIT_BYTES};" in out
