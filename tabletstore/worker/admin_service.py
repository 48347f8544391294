"""The admin service of a tablet server: the control requests of the master and the batch
jobs (§5.2, §5.4).

The request handlers of ``rpc.services.TabletService`` that change what a worker serves or how:
load and unload a tablet (the work — claims, fencing and replaying its logs — is the server's,
``TabletServer.load`` and ``TabletServer.unload``), compact one or adopt a major compaction run
elsewhere, reload a table's schema, report the server's status, hold and write a snapshot's
cuts, and add bulk-loaded cells. Authorization (control requests from cluster identities only)
wraps the dispatch table in ``worker/tablet_service_guard.py``; the data requests are
``worker/data_service.py``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from tabletstore.batch.load_files import cells_for_tablet
from tabletstore.engine.tablet import SnapshotCut, Tablet
from tabletstore.errors import InvalidArgument, NotServing
from tabletstore.metadata.record import BulkLoadMark, SSTableRef, TabletRecord, uncovered
from tabletstore.rpc.auth import current_principal
from tabletstore.rpc.messages import (
    AdoptCompactionRequest,
    BulkLoadTabletRequest,
    BulkLoadTabletResponse,
    CompactTabletRequest,
    LoadTabletAtRequest,
    LoadTabletRequest,
    ServerStatusRequest,
    ServerStatusResponse,
    SnapshotHoldRequest,
    SnapshotTablet,
    SnapshotWriteRequest,
    SnapshotWriteResponse,
    UnloadTabletRequest,
    UpdateSchemaRequest,
)
from tabletstore.sstable import SSTable
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore

if TYPE_CHECKING:
    from tabletstore.worker.tablet_server import TabletServer

__all__ = ["AdminService"]


class AdminService:
    """The control requests of ``TabletService``, served by one tablet server."""

    def __init__(self, server: TabletServer) -> None:
        self._server = server
        #: Snapshot cuts held here, by snapshot id, until snapshot_write (or until dropped
        #: by a timer: a master that died mid-snapshot must not pin memtables for ever).
        self._snapshot_cuts: dict[str, list[tuple[Tablet, SnapshotCut]]] = {}

    async def load_tablet(self, req: LoadTabletRequest) -> None:
        """Claim a tablet and serve it (``TabletServer.load``)."""
        await self._server.load(req)

    async def load_tablet_at(self, req: LoadTabletAtRequest) -> None:
        """Claim a tablet and serve it, reading its one METADATA row (``TabletServer.load``)."""
        await self._server.load(req)

    async def unload_tablet(self, req: UnloadTabletRequest) -> None:
        """Stop serving a tablet, minor-compacted first (``TabletServer.unload``)."""
        await self._server.unload(req)

    async def server_status(self, req: ServerStatusRequest) -> ServerStatusResponse:
        """What this worker serves. A caller sees only the tablets of tables it may read some
        family of (their boundaries are row keys); the cluster's own identities see all."""
        return self._server.status(current_principal())

    async def compact_tablet(self, req: CompactTabletRequest) -> None:
        tablet = self._server.tablet(req.table_id, req.tablet_id)
        if req.major:
            await tablet.major_compact()
        else:
            await tablet.minor_compact()
            await tablet.merge_if_needed()

    async def adopt_compaction(self, req: AdoptCompactionRequest) -> None:
        """Commit a major compaction run elsewhere (``Tablet.adopt_major``), or refuse it."""
        tablet = self._server.tablet(req.table_id, req.tablet_id)
        await tablet.adopt_major(
            epoch=req.epoch, schema=req.schema(), read=req.read(), outputs=req.outputs()
        )

    async def snapshot_hold(self, req: SnapshotHoldRequest) -> None:
        """Hold writes to the tablets and take their cuts (``Tablet.hold_for_snapshot``)."""
        if req.snapshot_id in self._snapshot_cuts:
            raise InvalidArgument(f"snapshot {req.snapshot_id} is already held here")
        tablets = [self._server.tablet(req.table_id, t) for t in req.tablet_ids]
        results = await asyncio.gather(
            *(t.hold_for_snapshot(req.hold_seconds) for t in tablets), return_exceptions=True
        )
        cuts = [(t, r) for t, r in zip(tablets, results, strict=True) if isinstance(r, SnapshotCut)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            for t, cut in cuts:
                t.release_snapshot_hold(cut)
            raise failed[0]
        self._snapshot_cuts[req.snapshot_id] = cuts
        asyncio.get_running_loop().call_later(
            2 * req.hold_seconds + 60.0, self._snapshot_cuts.pop, req.snapshot_id, None
        )

    async def snapshot_write(self, req: SnapshotWriteRequest) -> SnapshotWriteResponse:
        """End the hold first (writes go on at once), then write the memtables' part of each
        cut (``Tablet.write_snapshot``) unless ``abort``."""
        cuts = self._snapshot_cuts.pop(req.snapshot_id, None)
        if cuts is None:
            return SnapshotWriteResponse(False, ())
        held = all([t.release_snapshot_hold(cut) for t, cut in cuts])
        if req.abort or not held:
            return SnapshotWriteResponse(held, ())
        out = []
        for tablet, cut in cuts:
            sstables = await tablet.write_snapshot(cut)
            record = replace(cut.record, sstables=sstables)
            out.append(SnapshotTablet(record.tablet_id, record.to_bytes(), cut.mark))
        return SnapshotWriteResponse(True, tuple(out))

    async def bulk_load_tablet(self, req: BulkLoadTabletRequest) -> BulkLoadTabletResponse:
        """Add the bulk-load files' cells in the tablet's range (``Tablet.bulk_load``),
        but not in rows its record marks as loaded by ``req.load_id`` already."""
        tablet = self._server.tablet(req.table_id, req.tablet_id)
        rec = tablet.record
        start = max(rec.start_row, req.start_row)
        ends = [e for e in (rec.end_row, req.end_row) if e is not None]
        end = min(ends) if ends else None
        if end is not None and start >= end:
            return BulkLoadTabletResponse(0)
        ranges = uncovered(rec.bulk_loads, req.load_id, start, end) if req.load_id else []
        if req.load_id and not ranges:
            return BulkLoadTabletResponse(0)  # this load is in the tablet already
        pieces = ranges or [(start, end)]
        adopt = await self._staged_sstables(rec, req.adopt, pieces)
        groups = (
            await cells_for_tablet(self._load_source(req), req.keys, pieces, tablet.schema)
            if req.keys
            else {}
        )
        marks = tuple(BulkLoadMark(req.load_id, a, b) for a, b in ranges)
        return BulkLoadTabletResponse(await tablet.bulk_load(groups, marks, adopt))

    def _load_source(self, req: BulkLoadTabletRequest) -> ObjectStore:
        """The store to read a load's files from: this worker's own, and only its staging
        keys (batch/load_files.py); InvalidArgument for another store or key."""
        store = self._server.store
        if req.source_url != store.url:
            raise InvalidArgument(
                f"bulk-load files are read only from the database's bucket {store.url}, "
                f"not {req.source_url}"
            )
        for key in req.keys:
            if not key.startswith(layout.STAGING):
                raise InvalidArgument(f"bulk-load file {key!r} is not in a staging area")
        return store

    async def _staged_sstables(
        self,
        rec: TabletRecord,
        keys: Sequence[str],
        pieces: Sequence[tuple[bytes, bytes | None]],
    ) -> list[tuple[str, SSTableRef]]:
        """(locality group, reference with no seq base yet) of each SSTable the master
        staged for this tablet to adopt (batch/load_files.py step 2): one of this table's
        objects, lying inside rows still to load (NotServing otherwise: the master's view
        was stale, it looks again)."""
        out = []
        for key in keys:
            parsed = layout.parse_sstable_key(key)
            if parsed.table_id != rec.table_id:
                raise InvalidArgument(f"bulk-load SSTable {key} is not one of this table's")
            table = await SSTable.open(self._server.store, key)
            inside = any(
                a <= table.first_row and (b is None or table.last_row < b) for a, b in pieces
            )
            if not inside:
                raise NotServing(
                    f"tablet {rec.tablet_id}: bulk-load SSTable {key} reaches past the rows it "
                    "still has to load"
                )
            ref = SSTableRef.of(key, table.size, table)
            out.append((parsed.locality_group, ref))
        return out

    async def update_schema(self, req: UpdateSchemaRequest) -> None:
        info = await self._server.catalog.get_table(req.table_name)
        schema = self._server.newest_schema(info)
        for (table_id, _), tablet in self._server.tablets.items():
            if table_id == info.table_id:
                tablet.set_schema(schema)
        if schema.replica_of is not None and schema.replica_of.promoting:
            # A promotion's fence (client/replicator.py promote): the tablets refuse every
            # write from now on, and once the log has sealed what it holds, every write they
            # let through before is in a segment stamped before this answers.
            await self._server.log_barrier()
