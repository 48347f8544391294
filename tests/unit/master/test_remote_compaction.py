"""A major compaction run away from the tablet's worker (master/remote_compaction.py, the code
of functions/compaction.py) and its adoption by the worker (``Tablet.adopt_major``), through
the embedded database: the rewrite drops deleted data, the worker keeps what it wrote meanwhile,
and a result whose tablet changed or moved since the read -- a zombie's -- is refused, with
nothing lost and its output left unreferenced (garbage for GC)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from tabletstore.clock import micros
from tabletstore.data.model import Cell, DeleteCells, DeleteRow, SetCell
from tabletstore.data.schema import ColumnFamily, IntersectionRule, MaxAgeRule, MaxVersionsRule
from tabletstore.embedded import Database
from tabletstore.errors import Fenced, InvalidArgument, NotServing, PreconditionFailed
from tabletstore.keys import CellKind
from tabletstore.master.compaction_cycle import MajorCompactionCycle
from tabletstore.master.compaction_lambda import LambdaCompactionExecutor
from tabletstore.master.master_process import make_compaction_executor
from tabletstore.master.remote_compaction import (
    PreparedCompaction,
    RemoteCompactionExecutor,
    hand_over,
    prepare,
)
from tabletstore.metadata.record import TabletRecord
from tabletstore.rpc.messages import (
    AdoptCompactionRequest,
    LoadTabletRequest,
    UnloadTabletRequest,
)
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.sstable import read_sstable_bytes

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def db() -> AsyncIterator[Database]:
    database = await Database.open(f"memory://remote-compaction-{uuid.uuid4().hex}")
    try:
        yield database
    finally:
        await database.close()


async def _filled(db: Database) -> TabletRecord:
    """One tablet with three SSTables: two rounds of 20 rows, then row a00 deleted."""
    t = await db.create_table("t", ["cf"])
    for flush in range(2):
        for i in range(20):
            await t.mutate_row(b"a%02d" % i, [SetCell("cf", b"q", b"v%d" % flush)])
        await db.flush("t")
    await t.mutate_row(b"a00", [DeleteRow()])
    await db.flush("t")
    return await _record(db)


async def _record(db: Database) -> TabletRecord:
    table_id = (await db._info("t")).table_id
    (record,) = await db.master.catalog.list_tablets(table_id)
    return record


def _worker(db: Database) -> TabletService:
    return TABLET.client(db._transport, db.worker.address)


async def _prepare(db: Database, record: TabletRecord) -> PreparedCompaction:
    return await prepare(
        db.master.catalog, db.store, record.table_id, record.tablet_id, clock=db.master.clock
    )


async def _rows(db: Database) -> dict[bytes, bytes]:
    return {r.key: r.cells[0].value async for r in db.table("t").read_rows()}


async def test_the_worker_adopts_a_remote_major_compaction_behind_its_newer_writes(
    db: Database,
) -> None:
    record = await _filled(db)
    assert len(record.sstables["default"]) == 3
    prepared = await _prepare(db, record)
    assert prepared.inputs == 3 and set(prepared.outputs) == {"default"}
    out = prepared.outputs["default"]
    blob = await db.store.get(out.key)
    assert blob is not None
    cells = read_sstable_bytes(blob)
    # A major compaction: live values only (two versions of 19 rows), the deleted row and
    # its deletion entry gone.
    assert b"a00" not in {c.row for c in cells} and len(cells) == 38
    assert {c.kind for c in cells} == {CellKind.PUT}
    # Meanwhile the worker goes on: a flush (a newer SSTable), then a write in its memtable,
    # and row a01 deleted after the read (its deletion must win over the output's a01).
    t = db.table("t")
    await t.mutate_row(b"b00", [SetCell("cf", b"q", b"flushed")])
    await t.mutate_row(b"a01", [DeleteRow()])
    await db.flush("t")
    await t.mutate_row(b"b01", [SetCell("cf", b"q", b"memtable")])
    newer = (await _record(db)).sstables["default"][0]
    await hand_over(prepared, _worker(db))
    after = await _record(db)
    assert after.sstables == {"default": (newer, out)}
    assert after.events[-1].kind == "major_compaction"
    rows = await _rows(db)
    assert rows == {
        **{b"a%02d" % i: b"v1" for i in range(2, 20)},
        b"b00": b"flushed",
        b"b01": b"memtable",
    }
    # Adopting the same output again (a retry after an ambiguous answer) changes nothing.
    await hand_over(prepared, _worker(db))
    assert (await _record(db)).sstables == after.sstables
    # Moved (unloaded, loaded again from its record and logs): the same rows.
    await db.worker.services.unload_tablet(UnloadTabletRequest(record.table_id, record.tablet_id))
    await db.worker.services.load_tablet(LoadTabletRequest(record.table_id, record.tablet_id))
    assert await _rows(db) == rows


async def test_a_zombie_result_is_refused_and_nothing_is_lost(db: Database) -> None:
    record = await _filled(db)
    prepared = await _prepare(db, record)
    # The worker major-compacts by itself meanwhile: the inputs are gone from the record.
    await db.table("t").mutate_row(b"z", [SetCell("cf", b"q", b"late")])
    await db.compact("t")
    changed = await _record(db)
    rows = await _rows(db)
    with pytest.raises(PreconditionFailed, match="changed since the compaction read"):
        await hand_over(prepared, _worker(db))
    assert (await _record(db)).sstables == changed.sstables  # untouched
    listed = {r.key for refs in changed.sstables.values() for r in refs}
    assert not listed & {r.key for r in prepared.outputs.values()}  # garbage, for GC
    assert await _rows(db) == rows and rows[b"z"] == b"late"


async def test_a_result_for_another_epoch_schema_or_tablet_is_refused(db: Database) -> None:
    record = await _filled(db)
    prepared = await _prepare(db, record)
    request = prepared.request()
    worker = _worker(db)
    # The tablet moved (a new owner's epoch) after the read: a zombie's output.
    with pytest.raises(Fenced, match="epoch"):
        await worker.adopt_compaction(replace(request, epoch=request.epoch + 1))
    # The schema changed after the read: its GC rules are not the ones the rewrite applied.
    family = prepared.schema.families["cf"].model_copy(
        update={"gc_rule": MaxVersionsRule(max_versions=1)}
    )
    schema = prepared.schema.model_copy(update={"families": {"cf": family}})
    other = replace(request, schema_json=schema.model_dump_json().encode())
    with pytest.raises(PreconditionFailed, match="schema changed"):
        await worker.adopt_compaction(other)
    # Another tablet's objects are never adopted.
    wrong = AdoptCompactionRequest.of(
        record, prepared.schema, {"default": replace(prepared.outputs["default"], key="x/y")}
    )
    with pytest.raises(InvalidArgument, match="not a new SSTable"):
        await worker.adopt_compaction(wrong)
    # A tablet this worker does not serve.
    with pytest.raises(NotServing):
        await worker.adopt_compaction(replace(request, tablet_id="nope"))
    assert (await _record(db)).sstables == record.sstables
    # A stale request is refused before anything is read or written.
    with pytest.raises(Fenced, match="moved since"):
        await prepare(
            db.master.catalog,
            db.store,
            record.table_id,
            record.tablet_id,
            clock=db.master.clock,
            epoch=record.epoch + 1,
        )
    # The untouched request still adopts.
    await worker.adopt_compaction(request)
    assert (await _record(db)).sstables == {"default": (prepared.outputs["default"],)}


async def test_a_result_blind_to_a_deletion_that_saves_a_version_is_refused(
    db: Database,
) -> None:
    """The rewrite reads SSTables only. A deletion in the worker's memtable (or an SSTable
    written since) may delete the newest version of a column whose family counts versions:
    the rewrite, counting without it, dropped the older version -- here a version no moment
    made garbage (the only one left, in a family that collects a version only when it is
    both past the newest and old) -- so the worker refuses the output; its own next major
    compaction counts with the deletion."""
    rule = IntersectionRule(rules=[MaxVersionsRule(max_versions=1), MaxAgeRule(max_age_seconds=60)])
    t = await db.create_table("t", [ColumnFamily(name="cf", gc_rule=rule)])
    hour_ago = micros(db.master.clock.time() - 3600)
    await t.mutate_row(b"r", [SetCell("cf", b"q", b"old", hour_ago)])
    await db.flush("t")
    await t.mutate_row(b"r", [SetCell("cf", b"q", b"new", hour_ago + 1)])
    await db.flush("t")
    await t.mutate_row(b"r", [DeleteCells("cf", b"q", hour_ago + 1)])
    old = [Cell("cf", b"q", hour_ago, b"old")]
    assert (await t.read_row(b"r")).cells == old  # type: ignore[union-attr]
    record = await _record(db)
    prepared = await _prepare(db, record)
    with pytest.raises(PreconditionFailed, match="deletions written since"):
        await hand_over(prepared, _worker(db))
    assert (await _record(db)).sstables == record.sstables
    # Flushed, the deletion is in a newer SSTable: still not seen by that rewrite.
    await db.flush("t")
    with pytest.raises(PreconditionFailed, match="deletions written since"):
        await hand_over(prepared, _worker(db))
    # A rewrite that read it is adopted, and keeps the version.
    await hand_over(await _prepare(db, await _record(db)), _worker(db))
    assert len((await _record(db)).sstables["default"]) == 1
    assert (await t.read_row(b"r")).cells == old  # type: ignore[union-attr]


async def test_the_cycle_drives_the_remote_executor(db: Database) -> None:
    record = await _filled(db)
    executor = RemoteCompactionExecutor(
        db.master.catalog,
        db.store,
        lambda address: TABLET.client(db._transport, address),
        clock=db.master.clock,
    )

    async def records() -> list[TabletRecord]:
        return [await _record(db)]

    cycle = MajorCompactionCycle(
        period=1e-6, records=records, executor=executor, now=db.master.clock.time
    )
    assert await cycle.scan() == 1
    await cycle.wait()
    assert cycle.finished == 1
    (done,) = executor.done
    assert (done.tablet_id, done.inputs, done.epoch) == (record.tablet_id, 3, record.epoch)
    after = await _record(db)
    assert [r.key for r in after.sstables["default"]] == list(done.outputs)
    assert b"a00" not in await _rows(db)
    await cycle.close()


async def test_the_master_process_builds_the_executor_its_flag_names(db: Database) -> None:
    default = db.master.compaction_cycle.executor
    transport = db._transport
    assert make_compaction_executor("workers", db.master, db.store, transport, None) is default
    local = make_compaction_executor("local", db.master, db.store, transport, None)
    assert isinstance(local, RemoteCompactionExecutor)
    url = "etcd://127.0.0.1:2379/ns"
    remote = make_compaction_executor("lambda:fn", db.master, None, transport, url)
    assert isinstance(remote, LambdaCompactionExecutor) and remote.function_name == "fn"
    for kind, store, cluster, problem in [
        ("lambda:fn", None, None, "cluster's URL"),
        ("local", None, url, "store"),
        ("lambda:", None, url, "not one of"),
        ("threads", db.store, url, "not one of"),
    ]:
        with pytest.raises(InvalidArgument, match=problem):
            make_compaction_executor(kind, db.master, store, transport, cluster)


async def test_a_result_for_a_tablet_split_since_the_read_is_refused(db: Database) -> None:
    record = await _filled(db)
    prepared = await _prepare(db, record)
    rows = await _rows(db)
    await db.worker.splits._split((record.table_id, record.tablet_id))
    table_id = record.table_id
    children = await db.master.catalog.list_tablets(table_id)
    assert len(children) == 2 and record.tablet_id not in {c.tablet_id for c in children}
    with pytest.raises(NotServing):
        await hand_over(prepared, _worker(db))
    outputs = {r.key for r in prepared.outputs.values()}
    for child in await db.master.catalog.list_tablets(table_id):
        assert not outputs & {r.key for refs in child.sstables.values() for r in refs}
    assert await _rows(db) == rows
