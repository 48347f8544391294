"""The commit-log segment format: round trip, pinned bytes, truncation and corruption."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletstore.commitlog.format import (
    decode_segment,
    decode_segment_header,
    encode_record,
    encode_segment,
)
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


def test_version_2_carries_when_the_segment_was_written() -> None:
    """The writer stamps each segment (version 2); a version 1 segment still reads, with no
    stamp, and both versions' damage is Corruption."""
    records = [encode_record(t, r, c) for t, r, c in sample_records()]
    v2 = encode_segment("worker-1", 3, 42, records, written_at=1_795_000_000.123456)
    assert v2[4:6] == (2).to_bytes(2, "big")
    assert len(v2) == len(sample_segment()) + 8
    contents = decode_segment(v2)
    assert contents.header is not None
    assert contents.header.version == 2
    assert contents.header.written_at == 1_795_000_000.123456
    assert [(r.table_id, r.row, r.cells) for r in contents.records] == sample_records()
    old = decode_segment(sample_segment())
    assert old.header is not None and old.header.written_at is None and old.header.version == 1
    header, declared = decode_segment_header(v2[:100], where="s")
    assert declared == len(v2) and header.written_at == contents.header.written_at
    for cut in range(1, len(v2)):
        with pytest.raises(Corruption):
            decode_segment(v2[:cut])
    unknown = bytearray(v2)
    unknown[4:6] = (3).to_bytes(2, "big")
    with pytest.raises(Corruption, match="version 3"):
        decode_segment(bytes(unknown))


def test_the_writer_stamps_its_segments() -> None:
    """CommitLogWriter writes version 2 with its clock's wall time."""
    import asyncio

    from tabletstore.clock import ManualClock
    from tabletstore.commitlog.writer import CommitLogWriter
    from tabletstore.keys import Cell, CellKind
    from tabletstore.storage_s3 import layout
    from tabletstore.storage_s3.memory import MemoryObjectStore

    async def go() -> None:
        store = MemoryObjectStore()
        clock = ManualClock(1_800_000_000.5)
        async with CommitLogWriter(store, "w", 1, clock=clock) as writer:
            seq = writer.allocate(1)
            await writer.append("t", b"r", [Cell(b"r", "f", b"q", 1, seq, CellKind.PUT, b"v")])
        data = await store.get(layout.log_segment_key("w", 1, 0))
        assert data is not None
        header = decode_segment(data).header
        assert header is not None and header.version == 2 and header.written_at == 1_800_000_000.5

    asyncio.run(go())
