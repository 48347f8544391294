"""One decoded SSTable block: its cells as Arrow columns plus a row index (§4, §6).

A block is what the block cache holds (§6 "Caching for read performance"). It keeps the
row group's Arrow columns (compact: about the raw cell bytes) and, for lookups, the distinct
row keys of the block with the index of each one's first cell. A point read bisects the row
keys and turns only that row's slice into :class:`~tabletstore.keys.Cell` tuples; a scan turns
a whole block at once. A Block is immutable and shared between readers.

Decoding a row group's bytes with pyarrow is :class:`RowGroupDecoder`'s job: it reads through
one long-lived ``pyarrow.parquet.ParquetFile`` built from the SSTable's already parsed footer,
whose source serves the fetched block bytes at their offsets in the object. So a read never
parses the Parquet footer or builds a schema again. Only SSTables whose pages the page decoder
(``pages.py``) does not read keep one (format 1, and batch reads of pages compressed with
another codec than zstd): the parsed footer costs about 7 KiB of memory per block.
"""

from __future__ import annotations

import io
import threading
from bisect import bisect_left
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tabletstore.errors import Corruption
from tabletstore.keys import Cell

__all__ = ["Block", "BytesLike", "RowGroupDecoder"]

BytesLike = bytes | bytearray | memoryview

#: Estimated bytes of Python objects per distinct row in the row index (list slot, bytes
#: header, start offset), charged to the block cache on top of the Arrow buffers.
_ROW_INDEX_OVERHEAD = 80


class Block:
    """An immutable decoded block (see the module docstring)."""

    __slots__ = ("_columns", "_row_keys", "_row_starts", "cells", "nbytes")

    def __init__(self, table: pa.Table) -> None:
        """REQUIRES: ``table`` has the SSTable schema and at least one row."""
        self._columns = [
            col.chunk(0) if col.num_chunks == 1 else col.combine_chunks() for col in table.columns
        ]
        rows = self._columns[0]
        n = len(rows)
        if n > 1:
            changed = pc.not_equal(rows.slice(1), rows.slice(0, n - 1))
            firsts = np.flatnonzero(changed.to_numpy(zero_copy_only=False)) + 1
            starts = [0, *firsts.tolist()]
        else:
            starts = [0]
        #: Distinct row keys, ascending; row_keys[i]'s cells are [row_starts[i], row_starts[i+1]).
        self._row_keys: list[bytes] = rows.take(pa.array(starts, pa.int64())).to_pylist()
        self._row_starts: list[int] = [*starts, n]
        self.cells = n
        self.nbytes = (
            table.get_total_buffer_size()
            + sum(map(len, self._row_keys))
            + _ROW_INDEX_OVERHEAD * len(self._row_keys)
        )

    @property
    def first_row(self) -> bytes:
        return self._row_keys[0]

    @property
    def last_row(self) -> bytes:
        return self._row_keys[-1]

    def row_cells(self, row: bytes) -> list[Cell]:
        """The cells of ``row`` in this block (empty if it has none)."""
        i = bisect_left(self._row_keys, row)
        if i == len(self._row_keys) or self._row_keys[i] != row:
            return []
        return self._materialize(self._row_starts[i], self._row_starts[i + 1])

    def cells_in(self, start_row: bytes = b"", end_row: bytes | None = None) -> list[Cell]:
        """The cells whose row is in ``[start_row, end_row)`` (``None``: to the end)."""
        keys = self._row_keys
        lo = 0 if not start_row else bisect_left(keys, start_row)
        hi = len(keys) if end_row is None else bisect_left(keys, end_row)
        if lo >= hi:
            return []
        return self._materialize(self._row_starts[lo], self._row_starts[hi])

    def _materialize(self, start: int, stop: int) -> list[Cell]:
        if start == 0 and stop == self.cells:
            lists = [c.to_pylist() for c in self._columns]
        else:
            lists = [c.slice(start, stop - start).to_pylist() for c in self._columns]
        return list(map(Cell, *lists))


class _BlockSource(io.RawIOBase):
    """A read-only file of ``size`` bytes that holds only the bytes of one block.

    pyarrow reads a row group's column chunks by their offsets in the object; this serves
    them from the fetched block. A read outside it is a format violation (Corruption).
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0
        self._offset = 0
        self._data: memoryview = memoryview(b"")

    def load(self, offset: int, data: BytesLike) -> None:
        self._offset = offset
        self._data = memoryview(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = pos
        elif whence == io.SEEK_CUR:
            self._pos += pos
        else:
            self._pos = self._size + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int | None = -1) -> bytes:
        start = self._pos - self._offset
        if n is None or n < 0:
            n = self._size - self._pos
        if start < 0 or start + n > len(self._data):
            raise OSError(
                f"read of {n} bytes at {self._pos} falls outside the block at "
                f"{self._offset} ({len(self._data)} bytes)"
            )
        self._pos += n
        return self._data[start : start + n].tobytes()


class RowGroupDecoder:
    """Decodes row groups of one SSTable from their bytes (see the module docstring).

    Thread-safe: decodes are serialized by a lock, as the source holds one block at a time.
    """

    def __init__(self, parquet: pq.FileMetaData, object_size: int) -> None:
        self._source = _BlockSource(object_size)
        self._parquet = parquet
        #: Made at the first decode: readers of format-2 pages never need it.
        self._pq_file: pq.ParquetFile | None = None
        self._lock = threading.Lock()

    @property
    def _file(self) -> pq.ParquetFile:
        """REQUIRES: the lock held."""
        if self._pq_file is None:
            self._pq_file = pq.ParquetFile(self._source, metadata=self._parquet, pre_buffer=False)
        return self._pq_file

    def decode(self, index: int, offset: int, data: BytesLike, seq_base: int = 0) -> Block:
        """The decoded block ``index`` whose bytes ``data`` start at ``offset``, ``seq_base``
        added to its seqs (``SSTableRef.seq_base``).

        REQUIRES: ``data`` passed its checksum. Corruption if it still does not decode.
        """
        with self._lock:
            self._source.load(offset, data)
            try:
                table = self._file.read_row_group(index, use_threads=False)
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise Corruption(f"block {index} does not decode: {exc}") from exc
            finally:
                self._source.load(0, b"")
        if table.num_rows == 0:
            raise Corruption(f"block {index} decodes to no cells")
        if seq_base:
            try:
                seqs = pc.add_checked(table.column(4), pa.scalar(seq_base, pa.int64()))
            except pa.ArrowInvalid as exc:
                raise Corruption(f"block {index}: seq base {seq_base} overflows: {exc}") from exc
            table = table.set_column(4, table.schema.field(4), seqs)
        return Block(table)

    def decode_range(
        self,
        indexes: list[int],
        offset: int,
        data: BytesLike,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Consecutive blocks ``indexes`` decoded in one call (batch reads, §8), whose bytes
        ``data`` start at ``offset``: one decode instead of one per block; ``columns`` only,
        when given (the others' pages are not decompressed).

        REQUIRES: every block's bytes passed its checksum. Corruption if they do not decode.
        """
        with self._lock:
            self._source.load(offset, data)
            try:
                return self._file.read_row_groups(indexes, columns=columns, use_threads=False)
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise Corruption(
                    f"blocks {indexes[0]}..{indexes[-1]} do not decode: {exc}"
                ) from exc
            finally:
                self._source.load(0, b"")
