"""Worker and tablet settings that cannot work are refused, naming the setting, before
anything is started with them (worker/tablet_server.check_options)."""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument
from tabletstore.options import IN_PROCESS_LEASE, LeaseOptions, TabletOptions, WorkerOptions
from tabletstore.worker.tablet_server import check_options

W = WorkerOptions(lease=IN_PROCESS_LEASE)
T = TabletOptions()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("compaction_processes", -1),
        ("block_cache_bytes", -1),
        ("scan_cache_rows", -5),
        ("compaction_memory_bytes", 0),
        ("load_concurrency", 0),
        ("sort_processes", -1),
        ("sort_memory_bytes", -1),
        ("log_trim_segments", 0),
        ("log_trim_bytes", 0),
        ("log_trim_interval", 0.0),
        ("heap_trim_interval", -1.0),
        ("drain_deadline", math.nan),
        ("report_stalls", 0),
        ("split_cooldown", "5"),
        ("compaction_processes", True),
    ],
)
def test_a_worker_setting_out_of_bounds_is_named(field: str, value: Any) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(f"WorkerOptions.{field} must be")):
        check_options(replace(W, **{field: value}), T)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memtable_flush_bytes", 0),
        ("max_sstables_per_group", 0),
        ("max_row_mutations", -1),
        ("split_bytes", 0),
        ("memtable_limit_bytes", 0),
    ],
)
def test_a_tablet_setting_out_of_bounds_is_named(field: str, value: Any) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(f"TabletOptions.{field} must be")):
        check_options(W, replace(T, **{field: value}))


def test_contradicting_bounds_are_named() -> None:
    with pytest.raises(InvalidArgument, match="max_disjoint_sstables_per_group must be at least"):
        check_options(W, TabletOptions(max_sstables_per_group=8, max_disjoint_sstables_per_group=4))
    with pytest.raises(
        InvalidArgument, match=re.escape("LeaseOptions.safety_margin must be below ttl")
    ):
        check_options(replace(W, lease=LeaseOptions(ttl=2.0, safety_margin=2.0)), T)
    with pytest.raises(InvalidArgument, match=re.escape("LeaseOptions.ttl must be > 0")):
        check_options(replace(W, lease=LeaseOptions(ttl=0.0, safety_margin=0.0)), T)


def test_the_defaults_and_none_where_allowed_pass() -> None:
    check_options(WorkerOptions(), TabletOptions())
    check_options(
        replace(W, log_trim_interval=None, heap_trim_interval=None, compaction_processes=0),
        replace(T, memtable_limit_bytes=None),
    )


async def test_an_embedded_database_refuses_them_before_opening_anything(tmp_path: Path) -> None:
    where = tmp_path / "db"
    with pytest.raises(InvalidArgument, match=re.escape("WorkerOptions.compaction_processes")):
        await Database.open(f"file://{where}", worker_options=replace(W, compaction_processes=-1))
    assert not where.exists()
    with pytest.raises(InvalidArgument, match=re.escape("TabletOptions.split_bytes")):
        await Database.open(
            f"memory://bad-{uuid.uuid4().hex}", tablet_options=TabletOptions(split_bytes=0)
        )
