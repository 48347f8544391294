"""Building SSTables: sorted cells in, one immutable Parquet object out (§4, §5.3, §5.4).

:func:`write_sstable` is pure CPU work over plain values (cells in, bytes and an
:class:`SSTableInfo` out; :class:`SSTableBuilder` the same a cell at a time), so minor compactions call it inline and merging/major compactions
run it in a process pool. :func:`upload_sstable` is the I/O shell: it creates the object with a
create-only PUT, so an SSTable, once named, is never replaced (docs/architecture/design.md §3).

How the bytes are made (the format itself is specified in ``format.py``):

1. Cells are consumed in chunks, transposed into Arrow columns and checked to be in
   ``cell_sort_key`` order (equal keys are allowed: replays may repeat a cell).
2. A block (Parquet row group) is cut when its cells' raw size reaches ``block_size``; each
   block is one ``write_table`` call, so row groups are exactly the blocks.
3. The block index needs each row group's byte range and checksum, which exist only once the
   row groups are written, while Parquet writes key-value metadata into the footer at
   ``close()``. So the row groups are written first (with a throwaway footer), their ranges read
   from that footer, and a second footer, carrying the same row groups plus our metadata, is
   serialized from an empty writer's metadata with ``append_row_groups``. The data pages are
   encoded once; only the footer is built twice.
4. Format 2 (``pages.py``): the Parquet writer is created at the first cells, with
   ``max_rows_per_page`` = ``write_batch_size`` = ``page_cells`` (chosen from those cells'
   average size), PLAIN encoding and no size limit on pages, so every column's pages are cut
   at the same cells. The page headers are read back from the written bytes to build the page
   index; a file whose pages are not so aligned is never written.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tabletstore.errors import InvalidArgument
from tabletstore.keys import Cell, CellFields, CellKind, cell_sort_key
from tabletstore.sstable.bloom import DEFAULT_BITS_PER_KEY, BloomFilter
from tabletstore.sstable.format import (
    CELL_OVERHEAD,
    COMPRESSIONS,
    DEFAULT_BLOCK_SIZE,
    FORMAT_VERSION,
    READABLE_VERSIONS,
    SCHEMA,
    BlockHandle,
    Footer,
    column_bloom_key,
    encode_footer,
    encode_trailer,
    footer_length,
    parquet_block_ranges,
)
from tabletstore.sstable.pages import (
    COLUMNS,
    CONTINUES,
    DEFAULT_PAGE_BYTES,
    PageIndex,
    chunk_pages,
    page_cells_for,
)
from tabletstore.storage_s3.base import ObjectStore

__all__ = [
    "SSTableBuilder",
    "SSTableInfo",
    "load_lazy_imports",
    "upload_sstable",
    "write_sstable",
    "write_sstable_table",
]

#: Cells transposed into Arrow columns at a time, at most; and their row, qualifier and value
#: bytes at most (:class:`SSTableBuilder`). Bound the writer's extra memory.
_CHUNK = 8192
_CHUNK_BYTES = 4 * 1024 * 1024
_MIN_BLOCK_SIZE = 1024
_MIN_PAGE_SIZE = 64
_MAX_BLOCK_SIZE = 64 * 1024 * 1024
_KINDS = frozenset(int(k) for k in CellKind)


@dataclass(frozen=True, slots=True)
class SSTableInfo:
    """What METADATA records about an SSTable (and what a reader can open it with)."""

    #: Object key; ``""`` until :func:`upload_sstable` (or the caller) names the object.
    key: str
    #: Object bytes.
    size: int
    cells: int
    #: Distinct row keys.
    rows: int
    #: Cells that are deletion entries (any kind but PUT).
    deletions: int
    blocks: int
    min_seq: int
    max_seq: int
    #: First and last row key (both ``b""`` when there are no cells).
    first_row: bytes
    last_row: bytes
    #: Bytes from the trailer to the end: pass to ``SSTable.open(tail_size=)`` for a
    #: one-request open.
    tail_size: int
    locality_group: str
    compression: str


#: Set once :func:`load_lazy_imports` has run in this process.
_LOADED = False


async def load_lazy_imports() -> None:
    """Make pyarrow load what it imports on first use (pandas, if installed: 0.2-0.5 s of
    imports) now, on a thread, once per process. Loaded lazily in a minor compaction's
    encoding thread instead, that import contends for the GIL with a busy event loop at
    every one of its thousands of file reads, and took minutes under a write loop: the
    tablet's first minor compaction with it, while its memtable grew. Tablets call this
    when they load, before they take writes."""
    global _LOADED
    if not _LOADED:
        await asyncio.to_thread(pa.array, [], pa.binary())
        _LOADED = True


def write_sstable(
    cells: Iterable[CellFields],
    *,
    compression: str = "zstd",
    block_size: int = DEFAULT_BLOCK_SIZE,
    locality_group: str = "default",
    bloom_bits_per_key: int = DEFAULT_BITS_PER_KEY,
    column_bloom: bool = False,
    compression_level: int | None = None,
    format_version: int = FORMAT_VERSION,
    page_size: int = DEFAULT_PAGE_BYTES,
) -> tuple[bytes, SSTableInfo]:
    """Encode ``cells`` (``keys.Cell`` values or their plain-tuple fields, sorted by
    ``keys.cell_sort_key``) as one SSTable object.

    No cells give a valid SSTable with no blocks and ``info.cells == 0``; callers normally
    skip uploading it. InvalidArgument for unsorted cells, an unknown kind or compression, a
    block size outside 1 KiB..64 MiB, values that do not fit the columns, or a format version
    this build does not write (1 and 2: version 1 is kept for tests of old SSTables), or a
    ``page_size`` (format 2: target raw bytes per page; one page per block when it is larger
    than ``block_size``) outside 64 bytes..64 MiB.
    """
    builder = SSTableBuilder(
        compression=compression,
        block_size=block_size,
        locality_group=locality_group,
        bloom_bits_per_key=bloom_bits_per_key,
        column_bloom=column_bloom,
        compression_level=compression_level,
        format_version=format_version,
        page_size=page_size,
    )
    add = builder.add
    for cell in cells:
        add(cell)
    return builder.finish()


class SSTableBuilder:
    """One SSTable written as its cells come (leveldb's ``TableBuilder``): :meth:`add` one
    cell at a time, or :meth:`add_sorted` a list of them, in ``keys.cell_sort_key`` order
    across every call; :meth:`finish` returns the object's bytes. Holds at most
    :data:`_CHUNK` cells (and :data:`_CHUNK_BYTES` of their keys and values) as Python
    objects plus the blocks encoded so far, so a compaction
    that feeds several of these from one merged stream (one per locality group) never holds
    its whole output as cells. The arguments and their errors are :func:`write_sstable`'s,
    raised here."""

    __slots__ = ("_bits", "_builder", "_pending", "_pending_bytes")

    def __init__(
        self,
        *,
        compression: str = "zstd",
        block_size: int = DEFAULT_BLOCK_SIZE,
        locality_group: str = "default",
        bloom_bits_per_key: int = DEFAULT_BITS_PER_KEY,
        column_bloom: bool = False,
        compression_level: int | None = None,
        format_version: int = FORMAT_VERSION,
        page_size: int = DEFAULT_PAGE_BYTES,
    ) -> None:
        _check_version(format_version)
        if not _MIN_PAGE_SIZE <= page_size <= _MAX_BLOCK_SIZE:
            raise InvalidArgument(
                f"page_size must be {_MIN_PAGE_SIZE}..{_MAX_BLOCK_SIZE} bytes, got {page_size}"
            )
        if compression not in COMPRESSIONS:
            raise InvalidArgument(
                f"compression must be one of {sorted(COMPRESSIONS)}, got {compression!r}"
            )
        if not _MIN_BLOCK_SIZE <= block_size <= _MAX_BLOCK_SIZE:
            raise InvalidArgument(
                f"block_size must be {_MIN_BLOCK_SIZE}..{_MAX_BLOCK_SIZE} bytes, got {block_size}"
            )
        if not 1 <= bloom_bits_per_key <= 64:
            raise InvalidArgument(f"bloom_bits_per_key must be 1..64, got {bloom_bits_per_key}")
        self._builder = _Builder(
            compression, block_size, locality_group, compression_level, column_bloom, format_version
        )
        self._builder.page_size = page_size
        self._bits = bloom_bits_per_key
        self._pending: list[CellFields] = []
        self._pending_bytes = 0

    def add(self, cell: CellFields) -> None:
        """Append one cell (sorted after every cell added before)."""
        pending = self._pending
        pending.append(cell)
        try:
            size = self._pending_bytes + len(cell[0]) + len(cell[2]) + len(cell[6])
        except (TypeError, IndexError) as exc:
            raise InvalidArgument(f"SSTable input must be keys.Cell values: {exc}") from exc
        if size >= _CHUNK_BYTES or len(pending) >= _CHUNK:
            self._builder.add(pending)
            self._pending = []
            size = 0
        self._pending_bytes = size

    def add_sorted(self, cells: list[CellFields]) -> None:
        """Append ``cells`` (sorted, and after every cell added before)."""
        if self._pending:
            self._builder.add(self._pending)
            self._pending = []
            self._pending_bytes = 0
        if cells:
            self._builder.add(cells)

    def finish(self) -> tuple[bytes, SSTableInfo]:
        """The SSTable's bytes and facts; the builder is not used again."""
        if self._pending:
            self._builder.add(self._pending)
            self._pending = []
            self._pending_bytes = 0
        return self._builder.finish(self._bits)


def write_sstable_table(
    table: pa.Table,
    *,
    compression: str = "zstd",
    block_size: int = DEFAULT_BLOCK_SIZE,
    locality_group: str = "default",
    bloom_bits_per_key: int = DEFAULT_BITS_PER_KEY,
    format_version: int = FORMAT_VERSION,
) -> tuple[bytes, SSTableInfo]:
    """:func:`write_sstable` for cells already in Arrow columns (the SSTable schema, sorted):
    the same bytes, with the checks done column-wise and no Python object per cell (bulk
    load, §8). InvalidArgument for a table that does not fit the schema, a null, an unknown
    kind or unsorted cells. ``bloom_bits_per_key=0`` writes a row filter that matches every
    row (no hashing: for staging files that are read whole, never looked up by row);
    ``format_version=1`` writes no page index (staging files are read whole: their blocks
    need no pages)."""
    _check_version(format_version)
    if compression not in COMPRESSIONS:
        raise InvalidArgument(
            f"compression must be one of {sorted(COMPRESSIONS)}, got {compression!r}"
        )
    if not _MIN_BLOCK_SIZE <= block_size <= _MAX_BLOCK_SIZE:
        raise InvalidArgument(
            f"block_size must be {_MIN_BLOCK_SIZE}..{_MAX_BLOCK_SIZE} bytes, got {block_size}"
        )
    try:
        table = table.select(SCHEMA.names).cast(SCHEMA)
    except (pa.ArrowException, KeyError, ValueError) as exc:
        raise InvalidArgument(f"the table does not fit the SSTable columns: {exc}") from exc
    nulls = [name for name, col in zip(SCHEMA.names, table.columns, strict=True) if col.null_count]
    if nulls:
        raise InvalidArgument(f"SSTable columns may hold no nulls: {nulls} do")
    if not 0 <= bloom_bits_per_key <= 64:
        raise InvalidArgument(f"bloom_bits_per_key must be 0..64, got {bloom_bits_per_key}")
    builder = _Builder(compression, block_size, locality_group, None, False, format_version)
    if table.num_rows:
        builder.add_table(table.combine_chunks())
    return builder.finish(bloom_bits_per_key)


async def upload_sstable(
    store: ObjectStore, key: str, data: bytes, info: SSTableInfo
) -> SSTableInfo:
    """Create the SSTable object ``key`` (create-only: PreconditionFailed if it exists) and
    return ``info`` naming it. The object is durable when this returns."""
    if len(data) != info.size:
        raise InvalidArgument(f"SSTable bytes ({len(data)}) differ from info.size ({info.size})")
    await store.create(key, data)
    return replace(info, key=key)


def _check_version(version: int) -> None:
    if version not in READABLE_VERSIONS:
        raise InvalidArgument(
            f"format_version must be one of {list(READABLE_VERSIONS)}, got {version!r}"
        )


def _first_unsorted(table: pa.Table) -> int | None:
    """The first index whose cell sorts before its predecessor, or None. Vectorized: a pair
    is in order when (row, family, qualifier) ascend, or tie and (ts, seq) do not ascend.
    Arrow compares binary and UTF-8 bytewise, as Python compares bytes and str."""
    n = table.num_rows
    if n < 2:
        return None
    a = [table.column(i).slice(0, n - 1) for i in range(5)]
    b = [table.column(i).slice(1) for i in range(5)]
    ok = pc.greater_equal(a[4], b[4])
    ok = pc.or_(pc.greater(a[3], b[3]), pc.and_(pc.equal(a[3], b[3]), ok))
    for i in (2, 1, 0):
        ok = pc.or_(pc.less(a[i], b[i]), pc.and_(pc.equal(a[i], b[i]), ok))
    if pc.all(ok).as_py():
        return None
    return int(np.flatnonzero(~ok.to_numpy(zero_copy_only=False))[0]) + 1


class _Builder:
    """Accumulates blocks in a ParquetWriter; keeps the facts the footer records."""

    def __init__(
        self,
        compression: str,
        block_size: int,
        group: str,
        level: int | None,
        columns: bool,
        version: int,
    ) -> None:
        self._props: dict[str, object] = {
            "compression": COMPRESSIONS[compression],
            "compression_level": level,
            "use_dictionary": ["family"],
            "write_statistics": ["row"],
            "store_schema": False,
        }
        self._version = version
        #: Format 2: target raw bytes per page.
        self.page_size = DEFAULT_PAGE_BYTES
        #: Cells per page (format 2), fixed when the Parquet writer is created.
        self._page_cells = 0
        self._page_rows: list[bytes] = []  # first row key of every page (format 2)
        self._page_continues: list[bool] = []  # its first row is its predecessor's last
        self._compression = compression
        self._block_size = block_size
        self._group = group
        self._sink = pa.BufferOutputStream()
        self._writer: pq.ParquetWriter | None = None
        self._pending: pa.Table | None = None
        self._pending_sizes = np.zeros(0, dtype=np.int64)
        self._block_rows: list[tuple[int, bytes, bytes]] = []  # (cells, first_row, last_row)
        self._last_key: tuple[bytes, str, bytes, int, int] | None = None
        self._rows: set[bytes] = set()
        #: Column bloom keys, or None when the SSTable gets no column bloom filter.
        self._columns: set[bytes] | None = set() if columns else None
        self._kinds: Counter[int] = Counter()
        self._cells = 0
        self._min_seq: int | None = None
        self._max_seq: int | None = None
        self._first_row = b""
        self._last_row = b""

    def add(self, chunk: list[CellFields]) -> None:
        try:
            rows, families, qualifiers, tss, seqs, kinds, values = zip(*chunk, strict=True)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"SSTable input must be keys.Cell values: {exc}") from exc
        bad = set(kinds) - _KINDS
        if bad:
            raise InvalidArgument(f"cell kind must be one of {sorted(_KINDS)}, got {sorted(bad)}")
        for name, column, want in (
            ("row", rows, bytes),
            ("family", families, str),
            ("qualifier", qualifiers, bytes),
            ("value", values, bytes),
        ):
            types = set(map(type, column))
            if types != {want}:
                raise InvalidArgument(
                    f"cells do not fit the SSTable columns: {name} must be {want.__name__}, "
                    f"got {sorted(t.__name__ for t in types - {want})}"
                )
        try:
            table = pa.Table.from_arrays(
                [
                    pa.array(rows, pa.binary()),
                    pa.array(families, pa.string()),
                    pa.array(qualifiers, pa.binary()),
                    pa.array(tss, pa.int64()),
                    pa.array(seqs, pa.int64()),
                    pa.array(kinds, pa.int8()),
                    pa.array(values, pa.binary()),
                ],
                schema=SCHEMA,
            )
        except (pa.ArrowException, TypeError, OverflowError) as exc:
            raise InvalidArgument(f"cells do not fit the SSTable columns: {exc}") from exc
        self._check_order(chunk, table)
        sizes = sum(
            (pc.binary_length(table.column(i)).to_numpy() for i in (0, 1, 2, 6)),
            start=np.full(len(chunk), CELL_OVERHEAD, dtype=np.int64),
        )
        self._note(chunk, rows, seqs, kinds)
        if self._columns is not None:
            self._columns.update(map(column_bloom_key, rows, families, qualifiers))
        if self._pending is None:
            self._pending = table
        else:
            self._pending = pa.concat_tables([self._pending, table])
        self._pending_sizes = np.concatenate([self._pending_sizes, sizes])
        self._cut_blocks(final=False)

    def add_table(self, table: pa.Table) -> None:
        """:meth:`add` for a chunk already in Arrow columns (``write_sstable_table``)."""
        kinds = {int(k) for k in pc.unique(table.column(5)).to_pylist()}
        if kinds - _KINDS:
            raise InvalidArgument(
                f"cell kind must be one of {sorted(_KINDS)}, got {sorted(kinds - _KINDS)}"
            )
        first = Cell(*(table.column(i)[0].as_py() for i in range(7)))
        last = Cell(*(table.column(i)[table.num_rows - 1].as_py() for i in range(7)))
        if self._last_key is not None and not self._last_key <= cell_sort_key(first):
            raise InvalidArgument(f"cells are not sorted: {first!r} follows key {self._last_key!r}")
        bad = _first_unsorted(table)
        if bad is not None:
            raise InvalidArgument(
                f"cells are not sorted: row {table.column(0)[bad].as_py()!r} at cell {bad}"
            )
        self._last_key = cell_sort_key(last)
        n = table.num_rows
        sizes = sum(
            (pc.binary_length(table.column(i)).to_numpy() for i in (0, 1, 2, 6)),
            start=np.full(n, CELL_OVERHEAD, dtype=np.int64),
        )
        if not self._cells:
            self._first_row = first.row
        self._last_row = last.row
        self._cells += n
        self._rows.update(pc.unique(table.column(0)).to_pylist())
        counts = pc.value_counts(table.column(5))
        self._kinds.update(
            dict(
                zip(
                    counts.field("values").to_pylist(),
                    counts.field("counts").to_pylist(),
                    strict=True,
                )
            )
        )
        lo_hi = pc.min_max(table.column(4))
        lo, hi = int(lo_hi["min"].as_py()), int(lo_hi["max"].as_py())
        self._min_seq = lo if self._min_seq is None else min(self._min_seq, lo)
        self._max_seq = hi if self._max_seq is None else max(self._max_seq, hi)
        self._pending = table if self._pending is None else pa.concat_tables([self._pending, table])
        self._pending_sizes = np.concatenate([self._pending_sizes, sizes])
        self._cut_blocks(final=False)

    def _check_order(self, chunk: list[CellFields], table: pa.Table) -> None:
        """InvalidArgument unless the chunk continues the ``cell_sort_key`` order."""
        first, last = cell_sort_key(chunk[0]), cell_sort_key(chunk[-1])
        if self._last_key is not None and not self._last_key <= first:
            raise InvalidArgument(
                f"cells are not sorted: {chunk[0]!r} follows key {self._last_key!r}"
            )
        bad = _first_unsorted(table)
        if bad is not None:
            raise InvalidArgument(
                f"cells are not sorted: {chunk[bad]!r} follows {chunk[bad - 1]!r}"
            )
        self._last_key = last

    def _note(
        self,
        chunk: list[CellFields],
        rows: tuple[bytes, ...],
        seqs: tuple[int, ...],
        kinds: tuple[int, ...],
    ) -> None:
        """Record counts, ranges and bloom keys for the footer."""
        if not self._cells:
            self._first_row = rows[0]
        self._last_row = rows[-1]
        self._cells += len(chunk)
        self._rows.update(rows)
        self._kinds.update(kinds)
        lo, hi = min(seqs), max(seqs)
        self._min_seq = lo if self._min_seq is None else min(self._min_seq, lo)
        self._max_seq = hi if self._max_seq is None else max(self._max_seq, hi)

    def _cut_blocks(self, *, final: bool) -> None:
        """Write every full block of the pending cells; with ``final``, the rest too."""
        if self._pending is None:
            return
        # One cumulative sum per call (not per block): a large add_table cuts many blocks.
        cumulative = np.cumsum(self._pending_sizes)
        done = 0  # cells of the pending table already written
        base = 0  # their raw bytes
        while done < len(cumulative):
            n = int(np.searchsorted(cumulative, base + self._block_size)) + 1 - done
            if done + n > len(cumulative):
                if not final:
                    break
                n = len(cumulative) - done
            self._write_block(self._pending.slice(done, n), int(cumulative[done + n - 1]) - base)
            done += n
            base = int(cumulative[done - 1])
        self._pending = self._pending.slice(done)
        self._pending_sizes = self._pending_sizes[done:]

    def _parquet_writer(self, average_cell_bytes: float) -> pq.ParquetWriter:
        """The Parquet writer, created at the first block (format 2 sizes pages by then)."""
        if self._writer is None:
            if self._version >= 2:
                self._page_cells = page_cells_for(average_cell_bytes, self.page_size)
                self._props.update(
                    use_dictionary=False,
                    max_rows_per_page=self._page_cells,
                    write_batch_size=self._page_cells,
                    data_page_size=1 << 30,
                )
            self._writer = pq.ParquetWriter(self._sink, SCHEMA, **self._props)  # type: ignore[arg-type]
        return self._writer

    def _write_block(self, block: pa.Table, raw_bytes: int) -> None:
        n = block.num_rows
        rows = block.column(0)
        self._block_rows.append((n, rows[0].as_py(), rows[n - 1].as_py()))
        writer = self._parquet_writer(raw_bytes / n)
        if self._page_cells:
            starts = np.arange(0, n, self._page_cells)
            firsts = rows.take(starts).to_pylist()
            befores = rows.take(np.maximum(starts - 1, 0)).to_pylist()
            self._page_rows += firsts
            self._page_continues += [
                j > 0 and a == b for j, (a, b) in enumerate(zip(firsts, befores, strict=True))
            ]
        writer.write_table(block, row_group_size=n)

    def finish(self, bits_per_key: int) -> tuple[bytes, SSTableInfo]:
        self._cut_blocks(final=True)
        self._parquet_writer(1.0).close()
        data = self._sink.getvalue()
        parquet = pq.read_metadata(pa.BufferReader(data))
        data_end = data.size - 8 - footer_length(data[data.size - 8 :].to_pybytes())
        blocks = self._block_handles(data, parquet, data_end)
        footer = Footer(
            format_version=self._version,
            locality_group=self._group,
            compression=self._compression,
            block_size=self._block_size,
            cells=self._cells,
            rows=len(self._rows),
            kind_counts=(self._kinds[0], self._kinds[1], self._kinds[2], self._kinds[3]),
            min_seq=self._min_seq or 0,
            max_seq=self._max_seq or 0,
            first_row=self._first_row,
            last_row=self._last_row,
            blocks=blocks,
            row_bloom=BloomFilter.build(self._rows, bits_per_key)
            if bits_per_key
            else BloomFilter.match_all(),
            column_bloom=None
            if self._columns is None
            else BloomFilter.build(self._columns, bits_per_key),
            pages=self._page_index(data, parquet, blocks) if self._version >= 2 else None,
        )
        tail = self._footer_bytes(parquet, footer)
        out = b"".join((memoryview(data)[:data_end], encode_trailer(tail[:-4]), tail))
        info = SSTableInfo(
            key="",
            size=len(out),
            cells=footer.cells,
            rows=footer.rows,
            deletions=sum(footer.kind_counts[1:]),
            blocks=len(blocks),
            min_seq=footer.min_seq,
            max_seq=footer.max_seq,
            first_row=footer.first_row,
            last_row=footer.last_row,
            tail_size=len(out) - data_end,
            locality_group=self._group,
            compression=self._compression,
        )
        return out, info

    def _block_handles(
        self, data: pa.Buffer, parquet: pq.FileMetaData, data_end: int
    ) -> tuple[BlockHandle, ...]:
        ranges = parquet_block_ranges(parquet)
        view = memoryview(data)
        handles = []
        expected = 4
        for (offset, length), (cells, first, last) in zip(ranges, self._block_rows, strict=True):
            # Row groups are written back to back after "PAR1"; the index relies on it.
            assert offset == expected, f"row group at {offset}, expected {expected}"
            expected = offset + length
            crc = crc32c.crc32c(view[offset : offset + length])
            handles.append(BlockHandle(offset, length, cells, crc, first, last))
        assert not handles or expected == data_end, "row groups do not end at the footer"
        return tuple(handles)

    def _page_index(
        self, data: pa.Buffer, parquet: pq.FileMetaData, blocks: tuple[BlockHandle, ...]
    ) -> PageIndex:
        """Read the page headers back and index every page (see ``pages.py``)."""
        view = memoryview(data)
        k = max(1, self._page_cells)
        rows: list[list[int]] = []
        for b, block in enumerate(blocks):
            rg = parquet.row_group(b)
            per_column = []
            for c in range(COLUMNS):
                col = rg.column(c)
                start = col.data_page_offset
                if col.has_dictionary_page:
                    raise AssertionError(f"block {b} column {c} has a dictionary page")
                per_column.append(
                    chunk_pages(view, start, start + col.total_compressed_size, block.cells, k)
                )
            for j in range(len(per_column[0])):
                entry = [b]
                crc = 0
                for c in range(COLUMNS):
                    offset, compressed, uncompressed = per_column[c][j]
                    entry += (offset - block.offset, compressed, uncompressed)
                    crc = crc32c.crc32c(view[offset : offset + compressed], crc)
                entry += (crc, CONTINUES if self._page_continues[len(rows)] else 0)
                rows.append(entry)
        table = np.array(rows, dtype=np.uint32).reshape(len(rows), 3 + 3 * COLUMNS)
        assert len(self._page_rows) == len(rows), "page first rows disagree with the pages"
        starts = [0]
        for block in blocks:
            starts.append(starts[-1] + -(-block.cells // k))
        return PageIndex(
            k, table, tuple(self._page_rows), tuple(starts), tuple(b.cells for b in blocks)
        )

    def _footer_bytes(self, parquet: pq.FileMetaData, footer: Footer) -> bytes:
        """Thrift footer + u32 length + "PAR1": the written row groups and our metadata."""
        sink = pa.BufferOutputStream()
        empty = pq.ParquetWriter(sink, SCHEMA, **self._props)  # type: ignore[arg-type]
        empty.add_key_value_metadata(encode_footer(footer))
        empty.close()
        merged = pq.read_metadata(pa.BufferReader(sink.getvalue()))
        merged.append_row_groups(parquet)
        out = pa.BufferOutputStream()
        merged.write_metadata_file(out)
        # write_metadata_file writes "PAR1" + footer + length + "PAR1"; drop the leading magic.
        tail: bytes = out.getvalue().to_pybytes()
        return tail[4:]
