"""A tablet's SSTable objects: sorting memtable cells into locality groups, encoding and
creating new SSTables (create-only: objects are never overwritten), opening them, and fetching
a compaction's inputs (§5.4, §6)."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Iterable, Mapping, Sequence

from tabletstore.engine.iterators import merge_sources
from tabletstore.engine.memtable import MemTable
from tabletstore.engine.state import Written
from tabletstore.engine.tablet_core import TabletCore
from tabletstore.errors import NotFound, Unavailable
from tabletstore.keys import CellFields, CellKind
from tabletstore.metadata.record import SSTableRef
from tabletstore.sstable import SSTable, SSTableExcerpt, SSTableInfo, write_sstable
from tabletstore.sstable.block_cache import BlockCache, ScanCache
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["MINOR_PAGE_BYTES", "TabletSSTables", "open_sstable"]

#: Target raw bytes of a page in a minor compaction's SSTables (merging and major
#: compactions write ``sstable.pages.DEFAULT_PAGE_BYTES``, 8 KiB). Encoding costs about one
#: zstd call per page of each column, and pyarrow makes a new zstd context for every call, so
#: 8 KiB pages of 1 KB values cost more than twice the CPU per cell of 32 KiB ones, on the
#: write path: every acknowledged write is encoded once by a minor compaction. What a larger
#: page costs is a cold point read decoding more bytes (about a tenth more CPU), only while
#: the SSTable lives: merging compactions rewrite minor compactions' output with small pages.
MINOR_PAGE_BYTES = 32 * 1024

#: A row deletion's kind, as memtable entries hold it (a plain int).
_DELETE_ROW = int(CellKind.DELETE_ROW)


async def open_sstable(
    store: ObjectStore,
    ref: SSTableRef,
    block_cache: BlockCache | None,
    scan_cache: ScanCache | None,
) -> SSTable:
    """Open the SSTable ``ref`` names (its footer read; its blocks on demand)."""
    return await SSTable.open(
        store,
        ref.key,
        size=ref.size,
        tail_size=ref.tail_size or None,
        block_cache=block_cache,
        scan_cache=scan_cache,
        seq_base=ref.seq_base,
    )


class TabletSSTables:
    """Creates, opens and fetches the SSTables of one tablet."""

    def __init__(
        self, core: TabletCore, block_cache: BlockCache | None, scan_cache: ScanCache | None
    ) -> None:
        self._core = core
        self._block_cache = block_cache
        self._scan_cache = scan_cache

    def split_by_group(self, memtables: Sequence[MemTable]) -> dict[str, list[CellFields]]:
        """Cells of memtables (newest first) per locality group, in sort order; row deletions
        go to every group. One memtable (the usual case) gives its plain-tuple entries: no
        Cell objects made for the cyclic GC to track while the SSTables are encoded."""
        groups: dict[str, list[CellFields]] = {}
        schema = self._core.schema
        fams = schema.families
        all_groups = list(schema.locality_groups)
        cells: Iterable[CellFields] = (
            memtables[0].entries()
            if len(memtables) == 1
            else merge_sources([mt.scan() for mt in memtables])
        )
        for c in cells:
            if c[5] == _DELETE_ROW:  # kind
                for g in all_groups:
                    groups.setdefault(g, []).append(c)
                continue
            fam = fams.get(c[1])  # family
            # Cells of a dropped family are garbage: they are not written out.
            if fam is not None:
                groups.setdefault(fam.locality_group, []).append(c)
        return groups

    async def write_groups(self, groups: Mapping[str, Iterable[CellFields]]) -> dict[str, Written]:
        """Write each group's cells (sorted: a minor compaction's) as one new SSTable of that
        group, opened, with pages of :data:`MINOR_PAGE_BYTES`."""
        out: dict[str, Written] = {}
        for group, cells in groups.items():
            lg = self._core.locality_group(group)
            # On a thread (the cells are a frozen memtable's): a 16 MB minor compaction is
            # ~1 s of encoding that would otherwise hold the event loop.
            data, info = await asyncio.to_thread(
                functools.partial(
                    write_sstable,
                    cells,
                    compression=lg.compression,
                    block_size=lg.block_size,
                    locality_group=group,
                    page_size=MINOR_PAGE_BYTES,
                )
            )
            if info.cells:
                out[group] = await self.store(group, data, info)
        return out

    async def store(self, group: str, data: bytes, info: SSTableInfo) -> Written:
        """Upload a new SSTable of ``group`` and open it (loaded whole for an in-memory
        locality group, §6)."""
        ref = await self.upload(group, data, info)
        return ref, await self.open(group, ref)

    async def open(self, group: str, ref: SSTableRef) -> SSTable:
        """Open ``ref``, an SSTable of ``group`` (loaded whole for an in-memory group, §6)."""
        table = await open_sstable(self._core.store, ref, self._block_cache, self._scan_cache)
        if self._core.locality_group(group).in_memory:
            await table.load_all()
        return table

    async def upload(self, group: str, data: bytes, info: SSTableInfo) -> SSTableRef:
        """Create the SSTable object (create-only: objects are never overwritten)."""
        rec = self._core.record
        key = layout.sstable_key(rec.table_id, rec.tablet_id, group, uuid.uuid4().hex)
        await self._core.store.create(key, data)
        return SSTableRef.of(key, len(data), info)

    async def fetch(self, keys: Sequence[str]) -> list[bytes | SSTableExcerpt]:
        """A compaction's inputs, the SSTables ``keys``: of each, what the tablet's rows need
        (:meth:`SSTable.excerpt`: a split's child reads its half of its parent's SSTables,
        not the whole). A key the tablet does not have open is read whole."""
        state = self._core.state
        rec = state.record
        opened = {
            ref.key: table
            for group, refs in rec.sstables.items()
            for ref, table in zip(refs, state.sstables.get(group, ()), strict=True)
        }

        async def one(key: str) -> bytes | SSTableExcerpt | None:
            table = opened.get(key)
            if table is None:
                return await self._core.store.get(key)
            try:
                return await table.excerpt(rec.start_row, rec.end_row)
            except NotFound:
                return None

        blobs = await asyncio.gather(*(one(key) for key in keys))
        missing = [k for k, b in zip(keys, blobs, strict=True) if b is None]
        if missing:
            raise Unavailable(f"SSTable objects vanished before compaction: {missing}")
        return [b for b in blobs if b is not None]
