"""A worker's own commit log under faults (§5.3, §6; docs/architecture/design.md §6, §9).

Through the embedded database (a real TabletServer and Master in one process, memory store):

* a tablet whose unload failed or was cancelled mid-flush, then given back to the *same*
  worker, replays that worker's live log (it used to skip it: every acknowledged write lost);
* a tablet being unloaded serves writes while its memtable is written out (a slow store);
* a worker whose log fails while its lease lives (a PUT failing for good, or recovery fencing
  it) goes on under a new incarnation instead of refusing every write for ever;
* one whose new logs keep failing (a full disk) keeps its tablets served for reads and takes
  writes again by itself once they no longer fail;
* a tablet the worker dropped is loaded again by the embedded database's own master;
* a tablet made to fail by a write answered Indeterminate is reloaded by its worker itself,
  and holds that write exactly if its record is in the log;
* a tablet whose flushes fail for a while (the store refusing SSTable PUTs) is kept, refuses
  writes only past its memtable limit, and takes them again once the store heals.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

from tabletstore.commitlog import fence
from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.engine.tablet import Tablet
from tabletstore.errors import NotServing, TabletStoreError, Unavailable
from tabletstore.options import TabletOptions
from tabletstore.rpc.messages import MutateRowsRequest, ReadRowsRequest, UnloadTabletRequest
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore, Op
from tabletstore.testing.faulty_store import FaultyObjectStore
from tests.tablet_harness import PutGate, until

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
        db.worker.services.unload_tablet(UnloadTabletRequest(table_id, tablet_id, flush=True))
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


async def test_a_tablet_being_unloaded_serves_writes_while_its_memtable_is_written_out(
    db: Database,
) -> None:
    """§5.4's first minor compaction of a moving tablet runs while it serves; only what
    arrives meanwhile is written out with its writes refused."""
    await write(db)
    key, tablet = served(db)
    gate = PutGate(tablet._core.store, "tables/*")
    tablet._core.store = gate
    gate.shut()
    unload = asyncio.ensure_future(
        db.worker.services.unload_tablet(UnloadTabletRequest(*key, flush=True))
    )
    async with asyncio.timeout(30):
        await gate.waiting.wait()  # the flush is stuck on its SSTable PUT
    db.retry_deadline = 5.0  # NotServing until the unload ends and the master reassigns
    await write(db, 50, b"w")  # served, not refused, while the flush is under way
    gate.open()
    async with asyncio.timeout(30):
        await unload
    assert key not in db.worker.tablets
    await db.master.assign()
    await check(db, 50, b"w")
    rows = {row.key async for row in db.table("t").read_rows()}
    assert len(rows) == ROWS


async def write_retrying(db: Database, rows: range, tag: bytes) -> set[int]:
    """Each row written until acknowledged (an error that says "not applied" is retried);
    returns the acknowledged ones."""
    table = db.table("t")
    acked: set[int] = set()
    for i in rows:
        async with asyncio.timeout(30):
            while True:
                try:
                    await table.mutate_row(b"r%04d" % i, [SetCell("f", b"q", tag + b"%d" % i)])
                except TabletStoreError as exc:
                    if exc.may_have_applied:
                        break  # neither acknowledged nor refused: leave it out
                    await asyncio.sleep(0.01)
                    continue
                acked.add(i)
                break
    return acked


@pytest.mark.parametrize("failure", ["fenced", "put_failed"])
async def test_a_log_that_fails_under_a_live_lease_moves_to_a_new_incarnation(
    db: Database, failure: str
) -> None:
    """The worker used to keep its claims and answer every write with Fenced for good."""
    await write(db)
    old = db.worker._log.log_ref  # type: ignore[union-attr]
    if failure == "fenced":
        await fence(db.store, old.worker_id, old.incarnation)
    else:
        faulty = FaultyObjectStore(db.worker._store)
        faulty.fail(Op.PUT, key="logs/*", times=1)
        db.worker._log.writer.store = faulty  # type: ignore[union-attr]
    acked = await write_retrying(db, range(ROWS, ROWS + 100), b"v")
    assert len(acked) >= 99  # at most the write whose segment failed is left out
    new = db.worker._log.log_ref  # type: ignore[union-attr]
    assert new.worker_id == old.worker_id and new.incarnation > old.incarnation
    for key, tablet in db.worker.tablets.items():
        assert new in tablet.record.logs, key
    # A crash of the tablet (dropped without a flush) and its recovery by the same worker:
    # the old log (fenced or plugged) and the new one hold every acknowledged write.
    (table_id, tablet_id), _ = served(db)
    await db.worker.services.unload_tablet(UnloadTabletRequest(table_id, tablet_id, flush=False))
    await db.master.assign()
    rows = {row.key: row.cells[0].value async for row in db.table("t").read_rows()}
    for i in [*range(ROWS), *acked]:
        assert rows.get(b"r%04d" % i) == b"v%d" % i, i


async def test_a_worker_past_its_safe_lease_time_answers_nothing(db: Database) -> None:
    """A worker paused past its lease (SIGSTOP) must not answer reads from a memtable whose
    tablet may have a new owner when it resumes, before its keep-alive notices."""
    await write(db, 10)
    (table_id, tablet_id), _ = served(db)
    lease = db.worker.lease
    assert lease is not None
    request = ReadRowsRequest(table_id, tablet_id, keys=(b"r0001",))
    assert (await db.worker.services.read_row(request)).rows
    safe_until = lease.safe_until
    lease.safe_until = lambda: 0.0  # type: ignore[method-assign]
    try:
        with pytest.raises(NotServing, match="lease"):
            await db.worker.services.read_row(request)
        with pytest.raises(NotServing, match="lease"):
            await db.worker.services.mutate_rows(MutateRowsRequest(table_id, tablet_id, ()))
    finally:
        # The lease is in fact fine: let the database close without waiting out its deadline.
        lease.safe_until = safe_until  # type: ignore[method-assign]


class FullLogStore:
    """The worker's object store on a disk that is full while ``full`` is set: a commit-log
    segment fails naming the full disk, while an empty object (the writer's plug of the failed
    number) still fits."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.full = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def create(self, key: str, data: bytes) -> None:
        if self.full and data and key.startswith(layout.LOGS):
            raise Unavailable(f"cannot create {key}: No space left on device")
        await self.inner.create(key, data)


async def test_a_log_that_cannot_be_replaced_for_a_while_keeps_its_tablets_and_recovers(
    db: Database,
) -> None:
    """While the disk is full the log fails, and so does the first segment of every new log
    (the METADATA write recording it in a tablet's record). The worker used to drop each
    tablet whose record could not take the new log: reads failed, and nothing loaded them
    again while the disk stayed full. They stay served for reads instead, writes are refused
    naming the full disk, and once there is room writes are taken again by themselves, by
    the same tablets (never dropped, so never reloaded)."""
    await write(db, 50)
    (_, tablet), worker = served(db), db.worker
    assert worker._log is not None
    first = worker._log.log_ref.incarnation
    full = FullLogStore(worker._store)
    worker._store = full  # type: ignore[assignment]  # the store every new log writes to
    worker._log.writer.store = full  # type: ignore[assignment]
    full.full = True
    db.retry_deadline = 3.0
    table = db.table("t")
    with pytest.raises(Unavailable, match="No space left on device"):
        await table.mutate_row(b"x", [SetCell("f", b"q", b"x")])
    # The worker tries again under another new log once the first one failed too.
    await until(lambda: worker._log.log_ref.incarnation >= first + 2)  # type: ignore[union-attr]
    assert served(db)[1] is tablet
    await check(db, 50)  # reads go on
    with pytest.raises(Unavailable, match="No space left on device"):
        await table.mutate_row(b"x", [SetCell("f", b"q", b"x")])
    full.full = False
    async with asyncio.timeout(60):
        while True:
            try:
                await table.mutate_row(b"x", [SetCell("f", b"q", b"x")])
                break
            except Unavailable:
                await asyncio.sleep(0.05)
    assert served(db)[1] is tablet
    await check(db, 50)
    for key, served_tablet in worker.tablets.items():
        assert worker._log.log_ref in served_tablet.record.logs, key


async def test_the_embedded_database_loads_again_a_tablet_its_worker_dropped(
    db: Database,
) -> None:
    """A worker drops a tablet that must be reloaded (a write whose record may or may not be
    in its failed log) or whose record cannot take its new log; a cluster's master loads it
    again in its next round. The embedded database ran no round after opening, so such a
    tablet stayed unserved until the database was opened again."""
    await write(db, 50)
    (table_id, tablet_id), _ = served(db)
    await db.worker.services.unload_tablet(UnloadTabletRequest(table_id, tablet_id, flush=False))
    assert (table_id, tablet_id) not in db.worker.tablets
    await until(lambda: (table_id, tablet_id) in db.worker.tablets)
    await check(db, 50)


async def stop_assigning(db: Database) -> None:
    """No master rounds from now on: what is served again is the worker's own doing."""
    db._assigning.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await db._assigning


@pytest.mark.parametrize("how", ["applying_failed", "log_failed_logged", "log_failed_not_logged"])
async def test_a_tablet_failed_by_an_indeterminate_write_serves_writes_again_by_itself(
    db: Database, how: str
) -> None:
    """A write answered Indeterminate (its record may be in the log while its cells are not in
    the memtable) makes the tablet refuse every write until it is reloaded. Its worker reloads
    it itself, without a flush: it takes writes again within a deadline, every acknowledged
    write is there, and the Indeterminate write is in the table exactly if its record is in
    the log. The tablet used to stay unwritable until something dropped it (only a log
    switch did, and then only a master's round loaded it again)."""
    await write(db, 50)
    await stop_assigning(db)
    _, tablet = served(db)
    worker = db.worker
    assert worker._log is not None
    logged = how != "log_failed_not_logged"
    if how == "applying_failed":
        # The record is durable, but putting its cells into the memtable fails: the log
        # holds the write, the memtable does not (the writer itself is healthy).
        def broken(cells: object) -> None:
            raise RuntimeError("injected: the memtable insert failed")

        tablet._writes._insert_durable = broken  # type: ignore[method-assign]
    else:
        faulty = FaultyObjectStore(worker._store)
        if logged:
            # The segment lands but its answer is lost, and so is the writer's check of it.
            faulty.lose_ack(Op.PUT, key="logs/*", times=1)
            faulty.fail(Op.GET, key="logs/*", times=1)
        else:
            # The segment PUT fails, and so does the writer's plug of its number.
            faulty.fail(Op.PUT, key="logs/*", times=2)
        worker._log.writer.store = faulty  # type: ignore[assignment]
    with pytest.raises(TabletStoreError) as caught:
        await db.table("t").mutate_row(b"x", [SetCell("f", b"q", b"x")])
    assert caught.value.may_have_applied, caught.value
    async with asyncio.timeout(60):
        while True:
            try:
                await db.table("t").mutate_row(b"y", [SetCell("f", b"q", b"y")])
                break
            except Unavailable:
                await asyncio.sleep(0.05)
    new = served(db)[1]
    assert new is not tablet and new.must_reload is None
    await check(db, 50)
    rows = {row.key: row.cells[0].value async for row in db.table("t").read_rows()}
    assert rows.get(b"y") == b"y"
    assert (rows.get(b"x") == b"x") is logged, rows.get(b"x")


async def test_a_worker_whose_flushes_fail_for_a_while_keeps_the_tablet_and_takes_writes_again() -> (
    None
):
    """The store refuses every SSTable PUT for a while (a 503 storm): the worker's tablet used
    to refuse writes for good after one failed background flush. It keeps taking writes until
    its memtables reach their limit, then refuses them naming the failure, and once the store
    heals the same tablet takes them again: no reload, every acknowledged write there."""
    options = TabletOptions(memtable_flush_bytes=4096, memtable_limit_bytes=64 * 1024)
    db = await Database.open(f"memory://flush-fails-{uuid.uuid4().hex}", tablet_options=options)
    try:
        await db.create_table("t", ["f"])
        await write(db, 10)
        _, tablet = served(db)
        faulty = FaultyObjectStore(tablet._core.store)
        faulty.fail(Op.PUT, key="tables/*", times=None)
        tablet._core.store = faulty
        db.retry_deadline = 1.0
        table = db.table("t")
        acked: list[int] = []
        async with asyncio.timeout(120):
            i = 10
            while True:
                try:
                    await table.mutate_row(b"r%04d" % i, [SetCell("f", b"q", b"v%d" % i * 20)])
                except Unavailable as exc:
                    refused = exc
                    break
                acked.append(i)
                i += 1
        assert "writing them out fails" in str(refused), refused
        assert tablet.flush_failure is not None and tablet.must_reload is None
        assert len(acked) > 10  # taken while failing, up to the limit
        faulty.clear()
        async with asyncio.timeout(60):
            while True:
                try:
                    await table.mutate_row(b"r%04d" % i, [SetCell("f", b"q", b"v%d" % i * 20)])
                    break
                except Unavailable:
                    await asyncio.sleep(0.05)
        acked.append(i)
        assert served(db)[1] is tablet and tablet.must_reload is None
        rows = {row.key: row.cells[0].value async for row in table.read_rows()}
        for j in acked:
            assert rows.get(b"r%04d" % j) == b"v%d" % j * 20, j
    finally:
        await db.close()
