"""Validation of row mutations and read-modify-write rules, and their engine cells (§2, §3)."""

from __future__ import annotations

from typing import Any

import pytest

from tabletstore.data import validation as mutations
from tabletstore.data.model import (
    MAX_QUALIFIER,
    MAX_ROW_KEY,
    MAX_VALUE,
    AppendValue,
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    IncrementValue,
    SetCell,
)
from tabletstore.data.schema import Acl, ColumnFamily, TableSchema
from tabletstore.data.validation import (
    check_row_key,
    families_of,
    validate_rmw_rules,
    validate_row_mutation,
)
from tabletstore.engine.cells import apply_rmw_rule, to_cells
from tabletstore.errors import InvalidArgument, NotFound, PermissionDenied
from tabletstore.keys import TS_MAX, Cell, CellKind, encode_ts_range

SCHEMA = TableSchema(
    name="t",
    families={
        "open": ColumnFamily(name="open"),
        "private": ColumnFamily(name="private", acl=Acl(readers=["alice"], writers=["alice"])),
        "wo": ColumnFamily(name="wo", acl=Acl(readers=["nobody"], writers=None)),
    },
)


def test_row_keys_are_1_byte_to_64_kib() -> None:
    check_row_key(b"x")
    check_row_key(b"x" * MAX_ROW_KEY)
    with pytest.raises(InvalidArgument, match="64 KiB"):
        check_row_key(b"x" * (MAX_ROW_KEY + 1))
    with pytest.raises(InvalidArgument, match="empty"):
        check_row_key(b"")
    with pytest.raises(InvalidArgument, match="bytes"):
        check_row_key("text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="64 KiB"):
        validate_row_mutation(SCHEMA, b"x" * (MAX_ROW_KEY + 1), [SetCell("open", b"q", b"v")])


def test_unknown_family_is_not_found() -> None:
    for m in (SetCell("nope", b"q", b"v"), DeleteCells("nope", b"q"), DeleteFamily("nope")):
        with pytest.raises(NotFound, match="no column family 'nope'"):
            validate_row_mutation(SCHEMA, b"r", [m])
    with pytest.raises(NotFound):
        validate_rmw_rules(SCHEMA, b"r", [AppendValue("nope", b"q", b"x")], None)


def test_acls_deny_writes_and_read_modify_write() -> None:
    validate_row_mutation(SCHEMA, b"r", [SetCell("private", b"q", b"v")], "alice")
    with pytest.raises(PermissionDenied, match="bob may not write column family t:private"):
        validate_row_mutation(SCHEMA, b"r", [SetCell("private", b"q", b"v")], "bob")
    with pytest.raises(PermissionDenied, match="anonymous"):
        validate_row_mutation(SCHEMA, b"r", [DeleteFamily("private")])
    # DeleteRow writes every family.
    with pytest.raises(PermissionDenied):
        validate_row_mutation(SCHEMA, b"r", [DeleteRow()], "bob")
    # Read-modify-write reads too: a write-only family is denied.
    validate_row_mutation(SCHEMA, b"r", [SetCell("wo", b"q", b"v")], "bob")
    with pytest.raises(PermissionDenied, match="may not read"):
        validate_rmw_rules(SCHEMA, b"r", [IncrementValue("wo", b"q", 1)], "bob")


def test_time_ranges_and_timestamps() -> None:
    validate_row_mutation(SCHEMA, b"r", [DeleteCells("open", b"q", 5, 5)])  # empty is fine
    validate_row_mutation(SCHEMA, b"r", [DeleteCells("open", b"q", None, 7)])
    with pytest.raises(InvalidArgument, match=r"invalid time range \[9, 3\)"):
        validate_row_mutation(SCHEMA, b"r", [DeleteCells("open", b"q", 9, 3)])
    with pytest.raises(InvalidArgument, match="invalid time range"):
        validate_row_mutation(SCHEMA, b"r", [DeleteCells("open", b"q", -1, None)])
    for ts in (-1, TS_MAX):
        with pytest.raises(InvalidArgument, match="outside"):
            validate_row_mutation(SCHEMA, b"r", [SetCell("open", b"q", b"v", ts)])
    validate_row_mutation(SCHEMA, b"r", [SetCell("open", b"q", b"v", TS_MAX - 1)])


@pytest.mark.parametrize(
    "mutation",
    [
        SetCell("open", b"q", b"v", True),
        SetCell("open", b"q", b"v", 2.5),  # type: ignore[arg-type]
        SetCell("open", b"q", b"v", "5"),  # type: ignore[arg-type]
        DeleteCells("open", b"q", False, None),
        DeleteCells("open", b"q", None, True),
        DeleteCells("open", b"q", 1.5, None),  # type: ignore[arg-type]
        DeleteCells("open", b"q", None, b"9"),  # type: ignore[arg-type]
        DeleteCells("open", b"q", 0, 2**64 - 1),
        DeleteFamily(("open",)),  # type: ignore[arg-type]
    ],
    ids=repr,
)
def test_times_and_names_of_the_wrong_type_are_refused(mutation: Any) -> None:
    """A bool or float timestamp passed the range checks (True is an int, 0 <= 2.5) and was
    stored, and every minor compaction of the tablet then failed on the SSTable's int64
    column: one request wedged the tablet's flushes for good. A bound past 2^63-1 failed
    deep in the engine. Each is an InvalidArgument naming the problem now."""
    with pytest.raises(InvalidArgument, match=r"must be|invalid time range"):
        validate_row_mutation(SCHEMA, b"r", [mutation])


def test_read_modify_write_rules_of_the_wrong_type_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="amount must be an int, not bool"):
        validate_rmw_rules(SCHEMA, b"r", [IncrementValue("open", b"q", True)], None)
    with pytest.raises(InvalidArgument, match="amount must be an int, not float"):
        validate_rmw_rules(SCHEMA, b"r", [IncrementValue("open", b"q", 1.0)], None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="value must be bytes, not str"):
        validate_rmw_rules(SCHEMA, b"r", [AppendValue("open", b"q", "x")], None)  # type: ignore[arg-type]


def test_shapes_and_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidArgument, match="no mutations"):
        validate_row_mutation(SCHEMA, b"r", [])
    with pytest.raises(InvalidArgument, match="must be bytes"):
        validate_row_mutation(SCHEMA, b"r", [SetCell("open", "q", b"v")])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unknown mutation type"):
        validate_row_mutation(SCHEMA, b"r", [AppendValue("open", b"q", b"v")])  # type: ignore[list-item]
    monkeypatch.setattr(mutations, "MAX_VALUE", 4)
    with pytest.raises(InvalidArgument, match="5 bytes; the limit is 4"):
        validate_row_mutation(SCHEMA, b"r", [SetCell("open", b"q", b"12345")])
    monkeypatch.setattr(mutations, "MAX_MUTATIONS_PER_ROW", 2)
    with pytest.raises(InvalidArgument, match="3 mutations"):
        validate_row_mutation(SCHEMA, b"r", [DeleteRow()] * 3)
    with pytest.raises(InvalidArgument, match="no rules"):
        validate_rmw_rules(SCHEMA, b"r", [], None)
    with pytest.raises(InvalidArgument, match="64 bits"):
        validate_rmw_rules(SCHEMA, b"r", [IncrementValue("open", b"q", 2**63)], None)


def test_to_cells_gives_consecutive_seqs_and_encodes_deletions() -> None:
    muts = [
        SetCell("open", b"q", b"v"),
        SetCell("open", b"q", b"w", 7),
        DeleteCells("open", b"q", 3, None),
        DeleteFamily("open"),
        DeleteRow(),
    ]
    assert to_cells(b"r", muts, 100, 555) == [
        Cell(b"r", "open", b"q", 555, 100, CellKind.PUT, b"v"),
        Cell(b"r", "open", b"q", 7, 101, CellKind.PUT, b"w"),
        Cell(b"r", "open", b"q", TS_MAX, 102, CellKind.DELETE_COLUMN, encode_ts_range(3, TS_MAX)),
        Cell(b"r", "open", b"", TS_MAX, 103, CellKind.DELETE_FAMILY, b""),
        Cell(b"r", "", b"", TS_MAX, 104, CellKind.DELETE_ROW, b""),
    ]
    assert families_of(muts, SCHEMA) == {"open", "private", "wo"}


def counter(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def test_increment_and_append() -> None:
    assert apply_rmw_rule(IncrementValue("f", b"q", 5), None) == counter(5)
    assert apply_rmw_rule(IncrementValue("f", b"q", 5), b"") == counter(5)
    assert apply_rmw_rule(IncrementValue("f", b"q", -7), counter(5)) == counter(-2)
    assert apply_rmw_rule(IncrementValue("f", b"q", 1), counter(2**63 - 1)) == counter(-(2**63))
    for bad in (b"x", b"123456789"):
        with pytest.raises(InvalidArgument, match=f"its value is {len(bad)} bytes"):
            apply_rmw_rule(IncrementValue("f", b"q", 1), bad)
    assert apply_rmw_rule(AppendValue("f", b"q", b"yz"), None) == b"yz"
    assert apply_rmw_rule(AppendValue("f", b"q", b"yz"), b"x") == b"xyz"


_AGG_SCHEMA = SCHEMA.model_copy(
    update={"families": {**SCHEMA.families, "sums": ColumnFamily(name="sums", value_type="sum")}}
)


@pytest.mark.parametrize(
    ("row", "muts", "identity", "error", "match"),
    [
        (b"r", [SetCell("open", b"q", b"v", 1000)], None, None, ""),
        (b"r", [SetCell("private", b"q", b"v")], "alice", None, ""),
        (bytearray(b"r"), [SetCell("open", b"q", b"v")], None, None, ""),
        (b"", [SetCell("open", b"q", b"v")], None, InvalidArgument, "empty"),
        (b"r", [], None, InvalidArgument, "no mutations"),
        (b"r", [SetCell("nope", b"q", b"v")], None, NotFound, "no column family"),
        (b"r", [SetCell("private", b"q", b"v")], "bob", PermissionDenied, "may not write"),
        (b"r", [SetCell("sums", b"q", b"v")], None, InvalidArgument, "aggregate family"),
        (b"r", [SetCell("open", b"q" * (MAX_QUALIFIER + 1), b"")], None, InvalidArgument, "64"),
        (b"r", [SetCell("open", "q", b"v")], None, InvalidArgument, "qualifier must be bytes"),  # type: ignore[arg-type]
        (b"r", [SetCell("open", b"q", "v")], None, InvalidArgument, "value must be bytes"),  # type: ignore[arg-type]
        (b"r", [SetCell("open", b"q", b"v", -1)], None, InvalidArgument, "outside"),
        (b"r", [SetCell("open", b"q", b"v", TS_MAX)], None, InvalidArgument, "outside"),
        (b"r", [SetCell("open", b"q", b"v", True)], None, InvalidArgument, "not bool"),
        (b"r", [SetCell("open", b"q", b"v", 1.0)], None, InvalidArgument, "not float"),
        (b"r", [SetCell(0, b"q", b"v")], None, InvalidArgument, "family must be a str"),  # type: ignore[arg-type]
        (
            b"r",
            [SetCell("open", b"q", b"x" * (MAX_VALUE // 2))] * 3,
            None,
            InvalidArgument,
            "split it",
        ),
        (b"r", [SetCell("open", b"q", b"v"), DeleteRow()], "alice", None, ""),
    ],
)
def test_the_set_cell_fast_path_refuses_what_the_full_checks_refuse(
    row: bytes,
    muts: list[Any],
    identity: str | None,
    error: type[Exception] | None,
    match: str,
) -> None:
    """validate_row_mutation takes a shortcut for plain SetCells; every way such a mutation
    can be wrong still gets the full path's error."""
    if error is None:
        validate_row_mutation(_AGG_SCHEMA, row, muts, identity)
    else:
        with pytest.raises(error, match=match):
            validate_row_mutation(_AGG_SCHEMA, row, muts, identity)
