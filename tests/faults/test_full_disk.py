"""A full disk under the local object store (the embedded database's ``file://`` directory):
the write the disk has no room for fails with an error that says so, nothing acknowledged is
lost, and the database takes writes again once there is room (tests/full_disk.py is the
size-limited directory)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tabletstore.data.model import SetCell
from tabletstore.embedded import connect_async
from tabletstore.errors import TabletStoreError
from tabletstore.storage_s3 import local
from tests.full_disk import FullDisk

pytestmark = pytest.mark.timeout(300)

VALUE = b"v" * 2000


async def test_a_full_local_store_refuses_clearly_loses_nothing_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "db"
    db = await connect_async(f"file://{root}")
    acked: list[bytes] = []
    try:
        await db.create_table("t", ["f"])
        table = db.table("t")
        await table.mutate_row(b"first", [SetCell("f", b"q", VALUE)])
        acked.append(b"first")
        disk = FullDisk(root, limit=FullDisk(root, 0).used() + 40_000)
        disk.patch(monkeypatch, local)
        refused: TabletStoreError | None = None
        for i in range(200):
            row = b"row%04d" % i
            try:
                async with asyncio.timeout(60):
                    await table.mutate_row(row, [SetCell("f", b"q", VALUE)])
            except TabletStoreError as exc:
                refused = exc
                break
            acked.append(row)
        assert refused is not None and disk.refused, "the disk never filled up"
        # The commit log's segment create failed: the writes in it are not acknowledged (the
        # writer's plug of the failed number shows nothing was logged, and while the worker
        # moves to a new log its tablets refuse writes naming why the old one failed), and
        # the error names the full disk and the file.
        assert "No space left on device" in str(refused), refused
        # Reads of what was acknowledged go on while the disk is full.
        got = await table.read_row(b"first")
        assert got is not None and got.cells[0].value == VALUE
        # Room again: writes are taken again (the first may still meet the failure's backoff).
        disk.resize(1 << 30)
        end = asyncio.get_running_loop().time() + 60
        while True:
            try:
                await table.mutate_row(b"after", [SetCell("f", b"q", VALUE)])
                acked.append(b"after")
                break
            except TabletStoreError:
                assert asyncio.get_running_loop().time() < end, "no write taken after room"
                await asyncio.sleep(0.5)
    finally:
        await db.close()
    # Reopened from the directory (the log replayed): every acknowledged row is there.
    db = await connect_async(f"file://{root}")
    try:
        table = db.table("t")
        for row in acked:
            got = await table.read_row(row)
            assert got is not None and got.cells[0].value == VALUE, row
    finally:
        await db.close()
