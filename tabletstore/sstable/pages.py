"""SSTable pages: a point read fetches and decodes one small page, not a whole block (§4, §6).

§4 reads "the appropriate block from disk" for a lookup; with 64 KiB Parquet row groups that
means fetching and decoding 64 KiB for one value, and pyarrow's row-group decode costs a few
hundred microseconds whatever the size. Format version 2 cuts every block into *pages*: every
column chunk of a row group is written as Parquet data pages of exactly ``page_cells`` cells
(the last page of a block may hold fewer), so page ``j`` of every column covers the same cells.
The pages are ordinary Parquet DATA_PAGE (v1) pages, PLAIN encoded, no dictionary, compressed
with the SSTable's codec: the file stays plain Parquet. Where each page's bytes are is recorded
in the footer (``tabletstore.pages``, :func:`encode_page_index`), so a point read binary-searches
the pages' first rows, fetches the byte range holding that page of every column, verifies its
crc32c, and decodes only those few KiB here, without pyarrow's Parquet reader.

Page index (little endian; in the footer as base64 of one zstd frame of these bytes, with
the content size in its header)::

    u32 page_cells           cells per page (every page but the last of a block)
    u32 P                    number of pages (of all blocks, in order)
    P x 24 u32               per page: block index, then for each of the 7 columns
                             (schema order) the offset of the page's compressed data
                             relative to the block's offset, its compressed length and its
                             uncompressed length; then the crc32c of the 7 compressed pieces
                             in column order (one running checksum); then flags: bit 0 set
                             when the page's first row is the previous page's last row (a
                             row continued; only the pages of one block are compared)
    P x (u32 n, n bytes)     the page's first row key

The writer reads the page headers back (Thrift compact protocol, :func:`read_page_header`)
to build the index, and refuses to write a file whose pages are not aligned so.
"""

from __future__ import annotations

import re
import struct
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, overload

import crc32c
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from tabletstore.errors import Corruption
from tabletstore.keys import Cell

__all__ = [
    "COLUMNS",
    "CONTINUES",
    "DEFAULT_PAGE_BYTES",
    "Page",
    "PageHeader",
    "PageIndex",
    "decode_blocks_arrow",
    "decode_page_index",
    "decode_pages",
    "encode_page_index",
    "page_cells_for",
    "read_page_header",
]

#: Target raw bytes of one page (see :func:`page_cells_for`).
DEFAULT_PAGE_BYTES: Final = 8 * 1024
#: Columns of the SSTable schema.
COLUMNS: Final = 7
_MAX_PAGE_CELLS = 4096
_FIELDS = 1 + 3 * COLUMNS + 2
_CRC = 1 + 3 * COLUMNS
_FLAGS = _CRC + 1
#: The flag bit of a page whose first row continues from the previous page.
CONTINUES: Final = 1
_U32 = struct.Struct("<I")
#: Bytes charged to the block cache per cached cell (tuple and objects) on top of its bytes.
_CELL_OVERHEAD = 200

#: Parquet codec decoders by tabletstore compression name.
_CODECS: Final[dict[str, str]] = {"lz4": "lz4_raw", "snappy": "snappy"}


def page_cells_for(average_cell_bytes: float, page_bytes: int = DEFAULT_PAGE_BYTES) -> int:
    """Cells per page so that a page holds about ``page_bytes`` raw bytes."""
    return max(1, min(_MAX_PAGE_CELLS, int(page_bytes // max(1.0, average_cell_bytes))))


@dataclass(frozen=True, slots=True)
class PageIndex:
    """Where every page of an SSTable is (see the module docstring)."""

    page_cells: int
    #: (P, 24) uint32: block, 7 x (relative offset, compressed, uncompressed), crc32c, flags.
    table: npt.NDArray[np.uint32]
    first_rows: tuple[bytes, ...]
    #: ``block_starts[b]``: index of block b's first page; one extra entry at the end.
    block_starts: tuple[int, ...]
    #: Cells of each block.
    block_cells: tuple[int, ...]
    #: ``table`` flattened, as a memoryview: a page's entry as Python ints in one slice
    #: (:meth:`entry`; numpy's per-row ``tolist`` cost more than the rest of a span lookup).
    _flat: memoryview = field(init=False, repr=False, compare=False)
    #: Per page, where its bytes of every column start and end relative to its block
    #: (:meth:`span`), as int64 memoryviews: two lookups per point read, not a min and a max
    #: over the page's entry (~2 us).
    _starts: memoryview = field(init=False, repr=False, compare=False)
    _ends: memoryview = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        flat = np.ascontiguousarray(self.table, dtype=np.uint32).reshape(-1)
        object.__setattr__(self, "_flat", flat.data)
        pieces = flat.reshape(-1, _FIELDS)[:, 1:_CRC].reshape(-1, COLUMNS, 3).astype(np.int64)
        starts = pieces[:, :, 0].min(axis=1) if len(pieces) else np.zeros(0, np.int64)
        ends = (pieces[:, :, 0] + pieces[:, :, 1]).max(axis=1) if len(pieces) else starts
        object.__setattr__(self, "_starts", np.ascontiguousarray(starts, np.int64).data)
        object.__setattr__(self, "_ends", np.ascontiguousarray(ends, np.int64).data)

    def entry(self, page: int) -> list[int]:
        """Page ``page``'s row of ``table`` (block, 7 x (offset, compressed, size), crc,
        flags) as Python ints."""
        return self._flat[page * _FIELDS : (page + 1) * _FIELDS].tolist()

    @property
    def pages(self) -> int:
        return len(self.first_rows)

    def pages_for_row(self, block: int, row: bytes) -> range:
        """Pages of ``block`` that may hold cells of ``row`` (the caller knows the block
        holds ``row``'s range): from the last page starting before ``row`` (unless the next
        page starts with ``row`` and does not continue it) through the last page starting at
        or before it."""
        lo, hi = self.block_starts[block], self.block_starts[block + 1]
        rows = self.first_rows
        i = bisect_left(rows, row, lo, hi)
        first = i
        if i > lo and not (
            i < hi and rows[i] == row and not int(self.table[i, _FLAGS]) & CONTINUES
        ):
            first = i - 1
        last = bisect_right(rows, row, lo, hi)
        return range(first, max(first + 1, last))

    def cells_in_page(self, page: int) -> int:
        """Cells of ``page``: ``page_cells``, or the rest of its block for a block's last."""
        return self._cells_in(page, int(self.table[page, 0]))

    def _cells_in(self, page: int, block: int) -> int:
        start = self.block_starts[block]
        if page + 1 < self.block_starts[block + 1]:
            return self.page_cells
        return self.block_cells[block] - (page - start) * self.page_cells

    def span(self, pages: range) -> tuple[int, int]:
        """``(relative offset, length)`` in its block of the bytes holding ``pages`` of every
        column (REQUIRES: consecutive pages of one block)."""
        start: int = self._starts[pages.start]
        end: int = self._ends[pages.stop - 1]
        return start, end - start


def encode_page_index(index: PageIndex) -> bytes:
    """The page index as it sits in the footer (before base64): zstd of the layout above
    (small integers and sorted keys: ~9x smaller, so opening an SSTable reads less)."""
    parts = [_U32.pack(index.page_cells), _U32.pack(index.pages)]
    parts.append(index.table.astype("<u4").tobytes())
    for row in index.first_rows:
        parts += (_U32.pack(len(row)), row)
    raw = b"".join(parts)
    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)


def decode_page_index(compressed: bytes, blocks: Sequence[tuple[int, int]]) -> PageIndex:
    """Inverse of :func:`encode_page_index`, checked against the blocks' ``(length, cells)``;
    Corruption when the bytes are malformed or disagree with the blocks."""
    try:
        data = _zstd.context.decompress(compressed)
    except zstandard.ZstdError as exc:
        raise Corruption(f"page index is malformed: {exc}") from exc
    try:
        page_cells, count = struct.unpack_from("<II", data, 0)
        pos = 8
        size = count * _FIELDS * 4
        if page_cells < 1 or pos + size > len(data):
            raise struct.error("page table runs past the end")
        table = np.frombuffer(data, dtype="<u4", count=count * _FIELDS, offset=pos)
        table = table.reshape(count, _FIELDS).astype(np.uint32)
        pos += size
        rows = []
        for _ in range(count):
            (n,) = _U32.unpack_from(data, pos)
            pos += 4
            if pos + n > len(data):
                raise struct.error("a first row key runs past the end")
            rows.append(data[pos : pos + n])
            pos += n
    except (struct.error, ValueError) as exc:
        raise Corruption(f"page index is malformed: {exc}") from exc
    if pos != len(data):
        raise Corruption(f"page index has {len(data) - pos} trailing bytes")
    # Every block's pages, checked for all blocks at once (a loop per block was most of
    # opening an SSTable of many blocks).
    lengths = np.array([length for length, _ in blocks], dtype=np.int64)
    cells = np.array([c for _, c in blocks], dtype=np.int64)
    want = -(-cells // page_cells)
    starts_arr = np.concatenate([[0], np.cumsum(want)]).astype(np.int64)
    owner = np.repeat(np.arange(len(blocks)), want)
    if int(starts_arr[-1]) != count:
        raise Corruption(f"page index has {count} pages, the blocks need {int(starts_arr[-1])}")
    bad = np.flatnonzero(table[:, 0] != owner)
    if len(bad):
        b = int(owner[bad[0]])
        raise Corruption(f"page index disagrees with block {b}'s {int(cells[b])} cells")
    pieces = table[:, 1 : 1 + 3 * COLUMNS].reshape(count, COLUMNS, 3).astype(np.int64)
    ends = (pieces[:, :, 0] + pieces[:, :, 1]).max(axis=1) if count else np.zeros(0, np.int64)
    bad = np.flatnonzero(ends > lengths[owner])
    if len(bad):
        raise Corruption(f"page index points outside block {int(owner[bad[0]])}")
    starts = [int(x) for x in starts_arr]
    return PageIndex(page_cells, table, tuple(rows), tuple(starts), tuple(c for _, c in blocks))


# -- the writer's side: reading Parquet page headers back ----------------------------------


@dataclass(frozen=True, slots=True)
class PageHeader:
    """The fields of a Parquet PageHeader the page index needs."""

    header_length: int
    page_type: int
    uncompressed: int
    compressed: int
    num_values: int
    encoding: int


_DATA_PAGE = 0
_PLAIN = 0


def read_page_header(buf: bytes | memoryview, pos: int) -> PageHeader:
    """Parse the Thrift-compact PageHeader at ``pos`` (parquet.thrift: 1 type, 2
    uncompressed_page_size, 3 compressed_page_size, 5 data_page_header{1 num_values,
    2 encoding}); ValueError when malformed.

    One flat loop (a compaction reads back every page header it wrote): integers and
    binaries are read inline, structs keep a stack of field ids; a header holding a list or
    map (pyarrow writes none) goes through the general :class:`_Compact` reader."""
    if isinstance(buf, memoryview) and buf.format != "B":
        buf = buf.cast("B")  # a pyarrow Buffer's view is signed chars
    plain = _PLAIN_HEADER.match(buf, pos)  # type: ignore[call-overload]
    if plain is not None:
        type_, uncompressed, compressed, values = (_zigzag(g) for g in plain.groups())
        return PageHeader(plain.end() - pos, type_, uncompressed, compressed, values, _PLAIN)
    try:
        return _read_header_flat(buf, pos)
    except _NeedsGeneral:
        return _read_header_general(buf, pos)
    except IndexError as exc:
        raise ValueError("page header runs past the end of its column chunk") from exc


_VARINT = rb"([\x80-\xff]{0,4}[\x00-\x7f])"
#: The page header pyarrow writes for a PLAIN data page without statistics: type, sizes, then
#: data_page_header{num_values, encoding PLAIN, RLE, RLE, an empty statistics struct or none};
#: anything else goes through the loop below.
_PLAIN_HEADER = re.compile(
    rb"\x15"
    + _VARINT
    + rb"\x15"
    + _VARINT
    + rb"\x15"
    + _VARINT
    + rb"\x2c\x15"
    + _VARINT
    + rb"\x15\x00\x15\x06\x15\x06(?:\x1c\x00)?\x00\x00",
    re.DOTALL,
)


def _zigzag(data: bytes) -> int:
    if len(data) == 1:
        b = data[0]
        return (b >> 1) ^ -(b & 1)
    raw = 0
    for shift, b in enumerate(data):
        raw |= (b & 0x7F) << (7 * shift)
    return (raw >> 1) ^ -(raw & 1)


class _NeedsGeneral(Exception):
    """The flat page-header reader met a type it does not handle."""


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos + 1
        shift += 7
        if shift > 70:
            raise ValueError("varint too long")


def _read_header_flat(buf: bytes | memoryview, pos: int) -> PageHeader:
    start = pos
    header: dict[int, int] = {}
    data_page: dict[int, int] = {}
    stack: list[int] = []  # field ids of the enclosing structs
    fid = 0
    while True:
        head = buf[pos]
        pos += 1
        ftype = head & 0x0F
        if ftype == 0:
            if not stack:
                break
            fid = stack.pop()
            continue
        if head >> 4:
            fid += head >> 4
        else:
            raw, pos = _varint(buf, pos)
            fid = (raw >> 1) ^ -(raw & 1)
        if ftype in (4, 5, 6):
            raw, pos = _varint(buf, pos)
            if ftype == 5 and not stack and fid in (1, 2, 3):
                header[fid] = (raw >> 1) ^ -(raw & 1)
            elif ftype == 5 and stack == [5] and fid in (1, 2):
                data_page[fid] = (raw >> 1) ^ -(raw & 1)
        elif ftype == 8:
            length, pos = _varint(buf, pos)
            pos += length
        elif ftype == 12:
            stack.append(fid)
            fid = 0
        elif ftype == 3:
            pos += 1
        elif ftype == 7:
            pos += 8
        elif ftype not in (1, 2):
            raise _NeedsGeneral
    if pos > len(buf):
        raise ValueError("page header runs past the end of its column chunk")
    return _page_header(pos - start, header, data_page)


def _page_header(length: int, fields: dict[int, int], data_page: dict[int, int]) -> PageHeader:
    if not {1, 2, 3} <= fields.keys():
        raise ValueError(f"page header lacks fields {sorted({1, 2, 3} - fields.keys())}")
    return PageHeader(
        header_length=length,
        page_type=fields[1],
        uncompressed=fields[2],
        compressed=fields[3],
        num_values=data_page.get(1, -1),
        encoding=data_page.get(2, -1),
    )


def _read_header_general(buf: bytes | memoryview, pos: int) -> PageHeader:
    reader = _Compact(buf, pos)
    fields: dict[int, int] = {}
    data_page: dict[int, int] = {}

    def on_field(fid: int, ftype: int) -> bool:
        if fid in (1, 2, 3) and ftype == 5:
            fields[fid] = reader.zigzag()
            return True
        if fid == 5 and ftype == 12:
            reader.struct(lambda f, t: _int_field(reader, data_page, f, t, (1, 2)))
            return True
        return False

    reader.struct(on_field)
    return _page_header(reader.pos - pos, fields, data_page)


def _int_field(
    reader: _Compact, out: dict[int, int], fid: int, ftype: int, wanted: tuple[int, ...]
) -> bool:
    if fid in wanted and ftype == 5:
        out[fid] = reader.zigzag()
        return True
    return False


class _Compact:
    """Just enough of Thrift's compact protocol to read (and skip) a PageHeader."""

    def __init__(self, buf: bytes | memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise ValueError("page header runs past the end of its column chunk")
        b = self.buf[self.pos]
        self.pos += 1
        return int(b)

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise ValueError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def struct(self, on_field: Callable[[int, int], bool]) -> None:
        fid = 0
        while True:
            head = self.byte()
            ftype = head & 0x0F
            if ftype == 0:
                return
            delta = head >> 4
            fid = fid + delta if delta else self.zigzag()
            if not on_field(fid, ftype):
                self.skip(ftype)

    def skip(self, ftype: int) -> None:
        if ftype in (1, 2):  # booleans live in the type nibble
            return
        if ftype in (3,):
            self.pos += 1
        elif ftype in (4, 5, 6):
            self.varint()
        elif ftype == 7:
            self.pos += 8
        elif ftype == 8:
            length = self.varint()  # read before self.pos: ``+=`` would load it first
            self.pos += length
        elif ftype in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.skip(head & 0x0F)
        elif ftype == 11:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4)
                    self.skip(kv & 0x0F)
        elif ftype == 12:
            self.struct(lambda _f, _t: False)
        else:
            raise ValueError(f"unknown Thrift compact type {ftype}")
        if self.pos > len(self.buf):
            raise ValueError("page header runs past the end of its column chunk")


def chunk_pages(
    data: bytes | memoryview, start: int, end: int, cells: int, page_cells: int
) -> list[tuple[int, int, int]]:
    """``(data offset, compressed, uncompressed)`` of every data page of the column chunk in
    ``data[start:end]``; ValueError unless they are PLAIN DATA_PAGEs of ``page_cells`` cells
    each (the last: the rest)."""
    if isinstance(data, memoryview) and data.format != "B":
        data = data.cast("B")
    pages = []
    pos = start
    left = cells
    plain = _PLAIN_HEADER.match
    while pos < end:
        want = min(page_cells, left)
        # The headers pyarrow writes take the regex fast path (a writer reads back every
        # page header of every column: no object per page here).
        m = plain(data, pos)  # type: ignore[call-overload]
        if m is not None:
            type_, uncompressed, compressed, values = map(_zigzag, m.groups())
            if type_ == _DATA_PAGE and values == want:
                body = m.end()
                pages.append((body, compressed, uncompressed))
                pos = body + compressed
                left -= want
                continue
        header = read_page_header(data, pos)
        if (header.page_type, header.encoding, header.num_values) != (_DATA_PAGE, _PLAIN, want):
            raise ValueError(
                f"page at {pos} is type {header.page_type}, encoding {header.encoding}, "
                f"{header.num_values} values; expected a PLAIN data page of {want}"
            )
        body = pos + header.header_length
        pages.append((body, header.compressed, header.uncompressed))
        pos = body + header.compressed
        left -= want
    if pos != end or left:
        raise ValueError(
            f"column chunk pages end at {pos} (chunk ends at {end}), {left} cells left"
        )
    return pages


# -- the reader's side: one page decoded ----------------------------------------------------


class Page:
    """The cells of one page, or of every page of a block, decoded: what the block cache
    holds for a format-2 SSTable (point reads cache single pages; scans whole blocks, which
    decode here faster than through pyarrow's reader). Same reading interface as
    ``block.Block``.

    A page read ahead (:meth:`deferred`) is decoded on its first use: a point read's fetch
    that reads ahead to the end of its block pays for the pages it was asked for, not for the
    others (a random read that happens to follow a recent fetch reads ahead too).

    What the cyclic GC sees. A cached page is one tracked object: its columns are tuples of
    bytes, str and int (the GC untracks those at their first collection), values of one
    length stay in their page's buffer (a ``bytes``, sliced out when read: ``_vstep`` is
    their stride), and cells are made for each reader, never kept. Every full collection
    traverses every tracked object, and a worker's block cache holds hundreds of thousands of
    pages: with a list per column and a ``Cell`` kept per scanned value, a full collection of
    a worker holding 2 GB took 100-969 ms."""

    __slots__ = ("_cells", "_columns", "_decode", "_rows", "_vstep", "nbytes")

    def __init__(self, cells: list[Cell] | None, rows: Sequence[bytes], nbytes: int) -> None:
        """``rows``: the row key of each cell; ``nbytes``: what the block cache charges."""
        self._cells = cells
        self._rows = rows
        self.nbytes = nbytes
        #: The seven columns (schema order); the last is a ``bytes`` buffer of values of one
        #: length when ``_vstep`` (each value's length prefix and bytes) is not 0.
        self._columns: tuple[Sequence[Any], ...] | None = None
        self._vstep = 0
        self._decode: Callable[[], Page] | None = None

    @classmethod
    def of_columns(cls, columns: tuple[Sequence[Any], ...], nbytes: int) -> Page:
        """A page of the cells whose fields are ``columns`` (schema order), each
        :class:`Cell` made when read: a point read makes the one or two of its row, not
        every cell of the page."""
        page = cls(None, columns[0], nbytes)
        values = columns[6]
        if type(values) is _Fixed:
            page._vstep = values._step
            columns = (*columns[:6], values._buf)
        page._columns = columns
        return page

    @classmethod
    def deferred(cls, decode: Callable[[], Page], nbytes: int) -> Page:
        """A page ``decode()`` returns when first read (its Corruption raised then, to that
        reader); ``nbytes`` is what the decoded page will be charged."""
        page = cls(None, (), nbytes)
        page._decode = decode
        return page

    def _load(self) -> None:
        decode = self._decode
        if decode is not None:
            page = decode()
            # Fields before clearing _decode: a reader on another thread that sees _decode
            # None sees them all (decoding twice in a race is harmless).
            self._cells, self._columns, self._rows = page._cells, page._columns, page._rows
            self._vstep = page._vstep
            self._decode = None

    def _values(self, lo: int, hi: int) -> Sequence[bytes]:
        """Values ``lo`` to ``hi`` of a page decoded as columns."""
        assert self._columns is not None
        values: Any = self._columns[6]
        step = self._vstep
        if not step:
            return values[lo:hi]  # type: ignore[no-any-return]
        return [values[j + 4 : j + step] for j in range(lo * step, hi * step, step)]

    def _range(self, lo: int, hi: int) -> list[Cell]:
        """Cells ``lo`` to ``hi``, made now if the page was decoded as columns."""
        columns = self._columns
        if columns is None:
            cells = self._cells
            assert cells is not None
            return cells[lo:hi]
        if hi - lo == len(columns[0]) and not self._vstep:
            return list(map(Cell, *columns))
        return list(map(Cell, *(c[lo:hi] for c in columns[:6]), self._values(lo, hi)))

    def _slice(self, lo: int, hi: int) -> list[Cell]:
        """:meth:`_range`, with the one cell of most rows made without slicing columns."""
        columns = self._columns
        if columns is None or hi - lo != 1:
            return self._range(lo, hi)
        r, f, q, t, s, k, v = columns
        step = self._vstep
        raw: Any = v  # a column, or the values' buffer (``_vstep``)
        value = raw[lo * step + 4 : (lo + 1) * step] if step else raw[lo]
        return [Cell(r[lo], f[lo], q[lo], t[lo], s[lo], k[lo], value)]

    @property
    def cells(self) -> int:
        if self._decode is not None:
            self._load()
        return len(self._rows)

    @property
    def first_row(self) -> bytes:
        if self._decode is not None:
            self._load()
        return self._rows[0]

    @property
    def last_row(self) -> bytes:
        if self._decode is not None:
            self._load()
        return self._rows[-1]

    def row_cells(self, row: bytes) -> list[Cell]:
        """The cells of ``row`` in this page (empty if none)."""
        if self._decode is not None:
            self._load()
        rows = self._rows
        lo = bisect_left(rows, row)
        hi = bisect_right(rows, row, lo)
        return self._slice(lo, hi) if lo < hi else []

    def cells_in(self, start_row: bytes = b"", end_row: bytes | None = None) -> list[Cell]:
        """The cells whose row is in ``[start_row, end_row)`` (``None``: to the end)."""
        if self._decode is not None:
            self._load()
        lo = bisect_left(self._rows, start_row) if start_row else 0
        hi = len(self._rows) if end_row is None else bisect_left(self._rows, end_row)
        return self._range(lo, hi) if lo < hi else []


#: Family names decoded, by their bytes: a page's family column repeats a handful of names.
_FAMILY_NAMES: dict[bytes, str] = {}


def _families(raw: Sequence[bytes]) -> tuple[str, ...]:
    """The family column's names as str, each decoded once (UnicodeDecodeError if not UTF-8)."""
    names = _FAMILY_NAMES
    if len(names) > 4096:  # bounded: a file of many families must not grow it for ever
        names.clear()
    if raw and raw.count(raw[0]) == len(raw):  # one family (a C loop: identity first)
        first = raw[0]
        name = names.get(first)
        if name is None:
            name = names[first] = first.decode()
        return (name,) * len(raw)
    out = []
    for f in raw:
        name = names.get(f)
        if name is None:
            name = names[f] = f.decode()
        out.append(name)
    return tuple(out)


#: Up to this many values, :func:`_binary` and :func:`_values` read values of one length with
#: one ``struct`` call (a format per width and count, :func:`_fixed_format`); more take
#: strided checks and slices.
_STRUCT_CELLS: Final = 256
#: Formats of :func:`_fixed_format`, by (width, count, lengths only).
_FIXED_FORMATS: dict[tuple[int, int, bool], struct.Struct] = {}


def _fixed_format(width: int, n: int, lengths_only: bool) -> struct.Struct:
    """The format of ``n`` PLAIN byte arrays of ``width`` bytes: each u32 length then the
    bytes (skipped when ``lengths_only``)."""
    key = (width, n, lengths_only)
    fmt = _FIXED_FORMATS.get(key)
    if fmt is None:
        if len(_FIXED_FORMATS) >= 256:  # bounded: few (width, count) pairs recur
            _FIXED_FORMATS.clear()
        one = f"I{width}x" if lengths_only else f"I{width}s"
        fmt = _FIXED_FORMATS[key] = struct.Struct("<" + one * n)
    return fmt


#: The formats of ``n`` int64s and ``n`` int32s (a page's ts and seq, its kind), by ``n``.
_INT_FORMATS: dict[int, tuple[struct.Struct, struct.Struct]] = {}


def _ints(n: int) -> tuple[struct.Struct, struct.Struct]:
    """Formats of ``n`` little-endian int64s and int32s (no format string made per page)."""
    found = _INT_FORMATS.get(n)
    if found is None:
        if len(_INT_FORMATS) >= 256:
            _INT_FORMATS.clear()
        found = _INT_FORMATS[n] = (struct.Struct(f"<{n}q"), struct.Struct(f"<{n}i"))
    return found


def _binary(buf: bytes, n: int) -> tuple[bytes, ...]:
    """``n`` PLAIN byte arrays (u32 length, bytes) from ``buf``; ValueError unless they fill it.
    Values of one length (row keys of fixed width, a page's family, often its qualifier,
    1000-byte values) are read by one ``struct`` call, or for many values by strided length
    checks and slices; others by a walk."""
    size = len(buf)
    if size >= 4:
        (width,) = _U32.unpack_from(buf, 0)
        step = width + 4
        if step * n == size:
            if n <= _STRUCT_CELLS:
                fields = _fixed_format(width, n, False).unpack(buf)
                if fields[0::2].count(width) == n:
                    return fields[1::2]
            elif _same_lengths(buf, step, n):
                return tuple([buf[i + 4 : i + step] for i in range(0, size, step)])
    return _walk(buf, n)


def _values(buf: bytes, n: int) -> Sequence[bytes]:
    """The value column of a page: :func:`_binary`, but values of one length are left in
    ``buf`` and sliced out when read (:class:`_Fixed`): a point read takes one or two values
    of a page, and copying out the others cost more than the rest of its decode."""
    size = len(buf)
    if 1 < n <= _STRUCT_CELLS and size >= 4:
        (width,) = _U32.unpack_from(buf, 0)
        if (width + 4) * n == size and _fixed_format(width, n, True).unpack(buf).count(width) == n:
            return _Fixed(buf, width + 4, n)
    return _binary(buf, n)


class _Fixed(Sequence[bytes]):
    """``n`` PLAIN byte arrays of ``step - 4`` bytes each, in ``buf`` (checked by the
    caller), each sliced out when read."""

    __slots__ = ("_buf", "_n", "_step")

    def __init__(self, buf: bytes, step: int, n: int) -> None:
        self._buf = buf
        self._step = step
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            lo, hi, stride = i.indices(self._n)
            buf, step = self._buf, self._step
            return [buf[j + 4 : j + step] for j in range(lo * step, hi * step, stride * step)]
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("value index out of range")
        step = self._step
        start = i * step + 4
        return self._buf[start : start + step - 4]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.tolist())

    def tolist(self) -> list[bytes]:
        buf, step = self._buf, self._step
        return [buf[i + 4 : i + step] for i in range(0, step * self._n, step)]


def _same_lengths(buf: bytes, step: int, n: int) -> bool:
    """Whether each of the ``n`` values of ``step - 4`` bytes in ``buf`` has that length: the
    4 length bytes compared as 4 strided slices (C loops), not ``n`` slices of 4 bytes."""
    return all(buf[k::step] == buf[k : k + 1] * n for k in range(4))


def _walk(buf: bytes, n: int) -> tuple[bytes, ...]:
    out = []
    pos = 0
    unpack = _U32.unpack_from
    for _ in range(n):
        (length,) = unpack(buf, pos)
        pos += 4
        out.append(buf[pos : pos + length])
        pos += length
    if pos != len(buf):
        raise ValueError(f"{n} PLAIN byte arrays end at {pos} of {len(buf)} bytes")
    return tuple(out)


class _Zstd(threading.local):
    """One zstd decompression context per thread (pyarrow's Codec makes one per call:
    ~50 us for an 8 KiB page, against ~5 us here)."""

    def __init__(self) -> None:
        self.context = zstandard.ZstdDecompressor()


_zstd = _Zstd()
#: pyarrow's decompressors for the other codecs (lz4, snappy), by compression name.
_codecs: dict[str, pa.Codec] = {}


def _decompress(compression: str, data: bytes | memoryview, size: int) -> bytes:
    if compression == "zstd":
        out = _zstd.context.decompress(data, size)
    elif compression == "none":
        out = bytes(data)
    else:
        codec = _codecs.get(compression) or _codecs.setdefault(
            compression, pa.Codec(_CODECS[compression])
        )
        out = codec.decompress(data, decompressed_size=size, asbytes=True)
    if len(out) != size:
        raise ValueError(f"a page decompresses to {len(out)} bytes, its header says {size}")
    assert isinstance(out, bytes)
    return out


def page_nbytes(index: PageIndex, page: int) -> int:
    """What :func:`decode_pages` charges for ``page`` alone, from the index (no decode)."""
    return sum(index.entry(page)[3:_CRC:3]) + _CELL_OVERHEAD * index.cells_in_page(page)


def decode_pages(
    index: PageIndex,
    pages: range,
    data: bytes | bytearray | memoryview,
    base: int,
    compression: str,
    seq_base: int = 0,
) -> Page:
    """Decode ``pages`` (consecutive, of one block) from ``data``, the block's bytes starting
    at relative offset ``base``, ``seq_base`` added to every seq (``SSTableRef.seq_base``).
    Corruption when a checksum fails or a page does not decode. The page's cells are made
    when read (:meth:`Page.of_columns`)."""
    view = memoryview(data)
    if len(pages) == 1:
        columns, nbytes = _decode_one(index, pages.start, view, base, compression, seq_base)
        return Page.of_columns(columns, nbytes)
    merged: tuple[list[Any], ...] = tuple([] for _ in range(COLUMNS))
    nbytes = 0
    for p in pages:
        one, n = _decode_one(index, p, view, base, compression, seq_base)
        for into, part in zip(merged, one, strict=True):
            into += part
        nbytes += n
    # Tuples: of bytes, str and int only, so the cyclic GC untracks them (Page._range).
    return Page.of_columns(tuple(map(tuple, merged)), nbytes)


def _decode_one(
    index: PageIndex, p: int, view: memoryview, base: int, compression: str, seq_base: int
) -> tuple[tuple[Sequence[Any], ...], int]:
    """Page ``p``'s seven columns (tuples, or a :class:`_Fixed` of values), and what the block
    cache charges for it."""
    entry = index.entry(p)
    block = entry[0]
    n = index._cells_in(p, block)
    crc = 0
    pieces = []
    for c in range(1, _CRC, 3):
        off = entry[c] - base
        length = entry[c + 1]
        piece = view[off : off + length]
        if off < 0 or len(piece) != length:
            raise Corruption(f"block {block} page {p} lies outside the bytes read")
        crc = crc32c.crc32c(piece, crc)
        pieces.append(piece)
    if crc != entry[_CRC]:
        raise Corruption(f"block {block} fails its crc32c checksum (page {p})")
    try:
        sizes = entry[3:_CRC:3]
        if compression == "zstd":
            decompress = _zstd.context.decompress
            bufs = []
            for piece, size in zip(pieces, sizes, strict=True):
                buf = decompress(piece, size)  # positional: keywords cost ~0.2 us a call
                if len(buf) != size:
                    raise ValueError(
                        f"a page decompresses to {len(buf)} bytes, its header says {size}"
                    )
                bufs.append(buf)
        else:
            bufs = [
                _decompress(compression, piece, size)
                for piece, size in zip(pieces, sizes, strict=True)
            ]
        rows = _binary(bufs[0], n)
        if rows[0] != index.first_rows[p]:
            raise Corruption(f"block {block} page {p} disagrees with the page index")
        ints = _ints(n)
        seqs: Sequence[int] = ints[0].unpack(bufs[4])
        columns: tuple[Sequence[Any], ...] = (
            rows,
            _families(_binary(bufs[1], n)),
            _binary(bufs[2], n),
            ints[0].unpack(bufs[3]),
            tuple([q + seq_base for q in seqs]) if seq_base else seqs,
            ints[1].unpack(bufs[5]),
            _values(bufs[6], n),
        )
    except (
        pa.ArrowException,
        zstandard.ZstdError,
        ValueError,
        IndexError,
        struct.error,
        UnicodeDecodeError,
    ) as exc:
        raise Corruption(f"block {block} page {p} does not decode: {exc}") from exc
    return columns, sum(sizes) + _CELL_OVERHEAD * n


# -- whole ranges of blocks as Arrow columns (batch reads, §8) ---------------------------------

#: Arrow types of the columns, schema order (``kind`` is stored as INT32).
_ARROW_COLUMNS: Final = ("row", "family", "qualifier", "ts", "seq", "kind", "value")
_FIXED: Final = {"ts": "<i8", "seq": "<i8", "kind": "<i4"}


def decode_blocks_arrow(
    index: PageIndex,
    first: int,
    last: int,
    data: bytes | bytearray | memoryview,
    block_offsets: Sequence[int],
    compression: str,
    columns: Sequence[str],
) -> dict[str, pa.Array] | None:
    """Every page of blocks ``first..last`` of a zstd SSTable, as one Arrow array per name in
    ``columns``, or None when the codec is not zstd (the caller uses pyarrow's reader).
    ``data`` holds the blocks' bytes, ``block_offsets[b]`` the offset in ``data`` of block
    ``b`` (the caller verified each block's crc32c, which covers all its pages).

    pyarrow's reader pays a fixed cost per page, and format 2's pages are small (8 KiB of
    cells over 7 columns): over a whole block range that cost was most of a batch read. Here
    each column's pages are decompressed in one call (``multi_decompress_to_buffer``), fixed
    width columns are viewed in place, and the PLAIN byte arrays (u32 length, bytes) are
    walked one value per page at a time across all pages at once with numpy, then framed as
    one Arrow array whose length prefixes one ``binary_slice`` drops. ValueError (or another
    decoding error) when the pages do not decode to exactly their cells."""
    if compression != "zstd":
        return None
    lo, hi = index.block_starts[first], index.block_starts[last + 1]
    table = index.table[lo:hi].astype(np.int64)
    counts = _page_counts(index, first, last)
    base = np.asarray(block_offsets, dtype=np.int64)[table[:, 0] - first]
    out: dict[str, pa.Array] = {}
    for name in columns:
        col = _ARROW_COLUMNS.index(name)
        offs = table[:, 1 + 3 * col] + base
        comp = table[:, 2 + 3 * col]
        size = table[:, 3 + 3 * col]
        buf = _decompress_all(data, offs, comp, size)
        if name in _FIXED:
            values = np.frombuffer(buf, dtype=_FIXED[name])
            if len(values) != int(counts.sum()) or len(buf) % values.itemsize:
                raise ValueError(f"column {name} decodes to {len(values)} values")
            out[name] = pa.array(values.astype(np.int8) if name == "kind" else values)
        else:
            arr = _plain_binary(buf, size, counts)
            out[name] = arr.cast(pa.string()) if name == "family" else arr
    if "row" in out:
        firsts = out["row"].take(pa.array(np.cumsum(counts) - counts)).to_pylist()
        if firsts != list(index.first_rows[lo:hi]):
            raise ValueError("pages disagree with the page index's first rows")
    return out


def _page_counts(index: PageIndex, first: int, last: int) -> npt.NDArray[np.int64]:
    """Cells of each page of blocks ``first..last``."""
    starts = np.asarray(index.block_starts[first : last + 2], dtype=np.int64)
    pages = np.diff(starts)
    counts = np.full(int(starts[-1] - starts[0]), index.page_cells, dtype=np.int64)
    ends = np.cumsum(pages) - 1  # the last page of each block holds the rest
    cells = np.asarray(index.block_cells[first : last + 1], dtype=np.int64)
    counts[ends] = cells - (pages - 1) * index.page_cells
    if (counts <= 0).any():
        raise ValueError("a page of no cells")
    return counts


def _decompress_all(
    data: bytes | bytearray | memoryview,
    offsets: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
) -> bytes:
    """The zstd frames at ``offsets``/``lengths`` of ``data`` decompressed (each exactly
    its ``sizes``), concatenated."""
    if (offsets < 0).any() or (offsets + lengths > len(data)).any():
        raise ValueError("a page lies outside the bytes read")
    segments = np.empty((len(offsets), 2), dtype=np.uint64)
    segments[:, 0] = offsets
    segments[:, 1] = lengths
    frames = zstandard.BufferWithSegments(bytes(data), segments.tobytes())
    result = _zstd.context.multi_decompress_to_buffer(
        frames, decompressed_sizes=sizes.astype(np.uint64).tobytes()
    )
    if len(result) != len(offsets) or result.size() != int(sizes.sum()):
        raise ValueError("pages decompress to other sizes than their headers say")
    pieces: list[Any] = [result[i] for i in range(len(result))]  # buffers: no copy each
    return b"".join(pieces)


def _u32_at(raw: npt.NDArray[np.uint8], at: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """The little-endian u32 at each of ``at`` in ``raw`` (IndexError past its end)."""
    return (  # type: ignore[no-any-return]
        raw[at].astype(np.int64)
        | raw[at + 1].astype(np.int64) << 8
        | raw[at + 2].astype(np.int64) << 16
        | raw[at + 3].astype(np.int64) << 24
    )


def _plain_binary(
    buf: bytes, sizes: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
) -> pa.Array:
    """The PLAIN byte arrays of pages of ``sizes`` bytes and ``counts`` values each,
    concatenated in ``buf``, as one Arrow binary array."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    n = int(counts.sum())
    if len(raw) >= 1 << 31:
        raise ValueError("a column range over 2 GiB")  # the caller's reader takes it
    page_start = np.cumsum(sizes) - sizes
    out_start = np.cumsum(counts) - counts
    cursor = page_start.copy()
    prefix = np.empty(n, dtype=np.int64)
    # Pages whose values all have the first one's length (fixed-width keys, qualifiers,
    # values) need no walk: their prefixes are at a fixed stride, checked all at once.
    stride = 4 + _u32_at(raw, page_start)
    page_of = np.repeat(np.arange(len(counts)), counts)
    guess = page_start[page_of] + (np.arange(n) - out_start[page_of]) * stride[page_of]
    fits = (sizes == counts * stride)[page_of]
    # In range for the check below (a page that cannot be uniform is checked at its start).
    guess = np.where(fits, guess, page_start[page_of]).astype(np.int64)
    ok = fits & (_u32_at(raw, guess) + 4 == stride[page_of])
    uniform = np.logical_and.reduceat(ok, out_start)
    prefix[:] = guess
    cursor[uniform] = page_start[uniform] + sizes[uniform]
    active = np.flatnonzero(~uniform)
    i = 0
    while len(active):
        c = cursor[active]
        length = _u32_at(raw, c)
        prefix[out_start[active] + i] = c
        cursor[active] = c + 4 + length
        i += 1
        active = active[counts[active] > i]
    if (cursor != page_start + sizes).any():
        raise ValueError("byte arrays do not fill their pages")
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[:-1] = prefix
    offsets[-1] = len(raw)
    framed = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(buf)])
    # Each value is its u32 length then its bytes, contiguous: drop the 4-byte prefixes.
    return pc.binary_slice(framed, 4, (1 << 31) - 1)  # type: ignore[no-any-return]
