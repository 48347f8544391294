"""Backups, restores and zero-copy clones through the client, on the embedded database.

A backup equals the table as of its creation whatever is written afterwards (in memtables or
flushed); a restore is a new table with the backup's cells, split points and schema, whose
writes order after every restored cell; a backup copied to another location restores from
there after the source's objects are gone; a clone and its source diverge; GC keeps what a
backup or a clone names and frees it once neither does; bad input changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest

from tabletstore.client.client import AsyncClient
from tabletstore.data.model import DeleteRow, SetCell
from tabletstore.embedded import Database
from tabletstore.errors import AlreadyExists, InvalidArgument, NotFound, Unimplemented
from tabletstore.metadata.backup import BackupManifest, BackupState, write_next_version
from tabletstore.metadata.backup_copy import checksum
from tabletstore.storage_s3 import layout


async def _write(db: AsyncClient, table: str, rows: range, value: bytes) -> None:
    t = db.table(table)
    for i in rows:
        await t.mutate_row(f"row{i:04d}".encode(), [SetCell("f", b"q", value)])


async def _rows(db: AsyncClient, table: str) -> dict[bytes, bytes | None]:
    return {row.key: row.latest("f", b"q") async for row in db.table(table).read_rows()}


async def _sstables(db: Database) -> set[str]:
    return {i.key async for i in db.store.list(layout.TABLES)}


async def _far_backup(
    tmp_path: Path, location: str
) -> tuple[dict[bytes, bytes | None], BackupManifest]:
    """A table of two tablets (flushed) in a database under ``tmp_path``, backed up to
    ``location`` as ``far``: its rows and the backup."""
    async with await Database.open(f"file://{tmp_path}/a") as db:
        await db.create_table("t", ["f"], split_keys=[b"row0005"])
        await _write(db, "t", range(10), b"v")
        await db.flush("t")
        return await _rows(db, "t"), await db.create_backup("t", "far", to=location)


async def test_restore_equals_the_table_at_backup_time(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"], split_keys=[b"row0010", b"row0020"])
        await _write(db, "t", range(0, 30), b"old")
        await db.flush("t")  # some cells in SSTables, some in memtables at the cut
        await _write(db, "t", range(5, 15), b"mid")
        await db.table("t").mutate_row(b"row0001", [DeleteRow()])
        at_backup = await _rows(db, "t")
        backup = await db.create_backup("t", "b1")
        assert backup.state is BackupState.READY and backup.split_keys() == [b"row0010", b"row0020"]
        # After the cut: overwrites, deletes, new rows, flushed and compacted away.
        await _write(db, "t", range(0, 40), b"new")
        await db.table("t").mutate_row(b"row0002", [DeleteRow()])
        await db.compact("t")
        info = await db.restore_table("b1", "r")
        assert await _rows(db, "r") == at_backup
        assert info.schema.families.keys() == {"f"}
        assert [r.end_row for r in await db.catalog.list_tablets(info.table_id)] == [
            b"row0010",
            b"row0020",
            None,
        ]
        # Writes to the restored table come after every restored cell (a larger seq wins).
        await _write(db, "r", range(3, 4), b"after")
        await db.table("r").mutate_row(b"row0005", [DeleteRow()])
        expected = {**at_backup, b"row0003": b"after"}
        del expected[b"row0005"]
        assert await _rows(db, "r") == expected
        # The backup outlives its table, and GC keeps what it names.
        await db.delete_table("t")
        await db.delete_table("r")
        await db.gc(grace=0)
        assert set(backup.sstable_keys()) <= await _sstables(db)
        again = await db.restore_table("b1", "r2")
        assert await _rows(db, "r2") == at_backup
        assert again.table_id != info.table_id


async def test_gc_frees_a_backup_after_delete_and_after_expiry(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"])
        await _write(db, "t", range(10), b"v")
        await db.flush("t")
        soon = time.time() + 3600
        kept = await db.create_backup("t", "kept")
        gone = await db.create_backup("t", "gone", expires_at=soon)
        await db.delete_table("t")
        await db.gc(grace=0)
        names = set(kept.sstable_keys()) | set(gone.sstable_keys())
        assert names <= await _sstables(db)
        # Expiry: the newest version's expiry decides; set it into the past by hand (an
        # update refuses a past expiry), as time passing would.
        manifest = await db.get_backup("gone")
        await write_next_version(db.store, manifest.changed(expires_at=time.time() - 1))
        await db.gc(grace=0)  # deletes the expired manifest
        with pytest.raises(NotFound):
            await db.get_backup("gone")
        await db.gc(grace=0)
        assert set(kept.sstable_keys()) <= await _sstables(db)
        await db.delete_backup("kept")
        await db.gc(grace=0)
        assert not (names & await _sstables(db))
        assert [b.backup_id for b in await db.list_backups()] == []


async def test_update_backup_expiry_and_list(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"])
        await _write(db, "t", range(3), b"v")
        await db.create_backup("t", "b1")
        later = time.time() + 7 * 86400
        updated = await db.update_backup("b1", expires_at=later)
        assert updated.expires_at == later and updated.version == 1
        assert [k async for k in _keys(db, layout.backup_prefix("b1"))] == [
            layout.backup_key("b1", 1)
        ]
        with pytest.raises(InvalidArgument, match="not in the future"):
            await db.update_backup("b1", expires_at=time.time() - 10)
        assert [b.backup_id for b in await db.list_backups("t")] == ["b1"]
        assert await db.list_backups("other") == []


async def _keys(db: Database, prefix: str):  # type: ignore[no-untyped-def]
    async for info in db.store.list(prefix):
        yield info.key


async def test_bad_restores_change_nothing(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"])
        await db.create_table("taken", ["f"])
        await _write(db, "t", range(3), b"v")
        backup = await db.create_backup("t", "b1")
        tables = await db.list_tables()
        with pytest.raises(AlreadyExists, match="'taken' already exists"):
            await db.restore_table("b1", "taken")
        with pytest.raises(NotFound, match="no backup 'nope'"):
            await db.restore_table("nope", "new")
        with pytest.raises(InvalidArgument, match="is not a backup id"):
            await db.get_backup("../x")
        with pytest.raises(AlreadyExists, match="backup 'b1' already exists"):
            await db.create_backup("t", "b1")
        # Incomplete: a copy that never finished.
        creating = backup.changed(state=BackupState.CREATING)
        await write_next_version(db.store, creating)
        with pytest.raises(InvalidArgument, match="incomplete"):
            await db.restore_table("b1", "new")
        # Expired.
        await write_next_version(
            db.store, creating.changed(state=BackupState.READY, expires_at=1.0)
        )
        with pytest.raises(InvalidArgument, match="expired"):
            await db.restore_table("b1", "new")
        # A newer format: refused, never guessed at.
        doc = json.loads(backup.to_bytes())
        doc["format"] = "tabletstore.backup/2"
        await db.store.create(layout.backup_key("b2", 0), json.dumps(doc).encode())
        with pytest.raises(Unimplemented, match="newer than this build reads"):
            await db.restore_table("b2", "new")
        # A missing SSTable: named, nothing created.
        await db.create_backup("t", "b3")
        b3 = await db.get_backup("b3")
        victim = b3.sstable_keys()[0]
        data = await db.store.get(victim)
        await db.store.delete(victim)
        with pytest.raises(NotFound, match="does not exist: the backup is damaged"):
            await db.restore_table("b3", "new")
        assert data is not None
        await db.store.create(victim, data)
        assert await db.list_tables() == tables
        # GC keeps every SSTable while a manifest it cannot read exists.
        await db.delete_backup("b3")
        await db.delete_table("t")
        await db.gc(grace=0)
        assert set(b3.sstable_keys()) <= await _sstables(db)


async def test_backup_to_another_location_restores_without_the_source(tmp_path: Path) -> None:
    elsewhere = f"file://{tmp_path}/backups"
    async with await Database.open(f"file://{tmp_path}/a") as db:
        await db.create_table("t", ["f"], split_keys=[b"row0005"])
        await _write(db, "t", range(10), b"v")
        await db.flush("t")
        await _write(db, "t", range(2, 4), b"w")
        expected = await _rows(db, "t")
        remote = await db.create_backup("t", "far", to=elsewhere)
        assert remote.state is BackupState.READY and remote.copied_from is not None
        assert set(remote.checksums) == set(remote.sstable_keys())
        assert await db.list_backups() == []  # it lives there alone
        assert [b.backup_id for b in await db.list_backups(location=elsewhere)] == ["far"]
        copy = await db.copy_backup("far", f"file://{tmp_path}/third", source=elsewhere)
        assert copy.checksums == remote.checksums
    import shutil

    shutil.rmtree(tmp_path / "a")  # the source database and its bucket are gone
    async with await Database.open(f"file://{tmp_path}/b") as db:
        with pytest.raises(NotFound):
            await db.restore_table("far", "r")
        await db.restore_table("far", "r", source=elsewhere)
        assert await _rows(db, "r") == expected
        await db.restore_table("far", "r2", source=elsewhere)  # the copy in is reused
        assert await _rows(db, "r2") == expected


async def test_delete_from_a_location_keeps_what_another_backup_names(tmp_path: Path) -> None:
    elsewhere = f"file://{tmp_path}/backups"
    async with await Database.open(f"file://{tmp_path}/a") as db:
        await db.create_table("t", ["f"])
        await _write(db, "t", range(10), b"v")
        await db.flush("t")
        first = await db.create_backup("t", "one", to=elsewhere)
        second = await db.create_backup("t", "two", to=elsewhere)
        shared = set(first.sstable_keys()) & set(second.sstable_keys())
        assert shared
        await db.delete_backup("one", location=elsewhere)
        async with _store(elsewhere) as store:
            left = {i.key async for i in store.list(layout.TABLES)}
        assert left == set(second.sstable_keys())
        await db.delete_backup("two", location=elsewhere)
        async with _store(elsewhere) as store:
            assert [i.key async for i in store.list("")] == []


def _store(url: str):  # type: ignore[no-untyped-def]
    import contextlib

    from tabletstore.storage_s3 import open_store

    @contextlib.asynccontextmanager
    async def opened():  # type: ignore[no-untyped-def]
        store = open_store(url)
        try:
            yield store
        finally:
            await store.close()

    return opened()


async def test_clone_is_independent_of_its_source(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"], split_keys=[b"row0050"])
        await _write(db, "t", range(100), b"src")
        await db.flush("t")
        await _write(db, "t", range(0, 10), b"mem")  # in memtables at the clone's cut
        at_clone = await _rows(db, "t")
        info = await db.clone_table("t", "c")
        assert await _rows(db, "c") == at_clone
        await _write(db, "t", range(0, 5), b"to-source")
        await _write(db, "c", range(5, 10), b"to-clone")
        await db.table("c").mutate_row(b"row0099", [DeleteRow()])
        src = await _rows(db, "t")
        clone = await _rows(db, "c")
        assert src[b"row0005"] == b"mem" and src[b"row0099"] == b"src"
        assert clone[b"row0000"] == b"mem" and clone[b"row0005"] == b"to-clone"
        assert b"row0099" not in clone
        # The clone's compaction writes under its own prefix; the source's objects stay put.
        await db.compact("c")
        own = layout.tables_prefix(info.table_id)
        for rec in await db.catalog.list_tablets(info.table_id):
            assert all(r.key.startswith(own) for refs in rec.sstables.values() for r in refs)
        # Deleting the source leaves the clone whole, through GC.
        await db.flush("c")
        source_id = (await db.describe_table("t")).name
        assert source_id == "t"
        await db.delete_table("t")
        await db.gc(grace=0)
        assert await _rows(db, "c") == clone
        with pytest.raises(AlreadyExists):
            await db.clone_table("c", "c")


async def test_gc_keeps_a_source_sstable_while_a_clone_names_it(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"])
        await _write(db, "t", range(20), b"v")
        await db.flush("t")
        await db.clone_table("t", "c")
        src_id = (await db._info("t")).table_id
        source_keys = {
            r.key
            for rec in await db.catalog.list_tablets(src_id)
            for refs in rec.sstables.values()
            for r in refs
        }
        await db.delete_table("t")
        await db.gc(grace=0)
        assert source_keys <= await _sstables(db)
        await db.compact("c")  # the clone no longer names them
        await db.gc(grace=0)
        assert not (source_keys & await _sstables(db))
        assert len(await _rows(db, "c")) == 20


async def test_bringing_a_backup_in_reads_its_manifest_in_the_location_once(
    tmp_path: Path,
) -> None:
    """A restore from another location lists and reads the backup's manifest there once (each
    is a round trip to that bucket), then copies every SSTable (a small one in one part). In
    the database's bucket it lists the backup's versions once, to find none before the copy
    starts (the creating version it wrote is the one the ready version replaces), and the
    table's SSTable prefix once, to find which SSTables are there already (no HEAD each)."""
    from tabletstore.client.backup_admin import _bring_in
    from tabletstore.storage_s3 import open_store
    from tabletstore.storage_s3.base import Op
    from tabletstore.storage_s3.instrumented import InstrumentedObjectStore

    elsewhere = f"file://{tmp_path}/backups"
    async with await Database.open(f"file://{tmp_path}/a") as db:
        await db.create_table("t", ["f"])
        await _write(db, "t", range(10), b"v")
        await db.flush("t")
        remote = await db.create_backup("t", "far", to=elsewhere)
    src = InstrumentedObjectStore(open_store(elsewhere))
    own = InstrumentedObjectStore(open_store(f"file://{tmp_path}/own"))
    try:
        await _bring_in(src, own, "far")
        stats, own_stats = src.stats(), own.stats()
        versions = [i.key async for i in own.list(layout.BACKUPS)]
    finally:
        await src.close()
        await own.close()
    assert own_stats[Op.LIST].requests == 2, own_stats
    assert own_stats[Op.HEAD].requests == 0, own_stats
    assert stats[Op.LIST].requests == 1, stats
    assert versions == [layout.backup_key("far", 1)]  # the ready one alone
    assert stats[Op.GET].requests == 1, stats  # the manifest
    assert stats[Op.GET_RANGE].requests == len(remote.sstable_keys()), stats  # one part each


async def test_a_copy_creates_no_object_before_its_manifest_pins_it(tmp_path: Path) -> None:
    """The objects are fetched while the creating manifest is written, but created in the
    destination only after it (in a database's bucket it is what pins them against GC); a
    destination that already has the backup id gets nothing."""
    from tabletstore.metadata.backup_copy import copy_backup
    from tabletstore.storage_s3 import open_store
    from tabletstore.storage_s3.memory import MemoryObjectStore

    class Recording(MemoryObjectStore):
        def __init__(self) -> None:
            super().__init__(shared=False)
            self.created: list[str] = []

        async def create(self, key: str, data: bytes) -> None:
            await super().create(key, data)
            self.created.append(key)

    elsewhere = f"file://{tmp_path}/backups"
    async with await Database.open(f"file://{tmp_path}/a") as db:
        await db.create_table("t", ["f"], split_keys=[b"row0005"])
        await _write(db, "t", range(10), b"v")
        await db.flush("t")
        remote = await db.create_backup("t", "far", to=elsewhere)
    src = open_store(elsewhere)
    dst = Recording()
    try:
        await copy_backup(src, dst, "far", now=time.time())
        assert dst.created[0].startswith(layout.BACKUPS)
        assert set(dst.created[1:-1]) == set(remote.sstable_keys())
        taken = Recording()
        await taken.create(layout.backup_key("far", 0), b"{}")
        with pytest.raises(AlreadyExists):
            await copy_backup(src, taken, "far", now=time.time())
        assert taken.created == [layout.backup_key("far", 0)]
    finally:
        await src.close()


_KILLED_RESTORE = """
import asyncio, pathlib, sys
from tabletstore.embedded import Database
from tabletstore.metadata import backup_copy
from tabletstore.storage_s3.local import LocalObjectStore

db_url, location, marker, point = sys.argv[1:]


async def stop_here(*args, **kwargs):
    pathlib.Path(marker).write_text("stopped")
    await asyncio.Event().wait()  # until killed

if point == "publish":  # every object staged (written, unsynced), none visible
    LocalObjectStore.publish = stop_here
else:  # every object published (durable), the manifest not yet ready
    backup_copy.write_next_version = stop_here


async def main():
    async with await Database.open(db_url) as db:
        await db.restore_table("far", "r", source=location)

asyncio.run(main())
"""


@pytest.mark.parametrize("point", ["publish", "ready"])
async def test_a_restore_killed_midway_leaves_nothing_that_looks_finished(
    tmp_path: Path, point: str
) -> None:
    """A process restoring from another location, killed (SIGKILL) with every object staged
    and none published, or with every object published and the manifest not yet ready: no
    table, the database's copy of the backup incomplete (refused by a restore, a finding of
    ``verify --backup``), nothing half-written visible; deleting that copy and restoring
    again gives the table, and removes the files the killed process staged."""
    import os
    import sys

    import tabletstore
    from tabletstore.master import verify_plan as vp
    from tabletstore.metadata.backup import read_backup
    from tabletstore.storage_s3.local import STAGE_PREFIX

    elsewhere = f"file://{tmp_path}/backups"
    expected, remote = await _far_backup(tmp_path, elsewhere)
    marker = tmp_path / "marker"
    root = Path(tabletstore.__file__).parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    db_url = f"file://{tmp_path}/b"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_RESTORE, db_url, elsewhere, str(marker), point, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.returncode is None, f"the restore ended first ({proc.returncode})"
            assert time.monotonic() < deadline, "the restore never reached the point"
            await asyncio.sleep(0.05)
    finally:
        if proc.returncode is None:
            proc.kill()  # SIGKILL: no cleanup of any kind
        await proc.wait()
    async with await Database.open(db_url) as db:
        assert "r" not in await db.list_tables()
        copy = await read_backup(db.store, "far")
        assert copy.state is BackupState.CREATING
        report = await db.verify_backup("far")
        assert vp.Kind.INCOMPLETE in [f.kind for f in report.findings], report.lines()
        with pytest.raises(InvalidArgument, match="incomplete"):
            await db.restore_table("far", "r")
        visible = await _sstables(db)
        staged = list((tmp_path / "b").rglob(f"{STAGE_PREFIX}*"))
        if point == "publish":
            assert visible == set()
            assert len(staged) == len(remote.sstable_keys())  # left by the killed process
        else:
            assert visible == set(remote.sstable_keys())
            for key in visible:  # published: whole, as the manifest's checksums say
                data = await db.store.get(key)
                assert data is not None and checksum(data) == remote.checksums[key]
        await db.delete_backup("far")
        await db.restore_table("far", "r", source=elsewhere)
        assert await _rows(db, "r") == expected
        assert (await db.verify()).ok
        assert list((tmp_path / "b").rglob(f"{STAGE_PREFIX}*")) == []  # swept by the restore


async def test_a_tables_tablet_rows_are_committed_together() -> None:
    """A table of many tablets (a restore's, a clone's) has its METADATA rows inserted at once,
    so the worker commits them in a few log writes, not one per tablet."""
    from tabletstore.data.schema import ColumnFamily, TableSchema
    from tabletstore.metadata.catalog import Catalog
    from tabletstore.metadata.record import TabletRecord
    from tabletstore.storage_s3 import find_layer
    from tabletstore.storage_s3.base import Op
    from tabletstore.storage_s3.instrumented import InstrumentedObjectStore

    async with await Database.open(f"memory://rows-{uuid.uuid4().hex}", instrument=True) as db:
        bounds: list[bytes | None] = [b"", *(b"k%02d" % i for i in range(1, 16)), None]
        table_id = Catalog.new_table_id("many")
        records = [
            TabletRecord(table_id, f"t{i:05d}", bounds[i] or b"", bounds[i + 1]) for i in range(16)
        ]
        counters = find_layer(db.store, InstrumentedObjectStore)
        assert counters is not None
        before = counters.stats()
        schema = TableSchema(name="many", families={"f": ColumnFamily(name="f")})
        await db.catalog.create_table(schema, records)
        puts = (counters.stats() - before)[Op.PUT].requests
        assert len(await db.catalog.list_tablets(table_id)) == 16
    assert puts <= 4, puts


async def test_a_restore_deletes_the_copys_creating_version_while_the_table_is_created(
    tmp_path: Path,
) -> None:
    """A restore from another location marks the database's copy ready, then deletes its
    creating version while the master creates the table (not before). A deletion that fails
    leaves that version beside the ready one, which harms nothing: the restore succeeds, GC
    keeps what the backup names, a second restore from the same location works, and deleting
    the backup removes both versions."""
    from tabletstore.errors import Unavailable
    from tabletstore.metadata.backup import read_backup

    elsewhere = f"file://{tmp_path}/backups"
    expected, remote = await _far_backup(tmp_path, elsewhere)
    async with await Database.open(f"file://{tmp_path}/b") as db:
        store_delete = db.store.delete
        held: list[str] = []

        async def delete(key: str) -> None:
            if not key.startswith(layout.BACKUPS):
                await store_delete(key)
                return
            held.append(key)
            deadline = time.monotonic() + 60
            while "r" not in await db.list_tables():  # the master creates it meanwhile
                assert time.monotonic() < deadline, "the table was never created"
                await asyncio.sleep(0.01)
            raise Unavailable(f"cannot delete {key}")

        db.store.delete = delete  # type: ignore[method-assign]
        try:
            await asyncio.wait_for(db.restore_table("far", "r", source=elsewhere), 120)
        finally:
            db.store.delete = store_delete  # type: ignore[method-assign]
        assert held == [layout.backup_key("far", 0)]
        assert await _rows(db, "r") == expected
        versions = [i.key async for i in db.store.list(layout.backup_prefix("far"))]
        assert versions == [layout.backup_key("far", 0), layout.backup_key("far", 1)]
        assert (await read_backup(db.store, "far")).state is BackupState.READY
        await db.delete_table("r")
        await db.gc(grace=0)
        assert set(remote.sstable_keys()) <= await _sstables(db)
        await db.restore_table("far", "r2", source=elsewhere)
        assert await _rows(db, "r2") == expected
        assert (await db.verify()).ok
        await db.delete_backup("far")
        assert [i.key async for i in db.store.list(layout.backup_prefix("far"))] == []


async def test_a_restore_from_elsewhere_checks_the_copy_in_one_round_trip(tmp_path: Path) -> None:
    """A restore from another location tells the master what its copy verified: the master
    reads the manifest version the copy wrote (no listing of the versions) and, while that
    read is under way, lists the table's SSTable prefix once to find every SSTable at its
    size (no HEAD per SSTable). The database's bucket is listed three times in all (the
    client's looks for the backup and its SSTables before copying, and that listing), and no
    object in it is HEADed."""
    from collections.abc import AsyncIterator

    from tabletstore.storage_s3 import find_layer
    from tabletstore.storage_s3.base import ObjectInfo, Op
    from tabletstore.storage_s3.instrumented import InstrumentedObjectStore

    elsewhere = f"file://{tmp_path}/backups"
    expected, remote = await _far_backup(tmp_path, elsewhere)
    async with await Database.open(f"file://{tmp_path}/b", instrument=True) as db:
        counters = find_layer(db.store, InstrumentedObjectStore)
        assert counters is not None
        store_get, store_head, store_list = db.store.get, db.store.head, db.store.list
        master_restore = db.master.restore_copied
        armed, listed, looked_up = [False], list[str](), list[str]()
        tables_listed = asyncio.Event()

        async def restore_copied(req: object) -> object:
            armed[0] = True  # from here on, the master's reads
            return await master_restore(req)  # type: ignore[arg-type]

        def listing(prefix: str, **kw: object) -> AsyncIterator[ObjectInfo]:
            if armed[0]:
                listed.append(prefix)
                if prefix.startswith(layout.TABLES):
                    tables_listed.set()
            return store_list(prefix, **kw)  # type: ignore[arg-type]

        async def head(key: str) -> object:
            if armed[0]:
                looked_up.append(key)
            return await store_head(key)

        async def get(key: str) -> bytes | None:
            if armed[0] and key.startswith(layout.BACKUPS):
                # Held until the SSTables are listed: they are, while it is read.
                await asyncio.wait_for(tables_listed.wait(), 60)
            return await store_get(key)

        db.store.get, db.store.head, db.store.list = get, head, listing  # type: ignore[method-assign, assignment]
        db.master.restore_copied = restore_copied  # type: ignore[method-assign, assignment]
        before = counters.stats()
        try:
            await db.restore_table("far", "r", source=elsewhere)
        finally:
            db.store.get, db.store.head, db.store.list = store_get, store_head, store_list  # type: ignore[method-assign]
        used = counters.stats() - before
        table_id = layout.parse_sstable_key(remote.sstable_keys()[0]).table_id
        assert listed == [layout.tables_prefix(table_id)]
        assert looked_up == []
        # The client's look for the backup and for its SSTables, the master's for them.
        assert used[Op.LIST].requests == 3, used
        assert used[Op.HEAD].requests == 0, used
        assert await _rows(db, "r") == expected


async def test_a_master_without_restore_copied_gets_restore_table(tmp_path: Path) -> None:
    """A master that predates ``restore_copied`` refuses it before running anything
    (Unimplemented); the client then sends ``restore_table`` without the field."""
    from tabletstore.rpc.messages import RestoreTableRequest

    elsewhere = f"file://{tmp_path}/backups"
    expected, _ = await _far_backup(tmp_path, elsewhere)
    async with await Database.open(f"file://{tmp_path}/b") as db:
        master_restore = db.master.restore_table
        plain: list[RestoreTableRequest] = []

        async def refused(req: RestoreTableRequest) -> object:
            raise Unimplemented("no RPC method 'restore_copied' on the master")

        async def restore_table(req: RestoreTableRequest) -> object:
            plain.append(req)
            return await master_restore(req)

        db.master.restore_copied = refused  # type: ignore[method-assign, assignment]
        db.master.restore_table = restore_table  # type: ignore[method-assign, assignment]
        await db.restore_table("far", "r", source=elsewhere)
        assert [(r.backup_id, r.copied) for r in plain] == [("far", None)]
        assert await _rows(db, "r") == expected


async def test_the_master_trusts_nothing_a_copy_says_it_verified(tmp_path: Path) -> None:
    """What a client says its copy verified decides only which reads the master starts at
    once. An account that does not match the bucket's manifest (another size, a version that
    is not there) gets the full check, and restores what the manifest names; an SSTable
    missing from the bucket is refused as for any restore, however the account reads, and
    nothing is created."""
    from tabletstore.rpc.messages import CopiedBackup, RestoreTableRequest

    elsewhere = f"file://{tmp_path}/backups"
    expected, _ = await _far_backup(tmp_path, elsewhere)
    async with await Database.open(f"file://{tmp_path}/b") as db:
        await db.restore_table("far", "r", source=elsewhere)  # copies it in
        copy = await db.get_backup("far")
        sizes = {r.key: r.size for t in copy.tablets for refs in t.sstables.values() for r in refs}
        true = CopiedBackup(copy.version, sizes, dict(copy.checksums))
        bigger = CopiedBackup(copy.version, {k: s + 1 for k, s in sizes.items()}, true.checksums)
        absent = CopiedBackup(copy.version + 5, sizes, true.checksums)
        for name, account in [("wrong", bigger), ("absent", absent), ("true", true)]:
            await db.master.restore_copied(RestoreTableRequest("far", name, account))
            assert await _rows(db, name) == expected
        gone = sorted(sizes)[0]
        await db.store.delete(gone)
        for name, account in [("r2", true), ("r3", CopiedBackup(copy.version, {}, {}))]:
            with pytest.raises(NotFound, match="does not exist"):
                await db.master.restore_copied(RestoreTableRequest("far", name, account))
        assert sorted(await db.list_tables()) == ["absent", "r", "true", "wrong"]


async def test_a_restored_tablet_is_loaded_with_one_metadata_write(tmp_path: Path) -> None:
    """A tablet never loaded before with no log to replay (a restored table's) takes its epoch
    in the same METADATA update that lists the worker's log; a tablet loaded before (moved,
    reloaded) still takes it first, then lists the log."""
    from tabletstore.metadata.record import TabletRecord
    from tabletstore.rpc.messages import UnloadTabletRequest

    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"], split_keys=[b"row0005"])
        await _write(db, "t", range(10), b"v")
        await db.flush("t")
        await db.create_backup("t", "b")
        catalog = db.worker._catalog
        catalog_update = catalog.update
        writes: dict[tuple[str, str], int] = {}

        async def update(old: TabletRecord, new: TabletRecord, **kw: object) -> TabletRecord:
            key = (old.table_id, old.tablet_id)
            writes[key] = writes.get(key, 0) + 1
            return await catalog_update(old, new, **kw)  # type: ignore[arg-type]

        catalog.update = update  # type: ignore[method-assign]
        restored = await db.restore_table("b", "r")
        records = await db.catalog.list_tablets(restored.table_id)
        keys = [(rec.table_id, rec.tablet_id) for rec in records]
        assert [writes.get(k) for k in keys] == [1, 1], writes
        assert all(rec.epoch > 0 and rec.logs and rec.location for rec in records)
        assert [e.kind for e in records[0].events][-2:] == ["assigned", "loaded"]
        await db.worker.unload(UnloadTabletRequest(*keys[0], flush=True))  # as when moved
        writes.clear()
        deadline = time.monotonic() + 60
        while keys[0] not in db.worker._tablets:
            assert time.monotonic() < deadline, "the unloaded tablet was never loaded again"
            await db.master.assign()
            await asyncio.sleep(0.01)
        assert writes[keys[0]] == 2, writes  # the epoch, then the log
        assert await _rows(db, "r") == await _rows(db, "t")


async def test_a_restored_tablets_load_loses_to_a_loader_that_took_it_first(
    tmp_path: Path,
) -> None:
    """The one update of a never-loaded tablet is conditional on epoch 0: a loader that
    claimed the tablet earlier and takes it (epoch 0 to its own) between this load's read and
    its update makes this load fail Fenced, writing nothing; the next load takes the epoch
    first, as for any tablet loaded before, and serves every restored row."""
    from dataclasses import replace

    from tabletstore.errors import Fenced
    from tabletstore.metadata.record import TabletRecord

    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"])
        await _write(db, "t", range(10), b"v")
        await db.flush("t")
        await db.create_backup("t", "b")
        source = (await db.catalog.get_table("t")).table_id
        catalog = db.worker._catalog
        get_tablet, catalog_update = catalog.get_tablet, catalog.update
        rival: list[TabletRecord] = []
        fenced: list[Fenced] = []

        async def racing_get(table_id: str, tablet_id: str, **kw: object) -> TabletRecord:
            record = await get_tablet(table_id, tablet_id, **kw)  # type: ignore[arg-type]
            if table_id != source and record.epoch == 0 and not rival:
                taken = replace(record, epoch=1, location="zombie:1")
                rival.append(await catalog_update(record, taken))
            return record

        async def update(old: TabletRecord, new: TabletRecord, **kw: object) -> TabletRecord:
            try:
                return await catalog_update(old, new, **kw)  # type: ignore[arg-type]
            except Fenced as exc:
                fenced.append(exc)
                raise

        catalog.get_tablet, catalog.update = racing_get, update  # type: ignore[method-assign, assignment]
        restored = await db.restore_table("b", "r")
        assert rival and len(fenced) == 1, (rival, fenced)
        assert await _rows(db, "r") == await _rows(db, "t")  # served once loaded again
        (record,) = await db.catalog.list_tablets(restored.table_id)
        assert record.epoch not in (0, 1) and record.location != "zombie:1" and record.logs
