"""ReadRows responses that pack several small rows (chunks.ChunkEncoder ``max_rows_bytes``):
each packed response is the serialized concatenation of its rows' chunks, within the bound,
and a row larger than the bound goes out alone after the rows before it."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("google.cloud.bigtable_v2")

from tabletstore.bigtable_api.chunks import ChunkEncoder, row_chunks
from tabletstore.bigtable_api.translate import ReadRowsResponsePB
from tabletstore.data.model import Cell, Row


def _small(i: int) -> Row:
    return Row(b"r%03d" % i, [Cell("cf", b"q", 1000, b"v" * 50)])


def _parse(resp: Any) -> Any:
    return ReadRowsResponsePB.FromString(resp) if type(resp) is bytes else resp


def _encode(enc: ChunkEncoder, rows: list[Row]) -> list[Any]:
    out = [resp for row in rows for resp in enc.add(row)]
    last = enc.flush()
    if last is not None:
        out.append(last)
    assert enc.flush() is None
    return out


def test_small_rows_share_responses_within_the_bound() -> None:
    rows = [_small(i) for i in range(23)]
    size = len(ReadRowsResponsePB(chunks=row_chunks(rows[0])).SerializeToString())
    enc = ChunkEncoder(max_rows_bytes=5 * size + size // 2)
    responses = _encode(enc, rows)
    assert all(type(r) is bytes and len(r) <= 5 * size + size // 2 for r in responses)
    assert [len(_parse(r).chunks) for r in responses] == [5, 5, 5, 5, 3]
    chunks = [c for r in responses for c in _parse(r).chunks]
    assert chunks == [c for row in rows for c in row_chunks(row)]


def test_rows_are_added_one_by_one_and_held_until_the_bound_fills() -> None:
    enc = ChunkEncoder(max_rows_bytes=1000)
    assert list(enc.add(_small(0))) == []
    assert list(enc.add(_small(1))) == []
    held = enc.flush()
    assert type(held) is bytes
    assert [c.row_key for c in _parse(held).chunks] == [b"r000", b"r001"]


def test_a_row_larger_than_the_bound_goes_alone_after_the_pending_rows() -> None:
    enc = ChunkEncoder(max_value_chunk=100, max_response_bytes=250, max_rows_bytes=200)
    big = Row(b"r001", [Cell("cf", b"q", 1000, b"B" * 420)])
    responses = _encode(enc, [_small(0), big, _small(2)])
    parsed = [_parse(r) for r in responses]
    assert [c.row_key for c in parsed[0].chunks] == [b"r000"]
    # The large row: its own responses, each starting with its key, its value whole.
    middle = parsed[1:-1]
    assert len(middle) > 1 and all(r.chunks[0].row_key == b"r001" for r in middle)
    assert b"".join(c.value for r in middle for c in r.chunks) == b"B" * 420
    assert [c.commit_row for r in middle for c in r.chunks][-1]
    assert not any(c.commit_row for r in middle[:-1] for c in r.chunks)
    assert all(r.ByteSize() <= 250 + 100 for r in middle)
    assert [c.row_key for c in parsed[-1].chunks] == [b"r002"]


def test_a_row_that_fits_one_response_but_not_the_pack_goes_out_as_one_message() -> None:
    enc = ChunkEncoder(max_rows_bytes=100)
    row = Row(b"mid", [Cell("cf", b"q%d" % i, 1000, b"x" * 40) for i in range(4)])
    responses = _encode(enc, [_small(0), row])
    assert len(responses) == 2
    assert list(_parse(responses[1]).chunks) == row_chunks(row)


def test_the_pack_bound_never_exceeds_the_response_bound() -> None:
    enc = ChunkEncoder(max_response_bytes=200, max_rows_bytes=10_000)
    responses = _encode(enc, [_small(i) for i in range(10)])
    assert len(responses) > 3 and all(len(r) <= 200 for r in responses)


def test_zero_sends_one_response_per_row_and_a_negative_bound_is_refused() -> None:
    responses = _encode(ChunkEncoder(max_rows_bytes=0), [_small(i) for i in range(3)])
    assert [len(_parse(r).chunks) for r in responses] == [1, 1, 1]
    with pytest.raises(ValueError, match="max_rows_bytes"):
        ChunkEncoder(max_rows_bytes=-1)


def test_an_all_ok_mutate_rows_response_names_every_entry_with_an_empty_status() -> None:
    from google.cloud.bigtable_v2.types import bigtable as bt

    from tabletstore.bigtable_api.front_door import _all_ok

    resp = bt.MutateRowsResponse.pb().FromString(_all_ok(3))
    assert [(e.index, e.HasField("status"), e.status.code) for e in resp.entries] == [
        (0, True, 0),
        (1, True, 0),
        (2, True, 0),
    ]
    assert _all_ok(3) is _all_ok(3)
