"""Rows split into bounded stream items and put back together (rpc/row_pieces.py).

Every piece's encoded size stays near the budget, the client's reassembly returns the exact
row (values split anywhere, exactly on a boundary, rows of many small cells), a broken piece
sequence is a clear error, and the pieces survive the real codec.
"""

from __future__ import annotations

import random
from dataclasses import replace

import msgpack
import pytest

from tabletstore.data.model import MAX_QUALIFIER, MAX_ROW_KEY, Cell, Row
from tabletstore.errors import InvalidArgument, Unavailable
from tabletstore.rpc import frames
from tabletstore.rpc.codec import Codec
from tabletstore.rpc.messages import LargeRow, RowBatch, RowPiece
from tabletstore.rpc.row_pieces import (
    CELL_OVERHEAD,
    STREAM_ITEM_BYTES,
    RowAssembler,
    row_bytes,
    split_row,
)
from tabletstore.rpc.wire import register_all

CODEC = register_all(Codec())


def roundtrip(row: Row, budget: int) -> tuple[list[RowPiece], Row]:
    """The pieces of ``row`` (through the codec, as on a connection) and the row rebuilt."""
    pieces = [CODEC.decode(CODEC.encode(p)) for p in split_row(row, budget)]
    assembler = RowAssembler()
    out: list[Row] = []
    for piece in pieces:
        out.extend(assembler.rows(piece))
    assembler.finish()
    assert len(out) == 1
    return pieces, out[0]


def test_two_large_values_cross_in_pieces_of_the_budget() -> None:
    a, b = random.randbytes(10_000_000), random.randbytes(10_000_000)
    row = Row(b"big", [Cell("f", b"a", 2, a), Cell("f", b"b", 1, b)])
    pieces, back = roundtrip(row, STREAM_ITEM_BYTES)
    assert back == row
    assert len(pieces) >= 20
    for piece in pieces:
        assert len(CODEC.encode(piece)) <= STREAM_ITEM_BYTES
    assert [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True]


def test_a_value_split_exactly_on_a_boundary() -> None:
    budget = 1000
    key = b"k"
    head = CELL_OVERHEAD + len("f") + len(b"q")
    per_piece = budget - len(key) - head
    for n in (per_piece, 2 * per_piece, 3 * per_piece, 3 * per_piece - 1, 3 * per_piece + 1):
        value = random.randbytes(n)
        row = Row(key, [Cell("f", b"q", 5, value), Cell("f", b"r", 5, b"after")])
        pieces, back = roundtrip(row, budget)
        assert back == row, n
        # no piece is empty, and a value that fits exactly is never split
        assert all(p.cells for p in pieces)
        assert sum(p.split_value for p in pieces) == -(-n // per_piece) - 1


def test_a_row_of_many_small_cells_larger_than_a_frame() -> None:
    max_frame = 64 * 1024
    cells = [Cell("fam", b"q%06d" % i, 1000 - i % 3, b"v" * (i % 50)) for i in range(20_000)]
    row = Row(b"wide", cells)
    assert len(CODEC.encode(RowBatch((row,)))) > 8 * max_frame
    pieces, back = roundtrip(row, max_frame // 2)
    assert back == row
    assert not any(p.split_value for p in pieces)
    for piece in pieces:
        body = CODEC.encode(piece)
        frames.check_outgoing(len(body), max_frame, "piece")  # never too large for the frame


def test_labels_and_timestamps_survive_and_cells_stay_in_order() -> None:
    cells = [
        Cell("a", b"x", 9, random.randbytes(3000), ("l1", "l2")),
        Cell("a", b"x", 8, b"", ("l1",)),
        Cell("b", b"", 7, random.randbytes(2500)),
        Cell("b", b"y", 6, b"small"),
    ]
    row = Row(b"r", cells)
    for budget in (200, 777, 2600, 10_000):
        _, back = roundtrip(row, budget)
        assert back == row, budget


def test_the_largest_keys_and_qualifiers_still_leave_room_for_values() -> None:
    row = Row(b"k" * MAX_ROW_KEY, [Cell("f", b"q" * MAX_QUALIFIER, 1, random.randbytes(3_000_000))])
    pieces, back = roundtrip(row, STREAM_ITEM_BYTES)
    assert back == row
    for piece in pieces:
        assert len(CODEC.encode(piece)) <= STREAM_ITEM_BYTES + 64 * 1024


def test_batches_and_pieces_interleave_in_one_stream() -> None:
    small = [Row(b"a", [Cell("f", b"q", 1, b"1")]), Row(b"b", [Cell("f", b"q", 1, b"2")])]
    big = Row(b"c", [Cell("f", b"q", 1, random.randbytes(5000))])
    after = [Row(b"d", [Cell("f", b"q", 1, b"4")])]
    items: list[object] = [RowBatch(tuple(small)), *split_row(big, 1000), RowBatch(tuple(after))]
    assembler = RowAssembler()
    got = [row for item in items for row in assembler.rows(CODEC.decode(CODEC.encode(item)))]
    assembler.finish()
    assert got == [*small, big, *after]


def test_row_bytes_estimates_what_decides_pieces() -> None:
    row = Row(b"key", [Cell("f", b"qq", 1, b"v" * 10), Cell("f", b"", 1, b"")])
    assert row_bytes(row) == 3 + (2 + 10 + 16) + 16
    # One cell (the fast path) counts as the same cell among others does.
    lone = Row(b"key", [Cell("f", b"qq", 1, b"v" * 10)])
    assert row_bytes(lone) == 3 + (2 + 10 + 16)
    assert row_bytes(Row(b"k", [])) == 1


def broken(items: list[object]) -> str:
    assembler = RowAssembler("w:1")
    with pytest.raises(Unavailable) as info:
        for item in items:
            assembler.rows(item)
        assembler.finish()
    return str(info.value)


def test_a_broken_piece_sequence_is_a_protocol_error() -> None:
    c = Cell("f", b"q", 1, b"v")
    first = RowPiece(b"r", (c,), split_value=False, last=False)
    assert "ended inside row" in broken([first])
    assert "batch of rows arrived inside" in broken([first, RowBatch(())])
    assert "inside row b'r'" in broken([first, RowPiece(b"s", (c,), False, True)])
    assert "empty piece" in broken([RowPiece(b"r", (), False, True)])
    split = RowPiece(b"r", (c,), split_value=True, last=False)
    other = RowPiece(b"r", (replace(c, qualifier=b"z"),), False, True)
    assert "does not continue" in broken([split, other])
    assert "splits a value" in broken([RowPiece(b"r", (c,), split_value=True, last=True)])
    assert "unexpected stream item LargeRow" in broken([LargeRow(b"r", 5)])
    assert "from w:1" in broken([first])


def test_row_batches_cross_the_wire_column_wise() -> None:
    """A RowBatch is sent as one array per cell field (``ROW_BATCH_FORM``, wire id 44): rows
    of one cell, of many, with and without labels, and no rows at all come back equal, and
    the arrays cost fewer bytes than the rows as objects."""
    one = [Row(b"r%03d" % i, [Cell("f", b"q", i, random.randbytes(i))]) for i in range(50)]
    many = [
        Row(b"m", [Cell("f", b"a", 3, b"x"), Cell("f", b"a", 1, b""), Cell("g", b"", 2, b"z")]),
        Row(b"n", [Cell("g", b"q", 7, b"w")]),
    ]
    labelled = [Row(b"l", [Cell("f", b"q", 1, b"v", ("a", "b")), Cell("f", b"r", 1, b"v")])]
    lone = [Row(b"x", [Cell("f", b"q", 1, b"v", ("l",))])]
    for rows in (one, many, labelled, lone, one[:1], [*one, *many, *labelled], []):
        data = CODEC.encode(RowBatch(tuple(rows)))
        assert msgpack.unpackb(data)[0] == msgpack.ExtType(44, b"")
        assert CODEC.decode(data) == RowBatch(tuple(rows))
    assert msgpack.unpackb(CODEC.encode(RowBatch(tuple(one))))[-1] == []  # no labels: empty
    assert len(CODEC.encode(RowBatch(tuple(one)))) < len(CODEC.encode(tuple(one)))


def test_row_batch_arrays_that_do_not_fit_together_are_invalid() -> None:
    marker = msgpack.ExtType(44, b"")
    good = [(b"a",), (2,), ("f", "f"), (b"q", b"r"), (1, 1), (b"1", b"2"), ()]

    def decode(*fields: object) -> str:
        with pytest.raises(InvalidArgument) as info:
            CODEC.decode(msgpack.packb([marker, *fields], use_bin_type=True))
        return str(info.value)

    assert CODEC.decode(msgpack.packb([marker, *good], use_bin_type=True)) == RowBatch(
        (Row(b"a", [Cell("f", b"q", 1, b"1"), Cell("f", b"r", 1, b"2")]),)
    )
    assert "RowBatch (type id 44): a row batch has 7 arrays, got 6" in decode(*good[:6])
    assert "unequal arrays" in decode(good[0], good[1], good[2], good[3], good[4], (b"1",), ())
    assert "unequal arrays" in decode((b"a", b"b"), *good[1:])
    assert "label sets" in decode(*good[:6], (("x",),))
    assert "do not add up" in decode(good[0], (3,), *good[2:])
    assert "do not add up" in decode((b"a", b"b"), (2, 0), *good[2:])


def test_decoded_rows_are_real_frozen_rows_with_or_without_the_fast_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decoder builds Cells and Rows through their slots (``row_pieces._new_cells``): the
    objects are equal, hash alike, stay frozen and keep a row's cell list its own, exactly as
    the constructors' are; with the fast build off (a class that gains ``__post_init__``) the
    constructors give the same batch. Covers one-cell rows, many versions, labels, empty
    values and qualifiers, a 5 MB value, and a batch of no rows."""
    from dataclasses import FrozenInstanceError

    from tabletstore.rpc import row_pieces

    assert row_pieces._FAST_BUILD
    versions = Row(b"v", [Cell("f", b"q", ts, b"%d" % ts) for ts in range(100, 0, -1)])
    rows = (
        Row(b"a", [Cell("f", b"", 0, b"")]),
        versions,
        Row(b"l", [Cell("f", b"q", 5, b"x", ("one", "two"))]),
        Row(b"big", [Cell("g", b"q", 1, random.randbytes(5 << 20))]),
        *(Row(b"r%04d" % i, [Cell("f", b"q", i, random.randbytes(100))]) for i in range(300)),
    )
    for batch in (RowBatch(rows), RowBatch(rows[4:]), RowBatch(())):
        data = CODEC.encode(batch)
        fast = CODEC.decode(data)
        monkeypatch.setattr(row_pieces, "_FAST_BUILD", False)
        slow = CODEC.decode(data)
        monkeypatch.setattr(row_pieces, "_FAST_BUILD", True)
        assert fast == slow == batch
        assert [hash(c) for r in fast.rows for c in r.cells] == [
            hash(c) for r in batch.rows for c in r.cells
        ]
    got = CODEC.decode(CODEC.encode(RowBatch(rows[4:6])))
    with pytest.raises(FrozenInstanceError):
        got.rows[0].cells[0].value = b"changed"  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        got.rows[0].key = b"changed"  # type: ignore[misc]
    got.rows[0].cells.append(Cell("f", b"z", 1, b""))  # each row has its own list
    assert len(got.rows[0].cells) == 2 and len(got.rows[1].cells) == 1
    assert repr(got.rows[1].cells[0]).startswith("Cell(family='f', qualifier=b'q'")
