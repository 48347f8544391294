"""Reading a snapshot straight from the bucket: input splits and a reader (§8).

The paper's §8: Bigtable tables are MapReduce input. Here a batch job needs only the bucket
(read-only credentials: GETs and LISTs) and a snapshot id: no coordinator, no worker.

* :func:`open_snapshot` finds the manifest (:mod:`tabletstore.metadata.snapshot`) in the
  store of the database URL (or store URL) it is given.
* :meth:`Snapshot.splits` cuts it into :class:`Split` values (picklable, one per tablet, and
  finer for tablets larger than ``max_split_bytes``, at SSTable block boundaries read from the
  footers: every row lies in exactly one split).
* :func:`read_split` reads one split with the engine's own semantics: the SSTables of the
  tablet merged by :func:`~tabletstore.engine.iterators.amerge_batches`, then
  :func:`~tabletstore.engine.iterators.avisible_batches` with ``snapshot_seq`` = the tablet's
  cut, the schema's GC rules evaluated at the snapshot's instant, the tablet's row range (an
  SSTable shared with a split sibling holds rows of both). No rule is re-implemented here.

Two documented output shapes, as Arrow record batches:

``cells`` (:data:`CELLS_SCHEMA`): one record per visible cell, in row order, then family,
qualifier, newest timestamp first::

    row: binary, family: string, qualifier: binary, timestamp: int64 (µs), value: binary

``wide``: one record per row key: ``row: binary`` then, for each column asked for with
``columns=["family:qualifier", ...]`` (required for this shape, so every batch and every
split has the same schema), a ``binary`` column named ``family:qualifier`` holding the newest
visible value (null when the row has none).

The Arrow path. A split is read as Arrow columns end to end, with no Python object per cell:
each SSTable with one ranged GET and one decode (``SSTable.read_arrow``, only the columns
used), merged (concatenated when their row ranges are disjoint, else sorted), then the
engine's rules applied column-wise (:mod:`tabletstore.batch.arrow_rules`: deletions of every
scope, rewrites of a version, the cut, per-family GC rules), projected, filtered and, for the
wide shape, pivoted with Arrow compute. When the footers vouch that the rules keep every cell
(no deletion entries, largest seq within the cut, no GC rule on the families read, and no
version rewritten, checked column-wise) the kind and seq columns are not even decoded. The
per-cell engine path (``amerge_batches`` + ``avisible_batches`` + ``apply_filter``) is taken
only for a split holding aggregate parts and for filters ``arrow_rules.vectorisable`` refuses
(``Interleave``, ``Condition``, ``Sink``, ``ApplyLabel``, ``RowSample``, non-ASCII regex
patterns). Both paths give the same batches (tests/batch/test_arrow_rules.py: a randomized
differential test against the per-cell path and the client's read_rows).

Projection and selection, applied as a read of the table applies them: ``columns`` (families
``"f"`` or columns ``"f:q"``), ``row_range`` (a :class:`~tabletstore.data.query.RowRange`),
``start_ts``/``end_ts`` (µs, ``[start, end)``; applied after deletions and versions, like a
``TimestampRange`` filter) and ``filter``: any :mod:`tabletstore.data.filters` row filter,
evaluated per row by :func:`~tabletstore.data.filters.apply_filter` exactly as a worker does.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabletstore.batch.arrow_rules import filter_table, vectorisable, visible_table
from tabletstore.clock import micros
from tabletstore.data.filters import RowFilter, apply_filter
from tabletstore.data.model import Cell as ApiCell
from tabletstore.data.query import RowRange
from tabletstore.data.schema import TableSchema
from tabletstore.engine.iterators import AsyncCellSource, amerge_batches, avisible_batches
from tabletstore.errors import InvalidArgument, NotFound
from tabletstore.metadata.record import SSTableRef
from tabletstore.metadata.snapshot import SnapshotManifest, TabletSnapshot, find_manifest
from tabletstore.metadata.store_location import locate_store
from tabletstore.sstable import SSTable
from tabletstore.sstable.format import SCHEMA
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectStore, object_url

__all__ = [
    "CELLS_SCHEMA",
    "DEFAULT_SPLIT_BYTES",
    "Snapshot",
    "Split",
    "aopen_snapshot",
    "aread_split",
    "open_snapshot",
    "read_split",
    "wide_schema",
]

T = TypeVar("T")

#: The ``cells`` shape.
CELLS_SCHEMA = pa.schema(
    [
        ("row", pa.binary()),
        ("family", pa.string()),
        ("qualifier", pa.binary()),
        ("timestamp", pa.int64()),
        ("value", pa.binary()),
    ]
)
#: Tablets with more SSTable bytes than this are cut into several splits.
DEFAULT_SPLIT_BYTES = 64 * 1024 * 1024
#: Records per Arrow batch the reader yields (at most).
BATCH_ROWS = 65536


def wide_schema(columns: Sequence[str]) -> pa.Schema:
    """The ``wide`` shape for ``columns`` (each ``"family:qualifier"``)."""
    return pa.schema([("row", pa.binary()), *((c, pa.binary()) for c in columns)])


@dataclass(frozen=True, slots=True)
class Split:
    """One input split: a row range of one tablet of a snapshot. Picklable; carries all a
    reader needs besides the bucket (no manifest read per split)."""

    store_url: str
    snapshot_id: str
    table: str
    tablet: TabletSnapshot
    schema: TableSchema
    #: The snapshot's instant in µs: GC rules by age are evaluated then.
    now_micros: int
    #: The split's rows, ``[start_row, end_row)`` inside the tablet's range.
    start_row: bytes
    end_row: bytes | None
    #: SSTable bytes of the split (an estimate: block lengths).
    size: int = 0
    #: Host hint for schedulers (none: object storage is equally far from everyone).
    locations: tuple[str, ...] = field(default=())


class Snapshot:
    """An opened snapshot (a manifest and where its bucket is)."""

    def __init__(self, store_url: str, manifest: SnapshotManifest) -> None:
        self.store_url = store_url
        self.manifest = manifest

    @property
    def snapshot_id(self) -> str:
        return self.manifest.snapshot_id

    @property
    def schema(self) -> TableSchema:
        return self.manifest.schema

    def splits(self, *, max_split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Split]:
        """The snapshot's input splits, in row order (see the module docstring)."""
        return _run(self.asplits(max_split_bytes=max_split_bytes))

    async def asplits(self, *, max_split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Split]:
        if max_split_bytes <= 0:
            raise InvalidArgument(f"max_split_bytes must be > 0, got {max_split_bytes}")
        m = self.manifest
        base = [
            Split(
                self.store_url,
                m.snapshot_id,
                m.table,
                t,
                m.schema,
                micros(m.created_at),
                t.start_row,
                t.end_row,
                t.size,
            )
            for t in m.tablets
        ]
        big = [s for s in base if s.size > max_split_bytes]
        if not big:
            return base
        store = open_store(self.store_url)
        try:
            finer = {s.tablet.tablet_id: await _finer(store, s, max_split_bytes) for s in big}
        finally:
            await store.close()
        out: list[Split] = []
        for s in base:
            out.extend(finer.get(s.tablet.tablet_id, [s]))
        return out

    def read(self, **kw: Any) -> pa.Table:
        """The whole snapshot as one Arrow table (keyword arguments as :func:`aread_split`),
        its splits read concurrently on this process."""
        return _run(self.aread(**kw))

    async def aread(self, **kw: Any) -> pa.Table:
        shape = kw.get("shape", "cells")
        schema = CELLS_SCHEMA if shape == "cells" else wide_schema(list(kw.get("columns") or ()))
        splits = await self.asplits()
        store = open_store(self.store_url)

        async def one(split: Split) -> list[pa.RecordBatch]:
            return [b async for b in aread_split(split, store=store, **kw)]

        try:
            parts = await asyncio.gather(*(one(s) for s in splits))
        finally:
            await store.close()
        return pa.Table.from_batches([b for part in parts for b in part], schema=schema)


async def _finer(store: ObjectStore, split: Split, max_bytes: int) -> list[Split]:
    """Cut a tablet's split at block boundaries so each piece has about ``max_bytes``."""
    blocks: list[tuple[bytes, int]] = []
    for refs in split.tablet.sstables.values():
        for ref in refs:
            table = await _open_sstable(store, split, ref)
            blocks.extend((b.first_row, b.length) for b in table.footer.blocks)
            table.close()
    blocks.sort()
    cuts: list[bytes] = []
    acc = 0
    for first_row, length in blocks:
        if acc >= max_bytes and first_row > (cuts[-1] if cuts else split.start_row):
            if split.end_row is None or first_row < split.end_row:
                cuts.append(first_row)
                acc = 0
        acc += length
    bounds: list[bytes | None] = [split.start_row, *cuts, split.end_row]
    sizes = [0] * (len(bounds) - 1)
    for first_row, length in blocks:
        i = sum(1 for c in cuts if c <= first_row)
        sizes[i] += length
    return [
        replace(split, start_row=lo or b"", end_row=hi, size=size)
        for lo, hi, size in zip(bounds[:-1], bounds[1:], sizes, strict=True)
    ]


async def _open_sstable(store: ObjectStore, split: Split, ref: SSTableRef) -> SSTable:
    try:
        return await SSTable.open(
            store,
            ref.key,
            size=ref.size,
            tail_size=ref.tail_size or None,
            seq_base=ref.seq_base,  # an adopted bulk-load SSTable's seqs (ref version 2)
        )
    except NotFound as exc:
        raise NotFound(
            f"snapshot {split.snapshot_id} of table {split.table!r} names SSTable "
            f"{object_url(store.url, ref.key)}, which is gone: {exc}"
        ) from exc


async def aopen_snapshot(url: str, snapshot_id: str) -> Snapshot:
    """:func:`open_snapshot` from a coroutine."""
    location = await locate_store(url)
    store = open_store(location.url)
    try:
        manifest = await find_manifest(store, snapshot_id, where=str(location))
    finally:
        await store.close()
    return Snapshot(location.url, manifest)


def open_snapshot(url: str, snapshot_id: str) -> Snapshot:
    """Open snapshot ``snapshot_id`` of a database: ``url`` is the database's URL
    (``file:///dir`` or a directory path, ``etcd://host:port/namespace``) or the store URL of
    its objects (``s3://bucket/prefix?endpoint_url=...``, ``file:///dir/objects``); see
    :mod:`tabletstore.metadata.store_location`. The splits carry the store URL, so the tasks
    reading them need the bucket only. NotFound names a missing manifest and the store
    searched; Corruption a manifest that is not one."""
    return _run(aopen_snapshot(url, snapshot_id))


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from synchronous code (a batch framework's task)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise InvalidArgument(
        "the synchronous batch API was called from a running event loop; use the a* "
        "functions (aopen_snapshot, aread_split) there"
    )


def _parse_columns(
    schema: TableSchema, columns: Sequence[str] | None
) -> tuple[set[str], set[tuple[str, bytes]] | None, set[str]]:
    """(families to read, exact columns wanted or None for all, whole families wanted)."""
    if columns is None:
        return set(schema.families), None, set(schema.families)
    families: set[str] = set()
    exact: set[tuple[str, bytes]] = set()
    whole: set[str] = set()
    for c in columns:
        fam, sep, qual = c.partition(":")
        if fam not in schema.families:
            raise InvalidArgument(f"table {schema.name!r} has no column family {fam!r} ({c!r})")
        families.add(fam)
        if sep:
            exact.add((fam, qual.encode()))
        else:
            whole.add(fam)
    return families, exact, whole


def read_split(split: Split, **kw: object) -> Iterator[pa.RecordBatch]:
    """:func:`aread_split` from synchronous code: all the split's batches."""

    async def collect() -> list[pa.RecordBatch]:
        return [b async for b in aread_split(split, **kw)]  # type: ignore[arg-type]

    yield from _run(collect())  # type: ignore[misc]


async def aread_split(
    split: Split,
    *,
    columns: Sequence[str] | None = None,
    row_range: RowRange | None = None,
    start_ts: int | None = None,
    end_ts: int | None = None,
    filter: RowFilter | None = None,
    shape: str = "cells",
    batch_rows: int = BATCH_ROWS,
    store: ObjectStore | None = None,
    arrow_path: bool = True,
) -> AsyncIterator[pa.RecordBatch]:
    """The visible cells of ``split`` as Arrow record batches of ``shape`` (see the module
    docstring for every argument; ``arrow_path=False`` forces the per-cell path)."""
    if shape not in ("cells", "wide"):
        raise InvalidArgument(f"shape must be 'cells' or 'wide', got {shape!r}")
    if shape == "wide" and not columns:
        raise InvalidArgument("the wide shape needs columns=['family:qualifier', ...]")
    if shape == "wide" and any(":" not in c for c in columns or ()):
        raise InvalidArgument("wide columns must be 'family:qualifier'")
    schema = split.schema
    families, exact, whole = _parse_columns(schema, columns)
    rng = RowRange.half_open(split.start_row, split.end_row)
    if row_range is not None:
        clipped = row_range.clip(split.start_row, split.end_row)
        if clipped is None:
            return
        rng = clipped
    tablet = split.tablet
    clipped_t = rng.clip(tablet.start_row, tablet.end_row)
    if clipped_t is None:
        return
    start, end = clipped_t.bounds()
    groups = {schema.families[f].locality_group for f in families}
    own = store is None
    st = open_store(split.store_url) if store is None else store
    try:
        tables = [
            await _open_sstable(st, split, ref)
            for group, refs in tablet.sstables.items()
            if group in groups
            for ref in refs
        ]
        gc_rules = {name: fam.gc_rule for name, fam in schema.families.items()}
        if arrow_path and vectorisable(filter):
            fast = await _arrow_cells(
                tables, tablet.cut_seq, families, gc_rules, split.now_micros, start, end
            )
            if fast is not None:
                selected = _select(fast, families, exact, whole, start_ts, end_ts)
                try:
                    selected = filter_table(selected, filter)
                except pa.ArrowInvalid:
                    fast = None  # a regex Arrow's RE2 build refuses: the engine's RE2 decides
            if fast is not None:
                if shape == "wide":
                    selected = _wide(selected, list(columns or ()))
                for b in selected.to_batches(max_chunksize=batch_rows):
                    if b.num_rows:
                        yield b
                return
        sources: list[AsyncCellSource] = [
            t.scan_blocks(start, end, fill_cache=False) for t in tables
        ]
        gc_rules = {name: fam.gc_rule for name, fam in schema.families.items()}
        visible = avisible_batches(
            amerge_batches(sources),
            gc_rules=gc_rules,
            now_micros=split.now_micros,
            snapshot_seq=tablet.cut_seq,
        )
        builder = _WideBuilder(list(columns or ())) if shape == "wide" else _CellsBuilder()
        async for row, cells in _rows(visible, families, exact, whole, start_ts, end_ts):
            if filter is not None:
                cells = apply_filter(filter, row, cells)
                if not cells:
                    continue
            builder.add(row, cells)
            if builder.count >= batch_rows:
                yield builder.finish()
        if builder.count:
            yield builder.finish()
    finally:
        if own:
            await st.close()


async def _arrow_cells(
    tables: Sequence[SSTable],
    cut_seq: int,
    families: set[str],
    gc_rules: dict[str, Any],
    now_micros: int,
    start: bytes,
    end: bytes | None,
) -> pa.Table | None:
    """The visible cells of ``tables`` in ``[start, end)`` as one sorted Arrow table
    (module docstring), or None when the split holds aggregate parts."""
    # SSTables whose row ranges do not overlap merge by concatenation in row order (the
    # usual case for flushes of sequential writes); others are sorted together, by seq too.
    ordered = sorted(tables, key=lambda t: t.first_row)
    disjoint = all(a.last_row < b.first_row for a, b in itertools.pairwise(ordered))
    if all(gc_rules.get(f) is None for f in families) and all(
        t.footer.kind_counts[0] == t.cells and t.max_seq <= cut_seq for t in tables
    ):
        # The footers vouch for kind (no deletions) and seq (within the cut): neither column
        # is decoded, nor seq when nothing is sorted; then the rules keep every cell unless
        # a version was rewritten.
        merged = await _merged(ordered, disjoint, start, end, simple=True)
        if pc.all(_not_repeated(merged, 4)).as_py():
            return merged
    merged = await _merged(ordered, disjoint, start, end, simple=False)
    # On a thread: Arrow's and numpy's kernels release the GIL, so splits read concurrently
    # apply their rules side by side.
    return await asyncio.to_thread(visible_table, merged, cut_seq, gc_rules, now_micros)


async def _merged(
    ordered: Sequence[SSTable], disjoint: bool, start: bytes, end: bytes | None, *, simple: bool
) -> pa.Table:
    """The SSTables' entries in ``[start, end)`` merged in the engine's order, each entry
    once; ``simple``: without the kind column (nor seq when ``disjoint``)."""
    if simple:
        columns: tuple[str, ...] = _DISJOINT_COLUMNS if disjoint else _SORTED_COLUMNS
    else:
        columns = tuple(SCHEMA.names)
    parts = [
        part for part in [await t.read_arrow(start, end, columns) for t in ordered] if part.num_rows
    ]
    if not parts:
        return SCHEMA.empty_table().select(columns)
    merged = pa.concat_tables(parts)
    if disjoint:
        return merged
    return await asyncio.to_thread(_sorted_once, merged)


def _sorted_once(merged: pa.Table) -> pa.Table:
    """``merged`` in the engine's order, each entry once (the same entry can be in two
    SSTables)."""
    merged = merged.sort_by(_SORT)
    return merged.filter(_not_repeated(merged, 5))


#: The columns the Arrow path decodes (key columns first: ``_not_repeated`` counts on it).
_DISJOINT_COLUMNS = ("row", "family", "qualifier", "ts", "value")
_SORTED_COLUMNS = ("row", "family", "qualifier", "ts", "seq", "value")
_SORT = [
    ("row", "ascending"),
    ("family", "ascending"),
    ("qualifier", "ascending"),
    ("ts", "descending"),
    ("seq", "descending"),
]


def _not_repeated(table: pa.Table, width: int) -> pa.Array:
    """True for each cell whose first ``width`` key columns (row, family, qualifier, ts,
    then seq) differ from its predecessor's. Candidates are narrowed column by column, the
    cheap integer timestamp first, so mostly distinct keys cost one comparison."""
    n = table.num_rows
    mask = np.ones(n, dtype=bool)
    if n < 2:
        return pa.array(mask)
    ts = table.column(3)
    cand = np.flatnonzero(pc.equal(ts.slice(1), ts.slice(0, n - 1)).to_numpy(zero_copy_only=False))
    for i in [c for c in (2, 1, 0, 4) if c < width]:
        if not len(cand):
            break
        col = table.column(i)
        same = pc.equal(col.take(cand + 1), col.take(cand)).to_numpy(zero_copy_only=False)
        cand = cand[same]
    mask[cand + 1] = False
    return pa.array(mask)


def _select(
    table: pa.Table,
    families: set[str],
    exact: set[tuple[str, bytes]] | None,
    whole: set[str],
    start_ts: int | None,
    end_ts: int | None,
) -> pa.Table:
    """:func:`_rows`'s projection and timestamp selection, column-wise, in the cells shape."""
    fam = table.column(1)
    if exact is None and start_ts is None and end_ts is None:
        present = set(pc.unique(fam).to_pylist())
        if present <= families:  # nothing to drop: no filter pass over the cells
            return pa.Table.from_arrays(
                [table.column(0), fam, table.column(2), table.column(3), table.column("value")],
                schema=CELLS_SCHEMA,
            )
    keep = pc.is_in(fam, value_set=pa.array(sorted(families), pa.string()))
    if exact is not None:
        col = pc.is_in(
            pc.binary_join_element_wise(
                pc.cast(fam, pa.binary()), table.column(2), pa.scalar(b"\x00", pa.binary())
            ),
            value_set=pa.array([f.encode() + b"\x00" + q for f, q in sorted(exact)], pa.binary()),
        )
        keep = pc.and_(
            keep, pc.or_(col, pc.is_in(fam, value_set=pa.array(sorted(whole), pa.string())))
        )
    if start_ts is not None:
        keep = pc.and_(keep, pc.greater_equal(table.column(3), start_ts))
    if end_ts is not None:
        keep = pc.and_(keep, pc.less(table.column(3), end_ts))
    out = table.filter(keep)
    return pa.Table.from_arrays(
        [out.column(0), out.column(1), out.column(2), out.column(3), out.column("value")],
        schema=CELLS_SCHEMA,
    )


def _wide(cells: pa.Table, columns: list[str]) -> pa.Table:
    """:class:`_WideBuilder` column-wise: ``cells`` (the cells shape, sorted, of the
    ``columns`` only) as one record per row with the newest value of each column."""
    schema = wide_schema(columns)
    n = cells.num_rows
    if not n:
        return schema.empty_table()
    rows, fam, qual, value = cells.column(0), cells.column(1), cells.column(2), cells.column(4)
    # The newest cell of a column is the first of its (row, family, qualifier) run.
    first = np.ones(n, dtype=bool)
    if n > 1:
        differs = pc.or_(
            pc.or_(
                pc.not_equal(rows.slice(1), rows.slice(0, n - 1)),
                pc.not_equal(fam.slice(1), fam.slice(0, n - 1)),
            ),
            pc.not_equal(qual.slice(1), qual.slice(0, n - 1)),
        )
        first[1:] = differs.to_numpy(zero_copy_only=False)
    keep = pa.array(first)
    rows, value = rows.filter(keep), value.filter(keep)
    key = pc.binary_join_element_wise(
        pc.cast(fam.filter(keep), pa.binary()), qual.filter(keep), pa.scalar(b"\x00", pa.binary())
    )
    out_rows = pc.unique(rows)  # in order of first appearance: sorted
    arrays: list[pa.Array | pa.ChunkedArray] = [out_rows]
    for c in columns:
        f, _, q = c.partition(":")
        mine = pc.equal(key, pa.scalar(f.encode() + b"\x00" + q.encode(), pa.binary()))
        where = pc.index_in(rows.filter(mine), value_set=out_rows).to_numpy(zero_copy_only=False)
        index = np.full(len(out_rows), -1, dtype=np.int64)
        index[where] = np.arange(len(where))
        arrays.append(value.filter(mine).take(pa.array(index, mask=index < 0)))
    return pa.Table.from_arrays(arrays, schema=schema)


async def _rows(
    batches: AsyncIterator[list],  # type: ignore[type-arg]
    families: set[str],
    exact: set[tuple[str, bytes]] | None,
    whole: set[str],
    start_ts: int | None,
    end_ts: int | None,
) -> AsyncIterator[tuple[bytes, list[ApiCell]]]:
    """Visible cells grouped by row, projected (families of the schema only: a dropped
    family's cells stay in SSTables until compacted, never shown) and timestamp-selected."""
    row: bytes | None = None
    cells: list[ApiCell] = []
    lo = start_ts if start_ts is not None else -(1 << 63)
    hi = end_ts if end_ts is not None else 1 << 63
    async for batch in batches:
        for c in batch:
            if c.row != row:
                if cells:
                    assert row is not None
                    yield row, cells
                row, cells = c.row, []
            fam = c.family
            if fam not in families:
                continue
            if exact is not None and fam not in whole and (fam, c.qualifier) not in exact:
                continue
            if not lo <= c.ts < hi:
                continue
            cells.append(ApiCell(fam, c.qualifier, c.ts, c.value))
    if cells:
        assert row is not None
        yield row, cells


class _CellsBuilder:
    def __init__(self) -> None:
        self._cols: tuple[list[object], ...] = ([], [], [], [], [])
        self.count = 0

    def add(self, row: bytes, cells: list[ApiCell]) -> None:
        rows, fams, quals, tss, vals = self._cols
        for c in cells:
            rows.append(row)
            fams.append(c.family)
            quals.append(c.qualifier)
            tss.append(c.timestamp)
            vals.append(c.value)
        self.count += len(cells)

    def finish(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [pa.array(col, type=f.type) for col, f in zip(self._cols, CELLS_SCHEMA, strict=True)],
            schema=CELLS_SCHEMA,
        )
        self._cols = ([], [], [], [], [])
        self.count = 0
        return batch


class _WideBuilder:
    def __init__(self, columns: list[str]) -> None:
        self._columns = columns
        self._index = {
            (c.partition(":")[0], c.partition(":")[2].encode()): i for i, c in enumerate(columns)
        }
        self._schema = wide_schema(columns)
        self._rows: list[bytes] = []
        self._values: list[list[bytes | None]] = [[] for _ in columns]
        self.count = 0

    def add(self, row: bytes, cells: list[ApiCell]) -> None:
        newest: list[bytes | None] = [None] * len(self._columns)
        for c in cells:  # newest version first within a column
            i = self._index.get((c.family, c.qualifier))
            if i is not None and newest[i] is None:
                newest[i] = c.value
        if all(v is None for v in newest):
            return
        self._rows.append(row)
        for i, v in enumerate(newest):
            self._values[i].append(v)
        self.count += 1

    def finish(self) -> pa.RecordBatch:
        arrays = [pa.array(self._rows, pa.binary())]
        arrays += [pa.array(v, pa.binary()) for v in self._values]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self._schema)
        self._rows = []
        self._values = [[] for _ in self._columns]
        self.count = 0
        return batch
