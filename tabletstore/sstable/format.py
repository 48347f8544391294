"""The SSTable format: a plain Parquet file plus tabletstore's footer metadata (§4, §6).

An SSTable is "a persistent, ordered immutable map from keys to values" stored as "a sequence of
blocks" with "a block index (stored at the end of the SSTable) ... used to locate blocks"
(§4). Here it is one Parquet object: any Parquet reader (pyarrow, DuckDB, Spark) reads its
cells; tabletstore's reader uses the extra footer metadata to serve a point read with one
ranged GET. This docstring is the specification; ``tests/golden/test_sstable_golden.py`` pins
it. A change of the bytes bumps :data:`FORMAT_VERSION` and edits both in the same commit.

Object layout::

    "PAR1"
    block 0 | block 1 | ... | block n-1       one Parquet row group each, contiguous
    trailer (16 bytes)                        tabletstore's footer checksum, see below
    Parquet footer (thrift FileMetaData)      schema, row groups, key-value metadata
    u32 LE footer length, "PAR1"

The trailer sits in the gap Parquet allows between the last row group and the footer (readers
find row groups through the footer's offsets), so the file stays plain Parquet.

Columns (one row per cell, cells sorted by ``keys.cell_sort_key``; no nulls)::

    row        BYTE_ARRAY                    row key
    family     BYTE_ARRAY (UTF8), dictionary  column family ("" for DELETE_ROW)
    qualifier  BYTE_ARRAY                    column qualifier
    ts         INT64                         timestamp, microseconds
    seq        INT64                         the tablet server's sequence number
    kind       INT32 (INT(8, signed))        keys.CellKind (0-7; 4-7 aggregate parts)
    value      BYTE_ARRAY                    the value (deletion entries: see keys.py)

Format versions. **1**: every column chunk is Parquet's choice of pages (``family``
dictionary encoded); a point read fetches and decodes a whole block. **2** (the default): the
columns are PLAIN encoded without dictionaries and every column chunk is cut into data pages
of exactly ``page_cells`` cells (the last page of a block holds the rest), so page ``j`` of
every column covers the same cells; ``page_cells`` is chosen per SSTable for pages of about
8 KiB of raw cells (``pages.page_cells_for``, from the first cells written). The page index in
the footer says where each page's bytes are: a point read fetches and decodes one page of each
column (``pages.py`` is the specification of the pages and their index). Both versions are
plain Parquet with the same schema; any Parquet reader reads either.

Blocks: the writer closes a row group once the raw size of its cells (``len(row) +
len(family) + len(qualifier) + len(value) + 17``, :func:`cell_raw_size`) reaches the block
size (default 64 KiB, per locality group), so a block holds at least one cell and a row's cells
may span blocks. Compression is a Parquet codec per locality group: zstd (default), lz4
(LZ4_RAW), snappy, none. Statistics are written for ``row`` only (for engines' pushdown).

Footer key-value metadata (all values ASCII; binary values are standard base64)::

    tabletstore.format_version  "2" (this build writes 2, reads 1 and 2)
    tabletstore.locality_group  the locality group's name
    tabletstore.compression     "zstd" | "lz4" | "snappy" | "none"
    tabletstore.block_size      target block bytes, decimal
    tabletstore.cells           number of cells, decimal
    tabletstore.rows            number of distinct rows, decimal
    tabletstore.kind_counts     cells per CellKind 0..3, "put,delete_column,delete_family,delete_row"
                                (aggregate cells, kinds 4-7, are counted in ``cells`` only)
    tabletstore.seq_range       "min,max" of seq (both 0 when there are no cells)
    tabletstore.first_row       base64 of the first row key ("" when empty)
    tabletstore.last_row        base64 of the last row key ("" when empty)
    tabletstore.block_index     base64 of the block index (below)
    tabletstore.row_bloom       base64 of a bloom.BloomFilter over distinct row keys
    tabletstore.column_bloom    optional; base64 of a BloomFilter over :func:`column_bloom_key`
    tabletstore.pages           format 2 only; base64 of the zstd-compressed page index (``pages.py``)

Block index (little endian)::

    u32 block count
    per block:
      u64 offset    byte offset of the row group in the object
      u32 length    bytes of the row group (its column chunks, contiguous)
      u32 cells     cells in the block (= the row group's num_rows)
      u32 crc32c    CRC-32C (Castagnoli) of the block's ``length`` bytes
      u32 n, n bytes   the block's first row key
      u32 n, n bytes   the block's last row key

So a point read needs only the in-memory index to issue ``GET bytes=offset..offset+length-1``,
and verifies the block before decoding it.

Trailer (16 bytes, little endian)::

    8 bytes  magic "TSSTFT01"
    u32      footer length (must equal the Parquet footer length field)
    u32      crc32c of the Parquet footer bytes followed by its u32 length

The trailer's checksum covers the whole Parquet footer (our key-value metadata included), so
any damage to the footer is a :class:`~tabletstore.errors.Corruption`, as is any mismatch
between the footer's row groups and the block index.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import crc32c
import pyarrow as pa
import pyarrow.parquet as pq

from tabletstore.errors import Corruption, InvalidArgument, Unimplemented
from tabletstore.sstable.bloom import BloomFilter
from tabletstore.sstable.pages import PageIndex, decode_page_index, encode_page_index

__all__ = [
    "CELL_OVERHEAD",
    "COMPRESSIONS",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_TAIL_GUESS",
    "FORMAT_VERSION",
    "MAGIC",
    "META_PREFIX",
    "READABLE_VERSIONS",
    "SCHEMA",
    "TRAILER_SIZE",
    "BlockHandle",
    "Compression",
    "Footer",
    "ParsedFooter",
    "cell_raw_size",
    "column_bloom_key",
    "decode_block_index",
    "decode_footer",
    "encode_block_index",
    "encode_footer",
    "encode_trailer",
    "footer_length",
    "parquet_block_ranges",
    "parse_tail",
    "tail_length",
]

FORMAT_VERSION: Final = 2
#: Format versions this build reads (1: no page index; 2: pages, see ``pages.py``).
READABLE_VERSIONS: Final = (1, 2)
META_PREFIX: Final = "tabletstore."
DEFAULT_BLOCK_SIZE: Final = 64 * 1024
#: How many tail bytes ``SSTable.open`` fetches when it does not know the footer's size.
DEFAULT_TAIL_GUESS: Final = 64 * 1024

Compression = Literal["zstd", "lz4", "snappy", "none"]
#: tabletstore's compression names -> pyarrow's Parquet codec names.
COMPRESSIONS: Final[Mapping[str, str]] = {
    "zstd": "zstd",
    "lz4": "lz4",
    "snappy": "snappy",
    "none": "none",
}

SCHEMA: Final = pa.schema(
    [
        pa.field("row", pa.binary(), nullable=False),
        pa.field("family", pa.string(), nullable=False),
        pa.field("qualifier", pa.binary(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("kind", pa.int8(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
    ]
)
#: Fixed bytes per cell in :func:`cell_raw_size`: ts, seq and kind.
CELL_OVERHEAD: Final = 17

MAGIC: Final = b"TSSTFT01"
_TRAILER = struct.Struct("<8sII")
TRAILER_SIZE: Final = _TRAILER.size
_PARQUET_MAGIC = b"PAR1"
_PARQUET_TAIL = 8  # u32 footer length + "PAR1"

_K_VERSION = META_PREFIX + "format_version"
_K_GROUP = META_PREFIX + "locality_group"
_K_COMPRESSION = META_PREFIX + "compression"
_K_BLOCK_SIZE = META_PREFIX + "block_size"
_K_CELLS = META_PREFIX + "cells"
_K_ROWS = META_PREFIX + "rows"
_K_KINDS = META_PREFIX + "kind_counts"
_K_SEQ = META_PREFIX + "seq_range"
_K_FIRST = META_PREFIX + "first_row"
_K_LAST = META_PREFIX + "last_row"
_K_INDEX = META_PREFIX + "block_index"
_K_ROW_BLOOM = META_PREFIX + "row_bloom"
_K_COLUMN_BLOOM = META_PREFIX + "column_bloom"
_K_PAGES = META_PREFIX + "pages"

_BLOCK_FIXED = struct.Struct("<QIII")
_U32 = struct.Struct("<I")


def cell_raw_size(row: bytes, family: str, qualifier: bytes, value: bytes) -> int:
    """The bytes a cell counts toward its block's size (see the module docstring)."""
    return len(row) + len(family.encode()) + len(qualifier) + len(value) + CELL_OVERHEAD


def column_bloom_key(row: bytes, family: str, qualifier: bytes) -> bytes:
    """The key of a (row, family:qualifier) in the column bloom filter: length-prefixed row,
    then family, NUL, qualifier (family names never contain NUL, so this is unambiguous)."""
    return _U32.pack(len(row)) + row + family.encode() + b"\0" + qualifier


@dataclass(frozen=True, slots=True)
class BlockHandle:
    """Where one block is and what it holds: one entry of the block index."""

    offset: int
    length: int
    cells: int
    crc32c: int
    first_row: bytes
    last_row: bytes


@dataclass(frozen=True, slots=True)
class Footer:
    """tabletstore's footer metadata, decoded (see the module docstring)."""

    format_version: int
    locality_group: str
    compression: str
    block_size: int
    cells: int
    rows: int
    kind_counts: tuple[int, int, int, int]
    min_seq: int
    max_seq: int
    first_row: bytes
    last_row: bytes
    blocks: tuple[BlockHandle, ...]
    row_bloom: BloomFilter
    column_bloom: BloomFilter | None = None
    #: Format 2: where every page of every block is (``pages.py``); None in format 1.
    pages: PageIndex | None = None


def encode_block_index(blocks: tuple[BlockHandle, ...]) -> bytes:
    """The block index bytes (see the module docstring)."""
    parts = [_U32.pack(len(blocks))]
    for b in blocks:
        parts.append(_BLOCK_FIXED.pack(b.offset, b.length, b.cells, b.crc32c))
        parts += (_U32.pack(len(b.first_row)), b.first_row, _U32.pack(len(b.last_row)), b.last_row)
    return b"".join(parts)


def decode_block_index(data: bytes) -> tuple[BlockHandle, ...]:
    """Inverse of :func:`encode_block_index`; Corruption on malformed bytes."""
    try:
        (count,) = _U32.unpack_from(data, 0)
        pos = _U32.size
        blocks = []
        for _ in range(count):
            offset, length, cells, crc = _BLOCK_FIXED.unpack_from(data, pos)
            pos += _BLOCK_FIXED.size
            first, pos = _read_bytes(data, pos)
            last, pos = _read_bytes(data, pos)
            blocks.append(BlockHandle(offset, length, cells, crc, first, last))
    except struct.error as exc:
        raise Corruption(f"block index is truncated: {exc}") from exc
    if pos != len(data):
        raise Corruption(f"block index has {len(data) - pos} trailing bytes")
    return tuple(blocks)


def _read_bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = _U32.unpack_from(data, pos)
    pos += _U32.size
    if pos + n > len(data):
        raise struct.error(f"a {n}-byte key runs past the end")
    return data[pos : pos + n], pos + n


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode_footer(footer: Footer) -> dict[str, str]:
    """The footer key-value metadata entries (see the module docstring)."""
    kv = {
        _K_VERSION: str(footer.format_version),
        _K_GROUP: footer.locality_group,
        _K_COMPRESSION: footer.compression,
        _K_BLOCK_SIZE: str(footer.block_size),
        _K_CELLS: str(footer.cells),
        _K_ROWS: str(footer.rows),
        _K_KINDS: ",".join(map(str, footer.kind_counts)),
        _K_SEQ: f"{footer.min_seq},{footer.max_seq}",
        _K_FIRST: _b64(footer.first_row),
        _K_LAST: _b64(footer.last_row),
        _K_INDEX: _b64(encode_block_index(footer.blocks)),
        _K_ROW_BLOOM: _b64(footer.row_bloom.to_bytes()),
    }
    if footer.column_bloom is not None:
        kv[_K_COLUMN_BLOOM] = _b64(footer.column_bloom.to_bytes())
    if footer.pages is not None:
        kv[_K_PAGES] = _b64(encode_page_index(footer.pages))
    return kv


def decode_footer(kv: Mapping[bytes, bytes]) -> Footer:
    """Inverse of :func:`encode_footer` over a Parquet file's key-value metadata.

    Corruption when an entry is missing or malformed; Unimplemented for a newer format version.
    """
    meta = {k.decode("utf-8", "replace"): v for k, v in kv.items()}
    try:
        version = int(_need(meta, _K_VERSION))
        if version not in READABLE_VERSIONS:
            raise Unimplemented(
                f"SSTable format version {version} is not supported (this build reads "
                f"versions {', '.join(map(str, READABLE_VERSIONS))}); upgrade tabletstore"
            )
        kinds = tuple(int(x) for x in _need(meta, _K_KINDS).split(b","))
        min_seq, max_seq = (int(x) for x in _need(meta, _K_SEQ).split(b","))
        if len(kinds) != 4:
            raise ValueError(f"{_K_KINDS} has {len(kinds)} counts, not 4")
        column_bloom = meta.get(_K_COLUMN_BLOOM)
        blocks = decode_block_index(_unb64(_need(meta, _K_INDEX)))
        pages = (
            None
            if version < 2
            else decode_page_index(
                _unb64(_need(meta, _K_PAGES)), [(b.length, b.cells) for b in blocks]
            )
        )
        return Footer(
            format_version=version,
            locality_group=_need(meta, _K_GROUP).decode(),
            compression=_need(meta, _K_COMPRESSION).decode(),
            block_size=int(_need(meta, _K_BLOCK_SIZE)),
            cells=int(_need(meta, _K_CELLS)),
            rows=int(_need(meta, _K_ROWS)),
            kind_counts=(kinds[0], kinds[1], kinds[2], kinds[3]),
            min_seq=min_seq,
            max_seq=max_seq,
            first_row=_unb64(_need(meta, _K_FIRST)),
            last_row=_unb64(_need(meta, _K_LAST)),
            blocks=blocks,
            row_bloom=BloomFilter.from_bytes(_unb64(_need(meta, _K_ROW_BLOOM))),
            column_bloom=None
            if column_bloom is None
            else BloomFilter.from_bytes(_unb64(column_bloom)),
            pages=pages,
        )
    except (ValueError, UnicodeDecodeError, binascii.Error) as exc:
        raise Corruption(f"SSTable footer metadata is malformed: {exc}") from exc


def _need(meta: Mapping[str, bytes], key: str) -> bytes:
    value = meta.get(key)
    if value is None:
        raise Corruption(f"SSTable footer lacks the {key!r} metadata entry")
    return value


def _unb64(value: bytes) -> bytes:
    return base64.b64decode(value, validate=True)


def encode_trailer(footer_and_length: bytes) -> bytes:
    """The 16-byte trailer for a Parquet footer given as its thrift bytes + u32 length."""
    return _TRAILER.pack(MAGIC, len(footer_and_length) - 4, crc32c.crc32c(footer_and_length))


def footer_length(tail: bytes) -> int:
    """The Parquet footer length from the last 8 bytes of an object; Corruption if they are
    not ``u32 length, "PAR1"``."""
    if len(tail) < _PARQUET_TAIL or tail[-4:] != _PARQUET_MAGIC:
        raise Corruption("object does not end with the Parquet magic 'PAR1'")
    (n,) = _U32.unpack_from(tail, len(tail) - _PARQUET_TAIL)
    return int(n)


def tail_length(footer_len: int) -> int:
    """Bytes at the end of the object that hold trailer, footer, length and magic."""
    return TRAILER_SIZE + footer_len + _PARQUET_TAIL


@dataclass(frozen=True, slots=True)
class ParsedFooter:
    """An opened SSTable's footer: Parquet's (for decoding row groups) and ours."""

    parquet: pq.FileMetaData
    footer: Footer
    #: Bytes from the trailer to the end of the object.
    tail_size: int


def parse_tail(tail: bytes, object_size: int) -> ParsedFooter:
    """Parse and verify the footer from the last ``len(tail)`` bytes of an object of
    ``object_size`` bytes. ``tail`` must hold at least :func:`tail_length` bytes.

    Corruption when the trailer's checksum fails, the Parquet footer does not parse, the schema
    is not :data:`SCHEMA`, or the row groups disagree with the block index.
    """
    flen = footer_length(tail)
    need = tail_length(flen)
    if need > object_size:
        raise Corruption(f"footer of {flen} bytes does not fit an object of {object_size} bytes")
    if len(tail) < need:
        raise InvalidArgument(f"parse_tail needs the last {need} bytes, got {len(tail)}")
    trailer = tail[len(tail) - need : len(tail) - need + TRAILER_SIZE]
    body = tail[len(tail) - need + TRAILER_SIZE : len(tail) - 4]
    magic, trailer_len, crc = _TRAILER.unpack(trailer)
    if magic != MAGIC:
        raise Corruption("the footer trailer's magic is wrong: not a tabletstore SSTable")
    if trailer_len != flen or crc != crc32c.crc32c(body):
        raise Corruption("the footer checksum does not match: the footer is corrupted")
    try:
        parquet = pq.read_metadata(pa.BufferReader(body + _PARQUET_MAGIC))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise Corruption(f"the Parquet footer does not parse: {exc}") from exc
    if not parquet.schema.to_arrow_schema().equals(SCHEMA):
        raise Corruption(f"SSTable schema is not tabletstore's: {parquet.schema.to_arrow_schema()}")
    footer = decode_footer(parquet.metadata or {})
    _check_consistent(parquet, footer, object_size - need)
    return ParsedFooter(parquet, footer, need)


def parquet_block_ranges(parquet: pq.FileMetaData) -> list[tuple[int, int]]:
    """``(offset, length)`` of every row group's column chunks, from Parquet's own metadata:
    from the first column chunk's start to the last one's end (the writer writes a row
    group's chunks contiguously in schema order; a chunk elsewhere fails its block's decode,
    which reads only inside the block's bytes). Two chunks' metadata per row group, not
    seven: opening an SSTable of many blocks spent most of its time here."""
    ranges = []
    for i in range(parquet.num_row_groups):
        rg = parquet.row_group(i)
        first, last = rg.column(0), rg.column(rg.num_columns - 1)
        lo = first.dictionary_page_offset if first.has_dictionary_page else first.data_page_offset
        start = last.dictionary_page_offset if last.has_dictionary_page else last.data_page_offset
        ranges.append((lo, start + last.total_compressed_size - lo))
    return ranges


def _check_consistent(parquet: pq.FileMetaData, footer: Footer, data_end: int) -> None:
    """The block index agrees with Parquet's row groups and tiles ``[4, data_end)``."""
    blocks = footer.blocks
    if parquet.num_row_groups != len(blocks):
        raise Corruption(
            f"footer has {parquet.num_row_groups} row groups but {len(blocks)} index entries"
        )
    expected_offset = len(_PARQUET_MAGIC)
    for i, ((offset, length), block) in enumerate(
        zip(parquet_block_ranges(parquet), blocks, strict=True)
    ):
        rows = parquet.row_group(i).num_rows
        if (offset, length, rows) != (block.offset, block.length, block.cells):
            raise Corruption(
                f"block {i}: index says offset={block.offset} length={block.length} "
                f"cells={block.cells}, Parquet says {offset}, {length}, {rows}"
            )
        if offset != expected_offset or block.first_row > block.last_row:
            raise Corruption(f"block {i} is out of place or its key range is inverted")
        if i and block.first_row < blocks[i - 1].last_row:
            raise Corruption(f"block {i} starts before block {i - 1} ends: blocks out of order")
        expected_offset = offset + length
    if expected_offset != data_end and blocks:
        raise Corruption(f"blocks end at {expected_offset}, the trailer starts at {data_end}")
    if sum(b.cells for b in blocks) != footer.cells or parquet.num_rows != footer.cells:
        raise Corruption("cell counts of the footer, the block index and Parquet disagree")
