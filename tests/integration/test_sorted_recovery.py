"""Recovery by sorting, end to end through the embedded database (§6, docs/architecture/design.md
§7): a process writes to a 16-tablet table and dies without closing; reopening sorts its log and
each tablet replays only its own runs. Every acknowledged write is back, and the objects read are
close to the log once (before sorting, each tablet read the whole log: about 18 times it)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.storage_s3 import find_layer, layout
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore

TABLETS = 16
ROWS = 800

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from tabletstore.data.model import SetCell
    from tabletstore.embedded import Database

    async def main(path, tablets, rows):
        db = await Database.open(f"file://{path}")
        splits = [b"r%02d" % i for i in range(1, tablets)]
        t = await db.create_table("t", ["cf"], split_keys=splits)
        for i in range(rows):
            row = b"r%02d-%05d" % (i % tablets, i)
            await t.mutate_row(row, [SetCell("cf", b"q", b"v" * 300 + row)])
        print("acked", flush=True)
        os._exit(0)  # a crash: no flush, no close

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    """
)


async def test_reopen_after_a_crash_sorts_the_log_and_reads_it_about_once(tmp_path: Path) -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", CHILD, str(tmp_path), str(TABLETS), str(ROWS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.strip() == "acked", done.stderr
    log_bytes = sum(
        p.stat().st_size for p in (tmp_path / "objects" / layout.LOGS).rglob("*") if p.is_file()
    )
    db = await Database.open(f"file://{tmp_path}", instrument=True)
    try:
        store = find_layer(db.store, InstrumentedObjectStore)
        assert store is not None
        recovered_read = store.stats().bytes_read
        t = db.table("t")
        rows = [r async for r in t.read_rows()]
        assert len(rows) == ROWS
        for r in rows:
            assert r.latest("cf", b"q") == b"v" * 300 + r.key
        # The log was sorted: a plan, task manifests and runs exist.
        objects = tmp_path / "objects" / layout.RECOVERY
        assert list(objects.rglob("plan.json")) and list(objects.rglob("*.run"))
        # Root and METADATA tablets of the same log replay it directly (they must be served
        # before the user tablets can be listed): 2 reads, plus the sort's, plus the runs'.
        # Without the sort this was TABLETS + 2 reads of the log.
        assert recovered_read < 5 * log_bytes, (recovered_read, log_bytes)
        assert recovered_read < (TABLETS + 2) * log_bytes / 3
    finally:
        await db.close()
    # Writes go on after the recovery, and a clean reopen needs no sort.
    db = await Database.open(f"file://{tmp_path}")
    try:
        await db.table("t").mutate_row(b"zz", [SetCell("cf", b"q", b"after")])
        assert len([r async for r in db.table("t").read_rows()]) == ROWS + 1
    finally:
        await db.close()
