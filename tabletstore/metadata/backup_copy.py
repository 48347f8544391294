"""Copying a backup from one location to another, and deleting one from a backup location
(docs/operations/backups.md).

A location is a store root: a database's bucket, or a backup location outside any database
(``s3://other-bucket/prefix``). Both keep a backup the same way: its manifest versions under
``backups/<id>/`` and the SSTables it names under their own ``tables/...`` keys
(metadata/backup.py). Keys are kept as they are because an SSTable key is unique (its table
id and SSTable id are random) and an SSTable is immutable: a key already in the destination
with the recorded size is the same object, so copies of several backups of one table into one
location share what they have in common, and a copy that was cut short resumes where it
stopped.

The copy is crash-safe. The destination's manifest is written first in state ``creating``
(in a database's bucket it pins the keys as they arrive: GC honours a creating backup too),
then every object is copied and checked against its recorded size (and its checksum when one
is recorded), then version 2 says ``ready``. A backup that is not ready is refused by
restores and copies; deleting it is how a failed copy is abandoned.

Durability is the copy's, not each object's: ``ready`` is written only once every object is
durable. Into a local directory (``file://``: a database restoring from another location, a
backup kept on a local disk) the objects are staged as they arrive and published together
(storage_s3/local.py ``stage``/``publish``: every file synced in parallel, linked, then each
directory synced once) instead of a file sync and a directory sync per object in turn; a name
still appears only for bytes already on disk, so a copy cut short by a crash leaves no object
that is not whole and no ``ready`` manifest. Elsewhere each create is durable when it returns.

Bytes go through this process (GET then create-only PUT), so checksums are recorded for
every object copied: a copy of a copy verifies them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace

from tabletstore.errors import (
    Corruption,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    TabletStoreError,
)
from tabletstore.metadata.backup import (
    BackupManifest,
    BackupState,
    check_backup_id,
    delete_backup_versions,
    list_backups,
    read_backup,
    write_backup,
    write_next_version,
)
from tabletstore.metadata.record import SSTableRef
from tabletstore.storage_s3 import find_layer, layout
from tabletstore.storage_s3.base import S3_BATCH, ObjectStore, object_url
from tabletstore.storage_s3.local import LocalObjectStore, Staged

__all__ = ["COPY_CONCURRENCY", "PART_BYTES", "checksum", "copy_backup", "delete_from_location"]

#: Objects copied at once (each one GET and one PUT in flight).
COPY_CONCURRENCY = 16

#: Objects larger than this are read in ranges of this size, in parallel (AWS's guidance for
#: ranged GETs is 8-16 MB). Smaller parts only add requests, each with its fixed cost on both
#: sides: one GET of a few MB is not slower per byte than two of half the size, and a copy
#: keeps many objects in flight at once anyway.
PART_BYTES = 16 * 1024 * 1024

#: Called with the bytes of each object copied (progress, benchmarks).
Progress = Callable[[int], None]


def checksum(data: bytes | Sequence[bytes]) -> str:
    """The checksum a manifest records for an object's bytes (or for the concatenation of
    its parts)."""
    h = hashlib.sha256()
    for part in (data,) if isinstance(data, bytes) else data:
        h.update(part)
    return "sha256:" + h.hexdigest()


async def copy_backup(
    src: ObjectStore,
    dst: ObjectStore,
    backup_id: str,
    *,
    now: float,
    new_id: str | None = None,
    expires_at: float | None = None,
    keep_expiry: bool = True,
    concurrency: int = COPY_CONCURRENCY,
    progress: Progress | None = None,
    source: BackupManifest | None = None,
) -> BackupManifest:
    """Copy backup ``backup_id`` from ``src`` to ``dst`` (as ``new_id``, default the same
    id) and return the destination's ready manifest. Only a ready, unexpired backup is
    copied; the copy keeps its expiry unless ``keep_expiry`` is False (then ``expires_at``).
    ``source``: its manifest in ``src``, when the caller has just read it (one LIST and one
    GET fewer)."""
    if concurrency < 1:
        raise InvalidArgument(f"copy concurrency must be at least 1, got {concurrency}")
    if source is None or source.backup_id != backup_id:
        source = await read_backup(src, backup_id)
    source.check_restorable(now, src.url)
    target = check_backup_id(new_id or backup_id)
    first = replace(
        source,
        backup_id=target,
        version=0,
        state=BackupState.CREATING,
        copied_from=src.url,
        expires_at=source.expires_at if keep_expiry else expires_at,
    )
    refs = {r.key: r for t in source.tablets for refs in t.sstables.values() for r in refs}
    sums: dict[str, str] = {}
    gate = asyncio.Semaphore(concurrency)
    pinned = asyncio.Event()
    sink = _Sink(dst, pinned)

    async def pin() -> None:
        await write_backup(dst, first)
        pinned.set()

    async def one(ref: SSTableRef) -> None:
        async with gate:
            sums[ref.key] = await _copy_object(src, dst, ref, source.checksums.get(ref.key), sink)
            if progress is not None:
                progress(ref.size)

    # The objects are fetched while the creating manifest is written; none is created in
    # ``dst`` before it (it pins them there). A manifest that cannot be written (the id is
    # taken) cancels the fetches.
    try:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(pin())
                for ref in refs.values():
                    tg.create_task(one(ref))
        except* TabletStoreError as group:
            raise group.exceptions[0] from None  # the first failure, named, as one error
        await sink.publish()
    finally:
        await sink.discard()
    done = first.changed(state=BackupState.READY, checksums={k: v for k, v in sums.items() if v})
    return await write_next_version(dst, done)


class _Sink:
    """Where a copy creates its objects: staged in a local directory and published together
    once every one is there (module docstring), or created one by one, each durable when its
    create returns. Either way none is visible in ``dst`` before ``pinned`` is set (the
    destination's manifest exists)."""

    def __init__(self, dst: ObjectStore, pinned: asyncio.Event) -> None:
        self._local = find_layer(dst, LocalObjectStore)
        self._dst = dst
        self.pinned = pinned
        self._staged: list[Staged] = []

    @property
    def stages(self) -> bool:
        """Whether objects are staged (invisible until :meth:`publish`)."""
        return self._local is not None

    async def create(self, key: str, parts: Sequence[bytes]) -> None:
        if self._local is not None:
            # A staged object is invisible (listings skip temporary files): no need to wait
            # for the manifest until :meth:`publish`, which runs after it is written.
            self._staged.append(await self._local.stage(key, parts))
            return
        await self.pinned.wait()
        try:
            await self._dst.create(key, parts[0] if len(parts) == 1 else b"".join(parts))
        except PreconditionFailed:
            # Another copy of a backup naming it landed meanwhile: the same immutable object.
            pass

    async def publish(self) -> None:
        """Every object created durable (a no-op for one-by-one creates). A key that appeared
        meanwhile is another copy's of the same immutable object, as for ``create``."""
        if self._local is not None and self._staged:
            await self.pinned.wait()
            staged, self._staged = self._staged, []
            await self._local.publish(staged)

    async def discard(self) -> None:
        """Remove what was staged and not published (a copy that failed)."""
        if self._local is not None and self._staged:
            staged, self._staged = self._staged, []
            await self._local.discard(staged)


async def _copy_object(
    src: ObjectStore,
    dst: ObjectStore,
    ref: SSTableRef,
    expected: str | None,
    sink: _Sink,
) -> str:
    """Copy one SSTable object into ``sink`` unless ``dst`` has it already; returns its
    checksum ("" when it was there already and none was recorded)."""
    there = await dst.head(ref.key)
    if there is not None and there.size == ref.size:
        # Seen before the manifest pinned it: garbage collection may have deleted it since;
        # once the manifest exists, what is there stays.
        await sink.pinned.wait()
        there = await dst.head(ref.key)
        if there is not None and there.size == ref.size:
            return expected or ""
    parts = await _fetch(src, ref)
    if parts is None:
        raise NotFound(
            f"the backup names {object_url(src.url, ref.key)}, which does not exist: the "
            "backup is damaged (nothing was restored or copied from it)"
        )
    size = sum(len(p) for p in parts)
    if size != ref.size:
        raise Corruption(
            f"{object_url(src.url, ref.key)} has {size} bytes, the backup recorded {ref.size}"
        )
    if there is not None:
        raise Corruption(
            f"{object_url(dst.url, ref.key)} exists with {there.size} bytes, not the "
            f"{ref.size} the backup records: not overwriting it"
        )
    # Hashed and written at once, in two threads (hashlib and file writes release the GIL);
    # what is written stays invisible unless the checksum matches (a staged object is
    # published only when the whole copy is checked; a direct create waits for the hash).
    hashing = asyncio.create_task(asyncio.to_thread(checksum, parts))
    if sink.stages:
        await asyncio.gather(hashing, sink.create(ref.key, parts))
        got = hashing.result()
    else:
        got = await hashing
    if expected is not None and got != expected:
        raise Corruption(f"{object_url(src.url, ref.key)} does not match its recorded checksum")
    if not sink.stages:
        await sink.create(ref.key, parts)
    return got


async def _fetch(src: ObjectStore, ref: SSTableRef) -> list[bytes] | None:
    """The object's bytes in parts: one GET, or for a large object ranged GETs of
    ``PART_BYTES`` in parallel (as S3's own clients split a download); None if it does not
    exist."""
    if ref.size <= PART_BYTES:
        data = await src.get(ref.key)
        return None if data is None else [data]
    offsets = range(0, ref.size, PART_BYTES)
    parts = await asyncio.gather(*(src.get_range(ref.key, o, PART_BYTES) for o in offsets))
    if any(p is None for p in parts):
        return None
    return [p for p in parts if p is not None]


async def delete_from_location(store: ObjectStore, backup_id: str) -> BackupManifest:
    """Delete a backup from a backup location (not a database's bucket, where GC frees
    objects): its manifest versions, then every SSTable it named that no other backup there
    names. If another manifest there cannot be read, no SSTable is deleted (what it names is
    unknown); they stay until the next delete."""
    manifest = await read_backup(store, backup_id)
    others = [m for m in await list_backups(store) if m.backup_id != backup_id]
    count = await _manifest_count(store)
    await delete_backup_versions(store, backup_id)
    if len(others) != count - 1:
        return manifest
    kept = {k for m in others for k in m.sstable_keys()}
    gone = [k for k in manifest.sstable_keys() if k not in kept]
    for i in range(0, len(gone), S3_BATCH):
        await store.delete_many(gone[i : i + S3_BATCH])
    return manifest


async def _manifest_count(store: ObjectStore) -> int:
    """How many backups have at least one manifest version in ``store``."""
    ids: set[str] = set()
    async for info in store.list(layout.BACKUPS):
        try:
            ids.add(layout.parse_backup_key(info.key).backup_id)
        except InvalidArgument:
            continue
    return len(ids)
