"""``verify`` end to end on the embedded default: a clean database verifies whole; an
SSTable deleted, a needed log segment truncated, two tablets overlapping, a gap between
tablets, an SSTable only a bulk-load part names deleted, and an expired or unfinished backup
are each found, and ``tabletstore verify`` exits 3 with the report (0 when whole)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from tabletstore.batch import awrite_sstables
from tabletstore.cli.main import main
from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.errors import NotFound
from tabletstore.master import verify_plan as vp
from tabletstore.metadata.backup import BackupState, read_backup, write_next_version
from tabletstore.metadata.load_part import list_load_parts
from tabletstore.metadata.record import TabletRecord
from tabletstore.metadata.store_location import OBJECTS_DIR
from tabletstore.storage_s3 import layout


async def _fill(db: Database, rows: range, value: bytes = b"v") -> None:
    t = db.table("t")
    for i in rows:
        await t.mutate_row(f"r{i:03d}".encode(), [SetCell("f", b"q", value)])


async def _listed(db: Database) -> list[str]:
    return [o.key async for o in db.store.list("")]


async def _records(db: Database) -> list[TabletRecord]:
    info = await db.master.catalog.get_table("t")
    return await db.master.catalog.list_tablets(info.table_id)


async def test_a_clean_database_verifies_whole(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("t", ["f"], split_keys=[b"r050"])
        await _fill(db, range(100))
        await db.flush("t")
        await _fill(db, range(0, 100, 7), b"w")
        manifest = await db.snapshot("t")
        report = await db.verify()
        assert report.ok, report.lines()
        assert report.tablets >= 2 and report.objects_checked >= 2
        assert report.segments_checked >= 1
        assert set(manifest.sstable_keys()) <= {o for o in await _listed(db)}
        only = await db.verify("t", deep=True)
        assert only.ok and only.tables == 1, only.lines()


async def test_a_missing_sstable_is_found(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("t", ["f"])
        await _fill(db, range(20))
        await db.flush("t")
        key = next(r.key for rec in await _records(db) for rs in rec.sstables.values() for r in rs)
        await db.store.delete(key)
        report = await db.verify()
        assert [(f.kind, f.subject) for f in report.findings] == [(vp.Kind.MISSING, key)]


async def test_a_truncated_segment_is_found(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("t", ["f"])
        await _fill(db, range(20))  # not flushed: the log holds them and the tablet needs it
        rec = (await _records(db))[0]
        ref = rec.logs[-1]
        key = layout.log_segment_key(ref.worker_id, ref.incarnation, rec.log_start(ref))
        path = tmp_path / OBJECTS_DIR / key
        data = path.read_bytes()
        os.chmod(path, 0o644)
        path.write_bytes(data[: len(data) - 10])
        report = await db.verify()
        kinds = [f.kind for f in report.findings]
        assert kinds == [vp.Kind.SEGMENT], report.lines()
        assert f"segment {rec.log_start(ref)}" in report.findings[0].subject
        assert (await db.verify(deep=True)).findings[0].kind is vp.Kind.SEGMENT
        path.write_bytes(data)  # the database closes (and flushes) normally


@pytest.mark.parametrize(("start", "kind"), [(b"r030", vp.Kind.OVERLAP), (b"r070", vp.Kind.GAP)])
async def test_overlapping_or_gapped_ranges_are_found(
    tmp_path: Path, start: bytes, kind: vp.Kind
) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("t", ["f"], split_keys=[b"r050"])
        second = (await _records(db))[1]
        catalog = db.master.catalog
        damaged = await catalog.update(second, replace(second, start_row=start))
        try:
            report = await db.verify("t")
            assert [f.kind for f in report.findings] == [kind], report.lines()
            assert second.table_id in report.findings[0].subject
        finally:
            await catalog.update(damaged, second)
        assert (await db.verify("t")).ok


def test_the_command_exits_3_with_the_report_and_0_when_whole(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    runner = CliRunner()
    assert runner.invoke(main, ["--url", url, "createtable", "t", "families=f"]).exit_code == 0
    assert runner.invoke(main, ["--url", url, "set", "t", "r1", "f:q=v"]).exit_code == 0
    assert runner.invoke(main, ["--url", url, "flush", "t"]).exit_code == 0
    whole = runner.invoke(main, ["--url", url, "verify"])
    assert whole.exit_code == 0, whole.output
    assert whole.output.startswith("verify: whole")
    tables = tmp_path / OBJECTS_DIR / "tables"
    sstables = [p for p in tables.rglob("*.parquet") if "!metadata" not in p.parts]
    assert sstables
    for p in sstables:
        p.unlink()
    damaged = runner.invoke(main, ["--url", url, "verify", "t"])
    assert damaged.exit_code == 3, damaged.output
    assert "missing object: tables/" in damaged.output
    as_json = runner.invoke(main, ["--url", url, "verify", "--json"])
    assert as_json.exit_code == 3 and '"kind": "missing"' in as_json.output
    missing = runner.invoke(main, ["--url", url, "verify", "nosuch"])
    assert missing.exit_code == 1 and "nosuch" in missing.output


def test_verify_backup_finds_a_missing_and_a_truncated_object(tmp_path: Path) -> None:
    """``verify --backup ID``: in the database's bucket and in another location (whose
    manifest records checksums); a missing object, a truncated one and one of the right size
    with other bytes are findings (exit 3); an unknown backup is an error (exit 1)."""
    url = f"file://{tmp_path}/db"
    location = f"file://{tmp_path}/elsewhere"
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(main, ["--url", url, *args])
        return result.exit_code, result.output

    assert run("createtable", "t", "families=f", "splits=r5")[0] == 0
    for row in ("r1", "r7"):
        assert run("set", "t", row, "f:q=v")[0] == 0
    assert run("flush", "t")[0] == 0
    assert run("backup", "create", "t", "--id", "here")[0] == 0
    assert run("backup", "create", "t", "--id", "away", "--to", location)[0] == 0
    for args in (("--backup", "here"), ("--backup", "away", "--at", location)):
        code, out = run("verify", *args)
        assert code == 0 and out.startswith("verify: whole"), out
        assert "2 objects" in out
    # In another location: one object truncated, one rewritten with other bytes.
    copies = sorted((tmp_path / "elsewhere").rglob("*.parquet"))
    assert len(copies) == 2
    truncated, altered = copies
    truncated.write_bytes(truncated.read_bytes()[:-5])
    data = altered.read_bytes()
    altered.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    code, out = run("verify", "--backup", "away", "--at", location, "--json")
    assert code == 3, out
    kinds = sorted(f["kind"] for f in json.loads(out)["findings"])
    assert kinds == ["checksum", "size"], out
    # In the database's bucket: one object gone.
    own = [p for p in (tmp_path / "db" / OBJECTS_DIR / "tables").rglob("*.parquet")]
    gone = next(p for p in own if "!metadata" not in p.parts)
    gone.unlink()
    code, out = run("verify", "--backup", "here")
    assert code == 3 and "missing object: tables/" in out and "backup here" in out, out
    for args, message in [
        (("verify", "--backup", "nosuch"), "no backup 'nosuch'"),
        (("verify", "--backup", "nosuch", "--at", location), "no backup 'nosuch'"),
        (("verify", "t", "--backup", "here"), "not both"),
        (("verify", "--at", location), "--backup ID"),
    ]:
        code, out = run(*args)
        assert code == 1 and message in out, (args, out)


async def test_verify_backup_from_python(tmp_path: Path) -> None:
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("t", ["f"])
        await _fill(db, range(10))
        backup = await db.create_backup("t", "b1")
        report = await db.verify_backup("b1")
        assert report.ok and report.objects_checked == len(backup.sstable_keys())
        await db.store.delete(backup.sstable_keys()[0])
        report = await db.verify_backup("b1")
        assert [f.kind for f in report.findings] == [vp.Kind.MISSING]
        with pytest.raises(NotFound, match="no backup 'b2'"):
            await db.verify_backup("b2")


async def test_an_sstable_only_a_bulk_load_part_names_is_checked(tmp_path: Path) -> None:
    """After a compaction the loaded SSTables are named only by the load's parts (kept for
    point-in-time restore): one deleted is a finding of the whole database's verify and the
    table's; a part that does not parse is one too."""
    async with await Database.open(f"file://{tmp_path}") as db:
        await db.create_table("t", ["f"], history=3600.0)
        out = await db.staging_url("a")
        rows = [b"r1", b"r2"]
        await awrite_sstables(
            pa.table(
                {
                    "row": pa.array(rows, pa.binary()),
                    "family": ["f"] * len(rows),
                    "qualifier": pa.array([b"q"] * len(rows), pa.binary()),
                    "value": pa.array([b"v"] * len(rows), pa.binary()),
                    "timestamp": [5] * len(rows),
                }
            ),
            out,
        )
        assert (await db.bulk_load("t", out))[1] == 2  # cells loaded
        await db.compact("t")
        table_id = (await db.master.catalog.get_table("t")).table_id
        (part,) = await list_load_parts(db.store, table_id)
        named = {r.key for rec in await _records(db) for rs in rec.sstables.values() for r in rs}
        loaded = sorted(part.keys() - named)
        assert loaded, "the compaction left the loaded SSTables named by the records"
        assert (await db.verify()).ok
        await db.store.delete(loaded[0])
        for report in (await db.verify(), await db.verify("t")):
            assert [(f.kind, f.subject) for f in report.findings] == [
                (vp.Kind.MISSING, loaded[0])
            ], report.lines()
            assert f"bulk-load part {part.load_id}" in report.findings[0].detail
        (key,) = [o.key async for o in db.store.list(layout.load_part_prefix(table_id))]
        await db.store.delete(key)
        await db.store.create(key, b"{not json")
        report = await db.verify()
        assert [(f.kind, f.subject) for f in report.findings] == [(vp.Kind.MANIFEST, key)]


async def test_verify_backup_flags_an_expired_or_unfinished_backup(tmp_path: Path) -> None:
    """Its objects all there, a backup past its expiry (a restore refuses it, GC frees it)
    or one whose creation never finished is not whole; the command exits 3."""
    url = f"file://{tmp_path}"
    async with await Database.open(url) as db:
        await db.create_table("t", ["f"])
        await _fill(db, range(10))
        await db.create_backup("t", "b1", expires_at=time.time() + 3600)
        assert (await db.verify_backup("b1")).ok
        manifest = await read_backup(db.store, "b1")
        await write_next_version(db.store, manifest.changed(expires_at=time.time() - 60))
        report = await db.verify_backup("b1")
        assert [(f.kind, f.subject) for f in report.findings] == [(vp.Kind.EXPIRED, "backup b1")], (
            report.lines()
        )
        assert report.objects_checked == len(manifest.sstable_keys())
        await db.create_backup("t", "b2")
        unfinished = (await read_backup(db.store, "b2")).changed(state=BackupState.CREATING)
        await write_next_version(db.store, unfinished)
        report = await db.verify_backup("b2")
        assert [f.kind for f in report.findings] == [vp.Kind.INCOMPLETE], report.lines()
    result = CliRunner().invoke(main, ["--url", url, "verify", "--backup", "b1", "--json"])
    assert result.exit_code == 3, result.output
    assert [f["kind"] for f in json.loads(result.output)["findings"]] == ["expired"]
