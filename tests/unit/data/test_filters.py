"""Row filters: each filter's semantics, compositions, validation, wire form and properties."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tabletstore.data.filters import (
    MAX_FILTER_CELL_WORK,
    MAX_FILTER_COPIES,
    MAX_FILTER_DEPTH,
    MAX_FILTER_NODES,
    MAX_FILTER_PROGRAM,
    MAX_FILTER_REGEX_BYTES,
    MAX_FILTER_REGEXES,
    ApplyLabel,
    BlockAll,
    CellsPerColumnLimit,
    CellsPerRowLimit,
    CellsPerRowOffset,
    Chain,
    ColumnQualifierRegex,
    ColumnRange,
    Condition,
    FamilyNameRegex,
    Interleave,
    PassAll,
    RowFilter,
    RowKeyRegex,
    RowSample,
    Sink,
    StripValue,
    TimestampRange,
    ValueRange,
    ValueRegex,
    apply_filter,
    compile_filter,
    filter_from_dict,
    iter_filters,
    uncompiled,
)
from tabletstore.data.model import Cell
from tabletstore.errors import InvalidArgument


def C(fam: str, qual: bytes, ts: int, value: bytes = b"v", labels: tuple[str, ...] = ()) -> Cell:
    return Cell(fam, qual, ts, value, labels)


# The row of the Sink example in data.proto, plus a newer version of A:B.
DOC_ROW = [
    C("A", b"A", 1, b"w"),
    C("A", b"B", 3, b"x2"),
    C("A", b"B", 2, b"x"),
    C("B", b"B", 4, b"z"),
]

ROW = [
    C("cf1", b"a", 30, b"apple"),
    C("cf1", b"a", 20, b"avocado"),
    C("cf1", b"a", 10, b"apricot"),
    C("cf1", b"b\n", 30, b"banana"),
    C("cf1", b"c\x00\xff", 5, b"\x00\xff"),
    C("cf2", b"a", 40, b""),
    C("cf2", b"z", 1, b"zebra"),
    C("meta", b"", 7, b"\n"),
]


def run(f: RowFilter | None, cells: Sequence[Cell] = ROW, key: bytes = b"row") -> list[Cell]:
    return apply_filter(f, key, cells, rng=random.Random(0))


def keys(cells: Sequence[Cell]) -> list[tuple[str, bytes, int]]:
    return [(c.family, c.qualifier, c.timestamp) for c in cells]


# -- leaves ----------------------------------------------------------------------------------
def test_no_filter_and_pass_all_return_a_copy_of_every_cell() -> None:
    assert run(None) == ROW
    out = run(PassAll())
    assert out == ROW and out is not ROW


def test_block_all() -> None:
    assert run(BlockAll()) == []


def test_input_is_not_mutated() -> None:
    row = list(ROW)
    run(Chain([StripValue(), ApplyLabel("x"), CellsPerRowLimit(2)]), row)
    assert row == ROW


@pytest.mark.parametrize(
    ("pattern", "key", "passes"),
    [
        (b"row", b"row", True),
        (b"ro", b"row", False),  # full match, not prefix
        (b"ow", b"row", False),
        (b"r.*", b"row", True),
        (b"r.*", b"r\nw", False),  # . does not match newline
        (b"r\\C*", b"r\nw", True),
        (b"\\x00\\xff", b"\x00\xff", True),
        (b"k\xff", b"k\xff", True),
        (b"", b"", True),
    ],
)
def test_row_key_regex_full_match(pattern: bytes, key: bytes, passes: bool) -> None:
    assert run(RowKeyRegex(pattern), key=key) == (ROW if passes else [])


def test_family_name_regex() -> None:
    assert {c.family for c in run(FamilyNameRegex("cf1"))} == {"cf1"}
    assert {c.family for c in run(FamilyNameRegex("cf."))} == {"cf1", "cf2"}
    assert run(FamilyNameRegex("cf")) == []  # full match
    assert {c.family for c in run(FamilyNameRegex("meta|cf2"))} == {"cf2", "meta"}


def test_family_name_regex_rejects_colon_and_non_str() -> None:
    with pytest.raises(InvalidArgument, match="':'"):
        FamilyNameRegex("cf1:")
    with pytest.raises(InvalidArgument):
        FamilyNameRegex(b"cf1")  # type: ignore[arg-type]


def test_column_qualifier_regex() -> None:
    assert keys(run(ColumnQualifierRegex(b"a"))) == [
        ("cf1", b"a", 30),
        ("cf1", b"a", 20),
        ("cf1", b"a", 10),
        ("cf2", b"a", 40),
    ]
    assert keys(run(ColumnQualifierRegex(b"b."))) == []  # . does not match \n
    assert keys(run(ColumnQualifierRegex(b"b\\C"))) == [("cf1", b"b\n", 30)]
    assert keys(run(ColumnQualifierRegex(b"c\\x00\\xff"))) == [("cf1", b"c\x00\xff", 5)]
    assert keys(run(ColumnQualifierRegex(b""))) == [("meta", b"", 7)]


def test_value_regex() -> None:
    assert [c.value for c in run(ValueRegex(b"a.*"))] == [b"apple", b"avocado", b"apricot"]
    assert [c.value for c in run(ValueRegex(b"\\x00\\xff"))] == [b"\x00\xff"]
    assert [c.value for c in run(ValueRegex(b""))] == [b""]
    assert [c.value for c in run(ValueRegex(b"."))] == []  # a newline value
    assert [c.value for c in run(ValueRegex(b"\\C"))] == [b"\n"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: RowKeyRegex(b"("),
        lambda: ColumnQualifierRegex(b"[a"),
        lambda: ValueRegex(b"(?=a)"),
        lambda: FamilyNameRegex("a**"),
        lambda: ValueRegex(b"(a)\\1"),
    ],
)
def test_malformed_regex_is_invalid_argument_naming_pattern(make: Callable[[], RowFilter]) -> None:
    f = make()  # built without compiling: the patterns are compiled once the limits passed
    with pytest.raises(InvalidArgument, match=r"regex .*b'"):
        compile_filter(f)
    with pytest.raises(InvalidArgument, match=r"regex .*b'"):
        apply_filter(f, b"row", [])


def _many_regexes(n: int, size: int = 40) -> RowFilter:
    return Interleave([ValueRegex(b"v%04d" % i + b"x" * (size - 5)) for i in range(n)])


def test_a_wire_filter_over_the_regex_limit_is_refused_before_any_part_is_built() -> None:
    # The first part is malformed: building parts before counting would name it instead.
    wire = _many_regexes(MAX_FILTER_REGEXES).to_dict()
    wire["interleave"] = [{"no_such_filter": 1}, *wire["interleave"], {"value_regex": "eA=="}]
    with pytest.raises(InvalidArgument, match=f"MAX_FILTER_REGEXES={MAX_FILTER_REGEXES}"):
        filter_from_dict(wire)
    wire["interleave"] = wire["interleave"][:-1]  # within the limits: the parser names the part
    with pytest.raises(InvalidArgument, match="no_such_filter"):
        filter_from_dict(wire)


@pytest.mark.parametrize(
    ("make", "limit"),
    [
        (lambda: _many_regexes(MAX_FILTER_REGEXES + 1), f"MAX_FILTER_REGEXES={MAX_FILTER_REGEXES}"),
        (
            lambda: Chain([ValueRegex(b"a" * (MAX_FILTER_REGEX_BYTES // 2 + 1))] * 2),
            f"MAX_FILTER_REGEX_BYTES={MAX_FILTER_REGEX_BYTES}",
        ),
        (
            lambda: ValueRegex(b"a" * (MAX_FILTER_REGEX_BYTES + 1)),
            f"MAX_FILTER_REGEX_BYTES={MAX_FILTER_REGEX_BYTES}",
        ),
        (
            lambda: Chain([Chain([PassAll()] * 10)] * (MAX_FILTER_NODES // 10)),
            f"MAX_FILTER_NODES={MAX_FILTER_NODES}",
        ),
        # Twenty two-branch interleaves in a chain: a million copies of every cell.
        (
            lambda: Chain([Interleave([PassAll(), PassAll()])] * 20),
            f"MAX_FILTER_COPIES={MAX_FILTER_COPIES}",
        ),
        (
            lambda: Chain([Interleave([PassAll()] * 60)] + [PassAll()] * 100),
            f"MAX_FILTER_CELL_WORK={MAX_FILTER_CELL_WORK}",
        ),
    ],
)
def test_a_filter_over_a_cost_limit_is_refused_when_built(
    make: Callable[[], RowFilter], limit: str
) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(limit)):
        make()


def test_a_filter_at_the_limits_is_accepted() -> None:
    f = _many_regexes(MAX_FILTER_REGEXES)
    assert f.shape.regexes == MAX_FILTER_REGEXES
    assert compile_filter(f) > 0
    assert Chain([Interleave([PassAll(), PassAll()])] * 6).shape.copies == MAX_FILTER_COPIES


def test_compiled_programs_are_bounded_in_total() -> None:
    # Each pattern alone compiles (a program of about 20,000 instructions), together they
    # exceed the budget: refused after at most one pattern beyond it.
    f = Interleave(
        [
            ValueRegex(b"(" + b"|".join(b"%d[a-y]{999}" % (i * 100 + j) for j in range(19)) + b")")
            for i in range(8)
        ]
    )
    with pytest.raises(InvalidArgument, match=f"MAX_FILTER_PROGRAM={MAX_FILTER_PROGRAM}"):
        compile_filter(f)


def test_uncompiled_takes_cached_patterns_without_compiling() -> None:
    pattern = b"cached-%d" % random.getrandbits(64)
    assert uncompiled(ValueRegex(pattern))
    compile_filter(ValueRegex(pattern))
    f = ValueRegex(pattern)
    assert not uncompiled(f)
    assert not uncompiled(None) and not uncompiled(PassAll())


def test_regex_filters_require_bytes() -> None:
    with pytest.raises(InvalidArgument, match="bytes"):
        ColumnQualifierRegex("a")  # type: ignore[arg-type]


def test_row_sample_uses_the_injected_rng() -> None:
    f = RowSample(0.5)
    expected = random.Random(7).random() < 0.5
    assert (apply_filter(f, b"r", ROW, rng=random.Random(7)) == ROW) is expected
    rng = random.Random(3)
    kept = sum(bool(apply_filter(f, b"r", ROW, rng=rng)) for _ in range(1000))
    assert 400 < kept < 600
    assert all(apply_filter(f, b"r", ROW, rng=rng) in (ROW, []) for _ in range(20))


@pytest.mark.parametrize("p", [0, 0.0, 1, 1.0, -0.1, 1.5, float("nan"), True, "0.5"])
def test_row_sample_probability_must_be_strictly_between_0_and_1(p: Any) -> None:
    with pytest.raises(InvalidArgument):
        RowSample(p)


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (
            ColumnRange("cf1"),
            [
                ("cf1", b"a", 30),
                ("cf1", b"a", 20),
                ("cf1", b"a", 10),
                ("cf1", b"b\n", 30),
                ("cf1", b"c\x00\xff", 5),
            ],
        ),
        (
            ColumnRange("cf1", b"a", b"b\n"),
            [("cf1", b"a", 30), ("cf1", b"a", 20), ("cf1", b"a", 10)],
        ),
        (
            ColumnRange("cf1", b"a", b"b\n", end_inclusive=True),
            [("cf1", b"a", 30), ("cf1", b"a", 20), ("cf1", b"a", 10), ("cf1", b"b\n", 30)],
        ),
        (
            ColumnRange("cf1", b"a", None, start_inclusive=False),
            [("cf1", b"b\n", 30), ("cf1", b"c\x00\xff", 5)],
        ),
        (ColumnRange("cf1", None, b"b"), [("cf1", b"a", 30), ("cf1", b"a", 20), ("cf1", b"a", 10)]),
        (ColumnRange("cf1", b"c", b"c\x00\xff", end_inclusive=True), [("cf1", b"c\x00\xff", 5)]),
        (ColumnRange("cf1", b"c", b"a"), []),  # inverted: nothing
        (ColumnRange("cf2", b"a", b"a", end_inclusive=True), [("cf2", b"a", 40)]),
        (ColumnRange("cf2", b"a", b"a"), []),
        (ColumnRange("nope"), []),
    ],
)
def test_column_range(f: ColumnRange, expected: list[tuple[str, bytes, int]]) -> None:
    assert keys(run(f)) == expected


def test_column_range_validation() -> None:
    with pytest.raises(InvalidArgument, match="family"):
        ColumnRange("")
    with pytest.raises(InvalidArgument):
        ColumnRange("cf1", "a")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        ColumnRange("cf1", b"a", start_inclusive=1)  # type: ignore[arg-type]


def test_timestamp_range_is_start_inclusive_end_exclusive() -> None:
    assert [c.timestamp for c in run(TimestampRange(10, 30))] == [20, 10]
    assert [c.timestamp for c in run(TimestampRange(30))] == [30, 30, 40]
    assert [c.timestamp for c in run(TimestampRange(0, 2))] == [1]
    assert run(TimestampRange()) == ROW
    assert run(TimestampRange(30, 10)) == []


def test_timestamp_range_zero_and_none_are_unbounded_and_equal() -> None:
    assert TimestampRange(0, 0) == TimestampRange(None, None) == TimestampRange()
    assert TimestampRange(None, 0).end is None
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(InvalidArgument):
            TimestampRange(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            TimestampRange(0, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("f", "values"),
    [
        (ValueRange(b"apple", b"apricot"), [b"apple"]),
        (ValueRange(b"apple", b"apricot", end_inclusive=True), [b"apple", b"apricot"]),
        (ValueRange(b"apple", b"b", start_inclusive=False), [b"avocado", b"apricot"]),
        (ValueRange(None, b"\x01"), [b"\x00\xff", b"", b"\n"][:2]),
        (ValueRange(b"z"), [b"zebra"]),
        (ValueRange(b"z", b"a"), []),
    ],
)
def test_value_range(f: ValueRange, values: list[bytes]) -> None:
    assert sorted(c.value for c in run(f)) == sorted(values)


def test_cells_per_row_offset_and_limit() -> None:
    assert run(CellsPerRowOffset(0)) == ROW
    assert run(CellsPerRowOffset(3)) == ROW[3:]
    assert run(CellsPerRowOffset(100)) == []
    assert run(CellsPerRowLimit(3)) == ROW[:3]
    assert run(CellsPerRowLimit(100)) == ROW


def test_cells_per_column_limit_counts_per_family_and_qualifier() -> None:
    # cf1:a and cf2:a share a qualifier but are different columns.
    assert keys(run(CellsPerColumnLimit(1))) == [
        ("cf1", b"a", 30),
        ("cf1", b"b\n", 30),
        ("cf1", b"c\x00\xff", 5),
        ("cf2", b"a", 40),
        ("cf2", b"z", 1),
        ("meta", b"", 7),
    ]
    assert keys(run(CellsPerColumnLimit(2)))[:2] == [("cf1", b"a", 30), ("cf1", b"a", 20)]


@pytest.mark.parametrize(
    ("cls", "n"),
    [
        (CellsPerRowLimit, 0),
        (CellsPerColumnLimit, 0),
        (CellsPerRowOffset, -1),
        (CellsPerRowLimit, -1),
        (CellsPerRowLimit, True),
        (CellsPerRowLimit, 1.0),
        (CellsPerRowLimit, 2**31),
    ],
)
def test_counts_are_validated(cls: Callable[[Any], RowFilter], n: Any) -> None:
    with pytest.raises(InvalidArgument):
        cls(n)


def test_strip_value_and_apply_label() -> None:
    out = run(Chain([StripValue(), ApplyLabel("tag-1")]))
    assert keys(out) == keys(ROW)
    assert all(c.value == b"" and c.labels == ("tag-1",) for c in out)


@pytest.mark.parametrize("label", ["", "Upper", "under_score", "a" * 16, "sp ace", "é", 5])
def test_invalid_labels(label: Any) -> None:
    with pytest.raises(InvalidArgument, match="label"):
        ApplyLabel(label)


def test_valid_labels() -> None:
    for label in ["a", "0-9", "a" * 15, "-"]:
        assert ApplyLabel(label).label == label


# -- compositions ----------------------------------------------------------------------------
def test_sink_example_from_data_proto() -> None:
    f = Chain(
        [
            FamilyNameRegex("A"),
            Interleave([PassAll(), Chain([ApplyLabel("foo"), Sink()])]),
            ColumnQualifierRegex(b"B"),
        ]
    )
    # Every cell that reached the sink is in the result, labelled, despite the qualifier filter;
    # the copies that went through PassAll were filtered. On ties the main output comes first.
    assert run(f, DOC_ROW) == [
        C("A", b"A", 1, b"w", ("foo",)),
        C("A", b"B", 3, b"x2"),
        C("A", b"B", 3, b"x2", ("foo",)),
        C("A", b"B", 2, b"x"),
        C("A", b"B", 2, b"x", ("foo",)),
    ]


def test_sink_outputs_nothing_to_its_parent() -> None:
    assert run(Sink(), DOC_ROW) == DOC_ROW  # top level: straight to the result
    assert run(Chain([Sink(), BlockAll()]), DOC_ROW) == DOC_ROW
    assert run(Chain([Sink(), ApplyLabel("x")]), DOC_ROW) == DOC_ROW  # nothing reaches the label
    f = Interleave([Sink(), PassAll()])
    assert run(f, DOC_ROW) == [c for c in DOC_ROW for _ in range(2)]


def test_sink_after_a_limit_then_more_filters() -> None:
    f = Chain([CellsPerRowLimit(2), Sink(), BlockAll()])
    assert run(f, DOC_ROW) == DOC_ROW[:2]
    f = Chain([Interleave([Chain([FamilyNameRegex("B"), Sink()]), PassAll()]), CellsPerRowLimit(1)])
    assert run(f, DOC_ROW) == [DOC_ROW[0], DOC_ROW[3]]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Condition(Sink(), PassAll()),
        lambda: Condition(PassAll(), Sink()),
        lambda: Condition(PassAll(), PassAll(), Chain([PassAll(), Sink()])),
        lambda: Condition(PassAll(), Interleave([Sink(), PassAll()])),
    ],
)
def test_sink_is_rejected_inside_a_condition(make: Callable[[], RowFilter]) -> None:
    with pytest.raises(InvalidArgument, match="Sink"):
        make()


def test_interleave_keeps_duplicates_in_row_order() -> None:
    f = Interleave([FamilyNameRegex("A"), ColumnQualifierRegex(b"B")])
    assert keys(run(f, DOC_ROW)) == [
        ("A", b"A", 1),
        ("A", b"B", 3),
        ("A", b"B", 3),
        ("A", b"B", 2),
        ("A", b"B", 2),
        ("B", b"B", 4),
    ]


def test_interleave_ties_keep_branch_order() -> None:
    f = Interleave([ApplyLabel("one"), ApplyLabel("two")])
    assert [c.labels for c in run(f, DOC_ROW[:2])] == [("one",), ("two",), ("one",), ("two",)]


def test_empty_and_single_compositions() -> None:
    assert run(Chain([])) == ROW
    assert run(Interleave([])) == []
    assert run(Chain([CellsPerRowLimit(2)])) == ROW[:2]
    assert run(Interleave([CellsPerRowLimit(2)])) == ROW[:2]


def test_chain_applies_in_sequence() -> None:
    f = Chain([FamilyNameRegex("cf1"), CellsPerColumnLimit(1), CellsPerRowOffset(1)])
    assert keys(run(f)) == [("cf1", b"b\n", 30), ("cf1", b"c\x00\xff", 5)]


def test_limits_after_family_filters() -> None:
    assert keys(run(Chain([FamilyNameRegex("cf2"), CellsPerRowLimit(1)]))) == [("cf2", b"a", 40)]
    assert keys(run(Chain([CellsPerRowLimit(1), FamilyNameRegex("cf2")]))) == []


def test_limits_count_duplicates_separately() -> None:
    doubled = Interleave([PassAll(), PassAll()])
    assert keys(run(Chain([doubled, CellsPerRowLimit(3)]))) == [("cf1", b"a", 30)] * 2 + [
        ("cf1", b"a", 20)
    ]
    assert keys(run(Chain([doubled, CellsPerColumnLimit(1)]), DOC_ROW)) == [
        ("A", b"A", 1),
        ("A", b"B", 3),
        ("B", b"B", 4),
    ]
    assert len(run(Chain([doubled, CellsPerRowOffset(3)]))) == 2 * len(ROW) - 3


def test_chain_of_interleaves() -> None:
    f = Chain(
        [
            Interleave([FamilyNameRegex("cf2"), ColumnQualifierRegex(b"a")]),
            Interleave([CellsPerColumnLimit(1), ValueRegex(b"zebra")]),
        ]
    )
    # After the first interleave: cf1:a x3, cf2:a x2 (dup), cf2:z. Then the newest of each
    # column (one copy of cf2:a: the limit counts copies) plus zebra again.
    assert keys(run(f)) == [
        ("cf1", b"a", 30),
        ("cf2", b"a", 40),
        ("cf2", b"z", 1),
        ("cf2", b"z", 1),
    ]


def test_condition_chooses_per_row_on_the_input() -> None:
    f = Condition(FamilyNameRegex("meta"), ApplyLabel("t"), ApplyLabel("f"))
    assert {c.labels for c in run(f)} == {("t",)}
    assert {c.labels for c in run(f, DOC_ROW)} == {("f",)}
    # The branches see the whole input, not the predicate's output.
    assert len(run(f)) == len(ROW)


def test_condition_missing_branches_output_nothing() -> None:
    assert run(Condition(PassAll())) == []
    assert run(Condition(BlockAll(), PassAll())) == []
    assert run(Condition(PassAll(), None, PassAll())) == []
    assert run(Condition(BlockAll(), None, PassAll())) == ROW


def test_condition_predicate_output_is_discarded() -> None:
    f = Condition(Chain([ApplyLabel("p"), StripValue()]), PassAll())
    assert run(f) == ROW


def test_condition_sees_the_chains_input() -> None:
    f = Chain([FamilyNameRegex("cf1"), Condition(FamilyNameRegex("meta"), PassAll(), BlockAll())])
    assert run(f) == []


def test_condition_with_labels_in_a_chain() -> None:
    # The predicate's labels never reach the output, so they do not count toward the limit.
    ok = Chain([Condition(ApplyLabel("p"), PassAll()), ApplyLabel("x")])
    assert {c.labels for c in run(ok)} == {("x",)}
    with pytest.raises(InvalidArgument, match="label"):
        Chain([Condition(PassAll(), ApplyLabel("t")), ApplyLabel("x")])
    with pytest.raises(InvalidArgument, match="label"):
        Chain([Condition(PassAll(), None, ApplyLabel("f")), ApplyLabel("x")])


def test_one_label_per_cell() -> None:
    with pytest.raises(InvalidArgument, match="label"):
        Chain([ApplyLabel("a"), ApplyLabel("b")])
    with pytest.raises(InvalidArgument, match="label"):
        Chain([Interleave([ApplyLabel("a"), PassAll()]), ApplyLabel("b")])
    with pytest.raises(InvalidArgument, match="label"):
        Chain([Chain([ApplyLabel("a")]), PassAll(), ApplyLabel("b")])
    # Separate copies may carry different labels.
    assert len(run(Interleave([ApplyLabel("a"), ApplyLabel("b")]))) == 2 * len(ROW)
    assert (
        run(Chain([ApplyLabel("a"), Interleave([PassAll(), Sink()])]), DOC_ROW[:1])
        == [C("A", b"A", 1, b"w", ("a",))] * 2
    )


def test_nesting_depth_limit() -> None:
    f: RowFilter = PassAll()
    for _ in range(MAX_FILTER_DEPTH):
        f = Chain([f])
    assert f.depth == MAX_FILTER_DEPTH
    assert run(f) == ROW
    with pytest.raises(InvalidArgument, match="nested"):
        Interleave([f])


def test_composites_reject_non_filters() -> None:
    with pytest.raises(InvalidArgument):
        Chain([PassAll(), "x"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument):
        Condition("x")  # type: ignore[arg-type]


def test_filters_are_hashable_values() -> None:
    a = Chain([FamilyNameRegex("a"), Interleave([PassAll(), ValueRegex(b"x")])])
    b = Chain((FamilyNameRegex("a"), Interleave((PassAll(), ValueRegex(b"x")))))
    assert a == b and hash(a) == hash(b)
    assert ValueRegex(b"x") != ValueRegex(b"y")
    assert list(iter_filters(a)) == [
        a,
        FamilyNameRegex("a"),
        a.filters[1],
        PassAll(),
        ValueRegex(b"x"),
    ]


def test_family_regex_matches_each_family_once() -> None:
    big = [C(f"cf{i % 3}", b"q%d" % i, 1) for i in range(3000)]
    big.sort(key=lambda c: (c.family, c.qualifier, -c.timestamp))
    f = FamilyNameRegex("cf1")
    calls: list[bytes] = []
    real = re.compile(b"cf1")

    class Spy:
        def fullmatch(self, s: bytes) -> re.Match[bytes] | None:
            calls.append(s)
            return real.fullmatch(s)

    object.__setattr__(f, "_regex", Spy())
    assert len(run(f, big)) == 1000
    assert sorted(calls) == [b"cf0", b"cf1", b"cf2"]


# -- wire form -------------------------------------------------------------------------------
EXAMPLES: list[RowFilter] = [
    PassAll(),
    BlockAll(),
    Sink(),
    StripValue(),
    ApplyLabel("x-1"),
    RowKeyRegex(b"\x00\xff.*"),
    RowSample(0.25),
    FamilyNameRegex("cf[12]"),
    ColumnQualifierRegex(b"\\C+"),
    ValueRegex(b""),
    ColumnRange("cf1"),
    ColumnRange("cf1", b"a", b"\xff", False, True),
    TimestampRange(5, 10),
    TimestampRange(),
    ValueRange(None, b"x"),
    ValueRange(b"", None, False),
    CellsPerRowOffset(0),
    CellsPerRowLimit(3),
    CellsPerColumnLimit(1),
    Chain([]),
    Interleave([PassAll(), Chain([ApplyLabel("a"), Sink()])]),
    Condition(PassAll()),
    Condition(FamilyNameRegex("a"), ApplyLabel("t"), ApplyLabel("f")),
]


@pytest.mark.parametrize("f", EXAMPLES, ids=lambda f: type(f).__name__)
def test_to_dict_round_trips_through_json(f: RowFilter) -> None:
    wire = json.loads(json.dumps(f.to_dict()))
    assert filter_from_dict(wire) == f


@pytest.mark.parametrize(
    "d",
    [
        {},
        {"pass_all": True, "block_all": True},
        {"nope": True},
        {"pass_all": False},
        {"sink": 1},
        {"row_key_regex": "not base64!"},
        {"row_key_regex": b"abc"},
        {"row_key_regex": "KA=="},  # "(" : malformed regex
        {"chain": {"filters": []}},
        {"chain": [{"nope": 1}]},
        {"condition": {"true": {"pass_all": True}}},
        {"condition": {"predicate": {"pass_all": True}, "maybe": {}}},
        {"column_range": {"family": "a", "begin": "YQ=="}},
        {"column_range": {"start": "YQ=="}},
        {"timestamp_range": {"start": -1}},
        {"value_range": {"start": 5}},
        {"cells_per_row_limit": "3"},
        {"row_sample": float("inf")},
        {"apply_label": "Bad"},
        [],
        "pass_all",
    ],
)
def test_malformed_wire_filters_are_invalid_argument(d: Any) -> None:
    with pytest.raises(InvalidArgument):
        compile_filter(filter_from_dict(d))


# -- properties ------------------------------------------------------------------------------
def _sorted_cells(raw: list[tuple[str, bytes, int, bytes]]) -> list[Cell]:
    unique = {(f, q, ts): v for f, q, ts, v in raw}
    return [
        C(f, q, ts, v)
        for (f, q, ts), v in sorted(unique.items(), key=lambda i: (i[0][0], i[0][1], -i[0][2]))
    ]


cells_st = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.binary(max_size=2),
        st.integers(0, 6),
        st.binary(max_size=3),
    ),
    max_size=25,
).map(_sorted_cells)

_PATTERNS = [b"", b"a", b".*", b"\\C*", b"a|b", b"[\\x00-\\x7f]*", b"\\x00.?"]
leaf_st: st.SearchStrategy[RowFilter] = st.one_of(
    st.just(PassAll()),
    st.just(BlockAll()),
    st.just(Sink()),
    st.just(StripValue()),
    st.sampled_from(["x", "y"]).map(ApplyLabel),
    st.sampled_from(_PATTERNS).map(RowKeyRegex),
    st.sampled_from([0.3, 0.7]).map(RowSample),
    st.sampled_from(["a", "b|c", ".*", "z"]).map(FamilyNameRegex),
    st.sampled_from(_PATTERNS).map(ColumnQualifierRegex),
    st.sampled_from(_PATTERNS).map(ValueRegex),
    st.builds(
        ColumnRange,
        st.sampled_from(["a", "b"]),
        st.none() | st.binary(max_size=2),
        st.none() | st.binary(max_size=2),
        st.booleans(),
        st.booleans(),
    ),
    st.builds(TimestampRange, st.none() | st.integers(0, 6), st.none() | st.integers(0, 6)),
    st.builds(
        ValueRange,
        st.none() | st.binary(max_size=2),
        st.none() | st.binary(max_size=2),
        st.booleans(),
        st.booleans(),
    ),
    st.integers(0, 5).map(CellsPerRowOffset),
    st.integers(1, 5).map(CellsPerRowLimit),
    st.integers(1, 3).map(CellsPerColumnLimit),
)


def _try(make: Callable[..., RowFilter]) -> Callable[..., RowFilter | None]:
    def build(*args: Any) -> RowFilter | None:
        try:
            return make(*args)
        except InvalidArgument:
            return None  # an invalid combination (two labels in a chain, a sink in a condition)

    return build


def _extend(children: st.SearchStrategy[RowFilter]) -> st.SearchStrategy[RowFilter]:
    built = st.one_of(
        st.lists(children, max_size=3).map(_try(Chain)),
        st.lists(children, max_size=3).map(_try(Interleave)),
        st.builds(_try(Condition), children, st.none() | children, st.none() | children),
    )
    return built.filter(lambda f: f is not None)  # type: ignore[arg-type,return-value]


filter_st = st.recursive(leaf_st, _extend, max_leaves=8)


def ev(f: RowFilter, cells: list[Cell], key: bytes = b"a") -> list[Cell]:
    return apply_filter(f, key, cells, rng=random.Random(42))


def _order(c: Cell) -> tuple[str, bytes, int]:
    return (c.family, c.qualifier, -c.timestamp)


@settings(max_examples=300, deadline=None)
@given(filter_st, cells_st, st.sampled_from([b"a", b"\x00", b""]))
def test_output_is_in_row_order(f: RowFilter, cells: list[Cell], key: bytes) -> None:
    out = ev(f, cells, key)
    assert [_order(c) for c in out] == sorted(_order(c) for c in out)


@settings(max_examples=300, deadline=None)
@given(filter_st, cells_st)
def test_wire_round_trip_preserves_meaning(f: RowFilter, cells: list[Cell]) -> None:
    back = filter_from_dict(json.loads(json.dumps(f.to_dict())))
    assert back == f
    assert ev(back, cells) == ev(f, cells)


@settings(max_examples=200, deadline=None)
@given(filter_st, cells_st)
def test_single_compositions_are_identities(f: RowFilter, cells: list[Cell]) -> None:
    assume(f.depth < MAX_FILTER_DEPTH)
    assert ev(Chain([f]), cells) == ev(f, cells)
    assert ev(Interleave([f]), cells) == ev(f, cells)
    assert ev(Chain([PassAll(), f]), cells) == ev(f, cells)
    if not f.has_sink:  # a sink's copies bypass the BlockAll
        assert ev(Chain([f, BlockAll()]), cells) == []


@given(cells_st)
def test_pass_all_and_empty_compositions(cells: list[Cell]) -> None:
    assert ev(Interleave([PassAll()]), cells) == cells
    assert ev(Chain([]), cells) == cells
    assert ev(Interleave([]), cells) == []
    assert ev(Interleave([PassAll(), PassAll()]), cells) == [c for c in cells for _ in range(2)]


@given(cells_st, st.integers(1, 8), st.integers(1, 8), st.integers(0, 8))
def test_limit_and_offset_identities(cells: list[Cell], a: int, b: int, o: int) -> None:
    lim = CellsPerRowLimit
    assert ev(Chain([lim(a), lim(b)]), cells) == ev(lim(min(a, b)), cells)
    assert ev(Chain([CellsPerRowOffset(o), CellsPerRowOffset(a)]), cells) == cells[o + a :]
    assert ev(Chain([CellsPerRowOffset(o), lim(a)]), cells) == cells[o : o + a]
    col = CellsPerColumnLimit
    assert ev(Chain([col(a), col(b)]), cells) == ev(col(min(a, b)), cells)
    assert ev(Chain([col(a), lim(b)]), cells) == ev(lim(b), ev(col(a), cells))


@settings(max_examples=200, deadline=None)
@given(filter_st, filter_st, filter_st, cells_st)
def test_condition_is_a_choice_on_the_input(
    p: RowFilter, t: RowFilter, f: RowFilter, cells: list[Cell]
) -> None:
    assume(not (p.has_sink or t.has_sink or f.has_sink))
    assume(max(p.depth, t.depth, f.depth) < MAX_FILTER_DEPTH)
    rng = random.Random(1)
    matched = bool(apply_filter(p, b"a", cells, rng=rng))
    expected = apply_filter(t if matched else f, b"a", cells, rng=rng) if cells else []
    assert apply_filter(Condition(p, t, f), b"a", cells, rng=random.Random(1)) == expected


@settings(max_examples=200, deadline=None)
@given(filter_st, filter_st, cells_st)
def test_interleave_is_the_multiset_union(f: RowFilter, g: RowFilter, cells: list[Cell]) -> None:
    assume(max(f.depth, g.depth) < MAX_FILTER_DEPTH)
    assume(not any(isinstance(x, RowSample) for h in (f, g) for x in iter_filters(h)))
    both = ev(Interleave([f, g]), cells)
    assert sorted(both, key=repr) == sorted(ev(f, cells) + ev(g, cells), key=repr)
