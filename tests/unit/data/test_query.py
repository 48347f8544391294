"""Row ranges, row sets and read queries: bounds, prefixes, normal form, tablet splits, wire."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletstore.data.filters import Chain, FamilyNameRegex, PassAll
from tabletstore.data.query import ReadQuery, RowRange, RowSet, prefix_successor
from tabletstore.errors import InvalidArgument


# -- RowRange --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("prefix", "successor"),
    [
        (b"a", b"b"),
        (b"abc", b"abd"),
        (b"a\xff", b"b"),
        (b"a\xff\xff", b"b"),
        (b"\x00", b"\x01"),
        (b"\xfe\xff", b"\xff"),
        (b"\xff", None),
        (b"\xff\xff", None),
        (b"", None),
    ],
)
def test_prefix_successor(prefix: bytes, successor: bytes | None) -> None:
    assert prefix_successor(prefix) == successor


@pytest.mark.parametrize("prefix", [b"a", b"a\xff", b"\xff", b"\xff\x00", b"ab\xfe", b""])
def test_prefix_range_contains_exactly_the_prefixed_keys(prefix: bytes) -> None:
    r = RowRange.prefix(prefix)
    probes = [prefix, prefix + b"\x00", prefix + b"\xff" * 3, prefix + b"zz"]
    assert all(r.contains(k) for k in probes)
    for k in [b"", b"a", b"b", b"\xff", b"\xff\xff\xff\xff", b"a\xff\x00", b"ab\xff", b"\x00"]:
        assert r.contains(k) == k.startswith(prefix), k


@pytest.mark.parametrize(
    ("r", "inside", "outside"),
    [
        (RowRange(b"b", b"d"), [b"b", b"c", b"c\xff"], [b"a", b"d", b"d\x00"]),
        (RowRange(b"b", b"d", False, True), [b"b\x00", b"d"], [b"b", b"d\x00"]),
        (RowRange(None, b"b"), [b"", b"a\xff"], [b"b"]),
        (RowRange(b"b"), [b"b", b"\xff\xff"], [b"a"]),
        (RowRange(), [b"", b"\xff"], []),
        (RowRange(b"a", b"a", True, True), [b"a"], [b"a\x00", b""]),
    ],
)
def test_row_range_contains(r: RowRange, inside: list[bytes], outside: list[bytes]) -> None:
    assert all(r.contains(k) for k in inside)
    assert not any(r.contains(k) for k in outside)


def test_row_range_bounds_are_exact_half_open() -> None:
    assert RowRange(b"a", b"c", False, True).bounds() == (b"a\x00", b"c\x00")
    assert RowRange().bounds() == (b"", None)
    assert RowRange(b"a", b"c", False, True).normalized() == RowRange(b"a\x00", b"c\x00")


def test_empty_and_inverted_ranges() -> None:
    assert RowRange(b"a", b"a").is_empty()
    assert RowRange(b"a", b"a", False, True).is_empty()
    assert not RowRange(b"a", b"a", True, True).is_empty()
    with pytest.raises(InvalidArgument, match="start"):
        RowRange(b"b", b"a")


def test_row_range_validation() -> None:
    with pytest.raises(InvalidArgument):
        RowRange("a")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        RowRange(b"a", end_inclusive=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        RowRange.prefix("a")  # type: ignore[arg-type]


def test_unused_inclusiveness_is_normalized() -> None:
    assert RowRange(None, None, False, True) == RowRange()


def test_intersect_and_clip() -> None:
    assert RowRange(b"a", b"m").intersect(RowRange(b"f", b"z")) == RowRange(b"f", b"m")
    assert RowRange(b"a", b"f").intersect(RowRange(b"f", b"z")) is None
    assert RowRange(b"a", b"f", True, True).intersect(RowRange(b"f", b"z")) == RowRange(
        b"f", b"f\x00"
    )
    assert RowRange().clip(b"k", None) == RowRange(b"k")
    assert RowRange().clip(b"", b"k") == RowRange(None, b"k")
    assert RowRange(b"a", b"c").clip(b"c", b"d") is None
    assert RowRange(b"x", None, False).clip(b"k", b"x\x01") == RowRange(b"x\x00", b"x\x01")


# -- RowSet ----------------------------------------------------------------------------------
def test_row_set_normal_form() -> None:
    rs = RowSet(
        keys=[b"q", b"b", b"q", b"m", b"zz"],
        ranges=[
            RowRange(b"c", b"e"),
            RowRange(b"d", b"g"),  # overlaps
            RowRange(b"g", b"h"),  # touches
            RowRange(b"k", b"k"),  # empty
            RowRange(b"l", b"n"),  # covers key m
            RowRange(b"x", b"x", True, True),  # one key, written as a closed range
        ],
    )
    assert rs.ranges == (RowRange(b"c", b"h"), RowRange(b"l", b"n"), RowRange(b"x", b"x\x00"))
    assert rs.keys == (b"b", b"q", b"zz")
    assert rs.pieces() == [b"b", rs.ranges[0], rs.ranges[1], b"q", rs.ranges[2], b"zz"]


def test_row_set_unbounded_range_swallows_the_rest() -> None:
    rs = RowSet(keys=[b"a", b"z"], ranges=[RowRange(b"m"), RowRange(b"p", b"q"), RowRange(b"n")])
    assert rs.ranges == (RowRange(b"m"),)
    assert rs.keys == (b"a",)
    assert RowSet(ranges=[RowRange(), RowRange(b"a", b"b")]) == RowSet.all()


def test_row_set_contains() -> None:
    rs = RowSet(keys=[b"b"], ranges=[RowRange(b"d", b"f")])
    assert [k for k in [b"a", b"b", b"c", b"d", b"e\xff", b"f"] if rs.contains(k)] == [
        b"b",
        b"d",
        b"e\xff",
    ]
    assert not RowSet().contains(b"a")
    assert RowSet().is_empty() and not RowSet.all().is_empty()
    assert RowSet.prefix(b"ab").contains(b"ab\xff")


def test_row_set_validation() -> None:
    with pytest.raises(InvalidArgument):
        RowSet(keys=[b""])
    with pytest.raises(InvalidArgument):
        RowSet(keys=["a"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument):
        RowSet(ranges=[(b"a", b"b")])  # type: ignore[list-item]


def test_split_by_tablet_boundaries() -> None:
    rs = RowSet(keys=[b"a", b"g", b"m", b"t"], ranges=[RowRange(b"c", b"h"), RowRange(b"p")])
    parts = rs.split([b"f", b"m", b"s"])
    assert parts == [
        RowSet(keys=[b"a"], ranges=[RowRange(b"c", b"f")]),
        RowSet(keys=[b"g"], ranges=[RowRange(b"f", b"h")]),
        RowSet(keys=[b"m"], ranges=[RowRange(b"p", b"s")]),
        RowSet(ranges=[RowRange(b"s")]),  # key t is inside the range
    ]
    assert RowSet().split([b"m"]) == [RowSet(), RowSet()]
    assert RowSet.all().split([]) == [RowSet.all()]
    # A range ending exactly at a boundary does not reach the next tablet.
    assert RowSet(ranges=[RowRange(b"a", b"m")]).split([b"m"])[1].is_empty()
    assert not RowSet(ranges=[RowRange(b"a", b"m", True, True)]).split([b"m"])[1].is_empty()


@pytest.mark.parametrize("boundaries", [[b"b", b"a"], [b"a", b"a"], [b""], ["a"]])
def test_split_rejects_bad_boundaries(boundaries: list[Any]) -> None:
    with pytest.raises(InvalidArgument):
        RowSet.all().split(boundaries)


def test_clip() -> None:
    rs = RowSet(keys=[b"a", b"k"], ranges=[RowRange(b"c", b"z")])
    assert rs.clip(b"b", b"d") == RowSet(ranges=[RowRange(b"c", b"d")])
    assert rs.clip(b"", b"b") == RowSet(keys=[b"a"])


keys_st = st.binary(min_size=1, max_size=3)


@st.composite
def row_ranges(draw: st.DrawFn) -> RowRange:
    a, b = draw(st.none() | keys_st), draw(st.none() | keys_st)
    if a is not None and b is not None and a > b:
        a, b = b, a
    return RowRange(a, b, draw(st.booleans()), draw(st.booleans()))


row_sets = st.builds(RowSet, st.lists(keys_st, max_size=5), st.lists(row_ranges(), max_size=5))
probes = st.lists(st.binary(max_size=4), max_size=30)


@settings(max_examples=300, deadline=None)
@given(st.lists(keys_st, max_size=5), st.lists(row_ranges(), max_size=5), probes)
def test_normal_form_selects_the_same_keys(
    keys: list[bytes], ranges: list[RowRange], probe: list[bytes]
) -> None:
    rs = RowSet(keys, ranges)
    for k in probe + keys:
        expected = k in keys or any(r.contains(k) for r in ranges)
        assert rs.contains(k) == expected
    # Normal form: sorted, disjoint, non-touching ranges; sorted keys outside every range.
    spans = [r.bounds() for r in rs.ranges]
    for (_, hi), (lo, _) in itertools.pairwise(spans):
        assert hi is not None and hi < lo
    assert list(rs.keys) == sorted(set(rs.keys))
    assert RowSet(rs.keys, rs.ranges) == rs


@settings(max_examples=300, deadline=None)
@given(row_sets, st.lists(keys_st, max_size=4, unique=True).map(sorted), probes)
def test_split_partitions_the_row_set(
    rs: RowSet, boundaries: list[bytes], probe: list[bytes]
) -> None:
    parts = rs.split(boundaries)
    assert len(parts) == len(boundaries) + 1
    edges = [b"", *boundaries]
    for k in probe + list(rs.keys):
        owners = [i for i, p in enumerate(parts) if p.contains(k)]
        if rs.contains(k):
            # Exactly one tablet, the one whose range holds the key.
            assert len(owners) == 1
            i = owners[0]
            assert edges[i] <= k and (i == len(boundaries) or k < boundaries[i])
        else:
            assert owners == []


@settings(max_examples=200, deadline=None)
@given(row_ranges(), row_ranges(), probes)
def test_intersection_is_conjunction(a: RowRange, b: RowRange, probe: list[bytes]) -> None:
    both = a.intersect(b)
    for k in probe:
        assert (both is not None and both.contains(k)) == (a.contains(k) and b.contains(k))


# -- wire form -------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(row_sets, st.none() | st.integers(1, 10**6))
def test_read_query_round_trip(rs: RowSet, limit: int | None) -> None:
    q = ReadQuery(rs, Chain([FamilyNameRegex("cf"), PassAll()]), limit)
    assert ReadQuery.from_dict(json.loads(json.dumps(q.to_dict()))) == q
    q = ReadQuery(rs)
    assert ReadQuery.from_dict(json.loads(json.dumps(q.to_dict()))) == q


@given(row_ranges())
def test_row_range_round_trip(r: RowRange) -> None:
    assert RowRange.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_read_query_defaults_and_validation() -> None:
    q = ReadQuery()
    assert q.row_set == RowSet.all() and q.filter is None and q.limit is None
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidArgument, match="limit"):
            ReadQuery(limit=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        ReadQuery(row_set=[b"a"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        ReadQuery(filter={"pass_all": True})  # type: ignore[arg-type]


def test_read_query_clip_keeps_filter_and_limit() -> None:
    q = ReadQuery(RowSet.prefix(b"user"), FamilyNameRegex("cf"), 10)
    assert q.clip(b"user5", None) == ReadQuery(
        RowSet(ranges=[RowRange(b"user5", b"uses")]), FamilyNameRegex("cf"), 10
    )


@pytest.mark.parametrize(
    "d",
    [
        {},
        {"rows": {"keys": ["!!"]}},
        {"rows": {"keys": "YQ=="}},
        {"rows": {"ranges": [{"start": "Yg==", "end": "YQ=="}]}},  # inverted
        {"rows": {"ranges": [{"from": "YQ=="}]}},
        {"rows": {}, "filter": {"nope": 1}},
        {"rows": {}, "limit": 0},
        {"rows": {}, "extra": 1},
        [],
    ],
)
def test_malformed_wire_queries_are_invalid_argument(d: Any) -> None:
    with pytest.raises(InvalidArgument):
        ReadQuery.from_dict(d)
