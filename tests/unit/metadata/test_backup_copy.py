"""Copying a backup into a local directory (metadata/backup_copy.py): each object read in
ranged parts that land in any order, written at their offsets and hashed in order, so the
copy is byte for byte the source with its checksum; an object missing, shorter or longer than
its manifest records fails the copy and leaves nothing behind, visible or staged; the staged
files of a copy that was killed are removed by the next copy into the same directories."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from pathlib import Path

import pytest

from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.errors import Corruption, NotFound, Unavailable
from tabletstore.metadata import backup_copy
from tabletstore.metadata.backup import BackupManifest, BackupState
from tabletstore.metadata.backup_copy import checksum, copy_backup
from tabletstore.metadata.record import SSTableRef
from tabletstore.storage_s3 import InstrumentedObjectStore, Op, find_layer, layout, open_store
from tabletstore.storage_s3.local import STAGE_PREFIX, TEMP_PREFIX, LocalObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore
from tests.plugins.s3_server import REGION, boto3_client


class _Shuffled(LocalObjectStore):
    """A location whose ranged reads answer in reverse order of offset (later parts first)."""

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        await asyncio.sleep(0.002 * max(0, 20 - offset // 997))
        return await super().get_range(key, offset, length)


async def _backup(tmp_path: Path) -> tuple[str, BackupManifest]:
    """A backup of a table of random values in another location (a few KB per SSTable)."""
    location = f"file://{tmp_path}/location"
    rng = random.Random(3)
    async with await Database.open(f"file://{tmp_path}/db") as db:
        await db.create_table("t", ["f"], split_keys=[b"row0020"])
        t = db.table("t")
        for i in range(40):
            await t.mutate_row(f"row{i:04d}".encode(), [SetCell("f", b"q", rng.randbytes(300))])
        await db.flush("t")
        return location, await db.create_backup("t", "far", to=location)


def _leftovers(root: Path) -> list[Path]:
    """Staged files left behind. (A create cancelled with the copy, the creating manifest's,
    finishes in its thread and removes its own temporary file.)"""
    return list(root.rglob(f"{STAGE_PREFIX}*"))


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(backup_copy, "STAGED_PART_BYTES", 997)
    monkeypatch.setattr(backup_copy, "STAGED_GETS", 3)
    return 997


async def test_parts_landing_in_any_order_make_the_object_and_its_checksum(
    tmp_path: Path, small_parts: int
) -> None:
    _, remote = await _backup(tmp_path)
    refs = [r for t in remote.tablets for refs in t.sstables.values() for r in refs]
    assert any(ref.size > 3 * small_parts for ref in refs)  # read in several parts
    src = _Shuffled(tmp_path / "location")
    dst = open_store(f"file://{tmp_path}/dst")
    try:
        copy = await copy_backup(src, dst, "far", now=time.time())
        assert copy.state is BackupState.READY
        assert copy.checksums == remote.checksums
        for key in remote.sstable_keys():
            data = await dst.get(key)
            assert data == await src.get(key)
            assert data is not None and checksum(data) == remote.checksums[key]
    finally:
        await src.close()
        await dst.close()
    assert _leftovers(tmp_path / "dst") == []


@pytest.mark.parametrize("damage", ["missing", "shorter", "longer", "flipped"])
async def test_a_damaged_object_fails_the_copy_and_leaves_nothing(
    tmp_path: Path, small_parts: int, damage: str
) -> None:
    location, remote = await _backup(tmp_path)
    refs = [r for t in remote.tablets for refs in t.sstables.values() for r in refs]
    largest = max(refs, key=lambda r: r.size)
    assert largest.size > 3 * small_parts
    victim = tmp_path / "location" / largest.key
    data = victim.read_bytes()
    victim.unlink()
    if damage == "shorter":
        victim.write_bytes(data[:-1])
    elif damage == "longer":
        victim.write_bytes(data + b"x")
    elif damage == "flipped":
        middle = len(data) // 2
        victim.write_bytes(data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :])
    src = open_store(location)
    dst = open_store(f"file://{tmp_path}/dst")
    error = NotFound if damage == "missing" else Corruption
    message = {
        "missing": "does not exist: the backup is damaged",
        "shorter": f"has fewer than {len(data)} bytes, the backup recorded {len(data)}",
        "longer": f"has more than {len(data)} bytes, the backup recorded {len(data)}",
        "flipped": "does not match its recorded checksum",
    }[damage]
    try:
        with pytest.raises(error, match=message):
            await copy_backup(src, dst, "far", now=time.time())
        assert [i.key async for i in dst.list(layout.TABLES)] == []
    finally:
        await src.close()
        await dst.close()
    assert _leftovers(tmp_path / "dst") == []


async def test_an_empty_object_is_copied(tmp_path: Path) -> None:
    src = LocalObjectStore(tmp_path / "src")
    dst = LocalObjectStore(tmp_path / "dst")
    sink = backup_copy._Sink(src, dst, asyncio.Event())
    key = "tables/t-1/tab/default/empty.sst"
    await src.create(key, b"")
    from tabletstore.metadata.record import SSTableRef

    ref = SSTableRef(key, 0, 0, 0, 0, first_row=b"", last_row=b"")
    assert await backup_copy._stream(src, ref, sink) == checksum(b"")
    sink.pinned.set()
    await sink.publish()
    await sink.discard()
    assert await dst.get(key) == b""


async def test_a_later_copy_removes_what_a_killed_one_staged(tmp_path: Path) -> None:
    """Staged files of a process that no longer runs are swept by the next copy into their
    directories; a live process's are left alone."""
    location, remote = await _backup(tmp_path)
    dead = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await dead.wait()
    dead_pid = dead.pid
    dst_root = tmp_path / "dst"
    directory = dst_root / Path(remote.sstable_keys()[0]).parent
    directory.mkdir(parents=True)
    killed = directory / f"{STAGE_PREFIX}{dead_pid}-0123456789abcdef"
    live = directory / f"{STAGE_PREFIX}{os.getpid()}-fedcba9876543210"
    other = directory / f"{TEMP_PREFIX}0011223344556677"  # a create's, not a staged copy's
    for path in (killed, live, other):
        path.write_bytes(b"half")
    src = open_store(location)
    dst = open_store(dst_root.as_uri())
    try:
        await copy_backup(src, dst, "far", now=time.time())
    finally:
        await src.close()
        await dst.close()
    assert not killed.exists()
    assert live.exists() and other.exists()


async def test_staged_creates_go_through_the_wrappers(tmp_path: Path) -> None:
    """A copy into a local directory stages through the store's wrappers: the request
    counters count a PUT per object it publishes, and a PUT fault fails the copy, leaving
    nothing visible or staged."""
    location, remote = await _backup(tmp_path)
    keys = remote.sstable_keys()
    src = open_store(location)
    counted = open_store(f"file://{tmp_path}/counted", instrument=True)
    faulty = FaultyObjectStore(open_store(f"file://{tmp_path}/faulty"))
    faulty.fail(Op.PUT, key="tables/*")
    try:
        await copy_backup(src, counted, "far", now=time.time())
        stats = find_layer(counted, InstrumentedObjectStore)
        assert stats is not None
        puts = stats.stats()[Op.PUT]
        assert puts.requests == len(keys) + 2  # the objects and two manifest versions
        assert puts.bytes >= remote.size_bytes
        with pytest.raises(Unavailable):
            await copy_backup(src, faulty, "far", now=time.time())
        assert [i.key async for i in faulty.list(layout.TABLES)] == []
    finally:
        for store in (src, counted, faulty):
            await store.close()
    assert _leftovers(tmp_path / "faulty") == []


async def _in_two_buckets(
    tmp_path: Path, s3_server: str, s3_bucket: str
) -> tuple[BackupManifest, str, str]:
    """A backup copied into a bucket of moto's server (read and written by the client), and
    the URL of an empty second bucket on the same server."""
    location, _ = await _backup(tmp_path)
    other = f"{s3_bucket}-other"
    boto3_client(s3_server).create_bucket(Bucket=other)
    first = f"s3://{s3_bucket}/a?endpoint_url={s3_server}&region={REGION}"
    second = f"s3://{other}/b?endpoint_url={s3_server}&region={REGION}"
    src, dst = open_store(location), open_store(first)
    try:
        copied = await copy_backup(src, dst, "far", now=time.time())
    finally:
        await src.close()
        await dst.close()
    return copied, first, second


def _largest(manifest: BackupManifest) -> SSTableRef:
    """The backup's largest SSTable (the one a damaged-source test damages)."""
    return max(
        (r for t in manifest.tablets for refs in t.sstables.values() for r in refs),
        key=lambda r: r.size,
    )


async def test_a_copy_between_buckets_of_one_server_is_made_by_the_server(
    tmp_path: Path, s3_server: str, s3_bucket: str
) -> None:
    """Between two buckets of one S3 endpoint each SSTable is copied server-side: the client
    reads none of its bytes and writes none, one PUT (CopyObject) per object, and the copy
    records the same SHA-256 of each object as a copy that read it."""
    first_copy, first, second = await _in_two_buckets(tmp_path, s3_server, s3_bucket)
    src = open_store(first, instrument=True)
    dst = open_store(second, instrument=True)
    try:
        copied = await copy_backup(src, dst, "far", now=time.time())
        read = find_layer(src, InstrumentedObjectStore)
        written = find_layer(dst, InstrumentedObjectStore)
        assert read is not None and written is not None
        # Read: the manifest (one GET), and no object at all (each has a recorded checksum,
        # which the server's answer to the copy settles); written: the two manifest
        # versions and one CopyObject per object, whose bytes never came through here.
        assert read.stats()[Op.GET].requests == 1 and read.stats()[Op.GET_RANGE].requests == 0
        assert read.stats()[Op.HEAD].requests == 0
        assert written.stats()[Op.PUT].requests == len(first_copy.sstable_keys()) + 2
        (manifest,) = [i.size async for i in dst.list(layout.BACKUPS)]  # the ready one
        assert written.stats().bytes_written < 3 * manifest < first_copy.size_bytes
        assert copied.checksums == first_copy.checksums and copied.checksums
        for key in first_copy.sstable_keys():
            assert await dst.get(key) == await src.get(key)
    finally:
        await src.close()
        await dst.close()


async def test_a_server_copy_that_differs_from_its_checksum_fails_and_leaves_nothing(
    tmp_path: Path, s3_server: str, s3_bucket: str
) -> None:
    """An object whose bytes differ from the recorded checksum (same size) fails a server-side
    copy with Corruption, and the object it copied is removed: a later copy would take an
    object of the recorded size for the one it needs."""
    first_copy, first, second = await _in_two_buckets(tmp_path, s3_server, s3_bucket)
    victim = _largest(first_copy)
    client = boto3_client(s3_server)
    bucket, full = s3_bucket, f"a/{victim.key}"
    data = client.get_object(Bucket=bucket, Key=full)["Body"].read()
    middle = len(data) // 2
    client.put_object(
        Bucket=bucket, Key=full, Body=data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :]
    )
    src, dst = open_store(first), open_store(second)
    try:
        with pytest.raises(Corruption, match="does not match its recorded checksum"):
            await copy_backup(src, dst, "far", now=time.time())
        assert await dst.head(victim.key) is None
    finally:
        await src.close()
        await dst.close()


@pytest.mark.parametrize("damage", ["longer", "missing"])
async def test_a_server_copy_of_a_longer_or_missing_object_fails_and_leaves_nothing(
    tmp_path: Path, s3_server: str, s3_bucket: str, damage: str
) -> None:
    """A source object with a recorded checksum is not looked at before its server-side
    copy: one longer than recorded fails the copy with Corruption (its checksum differs) and
    the object copied is removed; a missing one fails it with NotFound naming it. Nothing is
    left in the destination for a later copy to take."""
    first_copy, first, second = await _in_two_buckets(tmp_path, s3_server, s3_bucket)
    victim = _largest(first_copy)
    client = boto3_client(s3_server)
    full = f"a/{victim.key}"
    if damage == "longer":
        data = client.get_object(Bucket=s3_bucket, Key=full)["Body"].read()
        client.put_object(Bucket=s3_bucket, Key=full, Body=data + b"x")
    else:
        client.delete_object(Bucket=s3_bucket, Key=full)
    src, dst = open_store(first), open_store(second)
    try:
        expected: type[Exception] = Corruption if damage == "longer" else NotFound
        with pytest.raises(expected, match=victim.key.rsplit("/", 1)[-1]):
            await copy_backup(src, dst, "far", now=time.time())
        assert await dst.head(victim.key) is None
    finally:
        await src.close()
        await dst.close()
