"""Reading SSTables from the object store: open, point reads, scans, in-memory groups (§4, §6).

"Opening an SSTable loads the block index into memory; a lookup can be performed with a single
disk seek: we first find the appropriate block by performing a binary search in the in-memory
index, and then reading the appropriate block from disk" (§4). Here:

* :meth:`SSTable.open` issues one ranged GET for the object's tail (two when the footer is
  larger than the guess; a HEAD first when the caller does not know the object's size), verifies
  the footer checksum and keeps the block and page indexes and the bloom filters in memory for
  the SSTable's lifetime (:class:`SSTableCore`). Every SSTable open on one object with one
  block cache shares one core: the second open costs no request (``BlockCache.open_core``).
* :meth:`SSTable.get_row`: bloom filter, then binary search of the index for the blocks whose
  row range holds the row (usually one), then the block cache, else one ranged GET per block,
  whose crc32c is verified before it is decoded (a mismatch is Corruption, never data).
  In a format-2 SSTable the unit is not the block but the page (``pages.py``): a binary search
  of the block's page index, then the block cache, else one ranged GET of the bytes holding
  that page of every column (a few KiB), verified and decoded without pyarrow's reader.
  Concurrent reads of one missing block (or page) share one GET.
* **Scan cache admission.** With a scan cache (§6), a row read from a format-2 SSTable is
  cached there only when the pages it was read from were already in the block cache (or
  there is no block cache): a row read from a page just fetched is most often read once (a
  uniform random read of a table larger than the cache), and its page is cached anyway, so
  its next read costs a block-cache hit, not a fetch, and is admitted then. Putting every
  such row in was 8-10 % of a cold random read's CPU, for entries never read again.
* :meth:`SSTable.scan` streams blocks in order from the first that can hold ``start_row``,
  fetching block i+1 while the caller consumes block i, and more blocks ahead (up to
  :data:`DEFAULT_READAHEAD`) as the scan goes on.
* :meth:`SSTable.load_all` (in-memory locality groups, §6) fetches the whole object once and
  decodes every block; afterwards reads never touch the store.
* :func:`iter_sstable_bytes` decodes a whole object already in memory, verified the same way,
  one block at a time as its cells are consumed (compactions: a merge holds one decoded block
  per input); :func:`read_sstable_bytes` is every cell of it as one list.
* :meth:`SSTable.excerpt` fetches what a compaction of a row range needs: the whole object,
  or, when the object also holds rows outside the range (a split's children share their
  parent's SSTables until each has rewritten its half, §5.2), an :class:`SSTableExcerpt` --
  the contiguous run of blocks that can hold the range's rows, and the tail -- which
  :func:`iter_sstable_bytes` decodes as it decodes a whole object. A child's rewrite so reads
  half its parent's bytes, not all of them.

Errors: Corruption for any checksum or format failure; NotFound when the object is gone;
Unavailable (retryable) for a block fetch that a concurrent reader abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import crc32c
import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from tabletstore.errors import Corruption, InvalidArgument, NotFound, Unavailable
from tabletstore.keys import Cell
from tabletstore.sstable.block import Block, BytesLike, RowGroupDecoder
from tabletstore.sstable.block_cache import BlockCache, ScanCache
from tabletstore.sstable.format import (
    DEFAULT_TAIL_GUESS,
    SCHEMA,
    BlockHandle,
    Footer,
    ParsedFooter,
    column_bloom_key,
    footer_length,
    parse_tail,
    tail_length,
)
from tabletstore.sstable.pages import (
    Page,
    PageIndex,
    decode_blocks_arrow,
    decode_pages,
    page_nbytes,
)
from tabletstore.storage_s3.base import ObjectStore, object_url

__all__ = [
    "DEFAULT_READAHEAD",
    "SSTable",
    "SSTableCore",
    "SSTableExcerpt",
    "iter_sstable_bytes",
    "read_sstable_bytes",
]

#: Blocks a long scan keeps in flight ahead of its consumer.
DEFAULT_READAHEAD = 4
#: Pages ending recent fetches (the last two of each) an SSTable remembers to recognize
#: sequential point reads.
_RECENT_PAGES = 64
#: Pages whose last row was read lately that an SSTable remembers: a reader going row by
#: row adds one per page, so this many readers interleaved are each recognized.
_READ_THROUGH_PAGES = 128
#: Tails up to this many bytes are parsed on the event loop when an SSTable opens (a few ms at
#: most: about 2.5 ms per 100 KB); larger ones, on a thread.
INLINE_TAIL_BYTES = 128 * 1024
#: :meth:`SSTable.excerpt` reads the whole object unless leaving out the blocks outside the
#: range saves at least this many bytes (an excerpt costs two GETs, not one).
EXCERPT_MIN_SAVING = 1 << 20


class SSTableCore:
    """The I/O-free part of a reader: the parsed footer, the index, verification, decoding."""

    def __init__(self, name: str, size: int, parsed: ParsedFooter, seq_base: int = 0) -> None:
        self.name = name
        self.size = size
        #: Added to every stored seq (``SSTableRef.seq_base``: an adopted bulk-load file).
        self.seq_base = seq_base
        self.footer: Footer = parsed.footer
        self.tail_size = parsed.tail_size
        self.blocks: tuple[BlockHandle, ...] = parsed.footer.blocks
        #: Format 2: the page index (point reads fetch pages); None for format 1.
        self.pages: PageIndex | None = parsed.footer.pages
        self._first_rows = [b.first_row for b in self.blocks]
        self._last_rows = [b.last_row for b in self.blocks]
        #: pyarrow's reader, for what the page decoder does not read: format 1's row groups,
        #: and batch reads of pages compressed with another codec than zstd. The Parquet
        #: footer it needs is about 7 KiB of C++ objects per 64 KiB block, 11 % of the data
        #: an open SSTable covers (a worker holding 3 GB of SSTables held 330 MB of it), so a
        #: format-2 zstd SSTable drops it once :func:`parse_tail` has checked it.
        self._decoder: RowGroupDecoder | None = (
            RowGroupDecoder(parsed.parquet, size)
            if self.pages is None or self.footer.compression != "zstd"
            else None
        )

    @classmethod
    def from_tail(cls, name: str, size: int, tail: bytes, seq_base: int = 0) -> SSTableCore:
        """Parse the footer from the object's last ``len(tail)`` bytes; ``seq_base`` is
        added to every seq decoded (``SSTableRef.seq_base``)."""
        try:
            return cls(name, size, parse_tail(tail, size), seq_base)
        except Corruption as exc:
            raise Corruption(f"SSTable {name}: {exc}") from exc

    def may_contain_row(self, row: bytes) -> bool:
        """False when the bloom filter proves the SSTable has no cell of ``row``."""
        return self.footer.row_bloom.may_contain(row)

    def may_contain_column(self, row: bytes, family: str, qualifier: bytes) -> bool:
        """False when a bloom filter proves there is no cell of that row and column."""
        bloom = self.footer.column_bloom
        if bloom is None:
            return self.may_contain_row(row)
        return bloom.may_contain(column_bloom_key(row, family, qualifier))

    def blocks_for_row(self, row: bytes) -> range:
        """Indexes of the blocks whose row range contains ``row`` (often none, usually one)."""
        first = bisect_left(self._last_rows, row)
        return range(first, max(first, bisect_right(self._first_rows, row)))

    def first_block_from(self, start_row: bytes) -> int:
        """The first block that can hold a row >= ``start_row`` (len(blocks) if none)."""
        return bisect_left(self._last_rows, start_row)

    def blocks_between(self, start_row: bytes, end_row: bytes | None) -> range:
        """The blocks that can hold a row in ``[start_row, end_row)``: a contiguous run
        (rows are sorted across blocks), possibly empty."""
        first = self.first_block_from(start_row) if start_row else 0
        stop = len(self.blocks) if end_row is None else bisect_left(self._first_rows, end_row)
        return range(first, max(first, stop))

    def decode(self, index: int, data: BytesLike) -> Block | Page:
        """Verify block ``index``'s bytes against the index, then decode them."""
        handle = self.blocks[index]
        if len(data) != handle.length:
            raise Corruption(
                f"SSTable {self.name}: block {index} read {len(data)} bytes, "
                f"expected {handle.length}"
            )
        if crc32c.crc32c(data) != handle.crc32c:
            raise Corruption(f"SSTable {self.name}: block {index} fails its crc32c checksum")
        block: Block | Page
        if self.pages is not None:
            # Format 2: every page of the block through the page decoder (about half the
            # CPU of pyarrow's reader over a row group of many small pages).
            pages = range(self.pages.block_starts[index], self.pages.block_starts[index + 1])
            block = self.decode_pages(index, pages, data, handle.offset)
        else:
            try:
                block = self._row_groups.decode(index, handle.offset, data, self.seq_base)
            except Corruption as exc:
                raise Corruption(f"SSTable {self.name}: {exc}") from exc
        if block.cells != handle.cells or (block.first_row, block.last_row) != (
            handle.first_row,
            handle.last_row,
        ):
            raise Corruption(f"SSTable {self.name}: block {index} disagrees with the index")
        return block

    @property
    def _row_groups(self) -> RowGroupDecoder:
        """pyarrow's decoder; only the SSTables it decodes keep one (``__init__``)."""
        if self._decoder is None:
            raise AssertionError(f"SSTable {self.name}: its pages are decoded without pyarrow")
        return self._decoder

    def page_range(self, block: int, pages: range) -> tuple[int, int]:
        """``(offset, length)`` in the object of the bytes holding ``pages`` of ``block``."""
        assert self.pages is not None
        rel, length = self.pages.span(pages)
        return self.blocks[block].offset + rel, length

    def decode_pages(self, block: int, pages: range, data: BytesLike, offset: int) -> Page:
        """Verify and decode ``pages`` of ``block`` from ``data``, bytes that start at
        ``offset`` in the object (as :meth:`page_range` names them)."""
        assert self.pages is not None
        rel = offset - self.blocks[block].offset
        try:
            return decode_pages(
                self.pages, pages, data, rel, self.footer.compression, self.seq_base
            )
        except Corruption as exc:
            raise Corruption(f"SSTable {self.name}: {exc}") from exc

    def deferred_page(self, block: int, page: int, data: BytesLike, offset: int) -> Page:
        """:meth:`decode_pages` of ``page`` alone, run when the page is first read."""
        assert self.pages is not None
        return Page.deferred(
            functools.partial(self.decode_pages, block, range(page, page + 1), data, offset),
            page_nbytes(self.pages, page),
        )

    def _decode_pages_arrow(
        self, first: int, last: int, data: BytesLike, columns: Sequence[str] | None
    ) -> pa.Table | None:
        return _decode_pages_arrow_of(self, first, last, data, columns)

    def decode_range(
        self, first: int, last: int, data: BytesLike, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Blocks ``first..last`` (inclusive) from their contiguous bytes ``data``, each
        verified against the index, decoded in one call (``columns`` only, when given)."""
        handles = self.blocks[first : last + 1]
        base = handles[0].offset
        view = memoryview(data)
        for i, h in enumerate(handles, start=first):
            piece = view[h.offset - base : h.offset - base + h.length]
            if len(piece) != h.length or crc32c.crc32c(piece) != h.crc32c:
                raise Corruption(f"SSTable {self.name}: block {i} fails its crc32c checksum")
        table = self._decode_pages_arrow(first, last, data, columns)
        if table is None:
            try:
                table = self._row_groups.decode_range(
                    list(range(first, last + 1)), base, data, columns
                )
            except Corruption as exc:
                raise Corruption(f"SSTable {self.name}: {exc}") from exc
        if table.num_rows != sum(h.cells for h in handles):
            raise Corruption(f"SSTable {self.name}: blocks {first}..{last} disagree with the index")
        if self.seq_base and "seq" in table.column_names:
            i = table.column_names.index("seq")
            table = table.set_column(i, SCHEMA.field("seq"), with_seq_base(table[i], self.seq_base))
        return table


def _decode_pages_arrow_of(
    core: SSTableCore, first: int, last: int, data: BytesLike, columns: Sequence[str] | None
) -> pa.Table | None:
    """:meth:`SSTableCore.decode_range` of a format-2 zstd SSTable by its page index
    (``pages.decode_blocks_arrow``), or None for any other (pyarrow's reader decodes it)."""
    if core.pages is None:
        return None
    names = list(columns) if columns is not None else list(SCHEMA.names)
    handles = core.blocks[first : last + 1]
    base = handles[0].offset
    try:
        arrays = decode_blocks_arrow(
            core.pages,
            first,
            last,
            data,
            [h.offset - base for h in handles],
            core.footer.compression,
            names,
        )
    except (ValueError, IndexError, pa.ArrowException, zstandard.ZstdError) as exc:
        raise Corruption(
            f"SSTable {core.name}: blocks {first}..{last} do not decode: {exc}"
        ) from exc
    if arrays is None:
        return None
    schema = pa.schema([SCHEMA.field(n) for n in names])
    return pa.Table.from_arrays([arrays[n] for n in names], schema=schema)


def _clip_rows(table: pa.Table, start_row: bytes, end_row: bytes | None) -> pa.Table:
    """The cells of ``table`` whose row is in ``[start_row, end_row)``."""
    rows = table.column(0)
    keep = pc.greater_equal(rows, pa.scalar(start_row, pa.binary()))
    if end_row is not None:
        keep = pc.and_(keep, pc.less(rows, pa.scalar(end_row, pa.binary())))
    return table.filter(keep)


def with_seq_base(seqs: pa.ChunkedArray | pa.Array, seq_base: int) -> pa.Array:
    """``seqs`` plus ``seq_base`` (an adopted SSTable's stored seqs made the cells' seqs);
    overflow past int64 is Corruption."""
    try:
        out = pc.add_checked(seqs, pa.scalar(seq_base, pa.int64()))
    except pa.ArrowInvalid as exc:
        raise Corruption(f"seq base {seq_base} overflows a stored seq: {exc}") from exc
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


@dataclass(frozen=True)
class SSTableExcerpt:
    """Part of an SSTable object, enough to read the rows of a range: the bytes ``blocks``
    that start at ``offset`` in the object (a contiguous run of whole blocks, possibly
    none), and the object's ``tail`` (its footer and trailer, :func:`parse_tail`), of an
    object of ``size`` bytes. Made by :meth:`SSTable.excerpt`; read by
    :func:`iter_sstable_bytes` with the range it was made for, or a narrower one."""

    blocks: bytes
    offset: int
    tail: bytes
    size: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.offset + len(self.blocks) + len(self.tail) > self.size:
            raise InvalidArgument(
                f"an excerpt of {len(self.blocks)} bytes at {self.offset} and a tail of "
                f"{len(self.tail)} bytes do not fit an object of {self.size} bytes"
            )

    @property
    def nbytes(self) -> int:
        return len(self.blocks) + len(self.tail)


def read_sstable_bytes(data: bytes, *, name: str = "<bytes>", seq_base: int = 0) -> list[Cell]:
    """Every cell of a whole SSTable object held in memory, verified (Corruption otherwise);
    ``seq_base`` is added to every seq (``SSTableRef.seq_base``)."""
    return list(iter_sstable_bytes(data, name=name, seq_base=seq_base))


def iter_sstable_bytes(
    data: bytes | SSTableExcerpt,
    *,
    name: str = "<bytes>",
    seq_base: int = 0,
    start_row: bytes = b"",
    end_row: bytes | None = None,
) -> Iterator[Cell]:
    """The cells of an SSTable held in memory -- a whole object, or an :class:`SSTableExcerpt`
    made for a range holding ``[start_row, end_row)`` -- whose row is in that range, decoded
    one block at a time as they are consumed (a compaction's merge holds one block of each
    input as Python objects, not every cell of every input). The footer is verified at once,
    each block when it is reached (Corruption, raised then; also for a block the excerpt does
    not hold); blocks wholly outside the range are not decoded."""
    if isinstance(data, SSTableExcerpt):
        core = SSTableCore.from_tail(name, data.size, data.tail, seq_base)
        return _iter_blocks(core, memoryview(data.blocks), data.offset, start_row, end_row)
    core = SSTableCore.from_tail(name, len(data), data, seq_base)
    return _iter_blocks(core, memoryview(data), 0, start_row, end_row)


def _iter_blocks(
    core: SSTableCore, view: memoryview, base: int, start_row: bytes, end_row: bytes | None
) -> Iterator[Cell]:
    """The cells in ``[start_row, end_row)`` of the blocks whose bytes ``view`` holds from
    offset ``base`` of the object."""
    blocks = core.blocks
    for i in core.blocks_between(start_row, end_row):
        b = blocks[i]
        at = b.offset - base
        if at < 0 or at + b.length > len(view):
            raise Corruption(
                f"SSTable {core.name}: block {i} ({b.length} bytes at {b.offset}) is not in the "
                f"{len(view)} bytes read from {base}"
            )
        yield from core.decode(i, view[at : at + b.length]).cells_in(start_row, end_row)


async def _no_bytes() -> bytes:
    return b""


class _RecentPages:
    """The last ``size`` page numbers added (repeats included), with O(1) membership: a
    deque's ``in`` walks all of them, and every cold point read asks twice or three times."""

    __slots__ = ("_counts", "_order")

    def __init__(self, size: int) -> None:
        self._order: deque[int] = deque(maxlen=size)
        self._counts: dict[int, int] = {}

    def append(self, page: int) -> None:
        order, counts = self._order, self._counts
        if len(order) == order.maxlen:
            old = order[0]
            n = counts[old] - 1
            if n:
                counts[old] = n
            else:
                del counts[old]
        order.append(page)
        counts[page] = counts.get(page, 0) + 1

    def __contains__(self, page: object) -> bool:
        return page in self._counts

    def __len__(self) -> int:
        return len(self._order)


class SSTable:
    """An opened SSTable object (see the module docstring). Create with :meth:`open`."""

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        core: SSTableCore,
        cache: BlockCache | None,
        scan_cache: ScanCache | None = None,
    ):
        self.store = store
        self.key = key
        self._core = core
        #: The caches' name for this SSTable: one object opened with two seq bases (an
        #: adopted file shared by tablets of two workers' seq sequences) decodes two ways.
        self._cache_key = key if not core.seq_base else f"{key}@{core.seq_base}"
        self._cache = cache
        self._scan_cache = scan_cache
        self._resident: list[Block | Page] | None = None
        self._inflight: dict[int, asyncio.Future[Block | Page]] = {}
        self._inflight_pages: dict[int, asyncio.Future[dict[int, Page]]] = {}
        #: The last page of each recent fetch (a sequential read's predecessor is one).
        self._recent_pages = _RecentPages(_RECENT_PAGES)
        #: Pages whose last row was read lately (a sequential reader has just read one).
        self._read_through = _RecentPages(_READ_THROUGH_PAGES)
        #: Reads the bloom filter answered without a fetch, and blocks fetched from the store.
        self.bloom_skips = 0
        self.block_fetches = 0

    @classmethod
    async def open(
        cls,
        store: ObjectStore,
        key: str,
        *,
        size: int | None = None,
        tail_size: int | None = None,
        block_cache: BlockCache | None = None,
        scan_cache: ScanCache | None = None,
        seq_base: int = 0,
    ) -> SSTable:
        """Open SSTable object ``key``: one ranged GET of its tail when ``size`` is given (a
        HEAD first otherwise). ``tail_size`` (``SSTableInfo.tail_size``) makes that GET exact;
        without it the last 64 KiB are read, plus one more GET if the footer is larger.
        ``seq_base`` (``SSTableRef.seq_base``) is added to every seq it reads. With a
        ``block_cache``, an object another SSTable has open costs no request: the two share
        its core (``BlockCache.open_core``)."""
        name = object_url(store.url, key)
        if block_cache is not None:
            # A split's children open their parent's SSTables: one core for all of them.
            shared = block_cache.open_core(name, seq_base)
            if shared is not None and size in (None, shared.size):
                return cls(store, key, shared, block_cache, scan_cache)
        if size is None:
            head = await store.head(key)
            if head is None:
                raise NotFound(f"SSTable {object_url(store.url, key)} does not exist")
            size = head.size
        guess = tail_size if tail_size is not None else DEFAULT_TAIL_GUESS
        start = max(0, size - guess)
        tail = await cls._get(store, key, start, size - start)
        need = tail_length(footer_length(tail))
        if need > len(tail) and need <= size:
            more = await cls._get(store, key, size - need, need - len(tail))
            tail = more + tail
        if len(tail) > INLINE_TAIL_BYTES:
            # A 128 MiB SSTable's tail is 1.4 MB and takes ~36 ms to parse: on a thread, so
            # the event loop serves meanwhile (it gets the GIL back every switch interval).
            core = await asyncio.to_thread(SSTableCore.from_tail, name, size, tail, seq_base)
        else:
            core = SSTableCore.from_tail(name, size, tail, seq_base)
        if block_cache is not None:
            core = block_cache.share_core(core)
        return cls(store, key, core, block_cache, scan_cache)

    @staticmethod
    async def _get(store: ObjectStore, key: str, offset: int, length: int) -> bytes:
        data = await store.get_range(key, offset, length)
        if data is None:
            raise NotFound(f"SSTable {object_url(store.url, key)} does not exist")
        if len(data) != length:
            raise Corruption(
                f"SSTable {object_url(store.url, key)}: read {len(data)} of {length} bytes at "
                f"{offset}; the object is shorter than its recorded size"
            )
        return data

    # -- what the footer says ---------------------------------------------------------------

    @property
    def footer(self) -> Footer:
        return self._core.footer

    @property
    def size(self) -> int:
        return self._core.size

    @property
    def first_row(self) -> bytes:
        return self._core.footer.first_row

    @property
    def last_row(self) -> bytes:
        return self._core.footer.last_row

    @property
    def tail_size(self) -> int:
        """Bytes of the footer and trailer (``SSTableRef.tail_size``)."""
        return self._core.tail_size

    @property
    def seq_base(self) -> int:
        return self._core.seq_base

    @property
    def min_seq(self) -> int:
        return self._core.footer.min_seq + self._core.seq_base

    @property
    def max_seq(self) -> int:
        return self._core.footer.max_seq + self._core.seq_base

    @property
    def cells(self) -> int:
        return self._core.footer.cells

    @property
    def block_count(self) -> int:
        return len(self._core.blocks)

    @property
    def resident(self) -> bool:
        """Whether :meth:`load_all` has made every read a memory read."""
        return self._resident is not None

    def may_contain_row(self, row: bytes) -> bool:
        return self._core.may_contain_row(row)

    def may_contain_column(self, row: bytes, family: str, qualifier: bytes) -> bool:
        return self._core.may_contain_column(row, family, qualifier)

    # -- reads ------------------------------------------------------------------------------

    async def get_row(self, row: bytes) -> list[Cell]:
        """Every cell of ``row`` in this SSTable, in order (empty if none).

        With a scan cache (§6: "caches the key-value pairs returned by the SSTable interface"),
        a repeated read of a row skips the block lookup and decode. An SSTable never changes,
        so its entries never go stale; :meth:`close` drops them."""
        if not self.might_hold(row):
            return []
        return await self.read_candidate(row)

    def might_hold(self, row: bytes) -> bool:
        """False when the key range or the bloom filter proves there is no cell of ``row``.
        A resident SSTable (in memory, §6) skips the bloom filter: the lookup is as cheap."""
        footer = self._core.footer
        if not footer.first_row <= row <= footer.last_row or not footer.cells:
            return False
        if self._resident is None and not self._core.may_contain_row(row):
            self.bloom_skips += 1
            return False
        return True

    def resident_row(self, row: bytes) -> list[Cell] | None:
        """The cells of ``row`` when the SSTable is resident (no await: an in-memory read
        does no I/O), else None."""
        resident = self._resident
        if resident is None:
            return None
        indexes = self._core.blocks_for_row(row)
        if len(indexes) == 1:
            return resident[indexes[0]].row_cells(row)
        return [c for i in indexes for c in resident[i].row_cells(row)]

    async def read_candidate(self, row: bytes) -> list[Cell]:
        """:meth:`get_row` for a row :meth:`might_hold` did not rule out."""
        scan_cache = self._scan_cache
        if scan_cache is not None:
            hit = scan_cache.get(self._cache_key, row)
            if hit is not None:
                return hit
        indexes = self._core.blocks_for_row(row)
        pages = self._core.pages
        if pages is not None and self._resident is None:
            cache = self._cache
            if len(indexes) == 1:
                wanted = pages.pages_for_row(indexes[0], row)
                # The scan cache admits rows read from pages the block cache held (or with
                # no block cache): module docstring, "Scan cache admission".
                admit = cache is None or cache.has_pages(self._cache_key, wanted)
                cells = [
                    c
                    for page in await self._pages(indexes[0], wanted, row)
                    for c in page.row_cells(row)
                ]
            else:
                admit = cache is None
                cells = [
                    c
                    for i in indexes
                    for page in await self._pages(i, pages.pages_for_row(i, row), row)
                    for c in page.row_cells(row)
                ]
            if scan_cache is not None and admit:
                scan_cache.put(self._cache_key, row, cells)
            return cells
        elif len(indexes) == 1:
            cells = (await self._block(indexes[0])).row_cells(row)
        else:
            blocks = await asyncio.gather(*(self._block(i) for i in indexes))
            cells = [c for b in blocks for c in b.row_cells(row)]
        if scan_cache is not None:
            scan_cache.put(self._cache_key, row, cells)
        return cells

    async def scan(
        self,
        start_row: bytes = b"",
        end_row: bytes | None = None,
        *,
        fill_cache: bool = True,
        readahead: int = DEFAULT_READAHEAD,
    ) -> AsyncIterator[Cell]:
        """Cells whose row is in ``[start_row, end_row)`` (``end_row=None``: to the end), in
        order. ``fill_cache=False`` keeps a long scan from evicting the block cache;
        ``readahead`` is explained at :meth:`scan_blocks`."""
        # aclosing: a consumer that stops early closes the inner generator (and its read-ahead)
        # now, not whenever the garbage collector finalizes it.
        async with contextlib.aclosing(
            self.scan_blocks(start_row, end_row, fill_cache=fill_cache, readahead=readahead)
        ) as blocks:
            async for cells in blocks:
                for cell in cells:
                    yield cell

    async def scan_blocks(
        self,
        start_row: bytes = b"",
        end_row: bytes | None = None,
        *,
        fill_cache: bool = True,
        readahead: int = DEFAULT_READAHEAD,
    ) -> AsyncGenerator[list[Cell], None]:
        """Like :meth:`scan`, one non-empty list of cells per block.

        Read-ahead grows with the scan: while the caller holds the k-th block, the next
        ``min(k, readahead)`` blocks are being fetched. So a scan that stops after one block
        fetched at most one block it did not need, and a long scan keeps ``readahead`` GETs
        in flight (what hides S3's latency). ``readahead=0`` fetches only on demand.
        """
        if end_row is not None and end_row <= start_row:
            return
        blocks = self._core.blocks
        scheduled = self._core.first_block_from(start_row)  # next block index to fetch

        def wanted(index: int) -> bool:
            return index < len(blocks) and (end_row is None or blocks[index].first_row < end_row)

        if not wanted(scheduled):
            return
        inflight: deque[asyncio.Task[Block | Page]] = deque()
        consumed = 0
        try:
            current = await self._block(scheduled, fill_cache=fill_cache)
            scheduled += 1
            while True:
                consumed += 1
                while len(inflight) < min(consumed, readahead) and wanted(scheduled):
                    inflight.append(
                        asyncio.ensure_future(self._block(scheduled, fill_cache=fill_cache))
                    )
                    scheduled += 1
                cells = current.cells_in(start_row, end_row)
                if cells:
                    yield cells
                if inflight:
                    current = await inflight.popleft()
                elif wanted(scheduled):  # readahead == 0: fetch on demand
                    current = await self._block(scheduled, fill_cache=fill_cache)
                    scheduled += 1
                else:
                    return
        finally:
            # The consumer stopped early (or a fetch failed): abandon the read-ahead and wait
            # for it to end, so no task outlives the scan.
            for task in inflight:
                task.cancel()
            for task in inflight:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def read_arrow(
        self,
        start_row: bytes = b"",
        end_row: bytes | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The cells of rows in ``[start_row, end_row)`` as one Arrow table of the SSTable
        schema, or of its ``columns`` (which must start with ``"row"``; the others are not
        decoded): one ranged GET for the blocks that may hold them, every block verified, one
        decode (batch reads, §8; no block cache, no Python object per cell)."""
        if columns is not None and (not columns or columns[0] != "row"):
            raise InvalidArgument(f"read_arrow columns must start with 'row', got {columns}")
        empty = SCHEMA.empty_table() if columns is None else SCHEMA.empty_table().select(columns)
        if end_row is not None and end_row <= start_row:
            return empty
        blocks = self._core.blocks
        first = self._core.first_block_from(start_row)
        last = first - 1
        while last + 1 < len(blocks) and (end_row is None or blocks[last + 1].first_row < end_row):
            last += 1
        if last < first:
            return empty
        offset = blocks[first].offset
        length = blocks[last].offset + blocks[last].length - offset
        data = await self._get(self.store, self.key, offset, length)
        # On a thread: the decode releases the GIL, so reads of several SSTables overlap,
        # and the event loop is not held for the whole range.
        table = await asyncio.to_thread(self._core.decode_range, first, last, data, columns)
        # Only the first and the last block can hold rows outside the range: blocks between
        # them start at or after start_row and end before the last block's first row.
        if first == last:
            return _clip_rows(table, start_row, end_row)
        n_first, n_last = blocks[first].cells, blocks[last].cells
        return pa.concat_tables(
            [
                _clip_rows(table.slice(0, n_first), start_row, end_row),
                table.slice(n_first, table.num_rows - n_first - n_last),
                _clip_rows(table.slice(table.num_rows - n_last), start_row, end_row),
            ]
        )

    async def excerpt(self, start_row: bytes, end_row: bytes | None) -> bytes | SSTableExcerpt:
        """What reading every row of ``[start_row, end_row)`` needs (a compaction's input):
        the whole object, or, when the blocks outside the range are at least
        :data:`EXCERPT_MIN_SAVING` bytes, an :class:`SSTableExcerpt` of the blocks inside it
        and the tail (two ranged GETs). NotFound if the object is gone."""
        core = self._core
        run = core.blocks_between(start_row, end_row)
        blocks = core.blocks
        start = blocks[run.start].offset if run else 0
        length = blocks[run[-1]].offset + blocks[run[-1]].length - start if run else 0
        if core.size - core.tail_size - length < EXCERPT_MIN_SAVING:
            data = await self.store.get(self.key)
            if data is None:
                raise NotFound(f"SSTable {core.name} does not exist")
            return data
        tail_at = core.size - core.tail_size
        inside, tail = await asyncio.gather(
            self._get(self.store, self.key, start, length) if length else _no_bytes(),
            self._get(self.store, self.key, tail_at, core.tail_size),
        )
        return SSTableExcerpt(inside, start, tail, core.size)

    async def load_all(self) -> None:
        """Fetch the whole object with one GET and decode every block; afterwards reads are
        served from memory only (in-memory locality groups, §6)."""
        if self._resident is not None:
            return
        data = await self.store.get(self.key)
        if data is None:
            raise NotFound(f"SSTable {self._core.name} does not exist")
        if len(data) != self.size:
            raise Corruption(
                f"SSTable {self._core.name} is {len(data)} bytes, expected {self.size}"
            )
        view = memoryview(data)
        self._resident = [
            self._core.decode(i, view[b.offset : b.offset + b.length])
            for i, b in enumerate(self._core.blocks)
        ]

    def close(self) -> None:
        """Drop this SSTable's blocks from the shared cache and from memory. Reads after this
        still work (they refetch); call it when the SSTable is no longer part of a tablet."""
        self._resident = None
        if self._cache is not None:
            self._cache.evict(self._cache_key)
        if self._scan_cache is not None:
            self._scan_cache.invalidate(self._cache_key)

    # -- blocks -----------------------------------------------------------------------------

    async def _block(self, index: int, *, fill_cache: bool = True) -> Block | Page:
        """Block ``index`` from memory, the block cache or the store (one shared GET)."""
        if self._resident is not None:
            return self._resident[index]
        cache = self._cache
        if cache is not None:
            block = cache.get(self._cache_key, index)
            if block is not None:
                return block
        pending = self._inflight.get(index)
        if pending is not None:
            # shield: a waiter's cancellation must not cancel the fetch other readers share.
            return await asyncio.shield(pending)
        future: asyncio.Future[Block | Page] = asyncio.get_running_loop().create_future()
        self._inflight[index] = future
        try:
            block = await self._fetch(index)
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else None
            future.set_exception(
                error
                or Unavailable(f"SSTable {self._core.name}: block {index} fetch was cancelled")
            )
            # Mark the exception retrieved: it is re-raised here, waiters may not exist.
            future.exception()
            raise
        else:
            future.set_result(block)
            if cache is not None and fill_cache:
                cache.put(self._cache_key, index, block)
            return block
        finally:
            del self._inflight[index]

    async def _pages(self, block: int, pages: range, row: bytes) -> list[Page]:
        """``pages`` of ``block`` (format 2) that hold ``row``, one :class:`Page` each, from
        the block cache or the store: one GET of a few KiB for the missing ones, shared by
        concurrent readers.

        Sequential point reads read ahead to the end of the block in the same GET
        (:meth:`_readahead_stop`), so reading a range row by row costs about one GET per
        block, as scans do, even with many such readers interleaved (:meth:`_sequential`
        says which reads are)."""
        cache = self._cache
        found: dict[int, Page] = {}
        missing: list[int] = []
        for p in pages:
            hit = cache.get_page(self._cache_key, p) if cache is not None else None
            if hit is not None:
                found[p] = hit
                continue
            pending = self._inflight_pages.get(p)
            if pending is not None:
                found[p] = (await asyncio.shield(pending))[p]
            else:
                missing.append(p)
        if missing:
            first, stop = missing[0], missing[-1] + 1
            if self._sequential(first, row):
                stop = self._readahead_stop(block, stop)
            found.update(await self._fetch_pages(block, range(first, stop), missing[-1] + 1))
        last = found[pages[-1]]
        if last.last_row == row:
            self._read_through.append(pages[-1])
        return [found[p] for p in pages]

    def _sequential(self, page: int, row: bytes) -> bool:
        """Whether a read of ``row`` missing ``page`` looks like one of a reader going row
        by row, by this reader's traces or others':

        * ``row`` is ``page``'s first and the previous page's last row was read lately: a
          reader's next row. Kept apart from the fetches, one entry per page read through,
          so it still holds with many readers interleaved (a worker serving many clients'
          ranges at once would see a reader's previous fetches pushed out of the fetches
          below, and fetch every page alone). A random read
          matches it only by hitting a page's first row (1 in ``page_cells``) just after
          another hit the previous page's last;
        * or the two pages before ``page`` were fetched lately. Two pages, not one: random
          reads of a small SSTable often follow a page fetched lately, and each such
          read-ahead would fetch half a block that pushes useful pages out of the cache."""
        index = self._core.pages
        assert index is not None
        if page - 1 in self._read_through and index.first_rows[page] == row:
            return True
        recent = self._recent_pages
        return page - 1 in recent and page - 2 in recent

    def _readahead_stop(self, block: int, stop: int) -> int:
        """Where a sequential reader's fetch ending at ``stop`` may extend to: the end of
        ``block``, or the first page on the way that is being fetched or is cached and
        followed by another such page (or by the block's end). Interleaved sequential
        readers (a worker serving many clients' ranges at once) then fetch each page of a
        block about once between them, not once each. A lone cached page (another reader's first,
        or a random read's) is read again rather than cutting the fetch in two: the span
        of a page of every column holds the value pages before it anyway (pages.py), so
        the extra bytes are few, and a GET saved is what S3 bills. Its cached page is
        kept (:meth:`_fetch_pages`)."""
        index = self._core.pages
        assert index is not None
        end = index.block_starts[block + 1]
        cache = self._cache
        inflight = self._inflight_pages
        key = self._cache_key

        def taken(p: int) -> bool:
            return p in inflight or (cache is not None and cache.has_page(key, p))

        while stop < end and stop not in inflight:
            if taken(stop) and (stop + 1 >= end or taken(stop + 1)):
                break
            stop += 1
        return stop

    async def _fetch_pages(self, block: int, pages: range, wanted_stop: int) -> dict[int, Page]:
        """Fetch ``pages`` of ``block`` in one GET; those before ``wanted_stop`` are decoded
        now, the ones read ahead when first read (``Page.deferred``). All go to the block
        cache but pages read ahead that it still holds (a lone cached page read over)."""
        future: asyncio.Future[dict[int, Page]] = asyncio.get_running_loop().create_future()
        mine = [p for p in pages if p not in self._inflight_pages]
        for p in mine:
            self._inflight_pages[p] = future
        # Only a fetch's last two pages: a sequential reader's next miss follows them, and a
        # fetch that read ahead to the end of its block does not push the other readers' out.
        if len(pages) > 1:
            self._recent_pages.append(pages[-2])
        self._recent_pages.append(pages[-1])
        try:
            offset, length = self._core.page_range(block, pages)
            self.block_fetches += 1
            data = await self._get(self.store, self.key, offset, length)
            decoded = {
                p: self._core.decode_pages(block, range(p, p + 1), data, offset)
                if p < wanted_stop
                else self._core.deferred_page(block, p, data, offset)
                for p in pages
            }
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else None
            future.set_exception(
                error or Unavailable(f"SSTable {self._core.name}: page fetch was cancelled")
            )
            future.exception()
            raise
        else:
            future.set_result(decoded)
            if self._cache is not None:
                for p, page in decoded.items():
                    if p < wanted_stop or not self._cache.has_page(self._cache_key, p):
                        self._cache.put_page(self._cache_key, p, page)
            return decoded
        finally:
            for p in mine:
                del self._inflight_pages[p]

    async def _fetch(self, index: int) -> Block | Page:
        handle = self._core.blocks[index]
        self.block_fetches += 1
        data = await self.store.get_range(self.key, handle.offset, handle.length)
        if data is None:
            raise NotFound(f"SSTable {self._core.name} does not exist")
        return self._core.decode(index, data)

    def __repr__(self) -> str:
        f = self._core.footer
        return (
            f"SSTable({self.key!r}, size={self.size}, cells={f.cells}, blocks={self.block_count}, "
            f"rows={f.first_row!r}..{f.last_row!r})"
        )
