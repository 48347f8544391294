"""The CSV form of a table: headers (ours and cbt's), records, encodings, round trips."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletstore.cli.tablecsv import (
    header_columns,
    header_length,
    header_record,
    record_to_mutation,
    row_to_record,
)
from tabletstore.data.model import Cell, Row, RowMutation, SetCell
from tabletstore.errors import InvalidArgument


def test_our_header() -> None:
    first = ["row", "contents:html", "anchor:a:b", ""]
    assert header_length(first) == 1
    assert header_columns([first]) == [("contents", b"html"), ("anchor", b"a:b"), None]


def test_cbt_headers() -> None:
    fams, quals = ["", "fam1", "", "fam2"], ["", "c1", "c2", "c3"]
    assert header_length(fams) == 2
    assert header_columns([fams, quals]) == [("fam1", b"c1"), ("fam1", b"c2"), ("fam2", b"c3")]
    assert header_length(quals, "f") == 1
    assert header_columns([quals], "f") == [("f", b"c1"), ("f", b"c2"), ("f", b"c3")]


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([], "empty"),
        ([["row", "nocolon"]], "bad header"),
        ([["row", ":q"]], "bad header column"),
        ([["", "fam"]], "no qualifier record"),
        ([["", "", "fam"], ["", "q1", "q2"]], "no column family to its left"),
    ],
)
def test_bad_headers(records: list[list[str]], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        header_columns(records)


COLUMNS = [("f", b"a"), None, ("g", b"b")]


def test_records() -> None:
    assert record_to_mutation(["r", "1", "ignored", ""], COLUMNS) == RowMutation(
        b"r", (SetCell("f", b"a", b"1"),)
    )
    assert record_to_mutation(["r", "", "", ""], COLUMNS) is None
    assert record_to_mutation([], COLUMNS) is None
    assert record_to_mutation(["r", "v@12"], COLUMNS, value_encoded=True) == RowMutation(
        b"r", (SetCell("f", b"a", b"v", 12),)
    )
    assert record_to_mutation(["r", "v@12"], COLUMNS) == RowMutation(
        b"r", (SetCell("f", b"a", b"v@12"),)
    )
    assert record_to_mutation(["cg==", "/w=="], COLUMNS, encoding="base64") == RowMutation(
        b"r", (SetCell("f", b"a", b"\xff"),)
    )
    with pytest.raises(InvalidArgument, match="fields"):
        record_to_mutation(["r", "1", "2", "3", "4"], COLUMNS)
    with pytest.raises(InvalidArgument, match="empty row key"):
        record_to_mutation(["", "1"], COLUMNS)
    with pytest.raises(InvalidArgument, match="not valid base64"):
        record_to_mutation(["r", "***"], COLUMNS, encoding="base64")


def test_export_refuses_binary_as_text() -> None:
    row = Row(b"r", [Cell("f", b"a", 1, b"\xff")])
    with pytest.raises(InvalidArgument, match="encoding=base64"):
        row_to_record(row, [("f", b"a")])
    assert row_to_record(row, [("f", b"a")], "base64") == ["cg==", "/w=="]
    with pytest.raises(InvalidArgument, match="binary qualifier"):
        header_record([("f", b"\xff")])


def test_export_writes_the_newest_version() -> None:
    row = Row(b"r", [Cell("f", b"a", 9, b"new"), Cell("f", b"a", 3, b"old")])
    assert row_to_record(row, [("f", b"a"), ("g", b"b")]) == ["r", "new", ""]


_text = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=20)


@given(
    rows=st.dictionaries(
        _text,
        st.dictionaries(st.sampled_from([("f", b"a"), ("f", b"a,b"), ("g", b"\"q'")]), _text),
        max_size=5,
    ),
    base64=st.booleans(),
)
def test_round_trip_through_csv(
    rows: dict[str, dict[tuple[str, bytes], str]], base64: bool
) -> None:
    encoding = "base64" if base64 else "text"
    columns = sorted({c for cells in rows.values() for c in cells})
    out = io.StringIO()
    # The default CRLF terminator (RFC 4180) also makes the writer quote fields holding a
    # lone "\r", which a "\n" terminator would leave bare and a reader would split on.
    writer = csv.writer(out)
    writer.writerow(header_record(columns))
    for key, cells in sorted(rows.items()):
        row = Row(key.encode(), [Cell(f, q, 1, v.encode()) for (f, q), v in sorted(cells.items())])
        writer.writerow(row_to_record(row, columns, encoding))
    records = list(csv.reader(io.StringIO(out.getvalue(), newline="")))
    parsed = header_columns(records[:1])
    assert parsed == columns
    back = {}
    for record in records[1:]:
        m = record_to_mutation(record, parsed, encoding=encoding)
        if m is not None:
            back[m.row.decode()] = {
                (s.family, s.qualifier): s.value.decode()
                for s in m.mutations
                if isinstance(s, SetCell)
            }
    assert back == {k: v for k, v in rows.items() if v}
