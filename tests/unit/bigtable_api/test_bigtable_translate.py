"""Pure conversions of the Bigtable API front door: names, filters, mutations, row sets, GC
rules, rows, error codes and the ReadRows chunk stream."""

from __future__ import annotations

import datetime

import grpc
import pytest

pytest.importorskip("google.cloud.bigtable_v2")

from google.cloud.bigtable.data import row_filters as rf
from google.cloud.bigtable_admin_v2.types import table as admin_table
from google.cloud.bigtable_v2.types import data

from tabletstore import errors
from tabletstore.bigtable_api import translate as t
from tabletstore.bigtable_api.chunks import ChunkEncoder, row_chunks
from tabletstore.data import filters as f
from tabletstore.data.model import (
    AppendValue,
    Cell,
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    IncrementValue,
    Row,
    SetCell,
)
from tabletstore.data.query import RowRange, RowSet
from tabletstore.data.schema import (
    ColumnFamily,
    IntersectionRule,
    MaxAgeRule,
    MaxVersionsRule,
    TableSchema,
    UnionRule,
)

F = data.RowFilter.pb()
M = data.Mutation.pb()


def pb(filter_: rf.RowFilter) -> object:
    """The raw protobuf the official client sends for one of its filter objects."""
    return filter_._to_pb()._pb


# -- names -------------------------------------------------------------------------------------
def test_table_names_parse_and_echo() -> None:
    name = t.parse_table_name("projects/p-1/instances/inst/tables/my_table.v2")
    assert (name.project, name.instance, name.table) == ("p-1", "inst", "my_table.v2")
    assert str(name) == "projects/p-1/instances/inst/tables/my_table.v2"
    assert name.parent == "projects/p-1/instances/inst"
    assert t.parse_instance_name("projects/p/instances/i") == ("p", "i")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "tables/t",
        "projects/p/instances/i/tables/",
        "projects/p/instances/i/tables/a b",
        "projects/p/instances/i/tables/" + "x" * 51,
        "projects/p/instances/i/tables/t/extra",
    ],
)
def test_bad_table_names_are_invalid_arguments(bad: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        t.parse_table_name(bad)


# -- filters -----------------------------------------------------------------------------------
def ts(micros: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(micros / 1e6, tz=datetime.UTC)


@pytest.mark.parametrize(
    ("official", "expected"),
    [
        (rf.PassAllFilter(True), f.PassAll()),
        (rf.BlockAllFilter(True), f.BlockAll()),
        (rf.SinkFilter(True), f.Sink()),
        (rf.StripValueTransformerFilter(True), f.StripValue()),
        (rf.ApplyLabelFilter("lbl-1"), f.ApplyLabel("lbl-1")),
        (rf.RowKeyRegexFilter(b"r.*"), f.RowKeyRegex(b"r.*")),
        (rf.RowSampleFilter(0.25), f.RowSample(0.25)),
        (rf.FamilyNameRegexFilter("c[fg]"), f.FamilyNameRegex("c[fg]")),
        (rf.ColumnQualifierRegexFilter(b"q\\d"), f.ColumnQualifierRegex(b"q\\d")),
        (rf.ValueRegexFilter(b"v.*"), f.ValueRegex(b"v.*")),
        (rf.CellsRowOffsetFilter(2), f.CellsPerRowOffset(2)),
        (rf.CellsRowLimitFilter(3), f.CellsPerRowLimit(3)),
        (rf.CellsColumnLimitFilter(1), f.CellsPerColumnLimit(1)),
        (
            rf.ColumnRangeFilter("cf", b"a", b"m", inclusive_start=False, inclusive_end=True),
            f.ColumnRange("cf", b"a", b"m", start_inclusive=False, end_inclusive=True),
        ),
        (rf.ColumnRangeFilter("cf"), f.ColumnRange("cf")),
        (
            rf.ValueRangeFilter(b"a", b"z", inclusive_start=True, inclusive_end=False),
            f.ValueRange(b"a", b"z", start_inclusive=True, end_inclusive=False),
        ),
        (rf.TimestampRangeFilter(ts(5000), ts(9000)), f.TimestampRange(5000, 9000)),
        (rf.TimestampRangeFilter(None, ts(9000)), f.TimestampRange(None, 9000)),
    ],
)
def test_every_leaf_filter_maps_one_to_one(official: rf.RowFilter, expected: f.RowFilter) -> None:
    assert t.filter_from_pb(pb(official)) == expected


def test_composite_filters_map_recursively() -> None:
    official = rf.RowFilterChain(
        [
            rf.FamilyNameRegexFilter("cf"),
            rf.RowFilterUnion([rf.CellsColumnLimitFilter(1), rf.ApplyLabelFilter("x")]),
            rf.ConditionalRowFilter(
                rf.ValueRegexFilter(b"yes"),
                true_filter=rf.StripValueTransformerFilter(True),
            ),
        ]
    )
    assert t.filter_from_pb(pb(official)) == f.Chain(
        [
            f.FamilyNameRegex("cf"),
            f.Interleave([f.CellsPerColumnLimit(1), f.ApplyLabel("x")]),
            f.Condition(f.ValueRegex(b"yes"), f.StripValue(), None),
        ]
    )


def test_an_empty_filter_message_passes_everything() -> None:
    assert t.filter_from_pb(F()) == f.PassAll()


@pytest.mark.parametrize(
    "bad",
    [
        F(pass_all_filter=False),
        F(block_all_filter=False),
        F(sink=False),
        F(strip_value_transformer=False),
        F(chain=F.Chain(filters=[F(pass_all_filter=True)])),
        F(interleave=F.Interleave()),
        F(condition=F.Condition(true_filter=F(pass_all_filter=True))),
        F(cells_per_row_limit_filter=0),
        F(cells_per_column_limit_filter=0),
        F(cells_per_row_offset_filter=-1),
        F(row_sample_filter=1.0),
        F(apply_label_transformer="UPPER"),
        F(row_key_regex_filter=b"("),
        F(family_name_regex_filter="a:b"),
        F(column_range_filter=data.ColumnRange.pb()(start_qualifier_closed=b"a")),
        F(timestamp_range_filter=data.TimestampRange.pb()(start_timestamp_micros=-5)),
    ],
)
def test_invalid_filters_are_rejected_with_a_reason(bad: object) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        f.compile_filter(t.filter_from_pb(bad))  # patterns: compiled by the tablet server
    assert str(info.value)


def test_a_filter_over_the_node_limit_is_refused_before_translation() -> None:
    leaves = [F(pass_all_filter=True)] * (f.MAX_FILTER_NODES + 1)
    with pytest.raises(errors.InvalidArgument, match=f"MAX_FILTER_NODES={f.MAX_FILTER_NODES}"):
        t.filter_from_pb(F(interleave=F.Interleave(filters=leaves)))


def test_a_filter_over_the_regex_limits_is_refused_before_any_part_is_translated() -> None:
    # The first part is invalid: translating parts before counting would name it instead.
    bad_first = F(cells_per_row_limit_filter=-1)
    regexes = [F(value_regex_filter=b"v%04d" % i) for i in range(f.MAX_FILTER_REGEXES + 1)]
    with pytest.raises(errors.InvalidArgument, match=f"MAX_FILTER_REGEXES={f.MAX_FILTER_REGEXES}"):
        t.filter_from_pb(F(interleave=F.Interleave(filters=[bad_first, *regexes])))
    big = [F(value_regex_filter=b"x" * 40_000), F(row_key_regex_filter=b"y" * 40_000)]
    with pytest.raises(errors.InvalidArgument, match="MAX_FILTER_REGEX_BYTES"):
        t.filter_from_pb(F(interleave=F.Interleave(filters=[bad_first, *big])))


def test_range_bounds_set_to_empty_are_taken_literally() -> None:
    cr = F(column_range_filter=data.ColumnRange.pb()(family_name="cf", end_qualifier_open=b""))
    assert t.filter_from_pb(cr) == f.ColumnRange("cf", None, b"")
    vr = F(value_range_filter=data.ValueRange.pb()(start_value_open=b""))
    assert t.filter_from_pb(vr) == f.ValueRange(b"", None, start_inclusive=False)


# -- row sets ----------------------------------------------------------------------------------
def test_row_sets() -> None:
    RS, RR = data.RowSet.pb(), data.RowRange.pb()
    assert t.row_set_from_pb(False, RS()) == RowSet.all()
    assert t.row_set_from_pb(True, RS()) == RowSet.all()
    got = t.row_set_from_pb(
        True,
        RS(
            row_keys=[b"k1", b""],
            row_ranges=[RR(start_key_open=b"a", end_key_closed=b"c"), RR(start_key_closed=b"x")],
        ),
    )
    assert got == RowSet(
        [b"k1"], [RowRange(b"a", b"c", start_inclusive=False, end_inclusive=True), RowRange(b"x")]
    )
    # Empty bounds are unbounded; an empty key selects nothing (not the whole table).
    assert t.row_set_from_pb(True, RS(row_ranges=[RR(start_key_closed=b"", end_key_open=b"")])) == (
        RowSet.all()
    )
    assert t.row_set_from_pb(True, RS(row_keys=[b""])).is_empty()
    with pytest.raises(errors.InvalidArgument):
        t.row_set_from_pb(True, RS(row_ranges=[RR(start_key_closed=b"z", end_key_open=b"a")]))


# -- mutations ---------------------------------------------------------------------------------
def test_mutations_translate_and_server_time_is_millisecond_granular() -> None:
    now = t.server_timestamp(1700000000.123456)
    assert now == 1700000000123000
    TR = data.TimestampRange.pb()
    got = t.mutations_from_pb(
        [
            M(
                set_cell=M.SetCell(
                    family_name="cf", column_qualifier=b"q", timestamp_micros=-1, value=b"v"
                )
            ),
            M(
                set_cell=M.SetCell(
                    family_name="cf", column_qualifier=b"q", timestamp_micros=5000, value=b"w"
                )
            ),
            M(
                delete_from_column=M.DeleteFromColumn(
                    family_name="cf",
                    column_qualifier=b"q",
                    time_range=TR(start_timestamp_micros=1000, end_timestamp_micros=3000),
                )
            ),
            M(delete_from_column=M.DeleteFromColumn(family_name="cf", column_qualifier=b"r")),
            M(delete_from_family=M.DeleteFromFamily(family_name="cf")),
            M(delete_from_row=M.DeleteFromRow()),
        ],
        now,
    )
    assert got == (
        SetCell("cf", b"q", b"v", now),
        SetCell("cf", b"q", b"w", 5000),
        DeleteCells("cf", b"q", 1000, 3000),
        DeleteCells("cf", b"r", None, None),
        DeleteFamily("cf"),
        DeleteRow(),
    )


@pytest.mark.parametrize(
    ("bad", "exc"),
    [
        (M(), errors.InvalidArgument),
        (M(set_cell=M.SetCell(family_name="cf", timestamp_micros=1001)), errors.InvalidArgument),
        (M(set_cell=M.SetCell(family_name="cf", timestamp_micros=-2000)), errors.InvalidArgument),
        (
            M(
                delete_from_column=M.DeleteFromColumn(
                    family_name="cf",
                    time_range=data.TimestampRange.pb()(
                        start_timestamp_micros=5000, end_timestamp_micros=2000
                    ),
                )
            ),
            errors.InvalidArgument,
        ),
        (M(add_to_cell=M.AddToCell(family_name="agg")), errors.InvalidArgument),  # no input
    ],
)
def test_invalid_mutations(bad: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        t.mutations_from_pb([bad], 0)


def test_no_mutations_is_invalid() -> None:
    with pytest.raises(errors.InvalidArgument):
        t.mutations_from_pb([], 0)


def test_read_modify_write_rules() -> None:
    R = data.ReadModifyWriteRule.pb()
    rules = [
        R(family_name="cf", column_qualifier=b"a", append_value=b"x"),
        R(family_name="cf", column_qualifier=b"n", increment_amount=-3),
    ]
    assert t.rmw_rules_from_pb(rules) == (
        AppendValue("cf", b"a", b"x"),
        IncrementValue("cf", b"n", -3),
    )
    with pytest.raises(errors.InvalidArgument):
        t.rmw_rules_from_pb([R(family_name="cf", column_qualifier=b"a")])


def test_row_to_pb_groups_families_and_columns() -> None:
    row = Row(
        b"r",
        [
            Cell("a", b"q1", 3000, b"x", ("l",)),
            Cell("a", b"q1", 1000, b"y"),
            Cell("a", b"q2", 1000, b"z"),
            Cell("b", b"q1", 2000, b"w"),
        ],
    )
    out = t.row_to_pb(row)
    assert out.key == b"r"
    assert [fam.name for fam in out.families] == ["a", "b"]
    assert [c.qualifier for c in out.families[0].columns] == [b"q1", b"q2"]
    assert [
        (c.timestamp_micros, c.value, list(c.labels)) for c in out.families[0].columns[0].cells
    ] == [
        (3000, b"x", ["l"]),
        (1000, b"y", []),
    ]


# -- GC rules and tables -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "rule",
    [
        None,
        MaxVersionsRule(max_versions=3),
        MaxAgeRule(max_age_seconds=86400.5),
        UnionRule(rules=[MaxVersionsRule(max_versions=1), MaxAgeRule(max_age_seconds=60)]),
        IntersectionRule(
            rules=[
                MaxVersionsRule(max_versions=2),
                UnionRule(rules=[MaxAgeRule(max_age_seconds=1)]),
            ]
        ),
    ],
)
def test_gc_rules_round_trip(rule: object) -> None:
    assert t.gc_rule_from_pb(t.gc_rule_to_pb(rule)) == rule  # type: ignore[arg-type]


def test_gc_rules_from_the_official_client() -> None:
    from google.cloud.bigtable import column_family as cf

    rule = cf.GCRuleIntersection(
        [cf.MaxVersionsGCRule(2), cf.MaxAgeGCRule(datetime.timedelta(days=5))]
    )
    assert t.gc_rule_from_pb(rule.to_pb()._pb) == IntersectionRule(
        rules=[MaxVersionsRule(max_versions=2), MaxAgeRule(max_age_seconds=5 * 86400)]
    )
    GC = admin_table.GcRule.pb()
    with pytest.raises(errors.InvalidArgument):
        t.gc_rule_from_pb(GC(max_num_versions=0))
    with pytest.raises(errors.InvalidArgument):
        t.gc_rule_from_pb(GC(intersection=GC.Intersection()))
    assert t.gc_rule_from_pb(GC(union=GC.Union())) is None


def test_table_to_pb_views() -> None:
    schema = TableSchema(
        name="t",
        families={
            "a": ColumnFamily(name="a", gc_rule=MaxVersionsRule(max_versions=1)),
            "b": ColumnFamily(name="b"),
        },
    )
    name = t.parse_table_name("projects/p/instances/i/tables/t")
    full = t.table_to_pb(name, schema, 0)
    assert full.name == "projects/p/instances/i/tables/t"
    assert set(full.column_families) == {"a", "b"}
    assert full.column_families["a"].gc_rule.max_num_versions == 1
    assert full.granularity == admin_table.Table.TimestampGranularity.MILLIS
    assert not t.table_to_pb(name, schema, admin_table.Table.View.NAME_ONLY).column_families


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.InvalidArgument("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.Unimplemented("x"), grpc.StatusCode.UNIMPLEMENTED),
        (errors.NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (errors.AlreadyExists("x"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.PermissionDenied("x"), grpc.StatusCode.PERMISSION_DENIED),
        (errors.PreconditionFailed("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.Fenced("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.Unavailable("x"), grpc.StatusCode.UNAVAILABLE),
        (errors.NotServing("x"), grpc.StatusCode.UNAVAILABLE),
        (errors.Indeterminate("x"), grpc.StatusCode.UNKNOWN),
        (errors.Corruption("x"), grpc.StatusCode.DATA_LOSS),
        (errors.TabletStoreError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_status_codes(exc: errors.TabletStoreError, code: grpc.StatusCode) -> None:
    assert t.status_code(exc) == code


# -- chunks ------------------------------------------------------------------------------------
def test_chunks_send_key_family_and_qualifier_only_when_they_change() -> None:
    row = Row(
        b"row",
        [
            Cell("a", b"q1", 3000, b"x", ("lbl",)),
            Cell("a", b"q1", 1000, b"y"),
            Cell("a", b"q2", 1000, b"z"),
            Cell("b", b"q2", 2000, b""),
        ],
    )
    chunks = row_chunks(row)
    fields = [
        (
            c.row_key,
            c.family_name.value if c.HasField("family_name") else None,
            c.qualifier.value if c.HasField("qualifier") else None,
            c.timestamp_micros,
            list(c.labels),
            c.value,
            c.commit_row,
        )
        for c in chunks
    ]
    assert fields == [
        (b"row", "a", b"q1", 3000, ["lbl"], b"x", False),
        (b"", None, None, 1000, [], b"y", False),
        (b"", None, b"q2", 1000, [], b"z", False),
        (b"", "b", b"q2", 2000, [], b"", True),
    ]


def test_large_values_are_split_with_value_size() -> None:
    row = Row(b"k", [Cell("a", b"q", 7000, b"0123456789", ("l",)), Cell("a", b"r", 1000, b"ab")])
    chunks = row_chunks(row, max_value_chunk=4)
    assert [(c.value, c.value_size, c.commit_row) for c in chunks] == [
        (b"0123", 10, False),
        (b"4567", 10, False),
        (b"89", 0, False),
        (b"ab", 0, True),
    ]
    # Continuation chunks carry nothing but the value.
    for c in chunks[1:3]:
        assert not c.row_key and not c.HasField("family_name") and not c.HasField("qualifier")
        assert c.timestamp_micros == 0 and not c.labels
    assert chunks[0].timestamp_micros == 7000 and list(chunks[0].labels) == ["l"]


def test_encoder_sends_one_response_per_row() -> None:
    """Small rows: one response each, ending with the row's commit (as the service sends)."""
    enc = ChunkEncoder(max_response_bytes=100)
    responses = []
    for i in range(11):
        out = list(enc.add(Row(b"r%02d" % i, [Cell("a", b"q", 1000, b"v" * 30)])))
        assert len(out) == 1 and out[0].chunks[-1].commit_row
        responses += out
    assert enc.flush() is None
    keys = [c.row_key for r in responses for c in r.chunks if c.row_key]
    assert keys == [b"r%02d" % i for i in range(11)]
    assert sum(c.commit_row for r in responses for c in r.chunks) == 11


def test_a_row_larger_than_the_bound_spans_responses_of_its_own() -> None:
    enc = ChunkEncoder(max_value_chunk=10, max_response_bytes=40)
    big = list(enc.add(Row(b"big", [Cell("a", b"q", 1000, b"v" * 95)])))
    small = list(enc.add(Row(b"small", [Cell("a", b"q", 1000, b"x")])))
    assert len(big) > 1 and big[-1].chunks[-1].commit_row
    assert not any(c.commit_row for r in big[:-1] for c in r.chunks)
    assert len(small) == 1 and small[0].chunks[0].row_key == b"small"


def test_encoding_an_empty_row_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        row_chunks(Row(b"k", []))


def test_a_response_that_starts_mid_row_repeats_the_row_key() -> None:
    enc = ChunkEncoder(max_value_chunk=10, max_response_bytes=40)
    row = Row(b"key", [Cell("a", b"q", 1000, b"v" * 95)])
    responses = [*enc.add(row)]
    last = enc.flush()
    responses += [last] if last is not None else []
    assert len(responses) > 1
    assert all(r.chunks[0].row_key == b"key" for r in responses)
    value = b"".join(c.value for r in responses for c in r.chunks)
    assert value == b"v" * 95


def test_a_large_row_goes_out_in_responses_of_at_most_the_bound() -> None:
    """A 20 MB row crosses the front door in messages well under gRPC's default 4 MiB receive
    limit: no response is larger than ``max_response_bytes`` (or one chunk)."""
    value = bytes(range(256)) * 80_000  # 20,480,000 bytes
    small = [Cell("a", b"p%04d" % i, 1000, b"s" * 1000) for i in range(1000)]  # ~1 MB first
    row = Row(b"big", [*small, Cell("a", b"q", 1000, value), Cell("a", b"r", 1000, b"tail")])
    enc = ChunkEncoder()
    responses = [*enc.add(row)]
    last = enc.flush()
    responses += [last] if last is not None else []
    limit = 1024 * 1024 + 64  # one 1 MiB value chunk with its key and cell names
    assert all(r.ByteSize() <= limit for r in responses)
    assert len(responses) >= 20
    got = b"".join(c.value for r in responses for c in r.chunks)
    assert got == b"s" * 1_000_000 + value + b"tail"


def test_a_row_that_fits_one_response_is_encoded_as_row_chunks_says() -> None:
    """The encoder's one-response fast path sends exactly the chunks of ``row_chunks``."""
    row = Row(
        b"row",
        [
            Cell("a", b"q1", 3000, b"x", ("lbl", "two")),
            Cell("a", b"q1", 1000, b"y"),
            Cell("a", b"q2", 1000, b"z"),
            Cell("b", b"q2", 2000, b""),
        ],
    )
    (resp,) = ChunkEncoder().add(row)
    assert list(resp.chunks) == row_chunks(row)
