"""The cbt command-line syntax: GC policies, set arguments, column filters, output format."""

from __future__ import annotations

import pytest

from tabletstore.cli.cbtsyntax import (
    column_filter,
    format_duration,
    format_gc_rule,
    format_row,
    go_quote,
    parse_families,
    parse_gc_policy,
    parse_kv_args,
    parse_set_arg,
    printable_key,
    read_filter,
)
from tabletstore.data.filters import apply_filter
from tabletstore.data.model import Cell, Row, SetCell
from tabletstore.data.schema import IntersectionRule, MaxAgeRule, MaxVersionsRule, UnionRule
from tabletstore.errors import InvalidArgument


@pytest.mark.parametrize(
    ("words", "shown"),
    [
        (["maxversions=3"], "versions() > 3"),
        (["maxage=10d"], "age() > 10d"),
        (["maxage=90m"], "age() > 90m"),
        (["maxage=1h30m"], "age() > 90m"),
        (["maxage=1500ms"], "age() > 1500ms"),
        (["maxage=10d||maxversions=1"], "(age() > 10d || versions() > 1)"),
        (["maxage=1d", "and", "maxversions=2", "&&", "maxage=5s"],
         "(age() > 1d && versions() > 2 && age() > 5s)"),
        (["(maxage=1d or maxversions=3) and maxversions=5"],
         "((age() > 1d || versions() > 3) && versions() > 5)"),
        (["maxversions=1", "OR", "(maxage=1d", "AND", "maxversions=2)", "force"],
         "(versions() > 1 || (age() > 1d && versions() > 2))"),
        (["never"], ""),
    ],
)  # fmt: skip
def test_gc_policies_parse_and_print_as_cbt(words: list[str], shown: str) -> None:
    assert format_gc_rule(parse_gc_policy(words)) == shown


def test_gc_policy_values() -> None:
    assert parse_gc_policy(["maxage=2h"]) == MaxAgeRule(max_age_seconds=7200)
    assert parse_gc_policy(["maxversions=2 or maxage=1s"]) == UnionRule(
        rules=[MaxVersionsRule(max_versions=2), MaxAgeRule(max_age_seconds=1)]
    )
    assert isinstance(parse_gc_policy(["maxversions=2 && maxage=1s"]), IntersectionRule)


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ([], "missing GC policy"),
        (["maxage=3x"], "bad duration '3x'"),
        (["maxage=0s"], "greater than zero"),
        (["maxversions=0"], "at least 1"),
        (["maxversions=two"], "not a whole number"),
        (["maxage=1d or maxversions=2 and maxversions=3"], "needs parentheses"),
        (["(maxage=1d"], "missing ')'"),
        (["maxage=1d)"], "unexpected ')'"),
        (["maxage=1d xor maxversions=1"], "expected and/or"),
        (["sometimes"], "bad GC policy term 'sometimes'"),
        (["maxage=1d or"], "ends where a rule was expected"),
    ],
)
def test_bad_gc_policies_name_the_problem(words: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_gc_policy(words)


def test_durations_print_in_the_largest_whole_unit() -> None:
    assert [format_duration(s) for s in (864000, 3600, 60, 1, 0.25, 1.0005)] == [
        "10d", "1h", "1m", "1s", "250ms", "1.0005s",
    ]  # fmt: skip


def test_families_with_policies() -> None:
    fams = parse_families("contents:maxversions=3,anchor,lang:maxage=1d||maxversions=1")
    assert [f.name for f in fams] == ["contents", "anchor", "lang"]
    assert fams[0].gc_rule == MaxVersionsRule(max_versions=3) and fams[1].gc_rule is None
    assert isinstance(fams[2].gc_rule, UnionRule)
    with pytest.raises(InvalidArgument, match="column family name 'a b'"):
        parse_families("a b")


def test_set_args_as_cbt() -> None:
    assert parse_set_arg("f:c=v") == SetCell("f", b"c", b"v", None)
    assert parse_set_arg("f:c=v@12345") == SetCell("f", b"c", b"v", 12345)
    assert parse_set_arg("f:=a=b@x") == SetCell("f", b"", b"a=b@x", None)
    assert parse_set_arg("f:a:b=mail@example.com@7") == SetCell("f", b"a:b", b"mail@example.com", 7)
    assert parse_set_arg("f:c=\udcff") == SetCell("f", b"c", b"\xff", None)  # raw argv bytes
    for bad in ("nocolon", "f:c", ":c=v"):
        with pytest.raises(InvalidArgument, match="bad set arg"):
            parse_set_arg(bad)


def test_kv_args() -> None:
    assert parse_kv_args(["a=1", "b=x=y"], ("a", "b")) == {"a": "1", "b": "x=y"}
    with pytest.raises(InvalidArgument, match="unknown arg key 'c'"):
        parse_kv_args(["c=1"], ("a",))
    with pytest.raises(InvalidArgument, match="expected key=value"):
        parse_kv_args(["bare"], ("a",))


CELLS = [
    Cell("anchor", b"cnnsi.com", 9, b"CNN"),
    Cell("anchor", b"my.look.ca", 8, b"CNN.com"),
    Cell("contents", b"", 6, b"v6"),
    Cell("contents", b"", 5, b"v5"),
    Cell("contents", b"cnnsi.com", 1, b"odd"),
]


def _columns(spec: str) -> list[tuple[str, bytes, int]]:
    return [
        (c.family, c.qualifier, c.timestamp) for c in apply_filter(column_filter(spec), b"r", CELLS)
    ]


def test_columns_select_like_cbt() -> None:
    assert _columns("anchor:") == [("anchor", b"cnnsi.com", 9), ("anchor", b"my.look.ca", 8)]
    assert _columns("cnnsi.com") == [("anchor", b"cnnsi.com", 9), ("contents", b"cnnsi.com", 1)]
    assert _columns(":cnnsi.com") == _columns("cnnsi.com")
    assert _columns("anchor:my.*") == [("anchor", b"my.look.ca", 8)]
    assert _columns("anchor:cnnsi.com,contents:") == [
        ("anchor", b"cnnsi.com", 9), ("contents", b"", 6), ("contents", b"", 5),
        ("contents", b"cnnsi.com", 1),
    ]  # fmt: skip
    with pytest.raises(InvalidArgument, match="bad column"):
        column_filter("a:b:c")


def test_read_filter_chains_regex_columns_and_versions() -> None:
    f = read_filter({"columns": "contents:", "cells-per-column": "1"})
    assert f is not None
    assert [c.value for c in apply_filter(f, b"r", CELLS)] == [b"v6", b"odd"]
    assert read_filter({}) is None
    f = read_filter({"regex": "com\\..*"})
    assert f is not None and apply_filter(f, b"org.x", CELLS) == []


def test_go_quote_matches_go() -> None:
    assert go_quote(b"CNN.com") == '"CNN.com"'
    assert go_quote(b'a"b\\c') == '"a\\"b\\\\c"'
    assert go_quote(b"\n\t\x00\x7f\x01") == '"\\n\\t\\x00\\x7f\\x01"'
    assert go_quote("é日本".encode()) == '"é日本"'
    assert go_quote(b"\xff\xc3") == '"\\xff\\xc3"'
    assert go_quote("\u200b\U000e0001".encode()) == '"\\u200b\\U000e0001"'
    assert printable_key(b'k\x01\xff"\\') == 'k\\x01\\xff"\\'


def test_rows_print_as_cbt() -> None:
    lines = format_row(Row(b"com.cnn.www", [Cell("anchor", b"cnnsi.com", 0, b"CNN")]))
    assert lines == [
        "-" * 40,
        "com.cnn.www",
        "  anchor:cnnsi.com                         @ " + lines[2].split("@ ")[1],
        '    "CNN"',
        "",
    ]
    assert lines[2].endswith(".000000") and lines[2][45:49].isdigit()
