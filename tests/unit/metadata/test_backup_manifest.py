"""The backup manifest format (metadata/backup.py): its JSON, versions, and refusals.

The JSON is pinned key by key (a format change edits this test and the module docstring in
the same commit); a newer format is Unimplemented, never guessed at; a damaged manifest is
Corruption naming it; versions are published create-only, and the newest one is the manifest.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.errors import (
    AlreadyExists,
    Corruption,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    Unavailable,
    Unimplemented,
)
from tabletstore.metadata.backup import (
    COPIED_VERSION,
    FORMAT,
    BackupManifest,
    BackupState,
    check_backup_id,
    list_backups,
    read_backup,
    write_backup,
    write_next_version,
)
from tabletstore.metadata.record import SSTableRef
from tabletstore.metadata.snapshot import TabletSnapshot
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectInfo
from tabletstore.storage_s3.memory import MemoryObjectStore

REF = SSTableRef(layout.sstable_key("t-1", "t00000", "default", "s1"), 100, 3, 1, 9, b"a", b"z")


def _manifest(**changes: object) -> BackupManifest:
    base = BackupManifest(
        backup_id="b1",
        table="t",
        table_id="t-1",
        source_url="memory://db",
        created_at=1000.5,
        expires_at=None,
        state=BackupState.READY,
        schema=TableSchema(name="t", families={"f": ColumnFamily(name="f")}),
        tablets=(
            TabletSnapshot("t00000", b"", b"m", 9, {"default": (REF,)}),
            TabletSnapshot("t00001", b"m", None, 4, {}),
        ),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_json_is_pinned() -> None:
    doc = json.loads(_manifest().to_bytes())
    assert list(doc) == [
        "format", "backup_id", "version", "state", "table", "table_id", "source_url",
        "created_at", "expires_at", "size_bytes", "copied_from", "checksums", "schema",
        "tablets",
    ]  # fmt: skip
    assert doc["format"] == FORMAT == "tabletstore.backup/1"
    assert doc["state"] == "ready" and doc["size_bytes"] == 100
    assert doc["tablets"][0]["cut_seq"] == 9 and doc["tablets"][0]["end_row"] == "bQ=="
    assert BackupManifest.from_bytes(_manifest().to_bytes()) == _manifest()


def test_split_keys_and_keys_named_once() -> None:
    m = _manifest()
    assert m.split_keys() == [b"m"]
    assert m.sstable_keys() == [REF.key]
    assert m.key == layout.backup_key("b1", 0)


def test_newer_format_is_unimplemented_other_garbage_is_corruption() -> None:
    doc = json.loads(_manifest().to_bytes())
    doc["format"] = "tabletstore.backup/7"
    with pytest.raises(Unimplemented, match="newer than this build reads"):
        BackupManifest.from_bytes(json.dumps(doc).encode(), name="x")
    doc["format"] = "tabletstore.snapshot/1"
    with pytest.raises(Corruption, match="x is malformed"):
        BackupManifest.from_bytes(json.dumps(doc).encode(), name="x")
    with pytest.raises(Corruption):
        BackupManifest.from_bytes(b"[1]", name="x")
    doc["format"] = FORMAT
    doc["tablets"] = doc["tablets"][:1]
    with pytest.raises(Corruption, match="does not continue"):
        BackupManifest.from_bytes(json.dumps(doc).encode(), name="x")


def test_restorable_only_when_ready_and_unexpired() -> None:
    _manifest().check_restorable(2000.0, "here")
    with pytest.raises(InvalidArgument, match="incomplete"):
        _manifest(state=BackupState.CREATING).check_restorable(2000.0, "here")
    with pytest.raises(InvalidArgument, match="expired at 1970"):
        _manifest(expires_at=1500.0).check_restorable(2000.0, "here")


@pytest.mark.parametrize("bad", ["", "-x", ".x", "a/b", "x" * 101, "sp ace"])
def test_backup_ids_are_checked(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="is not a backup id"):
        check_backup_id(bad)


async def test_versions_are_create_only_and_the_newest_is_read() -> None:
    store = MemoryObjectStore("memory://t")
    first = await write_backup(store, _manifest())
    with pytest.raises(AlreadyExists):
        await write_backup(store, _manifest())
    second = await write_next_version(store, first.changed(expires_at=5000.0))
    assert (await read_backup(store, "b1")) == second
    assert [i.key async for i in store.list(layout.backup_prefix("b1"))] == [second.key]
    with pytest.raises(PreconditionFailed, match="changed by someone else"):
        await write_next_version(store, first.changed(expires_at=6000.0))
    assert [m.backup_id for m in await list_backups(store)] == ["b1"]
    assert await list_backups(store, "other") == []


async def test_gc_mark_reads_a_version_replaced_after_the_listing() -> None:
    """An update between GC's listing and its mark publishes version n+1 (unlisted) and
    deletes version n: the mark must pin what the backup names, not nothing."""
    from tabletstore.master import gc

    store = MemoryObjectStore("memory://gc-race")
    first = await write_backup(store, _manifest())
    listed = [i async for i in store.list("")]
    await write_next_version(store, first.changed(expires_at=9e9))
    names, expiry = await gc._backup_names(store, listed)
    assert names == {first.key: frozenset({REF.key})}
    assert expiry == {first.key: 9e9}
    await store.delete_many([i.key async for i in store.list("")])
    assert (await gc._backup_names(store, listed))[0] == {first.key: frozenset()}


class _Meeting(MemoryObjectStore):
    """A store whose listing and GET of ``key`` each wait until the other has started: a
    read that does one after the other never finishes."""

    def __init__(self, key: str) -> None:
        super().__init__("memory://meeting", shared=False)
        self.key = key
        self.armed = False  # from the read on (writing the versions lists and reads too)
        self.listing, self.getting = asyncio.Event(), asyncio.Event()

    async def get(self, key: str) -> bytes | None:
        if self.armed and key == self.key:
            self.getting.set()
            await self.listing.wait()
        return await super().get(key)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        if self.armed:
            self.listing.set()
            await self.getting.wait()
        async for info in super().list(prefix, start_after=start_after):
            yield info


async def test_a_guessed_version_is_read_while_the_versions_are_listed() -> None:
    """With ``guess`` the newest version is read in one round trip (the GET beside the LIST)."""
    store = _Meeting(layout.backup_key("b1", COPIED_VERSION))
    first = await write_backup(store, _manifest(state=BackupState.CREATING))
    ready = await write_next_version(store, first.changed(state=BackupState.READY), only=first)
    assert ready.version == COPIED_VERSION
    store.armed = True
    got = await asyncio.wait_for(read_backup(store, "b1", guess=COPIED_VERSION), 10)
    assert got == ready


async def test_a_wrong_guess_still_reads_the_newest_version() -> None:
    store = MemoryObjectStore("memory://guess", shared=False)
    v0 = await write_backup(store, _manifest())
    # Only version 0: the guessed version 1 does not exist.
    assert await read_backup(store, "b1", guess=1) == v0
    # Versions 1 and 2 both there (2 published, 1 not yet deleted): 2 is read, not the guess.
    v1 = await write_next_version(store, v0.changed(expires_at=5000.0))
    await store.create(v1.changed(expires_at=6000.0).key, v1.changed(expires_at=6000.0).to_bytes())
    assert (await read_backup(store, "b1", guess=1)).expires_at == 6000.0
    with pytest.raises(NotFound):
        await read_backup(store, "nothing", guess=1)
    with pytest.raises(InvalidArgument, match="is not a backup id"):
        await read_backup(store, "a/b", guess=1)


class _HeldDeletes(MemoryObjectStore):
    def __init__(self, *, fail: bool = False) -> None:
        super().__init__("memory://held", shared=False)
        self.release = asyncio.Event()
        self.fail = fail

    async def delete(self, key: str) -> None:
        await self.release.wait()
        if self.fail:
            raise Unavailable(f"cannot delete {key}")
        await super().delete(key)


async def test_a_superseded_version_is_deleted_later_in_the_callers_task_group() -> None:
    """With ``later`` the new version is the newest one as soon as the call returns; the older
    one goes once the task group ends."""
    store = _HeldDeletes()
    first = await write_backup(store, _manifest(state=BackupState.CREATING))
    async with asyncio.TaskGroup() as later:
        ready = await write_next_version(
            store, first.changed(state=BackupState.READY), only=first, later=later
        )
        assert await read_backup(store, "b1") == ready  # the older version is still there
        assert len([i async for i in store.list(layout.backup_prefix("b1"))]) == 2
        store.release.set()
    assert [i.key async for i in store.list(layout.backup_prefix("b1"))] == [ready.key]


async def test_a_superseded_version_that_cannot_be_deleted_is_left_harmlessly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed deletion of the older version is logged, not raised (the caller's other work
    in the task group goes on); readers take the newest version, and the next change of the
    backup removes the leftover."""
    store = _HeldDeletes(fail=True)
    first = await write_backup(store, _manifest(state=BackupState.CREATING))
    store.release.set()
    async with asyncio.TaskGroup() as later:
        ready = await write_next_version(
            store, first.changed(state=BackupState.READY), only=first, later=later
        )
    assert "superseded backup manifest" in caplog.text
    assert await read_backup(store, "b1", guess=COPIED_VERSION) == ready
    store.fail = False
    third = await write_next_version(store, ready.changed(expires_at=9000.0))
    assert [i.key async for i in store.list(layout.backup_prefix("b1"))] == [third.key]
