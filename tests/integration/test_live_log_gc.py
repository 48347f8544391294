"""Garbage collection trims a live worker's commit log (gc_plan rule 3a), end to end.

A process writes to a 4-tablet table, flushes it (every tablet's log position moves past what
it wrote), writes more without a flush, moves the METADATA tablets' positions to the log's end
(what the worker's trim loop does once a second; done here so the test does not hang on when
that loop runs), collects with no grace period, which deletes the head of its own live log, writes again, and dies without closing. Reopening recovers every
acknowledged write: the trimmed segments held nothing any tablet's recovery reads.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tabletstore.embedded import Database
from tabletstore.master import gc_plan as gc
from tabletstore.storage_s3 import layout

CHILD = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from tabletstore.data.model import SetCell
    from tabletstore.embedded import Database
    from tabletstore.metadata.rows import METADATA_TABLE_ID

    async def write(t, start, stop):
        for i in range(start, stop):
            row = b"r%d-%05d" % (i % 4, i)
            await t.mutate_row(row, [SetCell("cf", b"q", b"v" + row)])

    async def main(path):
        db = await Database.open(f"file://{path}")
        t = await db.create_table("t", ["cf"], split_keys=[b"r1", b"r2", b"r3"])
        await write(t, 0, 200)
        await db.flush("t")
        await write(t, 200, 260)  # in the log only, past every position
        # METADATA's tablets took writes too (the flush's record updates) and list the log
        # from where they were loaded; the trim loop moves them on its next round.
        for (table_id, _), tablet in list(db.worker.tablets.items()):
            if table_id == METADATA_TABLE_ID:
                await tablet.trim_logs()
        log = db.worker._log.log_ref
        report = await db.gc(grace=0, fence_grace=0)
        trimmed = [k for k in report.deleted_keys if k.startswith("logs/")]
        await write(t, 260, 300)  # after the collection, in the same live log
        print(json.dumps({"worker": log.worker_id, "incarnation": log.incarnation,
                          "trimmed": trimmed, "counts": {str(k.name): v for k, v in
                          report.counts.items()}}), flush=True)
        os._exit(0)  # a crash: no flush, no close

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_worker_killed_after_its_log_was_trimmed_recovers_every_write(
    tmp_path: Path,
) -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    worker, incarnation = out["worker"], out["incarnation"]
    assert out["trimmed"], f"nothing was trimmed from the live log: {out['counts']}"
    assert all(layout.parse_log_segment_key(k)[:2] == (worker, incarnation) for k in out["trimmed"])
    assert out["counts"].get(gc.Reason.DELETE_TRIMMED_LOG.name) == len(out["trimmed"])
    left = [
        layout.parse_log_segment_key(p.relative_to(tmp_path / "objects").as_posix()).seq
        for p in (tmp_path / "objects" / layout.log_prefix(worker, incarnation)).rglob("*")
        if p.is_file()
    ]
    trimmed = [layout.parse_log_segment_key(k).seq for k in out["trimmed"]]
    assert max(trimmed) < min(left), "the live log lost a prefix, never a middle part"
    async with await Database.open(f"file://{tmp_path}") as db:
        rows = {r.key: r.latest("cf", b"q") async for r in db.table("t").read_rows()}
    expected = {b"r%d-%05d" % (i % 4, i) for i in range(300)}
    assert set(rows) == expected
    assert all(v == b"v" + k for k, v in rows.items())
