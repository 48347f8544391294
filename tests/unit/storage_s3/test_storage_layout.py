"""The object key layout: builders, exact parsers, validation, and listing order."""

from __future__ import annotations

import pytest

from tabletstore.errors import InvalidArgument
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.testing.store_conformance import collect


def test_keys_look_like_design_section_3() -> None:
    assert layout.sstable_key("t1", "tab-a", "default", "s0001") == (
        "tables/t1/tab-a/default/s0001.parquet"
    )
    assert layout.log_segment_key("w-7", 3, 42) == (
        "logs/w-7/00000000000000000003/00000000000000000042.log"
    )
    assert layout.recovery_run_key("w-7", 3, 42, "t1", "tab-a") == (
        "recovery/w-7/00000000000000000003/00000000000000000042/t1/tab-a.run"
    )
    assert layout.recovery_plan_key("w-7", 3) == "recovery/w-7/00000000000000000003/plan.json"
    assert layout.recovery_manifest_key("w-7", 3, 42) == (
        "recovery/w-7/00000000000000000003/00000000000000000042/done.json"
    )
    assert layout.snapshot_key("t1", "snap=1") == "snapshots/t1/snap=1.json"


def test_parsers_invert_builders() -> None:
    assert layout.parse_sstable_key(layout.sstable_key("t", "a b", "lg", "x.parquet")) == (
        layout.SSTableKey("t", "a b", "lg", "x.parquet")
    )
    assert layout.parse_log_segment_key(layout.log_segment_key("w", 0, 2**64 - 1)) == (
        layout.LogSegmentKey("w", 0, 2**64 - 1)
    )
    assert layout.parse_recovery_run_key(layout.recovery_run_key("w", 1, 2, "t", "tab")) == (
        layout.RecoveryRunKey("w", 1, 2, "t", "tab")
    )
    assert layout.parse_recovery_key(layout.recovery_run_key("w", 1, 2, "t", "tab")) == (
        layout.RecoveryKey("w", 1, "run", 2, "t", "tab")
    )
    assert layout.parse_recovery_key(layout.recovery_plan_key("w", 1)) == (
        layout.RecoveryKey("w", 1, "plan")
    )
    assert layout.parse_recovery_key(layout.recovery_manifest_key("w", 1, 7)) == (
        layout.RecoveryKey("w", 1, "manifest", 7)
    )
    assert layout.parse_snapshot_key(layout.snapshot_key("t", "é")) == layout.SnapshotKey("t", "é")


def test_prefixes_nest() -> None:
    key = layout.log_segment_key("w", 5, 9)
    for prefix in (layout.log_prefix(), layout.log_prefix("w"), layout.log_prefix("w", 5)):
        assert key.startswith(prefix)
    sst = layout.sstable_key("t", "tab", "lg", "s")
    assert sst.startswith(layout.tables_prefix("t", "tab"))
    assert sst.startswith(layout.tables_prefix("t"))
    assert layout.recovery_run_key("w", 5, 9, "t", "tab").startswith(
        layout.recovery_prefix("w", 5, 9)
    )
    assert layout.snapshot_key("t", "s").startswith(layout.snapshot_prefix("t"))
    assert not layout.log_prefix("w1").startswith(layout.log_prefix("w"))  # Ends in '/'.


@pytest.mark.parametrize("bad", ["", "a/b", ".", "..", "tab\n", "x\x00", "z" * 201])
def test_bad_components_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        layout.sstable_key("t", bad, "lg", "s")
    with pytest.raises(InvalidArgument):
        layout.log_segment_key(bad, 1, 1)


@pytest.mark.parametrize("bad", [-1, 10**20, True, 1.5, "3"])
def test_bad_numbers_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        layout.log_segment_key("w", 1, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "key",
    [
        "tables/t/tab/lg/s.log",
        "tables/t/tab/s.parquet",
        "logs/w/1/2.log",
        "logs/w/00000000000000000001/0000000000000000000x.log",
        "logs/w/00000000000000000001/00000000000000000002.parquet",
        "recovery/w/00000000000000000001/00000000000000000002/b.run",
        "recovery/w/00000000000000000001/plan.txt",
        "recovery/w/1/plan.json",
        "recovery/w/00000000000000000001/2/done.json",
        "snapshots/t/s.txt",
        "other/thing",
    ],
)
def test_parsers_reject_foreign_keys(key: str) -> None:
    for parse in (
        layout.parse_sstable_key,
        layout.parse_log_segment_key,
        layout.parse_recovery_run_key,
        layout.parse_recovery_key,
        layout.parse_snapshot_key,
    ):
        with pytest.raises(InvalidArgument):
            parse(key)


def test_prefix_arguments_must_nest() -> None:
    with pytest.raises(InvalidArgument):
        layout.tables_prefix(None, "tab")
    with pytest.raises(InvalidArgument):
        layout.log_prefix(None, 1)


async def test_listing_returns_segments_in_numeric_order() -> None:
    store = MemoryObjectStore()
    for seq in (10, 9, 100, 1, 2**40):
        await store.create(layout.log_segment_key("w", 7, seq), b"")
    await store.create(layout.log_segment_key("w", 70, 0), b"")
    listed = [
        layout.parse_log_segment_key(i.key).seq
        for i in await collect(store, layout.log_prefix("w", 7))
    ]
    assert listed == [1, 9, 10, 100, 2**40]


def test_a_restores_sorted_log_has_keys_of_its_own() -> None:
    run = layout.recovery_run_key("w", 1, 2, "t", "tab", "r1")
    assert run == "restores/r1/w/00000000000000000001/00000000000000000002/t/tab.run"
    assert run.startswith(layout.restore_scope_prefix("r1"))
    assert not run.startswith(layout.RECOVERY)
    assert layout.parse_recovery_run_key(run) == layout.RecoveryRunKey("w", 1, 2, "t", "tab", "r1")
    assert layout.parse_recovery_key(run) == layout.RecoveryKey(
        "w", 1, "run", 2, "t", "tab", scope="r1"
    )
    assert layout.parse_recovery_key(layout.recovery_plan_key("w", 1, "r1")) == (
        layout.RecoveryKey("w", 1, "plan", scope="r1")
    )
    assert layout.parse_recovery_key(layout.recovery_manifest_key("w", 1, 7, "r1")) == (
        layout.RecoveryKey("w", 1, "manifest", 7, scope="r1")
    )
    for bad in ("restores//w/00000000000000000001/plan.json", "restores/r1/w/1/plan.json"):
        with pytest.raises(InvalidArgument):
            layout.parse_recovery_key(bad)
