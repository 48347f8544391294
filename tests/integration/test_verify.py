"""``verify`` end to end on the embedded default: a clean database verifies whole; an
SSTable deleted, a needed log segment truncated, two tablets overlapping and a gap between
tablets are each found, and ``tabletstore verify`` exits 3 with the report (0 when whole)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from tabletstore.cli.main import main
from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.errors import NotFound
from tabletstore.master import verify_plan as vp
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
