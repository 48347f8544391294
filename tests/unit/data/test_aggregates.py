"""Aggregate families below the tablet: combine rules, HyperLogLog++ sketches, validation, and
how merges, visibility, compactions and the memtable fold the parts of a bucket."""

from __future__ import annotations

import random
import struct

import pytest

from tabletstore.data import aggregates, hll
from tabletstore.data.model import AddToCell, IncrementValue, MergeToCell, SetCell
from tabletstore.data.schema import ColumnFamily, MaxVersionsRule, TableSchema
from tabletstore.data.validation import validate_rmw_rules, validate_row_mutation
from tabletstore.engine.cells import to_cells
from tabletstore.engine.iterators import compact_cells, merge_sources, visible_cells
from tabletstore.engine.memtable import MemTable
from tabletstore.errors import InvalidArgument
from tabletstore.keys import TS_MAX, Cell, CellKind, encode_ts_range
from tabletstore.metadata.catalog import TableInfo

SUM = int(CellKind.AGGREGATE_SUM)
MIN = int(CellKind.AGGREGATE_MIN)
MAX = int(CellKind.AGGREGATE_MAX)
HLL = int(CellKind.AGGREGATE_HLL)


def i64(n: int) -> bytes:
    return struct.pack(">q", n)


def part(seq: int, value: int, *, kind: int = SUM, ts: int = 1000, q: bytes = b"q") -> Cell:
    return Cell(b"r", "s", q, ts, seq, kind, i64(value))


# ------------------------------------------------------------------ combine rules


def test_int64_combine_rules_and_wraparound() -> None:
    assert aggregates.combine(SUM, i64(5), i64(-7)) == i64(-2)
    assert aggregates.combine(SUM, i64(2**63 - 1), i64(1)) == i64(-(2**63))
    assert aggregates.combine(MIN, i64(5), i64(-7)) == i64(-7)
    assert aggregates.combine(MAX, i64(5), i64(-7)) == i64(5)
    assert aggregates.input_state("sum", -3) == i64(-3)


def test_bad_inputs_name_the_problem() -> None:
    with pytest.raises(ValueError, match="64-bit integers, not bytes"):
        aggregates.input_state("sum", b"\x01")
    with pytest.raises(ValueError, match="does not fit"):
        aggregates.input_state("max", 2**63)
    with pytest.raises(ValueError, match="byte strings, not int"):
        aggregates.input_state("hll", 5)
    with pytest.raises(ValueError, match="8-byte"):
        aggregates.validate_state("min", b"\x00" * 4)
    with pytest.raises(ValueError, match="HyperLogLog"):
        aggregates.validate_state("hll", b"\x09\x0e")


# ------------------------------------------------------------------ HyperLogLog++


@pytest.mark.parametrize("n", [0, 1, 50, 3000, 20000, 120000])
def test_hll_estimate_within_the_documented_error(n: int) -> None:
    sketch = hll.Sketch()
    for i in range(n):
        sketch.add(b"user-%d" % i)
    # Standard error 1.04/sqrt(2^14) = 0.81%: allow 4 standard errors (and exact when small).
    est = hll.parse(sketch.to_bytes()).estimate()
    assert abs(est - n) <= max(1, 4 * 0.0081 * n), (n, est)


def test_hll_counts_duplicates_once_and_merges_like_a_union() -> None:
    a = hll.add_values([b"x%d" % i for i in range(4000)])
    b = hll.add_values([b"x%d" % i for i in range(2000, 6000)] * 2)
    merged = hll.merge_states(a, b)
    assert abs(hll.estimate(merged) - 6000) <= 4 * 0.0081 * 6000
    # Commutative and idempotent: the engine may fold parts in any grouping, even twice.
    assert hll.merge_states(b, a) == merged
    assert hll.merge_states(merged, a) == merged


def test_hll_serialization_round_trips_sparse_and_dense() -> None:
    small = hll.Sketch()
    for i in range(10):
        small.add(b"%d" % i)
    assert small.is_sparse and len(small.to_bytes()) == 2 + 4 + 40
    big = hll.Sketch()
    for i in range(20000):
        big.add(b"%d" % i)
    assert not big.is_sparse and len(big.to_bytes()) == 2 + (1 << hll.PRECISION)
    for sketch in (small, big):
        data = sketch.to_bytes()
        assert hll.parse(data).to_bytes() == data
    # The hash is stable across processes: a fixed input always lands in the same register.
    assert hll.add_values([b"stable"]) == hll.add_values([b"stable"])
    for bad in (b"", b"\x01\x0e\x00\x00\x00\x05", b"\x02\x0e" + b"\x00" * 10, b"\x02\x0e"):
        with pytest.raises(ValueError):
            hll.parse(bad)


# ------------------------------------------------------------------ validation


def schema() -> TableSchema:
    return TableSchema(
        name="t",
        families={
            "s": ColumnFamily(name="s", value_type="sum"),
            "h": ColumnFamily(name="h", value_type="hll"),
            "p": ColumnFamily(name="p"),
        },
    )


def test_mutations_must_match_the_family_kind() -> None:
    sch = schema()
    validate_row_mutation(sch, b"r", [AddToCell("s", b"q", 3, 1000), AddToCell("h", b"q", b"u")])
    validate_row_mutation(sch, b"r", [MergeToCell("s", b"q", i64(4), 1000)])
    with pytest.raises(InvalidArgument, match="t:s: it is an aggregate family"):
        validate_row_mutation(sch, b"r", [SetCell("s", b"q", b"v")])
    with pytest.raises(InvalidArgument, match="t:p has no value type"):
        validate_row_mutation(sch, b"r", [AddToCell("p", b"q", 1)])
    with pytest.raises(InvalidArgument, match="64-bit integers"):
        validate_row_mutation(sch, b"r", [AddToCell("s", b"q", b"1")])
    with pytest.raises(InvalidArgument, match="8-byte"):
        validate_row_mutation(sch, b"r", [MergeToCell("s", b"q", b"123")])
    with pytest.raises(InvalidArgument, match="aggregate family"):
        validate_rmw_rules(sch, b"r", [IncrementValue("s", b"q", 1)], None)


def test_to_cells_stores_one_part_per_write() -> None:
    cells = to_cells(
        b"r",
        [AddToCell("s", b"q", 3, 1000), AddToCell("h", b"q", b"u")],
        10,
        555,
        {"s": "sum", "h": "hll"},
    )
    assert cells[0] == Cell(b"r", "s", b"q", 1000, 10, SUM, i64(3))
    assert cells[1].kind == HLL and cells[1].ts == 555 and hll.estimate(cells[1].value) == 1


def test_schema_record_version() -> None:
    plain = TableInfo("t-1", TableSchema(name="t", families={"p": ColumnFamily(name="p")}))
    assert b"version" not in plain.to_bytes() and b"value_type" not in plain.to_bytes()
    agg = TableInfo("t-1", schema())
    data = agg.to_bytes()
    assert b'"version":2' in data
    assert TableInfo.from_bytes(data).schema == agg.schema
    assert TableInfo.from_bytes(plain.to_bytes()).schema == plain.schema


# ------------------------------------------------------------------ merges, visibility, compactions


def read(cells: list[Cell], **kw: object) -> list[Cell]:
    return list(
        visible_cells(
            merge_sources([sorted(cells, key=lambda c: (-c.ts, -c.seq))]),
            gc_rules=kw.get("gc", {}),
            now_micros=0,
        )
    )  # type: ignore[arg-type]


def test_reads_fold_the_parts_of_a_bucket_from_every_source() -> None:
    newer = [part(5, 10)]
    older = [part(3, 1), part(1, 2)]
    out = list(visible_cells(merge_sources([newer, older]), gc_rules={}, now_micros=0))
    assert out == [part(5, 13)]


def test_a_deletion_masks_only_the_parts_written_before_it() -> None:
    delete = Cell(
        b"r", "s", b"q", TS_MAX, 4, int(CellKind.DELETE_COLUMN), encode_ts_range(0, TS_MAX)
    )
    cells = [delete, part(5, 10), part(3, 1), part(1, 2)]
    assert read(cells) == [part(5, 10)]
    # A minor compaction keeps the deletion entry and folds only unmasked parts.
    out = list(compact_cells(iter(cells), gc_rules={}, now_micros=0, major=False))
    assert out == [delete, part(5, 10)]


def test_a_bucket_is_one_version_for_gc() -> None:
    cells = [part(9, 1, ts=3000), part(8, 1, ts=2000), part(7, 1, ts=2000), part(6, 1, ts=1000)]
    out = list(
        visible_cells(iter(cells), gc_rules={"s": MaxVersionsRule(max_versions=2)}, now_micros=0)
    )
    assert [(c.ts, c.value) for c in out] == [(3000, i64(1)), (2000, i64(2))]


def test_parts_of_different_kinds_keep_the_newest_kind() -> None:
    cells = [part(9, 4, kind=MAX), part(8, 7, kind=SUM)]
    assert read(cells) == [part(9, 4, kind=MAX)]


# ------------------------------------------------------------------ memtable


def test_memtable_folds_on_write_but_not_across_deletions_or_a_snapshot_cut() -> None:
    mt = MemTable()
    mt.add([part(1, 1)])
    mt.add([part(2, 2)])
    assert mt.get_row(b"r") == [part(2, 3)] and mt.max_seq == 2
    delete = Cell(b"r", "s", b"q", TS_MAX, 3, int(CellKind.DELETE_COLUMN), encode_ts_range(0, 2000))
    mt.add([delete])
    mt.add([part(4, 5)])
    assert mt.get_row(b"r") == [delete, part(4, 5), part(2, 3)]
    assert read(mt.get_row(b"r")) == [part(4, 5)]
    mt.keep_parts_through(4)
    mt.add([part(5, 1)])
    assert mt.get_row(b"r")[1:3] == [part(5, 1), part(4, 5)]
    mt.add([part(6, 1)])
    assert mt.get_row(b"r")[1] == part(6, 2)
    # A record replayed twice (a part older than one held, or the same part) adds nothing.
    mt.add([part(5, 1), part(6, 1)])
    assert read(mt.get_row(b"r")) == [part(6, 7)]


def test_random_histories_fold_to_the_same_sums() -> None:
    rng = random.Random(7)
    for _ in range(50):
        mt = MemTable()
        expected: dict[int, int] = {}
        for seq in range(1, 60):
            ts = rng.choice([1000, 2000, 3000])
            v = rng.randrange(-100, 100)
            mt.add([part(seq, v, ts=ts)])
            expected[ts] = expected.get(ts, 0) + v
        got = {c.ts: struct.unpack(">q", c.value)[0] for c in read(mt.get_row(b"r"))}
        assert got == expected
        assert mt.cell_count == len(expected)


def test_vectorized_merge_equals_the_register_maximum() -> None:
    rng = random.Random(1)
    for _ in range(60):
        a, b = hll.Sketch(), hll.Sketch()
        for s in (a, b):
            for _ in range(rng.choice([0, 1, 5, 100, 2000, 5000])):
                s.add(b"%d" % rng.randrange(10**6))
        ref = hll.parse(b.to_bytes())
        ref.merge(hll.parse(a.to_bytes()))
        assert hll.merge_states(a.to_bytes(), b.to_bytes()) == ref.to_bytes()


def test_aggregates_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from bench.aggregates import run

    rows = asyncio.run(run(20))
    assert [r[0] for r in rows] == ["SetCell (baseline)", "AddToCell sum", "AddToCell hll"]
    assert "hll estimate of 20 distinct inputs: 20" in capsys.readouterr().out
