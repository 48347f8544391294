"""ReadRows response encoding: rows as the chunk stream the Bigtable API specifies (§3).

``google.bigtable.v2.ReadRowsResponse`` carries a row as a sequence of ``CellChunk`` messages
that clients reassemble with a strict state machine (the official clients reject any stream
that breaks it). The rules this encoder keeps, from ``bigtable.proto``:

* Rows are sent whole and in strictly increasing key order; the last chunk of a row has
  ``commit_row`` set. A response holds either several whole small rows, up to
  ``max_rows_bytes`` of them in all (as Cloud Bigtable itself packs them: a stream of small
  rows then costs one message per ``max_rows_bytes``, not one per row), or a part of one row:
  a row larger than ``max_rows_bytes`` goes out alone, in responses of at most
  ``max_response_bytes``. A stream cut anywhere loses at most one response's worth of work,
  and a client's resume point (the last committed key) is never more than one message
  behind. ``max_rows_bytes`` 0 sends one response per row, as Google's emulator does.
* The first chunk of every response carries its row's key, even mid-row. The API lets a
  response continue the previous one's row with an empty key, but google-cloud-bigtable's
  Python client (2.50) compares each response's first key with the last committed row and
  rejects an empty one; a repeated key equal to the row's own is accepted by every client.
* The first chunk of a row carries ``row_key``, ``family_name`` and ``qualifier``; later
  chunks carry ``family_name`` only when the family changes (and then ``qualifier`` too), and
  ``qualifier`` only when the column changes. Every cell's first chunk carries its
  ``timestamp_micros`` and ``labels``.
* A value longer than ``max_value_chunk`` is split: every chunk of the cell but the last sets
  ``value_size`` to the whole value's length; the continuation chunks carry only ``value``
  (and ``value_size``), never the key, family, qualifier, timestamp or labels.

The encoder never sends ``reset_row``: rows are committed only after they are complete.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tabletstore.bigtable_api.translate import ReadRowsResponsePB
from tabletstore.data.model import Row

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_MAX_ROWS_BYTES",
    "DEFAULT_MAX_VALUE_CHUNK",
    "ChunkEncoder",
    "row_chunks",
    "whole_row_response",
]

#: Values longer than this are split across chunks (the service uses about 1 MiB too).
DEFAULT_MAX_VALUE_CHUNK = 1024 * 1024
#: A response holds at most one row, and at most this many value and key bytes of it (or one
#: chunk, if that is more).
DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024
#: Small rows share a response up to this many serialized bytes (the front door's default; a
#: ChunkEncoder's own default is 0, one response per row).
DEFAULT_MAX_ROWS_BYTES = 64 * 1024

CellChunkPB: Any = ReadRowsResponsePB.CellChunk


def row_chunks(row: Row, *, max_value_chunk: int = DEFAULT_MAX_VALUE_CHUNK) -> list[Any]:
    """The chunks of one row. REQUIRES: ``row.cells`` non-empty and in row order
    (family asc, qualifier asc, timestamp desc), as tabletstore reads return them."""
    if not row.cells:
        raise ValueError(f"row {row.key[:64]!r} has no cells to encode")
    if max_value_chunk < 1:
        raise ValueError(f"max_value_chunk must be >= 1, got {max_value_chunk}")
    chunks: list[Any] = []
    family: str | None = None
    qualifier: bytes | None = None
    for cell in row.cells:
        chunk = CellChunkPB(timestamp_micros=cell.timestamp)
        if cell.labels:
            chunk.labels.extend(cell.labels)
        if not chunks:
            chunk.row_key = row.key
        if cell.family != family:
            family, qualifier = cell.family, None
            chunk.family_name.value = cell.family
        if cell.qualifier != qualifier:
            qualifier = cell.qualifier
            chunk.qualifier.value = cell.qualifier
        value = cell.value
        if len(value) <= max_value_chunk:
            chunk.value = value
            chunks.append(chunk)
            continue
        size = len(value)
        chunk.value = value[:max_value_chunk]
        chunk.value_size = size
        chunks.append(chunk)
        for offset in range(max_value_chunk, size, max_value_chunk):
            part = value[offset : offset + max_value_chunk]
            last = offset + max_value_chunk >= size
            chunks.append(CellChunkPB(value=part, value_size=0 if last else size))
    chunks[-1].commit_row = True
    return chunks


def _chunk_bytes(chunk: Any) -> int:
    return len(chunk.row_key) + len(chunk.qualifier.value) + len(chunk.value) + 16


def whole_row_response(row: Row, max_value_chunk: int, max_response_bytes: int) -> Any | None:
    """The fast path of the common case: ``row`` as one response of its chunks, built in place
    (no value longer than ``max_value_chunk``, at most ``max_response_bytes``). None when it
    does not fit (a :class:`ChunkEncoder` then cuts it into several)."""
    key_bytes = len(row.key) + 16  # counted per chunk, as ChunkEncoder.add does
    size = 0
    for cell in row.cells:
        n = len(cell.value)
        if n > max_value_chunk:
            return None
        size += n + len(cell.qualifier) + key_bytes
    if size > max_response_bytes or not row.cells:
        return None
    resp = ReadRowsResponsePB()
    add = resp.chunks.add
    family: str | None = None
    qualifier: bytes | None = None
    chunk: Any = None
    for cell in row.cells:
        chunk = add(timestamp_micros=cell.timestamp, value=cell.value)
        if family is None:
            chunk.row_key = row.key
        if cell.family != family:
            family, qualifier = cell.family, None
            chunk.family_name.value = cell.family
        if cell.qualifier != qualifier:
            qualifier = cell.qualifier
            chunk.qualifier.value = cell.qualifier
        if cell.labels:
            chunk.labels.extend(cell.labels)
    chunk.commit_row = True
    return resp


class ChunkEncoder:
    """Cuts rows into ReadRowsResponse messages: whole small rows packed together up to
    ``max_rows_bytes`` (serialized), or one row per response when that is 0; a row larger
    than that in responses of at most ``max_response_bytes``.

    ``add(row)`` yields the responses filled up meanwhile: response messages, or -- packed
    rows -- an already serialized response (``bytes``; the front door's serializers pass
    bytes through). ``flush()`` returns the last, partly filled one (None if nothing is
    pending): call it when the rows end, and before sending anything else on the stream.
    """

    def __init__(
        self,
        *,
        max_value_chunk: int = DEFAULT_MAX_VALUE_CHUNK,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_rows_bytes: int = 0,
    ) -> None:
        if max_rows_bytes < 0:
            raise ValueError(f"max_rows_bytes must be >= 0, got {max_rows_bytes}")
        self._max_value_chunk = max_value_chunk
        self._max_response_bytes = max_response_bytes
        self._max_rows_bytes = min(max_rows_bytes, max_response_bytes)
        self._pending: Any = ReadRowsResponsePB()
        self._pending_bytes = 0
        #: Serialized whole rows waiting to go out together (each a run of ``chunks`` fields:
        #: their concatenation is the serialized response holding them all).
        self._packed: list[bytes] = []
        self._packed_bytes = 0

    def add(self, row: Row) -> Iterator[Any]:
        """Encode ``row``; yield every response filled up meanwhile (see the class)."""
        if self._max_rows_bytes:
            whole = self._whole_row(row)
            if whole is not None:
                data: bytes = whole.SerializeToString()
                if len(data) <= self._max_rows_bytes:
                    if self._packed_bytes + len(data) > self._max_rows_bytes:
                        yield self._take_packed()
                    self._packed.append(data)
                    self._packed_bytes += len(data)
                    return
            if self._packed:
                yield self._take_packed()
            if whole is not None:
                yield whole
                return
        yield from self._add_alone(row)

    def _take_packed(self) -> bytes:
        out = b"".join(self._packed)
        self._packed.clear()
        self._packed_bytes = 0
        return out

    def _add_alone(self, row: Row) -> Iterator[Any]:
        """Encode ``row``; yield every response filled up meanwhile. A response is sent before
        a chunk would take it past ``max_response_bytes``, so none is larger than that or than
        one chunk (``max_value_chunk`` of value and the cell's names): gRPC clients receive
        4 MiB messages by default, and a row of any size arrives in messages of this size.
        The row's last response is sent at once: the next row starts a new one."""
        if not self._pending.chunks:
            whole = self._whole_row(row)
            if whole is not None:
                yield whole
                return
        for chunk in row_chunks(row, max_value_chunk=self._max_value_chunk):
            size = _chunk_bytes(chunk) + (0 if chunk.row_key else len(row.key))
            if self._pending.chunks and self._pending_bytes + size > self._max_response_bytes:
                yield self._take()
            if not self._pending.chunks:
                # The official clients read each response's first chunk as the key of the row
                # it continues, so a response that starts mid-row repeats the row key.
                chunk.row_key = row.key
            self._pending.chunks.append(chunk)
            self._pending_bytes += size
            if chunk.commit_row or self._pending_bytes >= self._max_response_bytes:
                yield self._take()

    def _whole_row(self, row: Row) -> Any | None:
        return whole_row_response(row, self._max_value_chunk, self._max_response_bytes)

    def flush(self) -> Any | None:
        """The partially filled response (a message, or packed rows' serialized bytes), or
        None if nothing is pending."""
        if self._packed:
            return self._take_packed()
        return self._take() if self._pending.chunks else None

    def _take(self) -> Any:
        out, self._pending, self._pending_bytes = self._pending, ReadRowsResponsePB(), 0
        return out
