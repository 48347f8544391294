"""Golden test pinning the recovery-run format (``commitlog/runs.py``'s docstring is the
specification): ``data/run_v1.bin`` must keep decoding to the same records, and encoding those
records again must give exactly its bytes.

A deliberate format change bumps RUN_FORMAT_VERSION and regenerates the file::

    python tests/golden/test_run_golden.py --regenerate
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tabletstore.commitlog.format import LogRecord
from tabletstore.commitlog.runs import RUN_FORMAT_VERSION, decode_run, encode_run
from tabletstore.errors import Corruption
from tabletstore.keys import Cell, CellKind

GOLDEN = Path(__file__).parent / "data" / "run_v1.bin"


def golden_records() -> list[LogRecord]:
    """Records of table "t1", rows in [b"b", b"m"), given out of order on purpose."""
    out = []
    for i, (row, seq) in enumerate([(b"k", 9), (b"b", 4), (b"k", 2), (b"c\x00\xff", 7)]):
        cells = [
            Cell(row, "cf", b"q", 1_000 + i, seq, CellKind.PUT, b"v%d" % i),
            Cell(row, "cf", b"gone", 1_000 + i, seq + 1, CellKind.DELETE_COLUMN, b""),
        ]
        out.append(LogRecord(-1, "t1", row, seq, seq + 1, cells))
    return out


def encode_golden() -> bytes:
    return encode_run("t1", b"b", b"m", golden_records())


def test_golden_run_decodes_and_reencodes_byte_for_byte() -> None:
    data = GOLDEN.read_bytes()
    header, records = decode_run(data)
    assert (header.table_id, header.start_row, header.end_row) == ("t1", b"b", b"m")
    assert (header.record_count, header.min_seq, header.max_seq) == (4, 2, 10)
    assert [(r.row, r.first_seq) for r in records] == [
        (b"b", 4),
        (b"c\x00\xff", 7),
        (b"k", 2),
        (b"k", 9),
    ]
    assert encode_golden() == data
    assert data[4:6] == RUN_FORMAT_VERSION.to_bytes(2, "big")


@pytest.mark.parametrize("damage", ["short", "extra", "flip-header", "flip-record", "magic"])
def test_damaged_run_is_corruption(damage: str) -> None:
    data = bytearray(GOLDEN.read_bytes())
    if damage == "short":
        data = data[:-3]
    elif damage == "extra":
        data += b"\x00"
    elif damage == "flip-header":
        data[20] ^= 0x01
    elif damage == "flip-record":
        data[-2] ^= 0x01
    else:
        data[0:4] = b"XXXX"
    with pytest.raises(Corruption):
        decode_run(bytes(data))


def test_unbounded_run_and_empty_start() -> None:
    recs = [
        r._replace(row=b"z" + r.row, cells=[c._replace(row=b"z" + r.row) for c in r.cells])
        for r in golden_records()
    ]
    header, back = decode_run(encode_run("t1", b"", None, recs))
    assert header.end_row is None and header.start_row == b""
    assert sorted(r.row for r in back) == sorted(r.row for r in recs)


if __name__ == "__main__" and "--regenerate" in sys.argv:
    GOLDEN.write_bytes(encode_golden())
    print(f"wrote {GOLDEN}")
