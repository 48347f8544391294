"""A worker's own commit log under faults (§5.3, §6; DESIGN.md §6, §9).

Through the embedded database (a real TabletServer and Master in one process, memory store):

* a tablet whose unload failed or was cancelled mid-flush, then given back to the *same*
  worker, replays that worker's live log (it used to skip it: every acknowledged write lost);
* a worker whose log fails while its lease lives (a PUT failing for good, or recovery fencing
  it) goes on under a new incarnation instead of refusing every write for ever.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from tabletstore.embedded import Database
from tabletstore.errors import TabletStoreError, Unavailable
from tabletstore.model import SetCell
from tabletstore.rpc.messages import UnloadTabletRequest
from tabletstore.tablet import Tablet

ROWS = 500


@pytest.fixture
async def db() -> AsyncIterator[Database]:
    database = await Database.open(f"memory://worker-log-{uuid.uuid4().hex}")
    await database.create_table("t", ["f"])
    yield database
    await database.close()


async def write(db: Database, n: int = ROWS, tag: bytes = b"v") -> None:
    table = db.table("t")
    await asyncio.gather(
        *(table.mutate_row(b"r%04d" % i, [SetCell("f", b"q", tag + b"%d" % i)]) for i in range(n))
    )


async def check(db: Database, n: int = ROWS, tag: bytes = b"v") -> None:
    rows = {row.key: row.cells[0].value async for row in db.table("t").read_rows()}
    missing = [i for i in range(n) if rows.get(b"r%04d" % i) != tag + b"%d" % i]
    assert not missing, f"{len(missing)} of {n} acknowledged writes lost, first r{missing[0]:04d}"


def served(db: Database) -> tuple[tuple[str, str], Tablet]:
    user = [(k, t) for k, t in db.worker.tablets.items() if not k[0].startswith("!")]
    assert len(user) == 1, list(db.worker.tablets)
    return user[0]


@pytest.mark.parametrize("how", ["fails", "cancelled"])
async def test_tablet_unloaded_without_flush_and_reloaded_by_same_worker_keeps_writes(
    db: Database, how: str
) -> None:
    await write(db)
    (table_id, tablet_id), tablet = served(db)
    entered, gate = asyncio.Event(), asyncio.Event()

    async def broken_flush() -> None:
        if how == "fails":
            raise Unavailable("injected: the flush's SSTable PUT failed")
        entered.set()
        await gate.wait()  # hangs until the master's call gives up (cancelled below)

    tablet.minor_compact = broken_flush  # type: ignore[method-assign]
    unload = asyncio.ensure_future(
        db.worker.unload_tablet(UnloadTabletRequest(table_id, tablet_id, flush=True))
    )
    if how == "fails":
        with pytest.raises(TabletStoreError):
            await unload
    else:
        await entered.wait()
        unload.cancel()
        with pytest.raises(asyncio.CancelledError):
            await unload
    assert (table_id, tablet_id) not in db.worker.tablets
    # The master gives the tablet back to the only worker there is: the same one.
    await db.master.assign()
    assert (table_id, tablet_id) in db.worker.tablets
    await check(db)
    # Later compactions move the redo point and drop the old log: still all there.
    await write(db, 50, b"w")
    await db.flush("t")
    await check(db, 50, b"w")
    rows = {row.key async for row in db.table("t").read_rows()}
    assert len(rows) == ROWS
