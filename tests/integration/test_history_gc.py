"""Garbage collection honours history windows end to end (embedded): a table with history
keeps a finished commit log (and its checkpoints) that a table without it would free, the
bytes kept are reported, the database's default window keeps it as a table's own does, and
ending the windows lets the log go."""

from __future__ import annotations

from pathlib import Path

from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.master import gc_plan as gc
from tabletstore.storage_s3 import layout


async def _log_keys(db: Database) -> set[str]:
    return {o.key async for o in db.store.list(layout.LOGS)}


async def test_the_window_keeps_what_it_must_and_frees_what_falls_out(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    async with await Database.open(url) as db:
        await db.create_table("t", ["f"], history=3600.0)
        await db.checkpoint()
        await db.table("t").mutate_row(b"r", [SetCell("f", b"q", b"v")])
    # Two restarts: the first incarnation's log is needed by no tablet any more.
    async with await Database.open(url) as db:
        pass
    async with await Database.open(url) as db:
        logs = await _log_keys(db)
        assert logs
        kept = await db.gc(grace=0, fence_grace=0)
        assert kept.counts.get(gc.Reason.KEEP_HISTORY), kept.counts
        assert kept.bytes[gc.Reason.KEEP_HISTORY] > 0
        assert not [k for k in kept.deleted_keys if k.startswith(layout.LOGS)]
        assert await _log_keys(db) == logs
        # The checkpoints (snapshots with a TTL) are kept, and their SSTables with them.
        assert kept.counts.get(gc.Reason.KEEP_LIVE_TABLE_SNAPSHOT)
        assert (await db.verify()).ok
        await db.set_history("t", None)
        await db.set_history_default(3600.0)  # the database's default keeps it as well
        kept = await db.gc(grace=0, fence_grace=0)
        assert kept.counts.get(gc.Reason.KEEP_HISTORY), kept.counts
        assert await _log_keys(db) == logs
        await db.set_history_default(None)
        freed = await db.gc(grace=0, fence_grace=0)
        assert not freed.counts.get(gc.Reason.KEEP_HISTORY)
        gone = [k for k in freed.deleted_keys if k.startswith(layout.LOGS)]
        assert gone and not set(gone) & (await _log_keys(db))
        assert (await db.verify()).ok
