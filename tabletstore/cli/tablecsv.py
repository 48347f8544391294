"""The CSV form of a table: the file format of ``tabletstore import`` and ``export``.

Pure conversions between CSV records (lists of strings, as the ``csv`` module reads and writes
them: RFC 4180 quoting of commas, quotes and line breaks, CRLF record ends on export) and the
data model (§2); the command does the file and database I/O.

Header. The first record names the columns: its first field names the row-key column (any text;
export writes ``row``) and every other field is ``family:qualifier`` (split at the first ``:``,
so qualifiers may contain ``:``)::

    row,contents:html,anchor:cnnsi.com
    com.cnn.www,<html>...,CNN

cbt's header is accepted too: a family record whose first field is empty and whose families
carry to the right until the next one (``,contents,,anchor``), then a qualifier record
(``,html,lang,cnnsi.com``); or only the qualifier record plus ``column-family=F``.

Records. A row key, then one field per header column. An empty field means "no cell", in both
directions, so a cell whose value is empty is not exported (the one lossy case). Export writes
the newest version of every column; import writes one version per field.

Encodings (``encoding=``). ``text``, the default: row keys and values are UTF-8 text written
verbatim; a row key or value that is not valid UTF-8 cannot be written as text, so export stops
with an error naming it and pointing at ``encoding=base64``. ``base64``: row keys and values are
standard base64 (RFC 4648), which carries any bytes. The header is UTF-8 text in both.

Timestamps. Import gives every cell the server's time (cbt's ``timestamp=now``) unless
``timestamp=value-encoded``: then ``value@micros`` sets the timestamp, and as in cbt, when what
follows the last ``@`` is not an integer it is part of the value.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from typing import Literal

from tabletstore.data.model import Row, RowMutation, SetCell
from tabletstore.errors import InvalidArgument

__all__ = [
    "ENCODINGS",
    "Column",
    "Encoding",
    "decode_field",
    "encode_field",
    "header_columns",
    "header_length",
    "header_record",
    "record_to_mutation",
    "row_to_record",
]

Encoding = Literal["text", "base64"]
ENCODINGS: tuple[Encoding, ...] = ("text", "base64")
#: A column of the file: (family, qualifier).
Column = tuple[str, bytes]
_TIMESTAMP = re.compile(r"[+-]?\d+")


def encode_field(data: bytes, encoding: Encoding, what: str) -> str:
    """Bytes as a CSV field; ``what`` names the datum in the error."""
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"{what} is binary (not UTF-8 text): export with encoding=base64"
        ) from None


def decode_field(text: str, encoding: Encoding, what: str) -> bytes:
    """A CSV field as bytes; ``what`` names the datum in the error."""
    if encoding == "text":
        return text.encode("utf-8")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"{what} is not valid base64: {text[:40]!r}") from None


def _column(field: str) -> Column:
    family, colon, qualifier = field.partition(":")
    if not colon or not family:
        raise InvalidArgument(f"bad header column {field!r}: expected family:qualifier")
    return family, qualifier.encode("utf-8")


def header_length(first: list[str], column_family: str | None = None) -> int:
    """How many records the header takes, judged from the file's first record: 2 for cbt's
    family record (empty first field, a field without ``:``) when no column family is given,
    else 1."""
    if column_family is not None or not first or first[0]:
        return 1
    return 1 if all(":" in f for f in first[1:] if f) else 2


def header_columns(
    records: Sequence[list[str]], column_family: str | None = None
) -> list[Column | None]:
    """The columns named by the header records (:func:`header_length` of them).

    A ``None`` column is one whose header field is empty: its values are ignored."""
    if not records or not records[0]:
        raise InvalidArgument("the CSV file is empty: expected a header record")
    first = records[0][1:]
    if column_family is not None:
        return [(column_family, q.encode("utf-8")) if q else None for q in first]
    named = [f for f in first if f]
    if all(":" in f for f in named):
        return [_column(f) if f else None for f in first]
    if records[0][0]:
        raise InvalidArgument(
            f"bad header {records[0][:4]!r}: expected row,family:qualifier,... (or cbt's "
            "family and qualifier records with an empty first field, or column-family=F)"
        )
    if len(records) < 2 or not records[1]:
        raise InvalidArgument("the CSV file has a column-family record but no qualifier record")
    qualifiers = records[1][1:]
    columns: list[Column | None] = []
    family = ""
    for i, q in enumerate(qualifiers):
        family = (first[i] if i < len(first) else "") or family
        if q and not family:
            raise InvalidArgument(f"header column {q!r} has no column family to its left")
        columns.append((family, q.encode("utf-8")) if q else None)
    return columns


def _cell_value(text: str, value_encoded: bool) -> tuple[str, int | None]:
    if value_encoded:
        head, at, tail = text.rpartition("@")
        if at and _TIMESTAMP.fullmatch(tail):
            return head, int(tail)
    return text, None


def record_to_mutation(
    record: list[str],
    columns: Sequence[Column | None],
    *,
    encoding: Encoding = "text",
    value_encoded: bool = False,
) -> RowMutation | None:
    """One data record as a row mutation; None for a record with no values (nothing to do)."""
    if len(record) - 1 > len(columns):
        raise InvalidArgument(
            f"record has {len(record)} fields but the header names {len(columns) + 1}"
        )
    if not record or not record[0]:
        if any(record):
            raise InvalidArgument("record has values but an empty row key")
        return None
    row = decode_field(record[0], encoding, "row key")
    cells = []
    for column, field in zip(columns, record[1:], strict=False):
        if column is None or not field:
            continue
        text, ts = _cell_value(field, value_encoded)
        what = f"value of {column[0]}:{column[1].decode('utf-8', 'backslashreplace')}"
        cells.append(SetCell(column[0], column[1], decode_field(text, encoding, what), ts))
    return RowMutation(row, tuple(cells)) if cells else None


def header_record(columns: Sequence[Column]) -> list[str]:
    """The header export writes; a qualifier that is not UTF-8 cannot be named in it."""
    out = ["row"]
    for family, qualifier in columns:
        try:
            out.append(f"{family}:{qualifier.decode('utf-8')}")
        except UnicodeDecodeError:
            raise InvalidArgument(
                f"column {family}:{qualifier!r} has a binary qualifier, which a CSV header "
                "cannot name"
            ) from None
    return out


def row_to_record(row: Row, columns: Sequence[Column], encoding: Encoding = "text") -> list[str]:
    """A row's newest values, one field per column ('' where the row has no cell)."""
    latest: dict[Column, bytes] = {}
    for c in row.cells:  # newest first within a column, so the first one seen wins
        latest.setdefault((c.family, c.qualifier), c.value)
    key = row.key.decode("utf-8", "backslashreplace")
    out = [encode_field(row.key, encoding, f"row key {key!r}")]
    for col in columns:
        value = latest.get(col)
        what = f"value of row {key!r} column {col[0]}:{col[1].decode('utf-8', 'replace')}"
        out.append("" if value is None else encode_field(value, encoding, what))
    return out
