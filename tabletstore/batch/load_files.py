"""Bulk-load files: written by a batch job, checked and read by the cluster (§8).

A job writes its output as sorted SSTables with the project's own writer
(:func:`write_sstables`, from Arrow tables or record batches or a pandas DataFrame) into its
*staging area* of the database's bucket: ``staging/<principal>/<load-name>/``, whose URL
``client.staging_url(load_name)`` gives (the job writes there with its own credentials to the
bucket). ``tabletstore bulkload TABLE LOAD-NAME`` (or ``table.bulk_load(load_name)``) then
hands them to the table, as HBase's completebulkload does. The cluster reads a load's files
only from the caller's own staging area of its own bucket, through the store it already has:
never a URL the caller names (another endpoint, ``file://``, another table's objects), so a
table admin cannot make the master or a worker read anything with the cluster's credentials
that the caller could not. What one load may make the cluster hold is bounded: at most
:data:`MAX_LOAD_FILES` files of at most :data:`MAX_LOAD_FILE_BYTES` each (refused from the
listing, before a byte is fetched), checked a few at a time within :data:`CHECK_BYTES` bytes
held at once.

1. the master checks every file first (:func:`inspect_sources`): each is an SSTable with the
   SSTable schema, its cells strictly sorted, only puts, only families the table has, and no
   two files overlap in rows. Any failure refuses the whole load before anything is
   committed: nothing is half-loaded;
2. a file that lies inside one tablet's rows, holds families of one locality group and
   stores seq 0 in every cell (what :func:`write_sstables` writes) is *adopted as it is*: the
   master copies the bytes it checked into the database's bucket (``tables/<table-id>/bulk/
   <locality-group>/<id>.parquet``, no decode, no encode) and the tablet's worker adds that
   object to the tablet with a ``seq_base`` in its ``SSTableRef`` (ref version 2): the
   tablet's next sequence number, added to every stored seq when the SSTable is read, so
   its cells are ordered against written ones exactly as cells written at that moment;
3. any other file (one spanning a tablet boundary: it is cut there, several locality
   groups, stored seqs) takes the cell path: the worker serving each tablet reads the cells
   in its row range (:func:`cells_for_tablet`; checksums verified), gives them fresh
   sequence numbers and writes them as new SSTables, one per locality group;
4. each tablet commits its part (adopted and written SSTables) in one METADATA update
   (``Tablet.bulk_load``): atomic per tablet. Loaded cells are then read, deleted, versioned,
   compacted and collected exactly like written ones.

So a job that cuts its files at the table's tablet boundaries (``split_keys=`` of
:func:`write_sstables`, from ``table.sample_row_keys()``, as HBase's HFileOutputFormat2
partitions by region) has every file adopted and nothing re-encoded. Adopted SSTables keep
the job's block size and compression, and no bloom filter, until a compaction rewrites them.

Input columns of :func:`write_sstables`: ``row``, ``family``, ``qualifier``, ``value``
(binary, or strings encoded as UTF-8) and optionally ``timestamp`` (int64 µs; default: now).
Two cells of one (row, family, qualifier, timestamp) are refused: which one wins would be
arbitrary.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tabletstore.clock import micros, wall_time
from tabletstore.data.schema import TableSchema
from tabletstore.errors import Corruption, InvalidArgument, TabletStoreError
from tabletstore.keys import CellKind
from tabletstore.sstable.format import SCHEMA
from tabletstore.sstable.reader import SSTableCore
from tabletstore.sstable.writer import write_sstable_table
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectInfo, ObjectStore, object_url

__all__ = [
    "CHECK_BYTES",
    "MAX_LOAD_FILES",
    "MAX_LOAD_FILE_BYTES",
    "SourceFile",
    "Stage",
    "awrite_sstables",
    "cells_for_tablet",
    "content_load_id",
    "inspect_sources",
    "overlapping",
    "to_cells_table",
    "write_sstables",
]

#: Cells per SSTable written by :func:`write_sstables` (a file per this many cells).
DEFAULT_FILE_CELLS = 1_000_000
#: Block size of bulk-load files: they are read whole, once, so large blocks (fewer Parquet
#: row groups to write and decode) cost less; the tablets' own SSTables use their locality
#: group's block size.
STAGING_BLOCK_SIZE = 1 << 20
#: Compression of bulk-load files: written once, decoded twice (the master's check, then the
#: tablets' workers) and deleted, so speed over size (as Spark's Parquet default, snappy):
#: lz4 decodes about 3 times as fast as zstd here. ``compression="zstd"`` for slow links.
STAGING_COMPRESSION = "lz4"
#: SSTable format of bulk-load files: 1, no page index (read whole, never looked up by page:
#: format 2's small pages and their index cost about 3 times the encode here, for nothing).
STAGING_FORMAT = 1
#: Bulk-load files the master checks at once.
CHECK_PARALLELISM = 4
#: Files one bulk load may have.
MAX_LOAD_FILES = 10_000
#: Largest bulk-load file: each is held whole while it is checked (and while a worker reads
#: a tablet's cells from it). ``write_sstables`` cuts files of ``DEFAULT_FILE_CELLS`` cells,
#: well under this for cells up to about 200 bytes; larger cells need ``file_cells=`` smaller.
MAX_LOAD_FILE_BYTES = 256 * 1024 * 1024
#: Bytes of bulk-load files the master holds at once while checking them.
CHECK_BYTES = 256 * 1024 * 1024
#: The columns a bulk-load file's check decodes (not the values; seq to know whether the
#: file can be adopted: every stored seq 0).
_CHECKED = ("row", "family", "qualifier", "ts", "seq", "kind")
_SORT = [
    ("row", "ascending"),
    ("family", "ascending"),
    ("qualifier", "ascending"),
    ("ts", "descending"),
]


def _as_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "to_pandas") or type(data).__name__ == "DataFrame":
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, Mapping):  # column name -> values
        return pa.table(dict(data))
    if isinstance(data, Iterable):
        batches = list(data)
        if all(isinstance(b, pa.RecordBatch) for b in batches):
            return pa.Table.from_batches(batches)
    raise InvalidArgument(
        f"bulk-load input must be an Arrow table, record batches, a mapping of columns or a "
        f"DataFrame, got "
        f"{type(data).__name__}"
    )


def _binary(table: pa.Table, name: str) -> pa.Array:
    if name not in table.column_names:
        raise InvalidArgument(f"bulk-load input has no {name!r} column: {table.column_names}")
    col = table.column(name).combine_chunks()
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return pc.cast(col, pa.binary())
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return pc.cast(col, pa.binary())
    raise InvalidArgument(f"bulk-load column {name!r} must be binary or string, not {col.type}")


def to_cells_table(data: Any, *, now_micros: int | None = None) -> pa.Table:
    """The input as a sorted table of the SSTable schema (seq 0, kind PUT): InvalidArgument
    for a missing column, a wrong type, a null or a duplicate cell."""
    table = _as_table(data)
    n = table.num_rows
    cols = {name: _binary(table, name) for name in ("row", "qualifier", "value")}
    if "family" not in table.column_names:
        raise InvalidArgument(f"bulk-load input has no 'family' column: {table.column_names}")
    family = pc.cast(table.column("family").combine_chunks(), pa.string())
    if "timestamp" in table.column_names:
        ts = pc.cast(table.column("timestamp").combine_chunks(), pa.int64())
    else:
        now = now_micros if now_micros is not None else micros(wall_time())
        ts = pa.array(np.full(n, now, dtype=np.int64))
    arrays = [cols["row"], family, cols["qualifier"], ts]
    for name, arr in zip(("row", "family", "qualifier", "timestamp"), arrays, strict=True):
        if arr.null_count:
            raise InvalidArgument(f"bulk-load column {name!r} has null values")
    if cols["value"].null_count:
        raise InvalidArgument("bulk-load column 'value' has null values")
    out = pa.Table.from_arrays(
        [
            *arrays,
            pa.array(np.zeros(n, dtype=np.int64)),
            pa.array(np.full(n, int(CellKind.PUT), dtype=np.int8)),
            cols["value"],
        ],
        schema=SCHEMA,
    )
    dup = _first_not_strictly_sorted(out)
    if dup is None:
        return out  # a job's output usually comes sorted: no sort then
    out = out.sort_by(_SORT)
    dup = _first_not_strictly_sorted(out)
    if dup is not None:
        raise InvalidArgument(
            f"bulk-load input has two cells for row {out.column(0)[dup].as_py()!r} column "
            f"{out.column(1)[dup].as_py()}:{out.column(2)[dup].as_py()!r} timestamp "
            f"{out.column(3)[dup].as_py()}"
        )
    return out


def _first_not_strictly_sorted(table: pa.Table) -> int | None:
    """The first index whose (row, family, qualifier, ts desc) key is not strictly after its
    predecessor's, or None."""
    n = table.num_rows
    if n < 2:
        return None
    a = [table.column(i).slice(0, n - 1) for i in range(4)]
    b = [table.column(i).slice(1) for i in range(4)]
    ok = pc.greater(a[3], b[3])
    for i in (2, 1, 0):
        ok = pc.or_(pc.less(a[i], b[i]), pc.and_(pc.equal(a[i], b[i]), ok))
    if pc.all(ok).as_py():
        return None
    return int(np.flatnonzero(~ok.to_numpy(zero_copy_only=False))[0]) + 1


async def awrite_sstables(
    data: Any,
    url: str,
    *,
    file_cells: int = DEFAULT_FILE_CELLS,
    compression: str = STAGING_COMPRESSION,
    block_size: int = STAGING_BLOCK_SIZE,
    now_micros: int | None = None,
    store: ObjectStore | None = None,
    split_keys: Sequence[bytes] = (),
) -> list[str]:
    """Write ``data`` (see the module docstring) as sorted SSTables under the store ``url``;
    returns the keys written. Files of one call never overlap; files of several calls (a
    job's partitions) must not either: range-partition the output by row. No file holds
    rows on both sides of a key of ``split_keys`` (the table's tablet boundaries: then
    every file is adopted whole, none re-encoded)."""
    table = to_cells_table(data, now_micros=now_micros)
    cuts = _boundary_cuts(table.column(0), split_keys)
    own = store is None
    st = open_store(url) if store is None else store
    keys: list[str] = []
    try:
        token = uuid.uuid4().hex[:12]
        start = 0
        while start < table.num_rows:
            end = min(table.num_rows, start + file_cells)
            boundary = next((c for c in cuts if c > start), table.num_rows)
            if boundary <= end:
                end = boundary  # a tablet boundary: rows on each side go to separate files
            elif end < table.num_rows:
                # Keep a row in one file: files must not overlap in rows.
                rows = table.column(0)
                last = rows[end - 1]
                tail = rows.slice(end, boundary - end)
                same = pc.equal(tail, last).to_numpy(zero_copy_only=False)
                end += int(np.argmin(same)) if not same.all() else len(same)
            data_bytes, _ = write_sstable_table(
                table.slice(start, end - start),
                compression=compression,
                block_size=block_size,
                bloom_bits_per_key=0,  # read whole, never looked up by row: no hashing
                format_version=STAGING_FORMAT,
            )
            key = f"bulk-{token}-{len(keys):05d}.sst"
            await st.create(key, data_bytes)
            keys.append(key)
            start = end
    finally:
        if own:
            await st.close()
    return keys


def _boundary_cuts(rows: pa.ChunkedArray, split_keys: Sequence[bytes]) -> list[int]:
    """The first cell index at or after each of ``split_keys`` (sorted, distinct, inside)."""
    keys = sorted(set(split_keys))
    if not keys or not len(rows):
        return []
    arr = rows.combine_chunks() if isinstance(rows, pa.ChunkedArray) else rows
    # Rows are sorted: a binary search per key over the Arrow column (no Python list of rows).
    out = []
    for key in keys:
        lo, hi = 0, len(arr)
        while lo < hi:
            mid = (lo + hi) // 2
            if arr[mid].as_py() < key:
                lo = mid + 1
            else:
                hi = mid
        if 0 < lo < len(arr):
            out.append(lo)
    return sorted(set(out))


def write_sstables(data: Any, url: str, **kw: Any) -> list[str]:
    """:func:`awrite_sstables` from synchronous code (a Dask or Spark task)."""
    return asyncio.run(awrite_sstables(data, url, **kw))


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A checked bulk-load SSTable: its key, size, rows and cells."""

    key: str
    size: int
    first_row: bytes
    last_row: bytes
    cells: int
    #: A hash of the file's bytes (blake2b, hex): :func:`content_load_id`.
    digest: str = ""
    #: The locality groups of its families (in the table's schema), sorted.
    groups: tuple[str, ...] = ()
    #: Whether every cell stores seq 0 (the footer's seq range is 0,0).
    zero_seqs: bool = False
    #: Where the master copied it in the database's bucket for adoption ("" when not).
    staged: str = ""

    @property
    def adoptable(self) -> bool:
        """Whether a tablet can take the file as it is (module docstring, step 2), when it
        lies inside the tablet's rows."""
        return len(self.groups) == 1 and self.zero_seqs


#: Called with each file that passed its checks and its bytes: returns where it staged
#: them for adoption, or "" (master/bulk_load.py).
Stage = Callable[[SourceFile, bytes], Awaitable[str]]


def content_load_id(files: Sequence[SourceFile]) -> str:
    """The default id of a bulk load of ``files``: a hash of their contents (not of their
    names), so loading the same output again is recognised as the same load."""
    h = hashlib.blake2b(digest_size=12)
    for f in sorted(files, key=lambda f: f.first_row):
        h.update(bytes.fromhex(f.digest))
    return "c" + h.hexdigest()


def _check_size(name: str, size: int) -> None:
    if size > MAX_LOAD_FILE_BYTES:
        raise InvalidArgument(
            f"bulk-load file {name} has {size} bytes, over the limit of "
            f"MAX_LOAD_FILE_BYTES={MAX_LOAD_FILE_BYTES}: write smaller files (file_cells=)"
        )


class _ByteSlots:
    """At most ``parallel`` holders and ``budget`` bytes held at once (one holder may hold
    up to the whole budget)."""

    def __init__(self, parallel: int, budget: int) -> None:
        self._free = budget
        self._budget = budget
        self._slots = asyncio.Semaphore(parallel)
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        size = min(size, self._budget)
        async with self._slots:
            async with self._changed:
                await self._changed.wait_for(lambda: self._free >= size)
                self._free -= size
            try:
                yield
            finally:
                async with self._changed:
                    self._free += size
                    self._changed.notify_all()


async def inspect_sources(
    store: ObjectStore, schema: TableSchema, stage: Stage | None = None, *, prefix: str = ""
) -> list[SourceFile]:
    """Check every object under ``prefix`` of ``store`` for a bulk load into a table of
    ``schema`` (module docstring, step 1); InvalidArgument naming the first problem found.
    ``stage`` is given each file that passed, with the bytes that were checked (no second
    GET). The listing's sizes are checked against the limits before anything is fetched."""
    listed: list[ObjectInfo] = []
    async for info in store.list(prefix):
        if len(listed) == MAX_LOAD_FILES:
            raise InvalidArgument(
                f"more than MAX_LOAD_FILES={MAX_LOAD_FILES} files to bulk-load under "
                f"{object_url(store.url, prefix)}"
            )
        _check_size(object_url(store.url, info.key), info.size)
        listed.append(info)
    if not listed:
        raise InvalidArgument(f"no files to bulk-load under {object_url(store.url, prefix)}")
    # A few files at a time and a bounded number of bytes: each is held whole while checked.
    slots = _ByteSlots(CHECK_PARALLELISM, CHECK_BYTES)

    async def check(info: ObjectInfo) -> SourceFile:
        key = info.key
        name = object_url(store.url, key)
        async with slots.hold(info.size):
            data = await store.get(key)
            if data is None:
                raise InvalidArgument(f"bulk-load file {name} vanished while being checked")
            _check_size(name, len(data))  # replaced since the listing
            # Decoding is CPU work that releases the GIL: off the event loop, in parallel.
            file = await asyncio.to_thread(_check_file, name, key, data, schema)
            if stage is not None:
                file = replace(file, staged=await stage(file, data))
            return file

    # Every check runs to its end, even after one refused its file: a file being staged
    # then is either staged (its key known to the caller, who deletes it) or not at all.
    results = await asyncio.gather(*(check(info) for info in listed), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    files = [r for r in results if isinstance(r, SourceFile)]
    files.sort(key=lambda f: f.first_row)
    for a, b in itertools.pairwise(files):
        if b.first_row <= a.last_row:
            raise InvalidArgument(
                f"bulk-load files overlap: {object_url(store.url, a.key)} has rows up to "
                f"{a.last_row!r} and {object_url(store.url, b.key)} starts at {b.first_row!r}"
            )
    return files


def _verified_table(
    name: str,
    data: bytes,
    start_row: bytes = b"",
    end_row: bytes | None = None,
    columns: Sequence[str] | None = None,
    core: SSTableCore | None = None,
) -> pa.Table:
    """The cells of an SSTable object's blocks that may hold rows of ``[start_row,
    end_row)``, as Arrow columns (``columns`` only, when given: the others are not decoded),
    after its footer, block index and those blocks' crc32c are checked (no Python object per
    cell); Corruption otherwise."""
    core = core or SSTableCore.from_tail(name, len(data), data)
    blocks = core.blocks
    first = core.first_block_from(start_row)
    last = first - 1
    while last + 1 < len(blocks) and (end_row is None or blocks[last + 1].first_row < end_row):
        last += 1
    if last < first:
        empty = SCHEMA.empty_table()
        return empty if columns is None else empty.select(columns)
    # The blocks are contiguous: one decode with the footer already parsed, each block's
    # crc32c and the cell count checked (SSTableCore.decode_range).
    offset = blocks[first].offset
    end = blocks[last].offset + blocks[last].length
    return core.decode_range(first, last, memoryview(data)[offset:end], columns)


def _check_file(name: str, key: str, data: bytes, schema: TableSchema) -> SourceFile:
    try:
        file_schema = pq.ParquetFile(pa.BufferReader(data)).schema_arrow.remove_metadata()
    except (pa.ArrowException, OSError) as exc:
        raise InvalidArgument(f"bulk-load file {name} is not an SSTable: {exc}") from exc
    if not file_schema.equals(SCHEMA):
        raise InvalidArgument(
            f"bulk-load file {name} has the wrong schema: {file_schema} "
            f"(expected the SSTable schema {SCHEMA})"
        )
    try:
        core = SSTableCore.from_tail(name, len(data), data)
        # Every block's checksum, but only the columns the checks read are decoded.
        table = _verified_table(name, data, columns=_CHECKED, core=core)
    except (Corruption, TabletStoreError, pa.ArrowException) as exc:
        raise InvalidArgument(f"bulk-load file {name} is not a valid SSTable: {exc}") from exc
    if table.num_rows == 0:
        raise InvalidArgument(f"bulk-load file {name} has no cells")
    bad = _first_not_strictly_sorted(table)
    if bad is not None:
        raise InvalidArgument(
            f"bulk-load file {name} is not sorted (or repeats a cell) at cell {bad}: row "
            f"{table.column(0)[bad].as_py()!r}"
        )
    kinds = pc.unique(table.column("kind")).to_pylist()
    if kinds != [int(CellKind.PUT)]:
        raise InvalidArgument(f"bulk-load file {name} holds deletion entries: only puts load")
    families = set(pc.unique(table.column("family")).to_pylist())
    unknown = families - set(schema.families)
    if unknown:
        raise InvalidArgument(
            f"bulk-load file {name} has cells of families {sorted(unknown)} that table "
            f"{schema.name!r} does not have"
        )
    aggregate = sorted(f for f in families if schema.families[f].value_type is not None)
    if aggregate:
        # Bulk-loaded cells bypass the memtable with fresh seqs: replay relies on aggregate
        # families never getting cells that way (engine/log_replay.py, _FlushedRows).
        raise InvalidArgument(
            f"bulk-load file {name} has cells of aggregate families {aggregate}: write them "
            "with AddToCell or MergeToCell"
        )
    rows = table.column("row")
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    footer = core.footer
    return SourceFile(
        key,
        len(data),
        rows[0].as_py(),
        rows[-1].as_py(),
        table.num_rows,
        digest,
        groups=tuple(sorted({schema.families[f].locality_group for f in families})),
        # The footer's range and the column itself (the footer is the job's word only).
        zero_seqs=footer.min_seq == footer.max_seq == 0
        and pc.min_max(table.column("seq")).as_py() == {"min": 0, "max": 0},
    )


async def cells_for_tablet(
    store: ObjectStore,
    keys: Sequence[str],
    ranges: Sequence[tuple[bytes, bytes | None]],
    schema: TableSchema,
) -> dict[str, pa.Table]:
    """The cells of the files ``keys`` of ``store`` (in row order, not overlapping) that fall
    in one of ``ranges`` (``[start, end)`` each, in row order, disjoint), per locality group,
    sorted (module docstring, step 2). One file is held whole at a time."""
    if not ranges:
        return {}
    parts: list[pa.Table] = []
    for key in keys:
        data = await store.get(key)
        name = object_url(store.url, key)
        if data is None:
            raise InvalidArgument(f"bulk-load file {name} is gone")
        _check_size(name, len(data))
        parts.append(await asyncio.to_thread(_cells_in, name, data, ranges))
        del data
    cells = pa.concat_tables(parts) if parts else SCHEMA.empty_table()
    families = pc.unique(cells.column(1)).to_pylist()
    unknown = set(families) - set(schema.families)
    if unknown:
        raise InvalidArgument(f"bulk-load cells of families {sorted(unknown)} the table lacks")
    aggregate = sorted(f for f in families if schema.families[f].value_type is not None)
    if aggregate:
        raise InvalidArgument(f"bulk-load cells of aggregate families {aggregate}")
    by_group: dict[str, list[str]] = {}
    for fam in families:
        by_group.setdefault(schema.families[fam].locality_group, []).append(fam)
    if len(by_group) == 1:
        return {next(iter(by_group)): cells}
    return {
        group: cells.filter(pc.is_in(cells.column(1), value_set=pa.array(fams, pa.string())))
        for group, fams in by_group.items()
    }


def _cells_in(name: str, data: bytes, ranges: Sequence[tuple[bytes, bytes | None]]) -> pa.Table:
    """The verified cells of one file in ``ranges`` (a thread's work: decoding releases the
    GIL)."""
    table = _verified_table(name, data, ranges[0][0], ranges[-1][1])
    return table.filter(_in_ranges(table.column(0), ranges))


def _in_ranges(rows: pa.ChunkedArray, ranges: Sequence[tuple[bytes, bytes | None]]) -> Any:
    """True for each row in one of ``ranges``."""
    keep = None
    for start, end in ranges:
        one = pc.greater_equal(rows, pa.scalar(start, pa.binary()))
        if end is not None:
            one = pc.and_(one, pc.less(rows, pa.scalar(end, pa.binary())))
        keep = one if keep is None else pc.or_(keep, one)
    return keep


def overlapping(files: Sequence[SourceFile], start: bytes, end: bytes | None) -> list[str]:
    """Keys of the files with rows in ``[start, end)``."""
    return [f.key for f in files if f.last_row >= start and (end is None or f.first_row < end)]
