"""Replication between two embedded databases (client/replicator.py in one process): a replica
converges to its source; a replicator that resumes from progress older than what it applied
(killed between applying and saving) applies the changes again without counting a sum twice,
which the guard is what prevents; the write policy and promotion; the front door's
consistency tokens; failback (the old primary follows the promoted one from its promotion);
a source table without changes, and a token of another table, are refused by name."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as bta

from tabletstore.bigtable_api.admin import TableAdmin
from tabletstore.bigtable_api.instances import Namespaces
from tabletstore.client import replicator as replicator_module
from tabletstore.client.client import AsyncClient
from tabletstore.client.replication_plan import MARKER_FAMILY
from tabletstore.client.replicator import TableReplicator, load_progress, promote, save_progress
from tabletstore.commitlog.format import decode_segment
from tabletstore.data.model import AddToCell, DeleteCells, DeleteRow, SetCell
from tabletstore.data.schema import ColumnFamily
from tabletstore.data.validation import REPLICATOR
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument, PreconditionFailed
from tabletstore.storage_s3 import layout

pytestmark = pytest.mark.timeout(180)

BUCKET = 86_400_000_000
Cells = list[tuple[bytes, str, bytes, int, bytes]]


async def cells(client: AsyncClient, table: str) -> Cells:
    out: Cells = []
    async for row in client.table(table).read_rows():
        out += [
            (row.key, c.family, c.qualifier, c.timestamp, c.value)
            for c in row.cells
            if c.family != MARKER_FAMILY
        ]
    return sorted(out)


async def _write(db: AsyncClient, rounds: int) -> None:
    t = db.table("t")
    for i in range(rounds):
        row = b"r%d" % (i % 7)
        await t.mutate_row(row, [SetCell("f", b"q", b"v%d" % i, i + 1)])
        await t.mutate_row(row, [AddToCell("n", b"sum", i + 1, BUCKET)])
        if i % 5 == 4:
            await t.mutate_row(row, [DeleteCells("f", b"q", start=1, end=i)])
        if i % 6 == 5:  # a deletion of a sum between its parts: replayed, it must not lose one
            await t.mutate_row(row, [DeleteCells("n", b"sum")])
        if i % 13 == 12:
            await t.mutate_row(row, [DeleteRow()])


async def _follow_until(r: TableReplicator, instant: float, deadline: float = 60.0) -> None:
    """Run ``r`` until its replica has applied every source write before ``instant``."""
    task = asyncio.create_task(r.run())
    try:
        end = time.monotonic() + deadline
        while True:
            assert not task.done(), task.exception()
            p = await load_progress(r.replica, r.table)
            if p is not None and p.applied_watermark() >= instant:
                return
            assert time.monotonic() < end, "the replica did not catch up"
            await asyncio.sleep(0.2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _replicator(src: AsyncClient, url: str, dst: AsyncClient, **kw: object) -> TableReplicator:
    return TableReplicator(src, url, dst, "t", poll=0.05, heartbeat=0.2, save_every=0.1, **kw)  # type: ignore[arg-type]


async def _pair(tmp_path: Path) -> tuple[Database, str, Database]:
    url = f"file://{tmp_path / 'source'}"
    src = await Database.open(url)
    dst = await Database.open(f"file://{tmp_path / 'replica'}", identity=REPLICATOR)
    await src.create_table("t", ["f", ColumnFamily(name="n", value_type="sum")], changes=3600.0)
    return src, url, dst


@pytest.mark.parametrize("guarded", [True, False])
async def test_a_resumed_replicator_applies_again_without_counting_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guarded: bool
) -> None:
    src, url, dst = await _pair(tmp_path)
    try:
        await _write(src, 40)
        r = _replicator(src, url, dst)
        first = await r.prepare()
        ended = time.time()
        await _follow_until(r, ended)
        assert await cells(dst, "t") == await cells(src, "t")
        # Killed after applying everything but before saving any of it: progress as it began.
        now = await load_progress(dst, "t")
        assert now is not None and now.applied_changes >= 80
        await save_progress(dst, "t", replace(first, applied_changes=0))
        if not guarded:
            monkeypatch.setattr(replicator_module, "guarded", lambda schema: False)
        await _write(src, 10)
        ended = time.time()
        await _follow_until(_replicator(src, url, dst), ended)
        same = await cells(dst, "t") == await cells(src, "t")
        # Without the guard the sums count the replayed inputs twice: the guard is needed.
        assert same is guarded
    finally:
        await src.close()
        await dst.close()


async def test_the_write_policy_and_promotion(tmp_path: Path) -> None:
    src, url, dst = await _pair(tmp_path)
    try:
        r = _replicator(src, url, dst)
        await r.prepare()
        schema = await dst.describe_table("t")
        assert schema.replica_of is not None and schema.replica_of.source == url
        assert MARKER_FAMILY in schema.families  # a sum family needs the guard
        dst.identity = None  # a client: not the replicator
        with pytest.raises(PreconditionFailed, match=r"replica of 't'.*refuses client writes"):
            await dst.table("t").mutate_row(b"x", [SetCell("f", b"q", b"v")])
        dst.identity = REPLICATOR
        await _write(src, 5)
        # A family made at the source after the replica was is made here when first written.
        await src.create_family("t", "g")
        await src.table("t").mutate_row(b"r1", [SetCell("g", b"new", b"family", 3)])
        await _follow_until(r, time.time())
        assert await cells(dst, "t") == await cells(src, "t")
        applied, promoted_at = await promote(dst, "t")
        assert applied <= promoted_at
        after = await dst.describe_table("t")
        assert after.replica_of is None and MARKER_FAMILY not in after.families
        # The replicator writes nothing but replicas: a follower left running stops.
        with pytest.raises(PreconditionFailed, match="not a replica"):
            await dst.table("t").mutate_row(b"x", [SetCell("f", b"q", b"v")])
        dst.identity = None
        await dst.table("t").mutate_row(b"x", [SetCell("f", b"q", b"v")])
        p = await load_progress(dst, "t")
        assert p is not None and p.state == "promoted" and p.promoted_at == promoted_at
    finally:
        await src.close()
        await dst.close()


async def test_bad_sources_are_named(tmp_path: Path) -> None:
    src, url, dst = await _pair(tmp_path)
    try:
        await src.create_table("plain", ["f"])
        r = TableReplicator(src, url, dst, "plain")
        with pytest.raises(InvalidArgument, match=r"keeps no changes.*tabletstore changes plain"):
            await r.prepare()
        # A replica whose saved tokens are another table's (the source table was dropped and
        # made again under its name) stops with the change stream's error.
        r = _replicator(src, url, dst)
        await r.prepare()
        await _write(src, 3)
        await _follow_until(r, time.time())
        await src.delete_table("t")
        await src.create_table("t", ["f", ColumnFamily(name="n", value_type="sum")], changes=60.0)
        with pytest.raises(InvalidArgument, match="another table"):
            await asyncio.wait_for(_replicator(src, url, dst).run(), 60)
        p = await load_progress(dst, "t")
        assert p is not None and p.error is not None and "another table" in p.error
        assert await cells(dst, "t")  # the replica still serves its reads
    finally:
        await src.close()
        await dst.close()


async def test_a_deleted_source_is_reported_and_the_replica_serves_reads(tmp_path: Path) -> None:
    """Deleting the source table leaves its logs in the bucket, so its stream goes on with
    heartbeats: the replicator must notice the table gone and say so, and keep running. An
    error a predecessor saved is not taken for this run's."""
    src, url, dst = await _pair(tmp_path)
    r = _replicator(src, url, dst)
    task: asyncio.Task[None] | None = None
    try:
        await r.prepare()
        await _write(src, 3)
        await _follow_until(r, time.time())
        want = await cells(dst, "t")
        assert want
        assert r.progress is not None
        r.progress = replace(r.progress, error="source unreachable: a predecessor's")
        await r._save(force=True)
        task = asyncio.create_task(r.run())

        async def cleared() -> bool:
            p = await load_progress(dst, "t")
            return p is not None and p.error is None

        end = time.monotonic() + 60
        while not await cleared():
            assert time.monotonic() < end, "the predecessor's error was kept"
            await asyncio.sleep(0.1)
        await src.delete_table("t")
        end = time.monotonic() + 60
        while True:
            assert not task.done(), task
            p = await load_progress(dst, "t")
            if p is not None and p.error:
                break
            assert time.monotonic() < end, "the deleted source was not reported"
            await asyncio.sleep(0.1)
        assert f"source table 't' is gone from {url}" in p.error
        assert "replication promote t" in p.error
        assert await cells(dst, "t") == want
        await asyncio.sleep(0.5)  # retries go on: the error stays, the task runs
        assert not task.done()
        p = await load_progress(dst, "t")
        assert p is not None and p.error is not None and "is gone" in p.error
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await src.close()
        await dst.close()


async def test_failback_follows_the_new_primary_from_its_promotion(tmp_path: Path) -> None:
    src, url, dst = await _pair(tmp_path)
    dst_url = f"file://{tmp_path / 'replica'}"
    try:
        await _write(src, 20)
        await _follow_until(_replicator(src, url, dst), time.time())
        # The replica's front door: a token is consistent once the replica caught up with it.
        admin = TableAdmin(dst, Namespaces("i"))
        name = "projects/x/instances/i/tables/t"
        token = (
            await admin.generate_consistency_token(
                bta.GenerateConsistencyTokenRequest.pb()(name=name)
            )
        ).consistency_token
        check = bta.CheckConsistencyRequest.pb()(name=name, consistency_token=token)
        assert not (await admin.check_consistency(check)).consistent
        await _follow_until(_replicator(src, url, dst), time.time())
        assert (await admin.check_consistency(check)).consistent
        other = bta.CheckConsistencyRequest.pb()(
            name="projects/x/instances/i/tables/u", consistency_token=token
        )
        await dst.create_table("u", ["f"])
        with pytest.raises(InvalidArgument, match="another table"):
            await admin.check_consistency(other)

        await promote(dst, "t")
        dst.identity = None
        await _write(dst, 15)  # the new primary's own writes, sums among them
        src.identity = None
        await src.table("t").mutate_row(b"late", [SetCell("f", b"q", b"old primary", 5)])
        src.identity = REPLICATOR
        with pytest.raises(InvalidArgument, match="exists on this cluster as a primary"):
            await TableReplicator(dst, dst_url, src, "t").prepare()
        back = TableReplicator(
            dst, dst_url, src, "t", attach=True, poll=0.05, heartbeat=0.2, save_every=0.1
        )
        await _follow_until(back, time.time())
        old = await cells(src, "t")
        assert [c for c in old if c[0] != b"late"] == await cells(dst, "t")  # none counted twice
        assert any(c[0] == b"late" for c in old)  # not replicated at failover: stays there
        src.identity = None
        with pytest.raises(PreconditionFailed, match="refuses client writes"):
            await src.table("t").mutate_row(b"x", [SetCell("f", b"q", b"v")])
    finally:
        await src.close()
        await dst.close()


async def test_a_replicated_write_racing_the_promotion_is_stamped_before_its_instant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The promotion's fence is strict: a replicator write that passed the worker's first
    check before the promotion began, then waited for its row's lock while the log was slow,
    is either refused or in a segment stamped before the promotion instant; never after it,
    where a follower of the promoted table (the old primary after a failback) would take it
    for a client write of the new primary. The replica's log is held up (a segment PUT that
    does not finish) for longer than the promotion took before the fence was strict."""
    src, url, dst = await _pair(tmp_path)
    try:
        await _replicator(src, url, dst).prepare()  # the replica table
        writer = dst.worker._writer
        assert writer is not None
        real, release, holding = writer._create, asyncio.Event(), asyncio.Event()

        async def held(key: str, data: bytes) -> None:
            holding.set()
            await release.wait()
            await real(key, data)

        monkeypatch.setattr(writer, "_create", held)
        table = dst.table("t")
        (tablet,) = [t for (tid, _), t in dst.worker.tablets.items() if tid.startswith("t-")]
        first = asyncio.create_task(table.mutate_row(b"r", [SetCell("f", b"q", b"first", 1)]))
        await asyncio.wait_for(holding.wait(), 30)  # its segment's PUT hangs; it holds the lock
        second = asyncio.create_task(table.mutate_row(b"r", [SetCell("f", b"q", b"second", 2)]))
        locks = tablet._writes.row_locks
        await _until(lambda: locks.users.get(b"r", 0) >= 2, "the second write waits for the lock")
        promotion = asyncio.create_task(promote(dst, "t"))
        await _until(
            lambda: tablet.schema.replica_of is not None and tablet.schema.replica_of.promoting,
            "the worker has the promoting schema",
        )
        # Hold the log past the instant the promotion would have printed without the barrier
        # (it waits for nothing then): the second write would join the log after it.
        await asyncio.wait([promotion], timeout=4 * replicator_module.CLOCK_SKEW + 1.0)
        release.set()
        _, promoted_at = await asyncio.wait_for(promotion, 60)
        await asyncio.wait_for(first, 60)
        await asyncio.gather(asyncio.wait_for(second, 60), return_exceptions=True)
        stamps: dict[bytes, list[float]] = {b"first": [], b"second": []}
        async for info in dst.store.list(layout.LOGS):
            data = await dst.store.get(info.key)
            if not data:
                continue
            segment = decode_segment(data, where=info.key)
            assert segment.header is not None and segment.header.written_at is not None
            for record in segment.records:
                for cell in record.cells:
                    if cell.value in stamps:
                        stamps[cell.value].append(segment.header.written_at)
        assert stamps[b"first"] and all(s < promoted_at for s in stamps[b"first"])
        late = [s - promoted_at for s in stamps[b"second"] if s >= promoted_at]
        assert not late, f"a replicated write stamped {late} s after the promotion instant"
    finally:
        await src.close()
        await dst.close()


async def _until(check: object, what: str, deadline: float = 30.0) -> None:
    assert callable(check)
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"not within {deadline}s: {what}"
        await asyncio.sleep(0.01)
