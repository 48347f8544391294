"""The commit-log segment format: round trip, pinned bytes, truncation and corruption."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletstore.commitlog.format import decode_segment, encode_record, encode_segment
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.keys import TS_MAX, Cell, CellKind, encode_ts_range


def sample_records() -> list[tuple[str, bytes, list[Cell]]]:
    return [
        (
            "users",
            b"row-1",
            [Cell(b"row-1", "cf", b"q", 1_700_000_000_000_000, 7, CellKind.PUT, b"v")],
        ),
        (
            "users",
            b"row-2",
            [
                Cell(b"row-2", "", b"", TS_MAX, 8, CellKind.DELETE_ROW, b""),
                Cell(b"row-2", "cf", b"", TS_MAX, 9, CellKind.DELETE_FAMILY, b""),
                Cell(
                    b"row-2",
                    "cf",
                    b"\x00q",
                    TS_MAX,
                    10,
                    CellKind.DELETE_COLUMN,
                    encode_ts_range(0, 5),
                ),
                Cell(b"row-2", "cf", b"\xffq", 0, 11, CellKind.PUT, b"\x00" * 3),
            ],
        ),
        ("t2", b"", [Cell(b"", "x", b"", 5, 12, CellKind.PUT, b"")]),
    ]


def sample_segment() -> bytes:
    records = [encode_record(t, r, c) for t, r, c in sample_records()]
    return encode_segment("worker-1", 3, 42, records)


def test_round_trip() -> None:
    contents = decode_segment(sample_segment())
    assert not contents.fence
    assert contents.header is not None
    assert (contents.header.worker_id, contents.header.incarnation, contents.header.segment) == (
        "worker-1",
        3,
        42,
    )
    got = [(r.table_id, r.row, r.cells) for r in contents.records]
    assert got == [(t, r, c) for t, r, c in sample_records()]
    assert [(r.first_seq, r.last_seq, r.segment) for r in contents.records] == [
        (7, 7, 42),
        (8, 11, 42),
        (12, 12, 42),
    ]


def test_bytes_are_pinned() -> None:
    """A format change must update this digest and the format module's docstring together."""
    data = sample_segment()
    assert len(data) == 314
    header = (
        "5453434c"  # magic "TSCL"
        "0001"  # format version
        "0008"  # len("worker-1")
        "0000000000000003"  # incarnation
        "000000000000002a"  # segment number 42
        "00000003"  # record count
        "000000000000010a"  # len(records) = 266 (314 - 48 header bytes)
    )
    assert data[: len(header) // 2].hex() == header
    assert data[len(header) // 2 : len(header) // 2 + 8] == b"worker-1"
    assert hashlib.sha256(data).hexdigest() == GOLDEN_SHA256


GOLDEN_SHA256 = "f8508d5f65af4597d025f9483020a043e680e5c0860b83d779fd40a04f93de0c"


def test_empty_object_is_a_fence() -> None:
    contents = decode_segment(b"")
    assert contents.fence and contents.records == [] and contents.header is None


def test_every_truncation_is_corruption() -> None:
    """A segment PUT is atomic, so a short segment was damaged after it was written: reading
    its good prefix as a shorter log once dropped acknowledged writes silently."""
    data = sample_segment()
    for cut in range(1, len(data)):
        with pytest.raises(Corruption):
            decode_segment(data[:cut])
    # Cut exactly after the second record: still Corruption (one record is missing).
    header_size = len(encode_segment("worker-1", 3, 42, []))
    cut = header_size + sum(len(encode_record(t, r, c)) for t, r, c in sample_records()[:2])
    with pytest.raises(Corruption, match="header declares"):
        decode_segment(data[:cut])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_flipped_byte_is_corruption(data: st.DataObject) -> None:
    segment = bytearray(sample_segment())
    pos = data.draw(st.integers(0, len(segment) - 1))
    segment[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(Corruption):
        decode_segment(bytes(segment))


def test_extra_bytes_and_wrong_magic_are_corruption() -> None:
    with pytest.raises(Corruption, match="beyond"):
        decode_segment(sample_segment() + b"\x00")
    with pytest.raises(Corruption, match="not a commit-log segment"):
        decode_segment(b"PAR1" + sample_segment()[4:])
    with pytest.raises(Corruption, match="not a commit-log segment"):
        decode_segment(b"{}")


def test_bad_input_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="no cells"):
        encode_record("t", b"r", [])
    with pytest.raises(InvalidArgument, match="row"):
        encode_record("t", b"r", [Cell(b"other", "f", b"", 1, 1, CellKind.PUT, b"")])
    with pytest.raises(InvalidArgument, match="span"):
        encode_record(
            "t",
            b"r",
            [
                Cell(b"r", "f", b"", 1, 1, CellKind.PUT, b""),
                Cell(b"r", "f", b"", 1, 1 << 33, CellKind.PUT, b""),
            ],
        )
    with pytest.raises(InvalidArgument, match="encoded"):
        encode_record("t", b"r", [Cell(b"r", "fé", b"", 1, 1, CellKind.PUT, b"")])
    with pytest.raises(InvalidArgument, match="worker id"):
        encode_segment("", 0, 0, [])
