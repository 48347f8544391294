"""The RPC frame format (tabletstore.rpc.frames): golden bytes and malformed input."""

from __future__ import annotations

import pytest

from tabletstore.data.model import (
    MAX_MUTATION_BYTES,
    MAX_QUALIFIER,
    MAX_ROW_KEY,
    MAX_VALUE,
    RowMutation,
    SetCell,
)
from tabletstore.data.validation import MAX_MUTATIONS_PER_ROW, mutation_bytes
from tabletstore.errors import InvalidArgument, Unimplemented
from tabletstore.rpc import frames
from tabletstore.rpc.codec import Codec
from tabletstore.rpc.frames import FrameError, Kind
from tabletstore.rpc.messages import MutateRowsRequest
from tabletstore.rpc.wire import register_all


def test_golden_hello() -> None:
    # Version 2: errors travel as ErrorCode numbers (version 1 sent class names). Version 3:
    # reversed-scan, scan-stats and bulk-load-id fields, aggregate mutations, the AUTH frame.
    # Version 4: column-wise RowBatch, AdoptCompactionRequest, BulkLoadTabletRequest.adopt.
    # Version 5: read_points (TabletKeys, PointReadsRequest, PointReadsResponse).
    # Version 6: mutate_tablets (TabletMutations, MutateTabletsRequest), typed-field checks.
    # Version 7: the REQUEST_AS frame (delegation).
    # Version 8: load_tablet_at (LoadTabletAtRequest).
    assert frames.encode_hello(16 << 20) == bytes.fromhex("54535250 0008 01000000")


def test_golden_response_frame() -> None:
    # u32 length (5 + body) | u8 kind | u32 request id | body
    assert frames.encode_frame(Kind.RESPONSE, 7, b"hi") == bytes.fromhex(
        "00000007 02 00000007 6869"
    )


def test_golden_request_frame() -> None:
    # body = u32 window | u8 method length | method | payload
    got = frames.encode_request(258, "get", b"\x90", window=3)
    assert got == bytes.fromhex("0000000e 01 00000102 00000003 03 676574 90")


def test_golden_request_as_frame() -> None:
    # body = u8 principal length | principal | a REQUEST body
    got = frames.encode_request(258, "get", b"\x90", window=3, on_behalf="t1")
    assert got == bytes.fromhex("00000011 0b 00000102 02 7431 00000003 03 676574 90")
    request = frames.parse_request_as(got[frames.HEADER.size :])
    assert (request.on_behalf, request.method, bytes(request.payload)) == ("t1", "get", b"\x90")


@pytest.mark.parametrize("body", [b"", b"\x00", b"\x05ab", b"\x01\xff\x00\x00\x00\x00\x01a"])
def test_malformed_request_as_body(body: bytes) -> None:
    with pytest.raises(InvalidArgument, match="malformed REQUEST_AS"):
        frames.parse_request_as(body)


def test_request_round_trip() -> None:
    frame = frames.encode_request(9, "read_rows", b"payload", window=64)
    length, kind, rid = frames.HEADER.unpack_from(frame)
    assert (length, kind, rid) == (len(frame) - 4, Kind.REQUEST, 9)
    request = frames.parse_request(frame[frames.HEADER.size :])
    assert (request.window, request.method, bytes(request.payload)) == (64, "read_rows", b"payload")


@pytest.mark.parametrize("body", [b"", b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x05abc"])
def test_malformed_request_body(body: bytes) -> None:
    with pytest.raises(InvalidArgument, match="malformed REQUEST"):
        frames.parse_request(body)


def test_method_name_limits() -> None:
    with pytest.raises(InvalidArgument, match="method name"):
        frames.encode_request(1, "", b"")
    with pytest.raises(InvalidArgument, match="method name"):
        frames.encode_request(1, "x" * 256, b"")


def test_parser_splits_and_joins_frames() -> None:
    data = (
        frames.encode_hello(1 << 20)
        + frames.encode_frame(Kind.STREAM_ITEM, 5, b"abc")
        + frames.encode_frame(Kind.STREAM_END, 5)
    )
    parser = frames.FrameParser(1024)
    got = []
    # One byte at a time: a frame is only returned once all of it has arrived.
    for i, byte in enumerate(data):
        if parser.hello is None:
            assert parser.feed_hello(bytes([byte])) is None or i == frames.HELLO_SIZE - 1
            continue
        got += parser.feed(bytes([byte]))
    assert parser.hello == (frames.MAGIC, frames.PROTOCOL_VERSION, 1 << 20)
    assert got == [(Kind.STREAM_ITEM, 5, b"abc"), (Kind.STREAM_END, 5, b"")]
    # All at once: the bytes after the hello stay buffered for feed().
    parser = frames.FrameParser(1024)
    assert parser.feed_hello(data) is not None
    assert parser.feed(b"") == got


def test_parser_reports_wrong_magic_early() -> None:
    parser = frames.FrameParser(1024)
    assert parser.feed_hello(b"GET") is None
    hello = parser.feed_hello(b" ")
    assert hello is not None and hello.magic == b"GET "


def test_parser_rejects_oversized_frame() -> None:
    parser = frames.FrameParser(frames.DEFAULT_MAX_FRAME)
    limit = frames.format_size(frames.DEFAULT_MAX_FRAME)
    with pytest.raises(FrameError, match=f"frame of 2147483647 bytes exceeds the {limit} limit"):
        parser.feed(frames.HEADER.pack(2147483647, Kind.REQUEST, 1))


def test_parser_rejects_short_frame() -> None:
    with pytest.raises(FrameError, match="shorter than the 5-byte header"):
        frames.FrameParser(1024).feed(frames.HEADER.pack(2, Kind.REQUEST, 1))


def test_check_hello() -> None:
    """check_hello returns the version both sides speak (rpc/versions.py), or names why not."""
    good = frames.decode_hello(frames.encode_hello(1 << 20))
    version = frames.PROTOCOL_VERSION
    assert frames.check_hello(good, peer="127.0.0.1:1", peer_role="server") == version
    with pytest.raises(FrameError, match="expected magic"):
        frames.check_hello(good._replace(magic=b"GET "), peer="p", peer_role="client")
    # A newer peer speaks ours too; one a version behind is spoken at its version.
    assert frames.check_hello(good._replace(version=99), peer="p", peer_role="client") == version
    older = good._replace(version=version - 1)
    assert frames.check_hello(older, peer="p", peer_role="client") == version - 1
    with pytest.raises(
        Unimplemented,
        match=f"client p speaks tabletstore RPC protocol version {version - 2} at most; this "
        f"side speaks versions {version - 1} to {version}",
    ):
        frames.check_hello(good._replace(version=version - 2), peer="p", peer_role="client")
    with pytest.raises(FrameError, match="max frame of 10 bytes"):
        frames.check_hello(older._replace(max_frame=10), peer="p", peer_role="client")


def test_credit_and_sizes() -> None:
    frame = frames.encode_credit(3, 32)
    assert frames.decode_credit(frame[frames.HEADER.size :]) == 32
    with pytest.raises(InvalidArgument, match="malformed CREDIT"):
        frames.decode_credit(b"\x01")
    assert frames.format_size(16 << 20) == "16 MiB"
    assert frames.format_size(64 << 10) == "64 KiB"
    assert frames.format_size(1000) == "1000 bytes"
    with pytest.raises(InvalidArgument, match="exceeds the peer's 1 KiB frame limit"):
        frames.check_outgoing(2000, 1024, "request")


@pytest.mark.parametrize("shape", ["one-value", "many-mutations"])
def test_the_default_frame_holds_any_acceptable_row_mutation(shape: str) -> None:
    """The write limits and the frame agree (model.MAX_MUTATION_BYTES): a row mutation just
    within the limit, in its worst shapes, fits one request frame with its envelope."""
    row = b"r" * MAX_ROW_KEY
    family = "f" * 64
    if shape == "one-value":
        big = SetCell(family, b"q" * MAX_QUALIFIER, b"v" * MAX_VALUE, 2**63 - 2)
        used = mutation_bytes(row, [big])
        filler = SetCell(family, b"", b"w" * (MAX_MUTATION_BYTES - used - 32 - 64), 2**63 - 2)
        mutations = [big, filler]
    else:
        n = MAX_MUTATIONS_PER_ROW
        each = (MAX_MUTATION_BYTES - len(row)) // n - 32 - 64
        mutations = [SetCell(family, b"", b"v" * each, 2**63 - 2) for _ in range(n)]
        rest = MAX_MUTATION_BYTES - mutation_bytes(row, mutations)
        mutations[0] = SetCell(family, b"", b"v" * (each + rest), 2**63 - 2)
    assert MAX_MUTATION_BYTES - 100 <= mutation_bytes(row, mutations) <= MAX_MUTATION_BYTES
    request = MutateRowsRequest(
        "t" * 32, "t" * 32, (RowMutation(row, tuple(mutations)),), identity="x" * 1000
    )
    payload = register_all(Codec()).encode(request)
    frame = frames.encode_request(2**32 - 1, "mutate_rows", payload, window=0)
    frames.check_outgoing(len(frame) - frames.HEADER.size, frames.DEFAULT_MAX_FRAME, "request")
