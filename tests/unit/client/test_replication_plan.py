"""Replication's pure decisions (client/replication_plan.py): a change as the replica's
mutation, which changes need the guard, the progress through splits and merges, its record,
the replica's schema; the write policy (data/validation.py); and the lag as the master's
metrics and page show it."""

from __future__ import annotations

import pytest

from tabletstore.client import replication_plan as rp
from tabletstore.client.change_plan import Change, ChangePartition, Mod
from tabletstore.data.model import DeleteCells, DeleteFamily, DeleteRow, MergeToCell, SetCell
from tabletstore.data.schema import ColumnFamily, ReplicaOf, TableSchema
from tabletstore.data.validation import REPLICATOR, check_replica_write, validate_row_mutation
from tabletstore.errors import Corruption, InvalidArgument, PreconditionFailed, Unavailable
from tabletstore.keys import TS_MAX, encode_ts_range
from tabletstore.ops.metrics import MasterMetrics
from tabletstore.ops.views import replication_infos

A = ChangePartition(b"", b"m")
B = ChangePartition(b"m", None)
WHOLE = ChangePartition(b"", None)


def _change(*mods: Mod, seq: int = 5) -> Change:
    return Change(b"row", 1.0, seq, mods, "tok")


def test_each_kind_becomes_the_mutation_that_writes_the_same_cell() -> None:
    change = _change(
        Mod("put", "f", b"q", 17, b"v"),
        Mod("aggregate_sum", "n", b"s", 86_400_000_000, b"\x00" * 7 + b"\x03"),
        Mod("aggregate_max", "x", b"s", 9, b"\x00" * 8),
        Mod("delete_column", "f", b"q", TS_MAX, encode_ts_range(10, 20)),
        Mod("delete_column", "f", b"r", TS_MAX, encode_ts_range(0, TS_MAX)),
        Mod("delete_family", "g", b"", TS_MAX, b""),
        Mod("delete_row", "", b"", TS_MAX, b""),
    )
    assert rp.mutations_of(change) == [
        SetCell("f", b"q", b"v", 17),
        MergeToCell("n", b"s", b"\x00" * 7 + b"\x03", 86_400_000_000),
        MergeToCell("x", b"s", b"\x00" * 8, 9),
        DeleteCells("f", b"q", 10, 20),
        DeleteCells("f", b"r", None, None),
        DeleteFamily("g"),
        DeleteRow(),
    ]
    with pytest.raises(Corruption, match="unknown kind 'bogus'"):
        rp.mutations_of(_change(Mod("bogus", "f", b"q", 1, b"")))


def test_only_a_table_with_a_sum_is_guarded() -> None:
    families = {"f": ColumnFamily(name="f"), "m": ColumnFamily(name="m", value_type="max")}
    plain = TableSchema(name="t", families=families)
    assert not rp.guarded(rp.replica_schema(plain))  # puts, deletions, max: idempotent
    summed = {**families, "n": ColumnFamily(name="n", value_type="sum")}
    assert rp.guarded(rp.replica_schema(TableSchema(name="t", families=summed)))
    # The marker orders by seq as bytes do: big-endian, fixed width.
    assert rp.marker_cell(255).value < rp.marker_cell(256).value
    assert rp.marker_cell(7) == SetCell(rp.MARKER_FAMILY, b"seq", (7).to_bytes(8, "big"), 0)


def test_a_split_starts_each_half_with_its_token() -> None:
    p = rp.starting("etcd://src/ns", "t", [WHOLE], 100.0)
    assert p.followed == [(WHOLE, ())]
    p = p.advanced(WHOLE, "t1", 130.0)
    p, ready = p.ended(WHOLE, [(A, "ta"), (B, "tb")])
    assert ready == [(A, ("ta",)), (B, ("tb",))]
    assert p.followed == [(A, ("ta",)), (B, ("tb",))]
    assert p.applied_watermark() == 130.0  # the halves start where the whole was complete


def test_a_merge_waits_for_both_halves_also_across_a_restart() -> None:
    p = rp.starting("etcd://src/ns", "t", [A, B], 100.0)
    p = p.advanced(A, "ta", 140.0).advanced(B, "tb", 120.0)
    p, ready = p.ended(A, [(WHOLE, "a->whole")])
    assert ready == [] and p.followed == [(B, ("tb",))]
    assert p.applied_watermark() == 120.0
    p = rp.Progress.from_bytes(p.to_bytes(), where="here")  # a restart in between
    p = p.advanced(B, "tb2", 150.0)
    p, ready = p.ended(B, [(WHOLE, "b->whole")])
    assert ready == [(WHOLE, ("a->whole", "b->whole"))]
    assert p.followed == [(WHOLE, ("a->whole", "b->whole"))] and not p.handed
    assert p.applied_watermark() == 140.0  # the lower of the two halves


def test_the_progress_record_round_trips_and_a_bad_one_is_named() -> None:
    p = rp.starting("etcd://src/ns", "t", [A, B], 100.0).advanced(A, "ta", 110.0)
    assert rp.Progress.from_bytes(p.to_bytes(), where="k") == p
    assert p.lag(112.5) == 12.5 and p.lag(50.0) == 0.0
    with pytest.raises(Corruption, match="k: unreadable replication progress"):
        rp.Progress.from_bytes(b'{"version": 1}', where="k")
    with pytest.raises(Corruption, match="progress version 9"):
        rp.Progress.from_bytes(b'{"version": 9}', where="k")


def test_a_replica_schema_copies_the_families_and_guards_sums() -> None:
    plain = TableSchema(name="t", families={"f": ColumnFamily(name="f")}, changes=60.0)
    assert rp.MARKER_FAMILY not in rp.replica_schema(plain).families
    summed = TableSchema(
        name="t",
        families={"f": ColumnFamily(name="f"), "n": ColumnFamily(name="n", value_type="sum")},
        changes=60.0,
    )
    made = rp.replica_schema(summed)
    assert set(made.families) == {"f", "n", rp.MARKER_FAMILY} and made.changes == 60.0
    taken = TableSchema(name="t", families={rp.MARKER_FAMILY: rp.marker_family()})
    with pytest.raises(InvalidArgument, match="cannot be replicated"):
        rp.replica_schema(taken)


def test_the_write_policy_single_primary() -> None:
    replica = TableSchema(
        name="t",
        families={"f": ColumnFamily(name="f")},
        replica_of=ReplicaOf(source="etcd://src/ns", table="t"),
    )
    with pytest.raises(PreconditionFailed, match=r"replica of 't' at etcd://src/ns.*promote t"):
        validate_row_mutation(replica, b"r", [SetCell("f", b"q", b"v")], "alice")
    validate_row_mutation(replica, b"r", [SetCell("f", b"q", b"v")], REPLICATOR)
    promoting = replica.model_copy(
        update={"replica_of": ReplicaOf(source="etcd://src/ns", table="t", promoting=True)}
    )
    with pytest.raises(Unavailable, match="being promoted"):
        check_replica_write(promoting, REPLICATOR)
    primary = replica.model_copy(update={"replica_of": None})
    check_replica_write(primary, None)
    with pytest.raises(PreconditionFailed, match="not a replica"):
        check_replica_write(primary, REPLICATOR)
    # The schema record keeps it (and leaves it out while unset).
    assert TableSchema.model_validate_json(replica.model_dump_json()) == replica
    assert "replica_of" not in primary.model_dump_json()


def test_the_lag_in_the_metrics_and_on_the_page() -> None:
    now = [1000.0]
    metrics = MasterMetrics("m:1", clock=lambda: now[0])
    p = rp.starting("etcd://src/ns", "t", [WHOLE], 900.0).advanced(WHOLE, "tok", 990.0)
    promoted = rp.Progress(source="etcd://src/ns", table="q", state="promoted", promoted_at=5.0)
    metrics.replication = {"t": p, "q": promoted}
    text = metrics.exposition().decode()
    assert 'tabletstore_replication_lag_seconds{table="t"} 10.0' in text
    assert 'tabletstore_replication_errors{table="t"} 0.0' in text
    assert 'table="q"' not in text  # a promoted table is no replica
    now[0] = 1030.0  # the replicator stopped: the lag grows
    assert 'tabletstore_replication_lag_seconds{table="t"} 40.0' in metrics.exposition().decode()
    infos = replication_infos(metrics.replication, 1030.0)
    assert [(i.table, i.state, i.lag_seconds) for i in infos] == [
        ("q", "promoted", 0.0),
        ("t", "following", 40.0),
    ]
