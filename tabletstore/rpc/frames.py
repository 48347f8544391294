"""The RPC wire format: handshake and length-prefixed frames (docs/architecture/design.md §8).

Clients talk to tablet servers and the master talks to workers (paper §5: "clients communicate
directly with tablet servers for reads and writes") over one TCP connection each, carrying many
requests at once. This module owns the bytes on that connection and nothing else: it knows
frame kinds and request ids, never message types (payloads are opaque bytes, see codec.py).

Handshake
---------
Each side writes a 10-byte hello as soon as the connection is up, then reads the peer's::

    hello := magic "TSRP" (4 bytes) | u16 protocol version | u32 max frame length

All integers are big-endian. The version is the highest its sender speaks; the connection uses
the highest version both sides speak (versions.py). A server that reads a wrong magic, or the
hello of a peer it cannot speak with, answers one ERROR frame (request id 0) naming the problem
(Unimplemented, naming both sides' versions, for the version) and closes; a client raises such
an error itself. Neither side sends a frame longer than the *peer's* advertised max frame
length: an oversized payload fails locally with InvalidArgument instead.

Frames
------
::

    frame  := u32 length | u8 kind | u32 request id | body      (length = 5 + len(body))

    REQUEST      c→s  body = u32 window | u8 n | method name (n bytes, UTF-8) | payload
                      window 0 = a unary call; window > 0 = a streaming call whose first
                      `window` items the server may send before waiting for CREDIT
    RESPONSE     s→c  body = payload (the unary result)
    STREAM_ITEM  s→c  body = payload (one item of a stream; consumes one credit)
    STREAM_END   s→c  body = empty (the stream finished normally)
    ERROR        s→c  body = payload [code, message] (codec.encode_error; the code is the
                      error class's errors.ErrorCode); request id 0
                      is about the whole connection, which the sender then closes
    CANCEL       c→s  body = empty (the client gave up on this request id; a reply already
                      on its way is dropped by the client, no other follows)
    CREDIT       c→s  body = u32 n (the client consumed n more stream items)
    PING         c→s  body = opaque bytes
    PONG         s→c  body = the PING's bytes, with the PING's request id
    AUTH         c→s  body = a bearer token (UTF-8); request id 0. Sent first, before any
                      REQUEST, by a client without a certificate on a server with auth on
                      (rpc/auth.py); a rejected token fails the connection (ERROR, id 0).
                      Until it is accepted, such a server reads nothing after it, and refuses a
                      first frame of another kind or of more than 4 KiB (rpc/admission.py);
                      clients have always sent it first, so the protocol version is unchanged
    REQUEST_AS   c→s  body = u8 m | principal name (m bytes, UTF-8) | a REQUEST body: a request
                      made on behalf of that principal (rpc/auth.py, delegation). The server
                      serves it as that principal only when the connection's own principal
                      holds a delegating role (security/principal.py); from anyone else it is
                      refused with PermissionDenied for that request id. Version 7 on
                      (versions.REQUEST_AS_VERSION): refused with Unimplemented on an older
                      connection, and never sent on one

Request id 0 is reserved for connection-level ERROR frames; clients number requests from 1.

Sizes
-----
``DEFAULT_MAX_FRAME`` (both sides' default) is ``limits.MAX_REQUEST_BYTES``, derived from the
write limits in ``tabletstore.limits``: one frame holds the largest acceptable row mutation
(``MAX_MUTATION_BYTES``) plus a request's envelope, so whatever a write may carry can be sent.
Nothing a read returns is bounded by a frame: a scan streams rows in items of about
``row_pieces.STREAM_ITEM_BYTES`` and a row larger than that in several pieces, which the client
reassembles (``rpc/row_pieces.py``). Big frames therefore only ever carry big writes.

A frame whose length exceeds the receiver's limit or is shorter than the 5-byte header leaves the
byte stream untrustworthy: the receiver answers ERROR (request id 0) and closes the connection.
A well-delimited frame with an unknown kind or a malformed body gets an ERROR for its own request
id and the connection carries on.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from tabletstore.errors import InvalidArgument
from tabletstore.limits import MAX_FRAME, format_size
from tabletstore.rpc.versions import PROTOCOL_VERSION, SPOKEN, Versions, negotiate

__all__ = [
    "DEFAULT_MAX_FRAME",
    "HEADER",
    "HELLO_SIZE",
    "MAGIC",
    "PROTOCOL_VERSION",
    "Frame",
    "FrameError",
    "FrameParser",
    "Hello",
    "Kind",
    "Request",
    "check_hello",
    "check_outgoing",
    "decode_credit",
    "decode_hello",
    "encode_credit",
    "encode_frame",
    "encode_hello",
    "encode_request",
    "format_size",
    "parse_request",
    "parse_request_as",
]

MAGIC = b"TSRP"
#: The largest frame either side accepts unless configured otherwise (module docstring).
DEFAULT_MAX_FRAME = MAX_FRAME

_HELLO = struct.Struct(">4sHI")
HELLO_SIZE = _HELLO.size
_LENGTH = struct.Struct(">I")
#: u32 length, u8 kind, u32 request id: the fixed part in front of every body.
HEADER = struct.Struct(">IBI")
_KIND_AND_ID = 5  # bytes of the header counted by the length field
_REQUEST_HEAD = struct.Struct(">IB")
_U32 = struct.Struct(">I")
_MAX_U32 = 0xFFFF_FFFF


class Kind(IntEnum):
    """The u8 frame kind."""

    REQUEST = 1
    RESPONSE = 2
    STREAM_ITEM = 3
    STREAM_END = 4
    ERROR = 5
    CANCEL = 6
    CREDIT = 7
    PING = 8
    PONG = 9
    AUTH = 10
    REQUEST_AS = 11


class FrameError(InvalidArgument):
    """The byte stream broke the frame format; the connection can no longer be trusted."""


class Frame(NamedTuple):
    """One received frame. ``kind`` is an int so unknown kinds survive to be reported."""

    kind: int
    request_id: int
    body: bytes


class Request(NamedTuple):
    """The parsed body of a REQUEST (or REQUEST_AS) frame; ``on_behalf`` is the principal a
    REQUEST_AS names, None for a REQUEST."""

    window: int
    method: str
    payload: memoryview
    on_behalf: str | None = None


class Hello(NamedTuple):
    magic: bytes
    version: int
    max_frame: int


def encode_hello(max_frame: int, version: int = PROTOCOL_VERSION) -> bytes:
    return _HELLO.pack(MAGIC, version, max_frame)


def decode_hello(data: bytes) -> Hello:
    magic, version, max_frame = _HELLO.unpack(data)
    return Hello(magic, version, max_frame)


def check_hello(hello: Hello, *, peer: str, peer_role: str, versions: Versions = SPOKEN) -> int:
    """The protocol version of a connection whose peer sent ``hello``, when this side speaks
    ``versions`` (versions.negotiate); a clear error unless ``hello`` is a tabletstore hello of
    a version both sides speak.

    ``peer_role`` is "client" or "server", used to word the message from our side.
    """
    if hello.magic != MAGIC:
        raise FrameError(
            f"bad handshake from {peer_role} {peer}: expected magic {MAGIC!r}, got "
            f"{hello.magic!r}; is it a tabletstore RPC {peer_role}?"
        )
    version = negotiate(versions, hello.version, peer=peer, peer_role=peer_role)
    if hello.max_frame < 1024:
        raise FrameError(f"{peer_role} {peer} advertised a max frame of {hello.max_frame} bytes")
    return version


def encode_frame(kind: int, request_id: int, body: bytes = b"") -> bytes:
    """One whole frame as a single bytes object (written with one ``write()`` call, so frames
    from concurrent tasks never interleave)."""
    return HEADER.pack(_KIND_AND_ID + len(body), kind, request_id) + body


def encode_request(
    request_id: int,
    method: str,
    payload: bytes,
    window: int = 0,
    *,
    on_behalf: str | None = None,
) -> bytes:
    """A REQUEST frame; with ``on_behalf``, a REQUEST_AS frame naming that principal."""
    name = method.encode()
    if not name or len(name) > 255:
        raise InvalidArgument(f"RPC method name must be 1..255 bytes of UTF-8, got {method!r}")
    if not 0 <= window <= _MAX_U32:
        raise InvalidArgument(f"stream window must fit in a u32, got {window}")
    body = _REQUEST_HEAD.pack(window, len(name)) + name + payload
    if on_behalf is None:
        return encode_frame(Kind.REQUEST, request_id, body)
    who = on_behalf.encode()
    if not who or len(who) > 255:
        raise InvalidArgument(
            f"a delegated principal must be 1..255 bytes of UTF-8, got {on_behalf!r}"
        )
    return encode_frame(Kind.REQUEST_AS, request_id, bytes([len(who)]) + who + body)


def parse_request_as(body: bytes) -> Request:
    """Split a REQUEST_AS body. Raises InvalidArgument (this request only) if malformed."""
    n = body[0] if body else 0
    if n == 0 or 1 + n > len(body):
        raise InvalidArgument(f"malformed REQUEST_AS: principal of {n} bytes in {len(body)}")
    try:
        who = bytes(body[1 : 1 + n]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument("malformed REQUEST_AS: principal name is not UTF-8") from exc
    return parse_request(memoryview(body)[1 + n :])._replace(on_behalf=who)


def parse_request(body: bytes | memoryview) -> Request:
    """Split a REQUEST body. Raises InvalidArgument (this request only) if it is malformed."""
    if len(body) < _REQUEST_HEAD.size:
        raise InvalidArgument(f"malformed REQUEST: body of {len(body)} bytes has no method")
    window, n = _REQUEST_HEAD.unpack_from(body)
    end = _REQUEST_HEAD.size + n
    if n == 0 or end > len(body):
        raise InvalidArgument(
            f"malformed REQUEST: method name of {n} bytes in a body of {len(body)} bytes"
        )
    view = memoryview(body)
    try:
        method = str(view[_REQUEST_HEAD.size : end], "utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument("malformed REQUEST: method name is not UTF-8") from exc
    return Request(window, method, view[end:])


def encode_credit(request_id: int, n: int) -> bytes:
    return encode_frame(Kind.CREDIT, request_id, _U32.pack(n))


def decode_credit(body: bytes) -> int:
    if len(body) != _U32.size:
        raise InvalidArgument(f"malformed CREDIT: body of {len(body)} bytes, expected 4")
    n: int = _U32.unpack(body)[0]
    return n


class FrameParser:
    """Sans-I/O reader: feed it the bytes received, get back the peer's hello, then frames.

    After it raises FrameError the stream cannot be trusted and the parser must not be fed
    again. A frame's bytes are kept until the whole frame has arrived, so a frame costs at
    most ``max_frame`` bytes of buffer however it is split across reads. The body of a frame
    of ``_BIG_FRAME`` bytes or more is kept as the list of the reads that brought it and joined
    once, when complete: one allocation of its size, never a buffer grown (and copied) read by
    read, which fragments the allocator's heap into far more memory than the frames hold.
    """

    __slots__ = ("_big", "_buffer", "_max_frame", "hello")

    def __init__(self, max_frame: int) -> None:
        self._max_frame = max_frame
        self._big: _BigFrame | None = None
        self._buffer = bytearray()
        #: The peer's hello once received (None before). A wrong magic is reported as soon as
        #: four bytes are in, with version and max frame 0, so check_hello names the problem.
        self.hello: Hello | None = None

    def feed_hello(self, data: bytes) -> Hello | None:
        """Consume the hello from ``data``; None while it is incomplete. Bytes after it stay
        buffered for ``feed``."""
        buffer = self._buffer
        buffer += data
        if len(buffer) >= len(MAGIC) and buffer[: len(MAGIC)] != MAGIC:
            self.hello = Hello(bytes(buffer[: len(MAGIC)]), 0, 0)
        elif len(buffer) >= HELLO_SIZE:
            self.hello = decode_hello(bytes(buffer[:HELLO_SIZE]))
            del buffer[:HELLO_SIZE]
        return self.hello

    def discard(self) -> None:
        """Drop whatever is buffered (the connection is gone). Its bytes are freed now, not
        whenever the garbage collector breaks the connection's reference cycles."""
        self._buffer = bytearray()
        self._big = None

    @property
    def partial(self) -> tuple[int, int]:
        """The frame in progress: (its declared length, 0 before the 4-byte length field has
        arrived; the bytes of it buffered). (0, 0) between frames."""
        big = self._big
        if big is not None:
            return big.need + _KIND_AND_ID, big.have + HEADER.size
        buffer = self._buffer
        if self.hello is not None and len(buffer) >= _LENGTH.size:
            length: int = _LENGTH.unpack_from(buffer)[0]
            return length, len(buffer)
        return 0, len(buffer)

    def feed(self, data: bytes) -> list[Frame]:
        """Every frame completed by ``data``, in order. Raises FrameError for a length out of
        bounds (too large for ``max_frame``, or shorter than the header)."""
        frames: list[Frame] = []
        while self._big is not None:
            frame, data = self._big.feed(data)
            if frame is None:
                return frames
            self._big = None
            frames.append(frame)
        buffer = self._buffer
        if not buffer:
            # The common case: parse straight from the bytes received, buffer only the tail.
            more, used = self._parse(data)
            if used < len(data):
                buffer += memoryview(data)[used:]
        else:
            buffer += data
            with memoryview(buffer) as view:  # released before the buffer is resized below
                more, used = self._parse(view)
            del buffer[:used]
        frames += more
        if len(buffer) >= HEADER.size:
            length, kind, request_id = HEADER.unpack_from(buffer)
            if length >= _BIG_FRAME:  # (_parse checked it against max_frame)
                self._big = _BigFrame(kind, request_id, length - _KIND_AND_ID, buffer)
                buffer.clear()
        return frames

    def _parse(self, data: bytes | memoryview) -> tuple[list[Frame], int]:
        frames: list[Frame] = []
        size = len(data)
        pos = 0
        while size - pos >= HEADER.size:
            length, kind, request_id = HEADER.unpack_from(data, pos)
            if length > self._max_frame:
                raise FrameError(
                    f"frame of {length} bytes exceeds the {format_size(self._max_frame)} limit"
                )
            if length < _KIND_AND_ID:
                raise FrameError(
                    f"malformed frame: length {length} is shorter than the "
                    f"{_KIND_AND_ID}-byte header"
                )
            end = pos + _LENGTH.size + length
            if end > size:
                break
            frames.append(Frame(kind, request_id, bytes(data[pos + HEADER.size : end])))
            pos = end
        return frames, pos


#: Frames at least this long are received as a list of reads, joined once (FrameParser).
_BIG_FRAME = 1 << 20


class _BigFrame:
    """A large frame being received: the reads that brought its body so far."""

    __slots__ = ("chunks", "have", "kind", "need", "request_id")

    def __init__(self, kind: int, request_id: int, need: int, start: bytearray) -> None:
        self.kind = kind
        self.request_id = request_id
        self.need = need  # bytes of body
        body = bytes(start[HEADER.size :])
        self.chunks = [body] if body else []
        self.have = len(body)

    def feed(self, data: bytes) -> tuple[Frame | None, bytes]:
        """The frame once ``data`` completes it, and what of ``data`` follows it."""
        take = min(len(data), self.need - self.have)
        if take:
            self.chunks.append(data if take == len(data) else data[:take])
            self.have += take
        if self.have < self.need:
            return None, b""
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        return Frame(self.kind, self.request_id, body), data[take:]


def check_outgoing(size: int, peer_max_frame: int, what: str) -> None:
    """Refuse to send a body the peer would reject as oversized (a local, clear error)."""
    if size + _KIND_AND_ID > peer_max_frame:
        raise InvalidArgument(
            f"{what} of {size} bytes exceeds the peer's {format_size(peer_max_frame)} frame limit"
        )
