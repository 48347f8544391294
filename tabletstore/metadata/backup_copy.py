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
backup kept on a local disk) each object is read in ranged parts, many at once across the
copy (as S3's own clients split a download), and each part is written to the object's staged
file at its offset as it arrives and hashed in order; the file is synced when it is whole and
the objects are published together (storage_s3/local.py ``stage_open``/``publish``: linked,
then each directory synced once) instead of a file sync and a directory sync per object in
turn. A name still appears only for bytes already on disk, so a copy cut short by a crash
leaves no object that is not whole and no ``ready`` manifest; the staged files of a copy that
was killed are removed by the next copy into the same directories. Elsewhere each object is
read whole (or in ranged parts if large), checked, then created, durable when its create
returns.

Between two S3 buckets of one endpoint and identity (a backup to or a restore from another
bucket of the database's S3 server: storage_s3/s3.py ``copies_from``), each object is copied
server-side instead, with one CopyObject that returns the SHA-256 the server computed of what
it copied: no byte passes through this process, as with boto3's managed copy. The copy is
made only once the manifest pins it, and a checksum that differs from the recorded one fails
the copy and removes the object it made; a source without a recorded checksum (a backup's
first copy out of its database) is first checked to exist with the recorded size. Elsewhere
bytes go through this process (GET then create-only PUT). Either way the destination is looked
at first: an object already there is never overwritten. Those looks are listings of each
table's SSTable prefix over the span of the copy's keys (:func:`look_up`: one request per
table, not a HEAD per object), made while the creating manifest is written. Either way a
checksum is recorded for every object copied: a copy of a copy verifies them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, TypeVar

from tabletstore.errors import (
    Corruption,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
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
from tabletstore.storage_s3.base import (
    S3_BATCH,
    CopyingStore,
    ObjectInfo,
    ObjectStore,
    StagingStore,
    object_url,
)
from tabletstore.storage_s3.local import LocalObjectStore, Staged, Staging

__all__ = [
    "COPY_CONCURRENCY",
    "LISTED_OBJECTS",
    "LISTED_TABLES",
    "PART_BYTES",
    "STAGED_GETS",
    "STAGED_PART_BYTES",
    "checksum",
    "copy_backup",
    "delete_from_location",
    "look_up",
]

T = TypeVar("T")

#: Objects copied at once (each one GET and one PUT in flight).
COPY_CONCURRENCY = 16

#: Objects larger than this are read in ranges of this size, in parallel (AWS's guidance for
#: ranged GETs is 8-16 MB). Smaller parts only add requests, each with its fixed cost on both
#: sides: one GET of a few MB is not slower per byte than two of half the size, and a copy
#: keeps many objects in flight at once anyway.
PART_BYTES = 16 * 1024 * 1024

#: Into a local directory an object is read in parts of about this size (equal parts), each
#: written to its staged file as it arrives: more requests in flight than objects, and the
#: disk writes and the hashing overlap the transfer instead of following it.
STAGED_PART_BYTES = 4 * 1024 * 1024

#: Ranged GETs in flight at once in a copy into a local directory, over all its objects (and
#: the threads that write, hash and sync their parts).
STAGED_GETS = 16

#: The largest object copied server-side: S3's limit for one CopyObject (larger ones are read
#: and written).
SERVER_COPY_BYTES = 5 * 1024**3

#: :func:`look_up` lists the SSTable prefixes of at most this many tables (a backup names its
#: table's SSTables, and a clone's those of the tables it was cloned from), at most this many
#: objects each (one page of S3's), instead of a HEAD per SSTable; what lies beyond is looked
#: up by HEAD.
LISTED_TABLES = 8
LISTED_OBJECTS = 1000

#: Called with the bytes of each object copied (progress, benchmarks).
Progress = Callable[[int], None]

#: What a store holds of some keys, as :func:`look_up` found it (None: absent).
Known = dict[str, ObjectInfo | None]


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
    absent: bool = False,
    later: asyncio.TaskGroup | None = None,
) -> BackupManifest:
    """Copy backup ``backup_id`` from ``src`` to ``dst`` (as ``new_id``, default the same
    id) and return the destination's ready manifest. Only a ready, unexpired backup is
    copied; the copy keeps its expiry unless ``keep_expiry`` is False (then ``expires_at``).
    ``source``: its manifest in ``src``, when the caller has just read it (one LIST and one
    GET fewer). ``absent``: the caller has just read ``dst`` and found no backup of the
    target id there (one LIST fewer before the copy starts). ``later``: the creating version
    is deleted in this task group once the ready one is written, off the caller's path
    (metadata/backup.py ``write_next_version``)."""
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
    sink = _Sink(src, dst, pinned)

    async def pin() -> None:
        await write_backup(dst, first, listed=absent)
        pinned.set()

    # What ``dst`` holds of them already, and (for a server-side copy without a recorded
    # checksum, whose source is checked before it is copied) what ``src`` holds: one listing
    # per table prefix each, instead of a HEAD per object (:func:`look_up`).
    unsummed = [k for k in refs if sink.copying is not None and k not in source.checksums]

    async def look() -> tuple[Known, Known]:
        return await asyncio.gather(look_up(dst, refs), look_up(src, unsummed))

    async def one(ref: SSTableRef, known: asyncio.Task[tuple[Known, Known]]) -> None:
        async with gate:
            in_dst, in_src = await known
            expected = source.checksums.get(ref.key)
            sums[ref.key] = await _copy_object(src, dst, ref, expected, sink, in_dst, in_src)
            if progress is not None:
                progress(ref.size)

    # The objects are fetched while the creating manifest is written; none is created in
    # ``dst`` before it (it pins them there). A manifest that cannot be written (the id is
    # taken) cancels the fetches.
    try:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(pin())
                tg.create_task(sink.sweep(refs))
                known = tg.create_task(look())
                for ref in refs.values():
                    tg.create_task(one(ref, known))
        except* TabletStoreError as group:
            raise _first(group) from None  # the first failure, named, as one error
        await sink.publish()
    finally:
        await sink.discard()
    done = first.changed(state=BackupState.READY, checksums={k: v for k, v in sums.items() if v})
    # The creating version is the only one before it: another writer's would have collided.
    return await write_next_version(dst, done, only=first, later=later)


class _Sink:
    """Where a copy creates its objects: staged in a local directory and published together
    once every one is there (module docstring), copied server-side from ``src``, or created
    one by one, each durable when its create returns. Either way none is visible in ``dst``
    before ``pinned`` is set (the destination's manifest exists)."""

    def __init__(self, src: ObjectStore, dst: ObjectStore, pinned: asyncio.Event) -> None:
        # Staged through ``dst`` itself: its wrappers count and inject faults as for creates.
        local = find_layer(dst, LocalObjectStore) is not None
        self._local = dst if local and isinstance(dst, StagingStore) else None
        #: ``dst`` when it copies objects of ``src`` server-side (through its wrappers too).
        self.copying = dst if isinstance(dst, CopyingStore) and dst.copies_from(src) else None
        self._dst = dst
        self.pinned = pinned
        self._staged: list[Staged] = []
        #: Ranged GETs in flight (staged copies).
        self.gets = asyncio.Semaphore(STAGED_GETS)
        #: The staged copy's own threads for file writes, hashing and syncs: a sync that
        #: takes a while must not hold back another object's parts, as it would in the
        #: event loop's small default pool.
        self._pool: ThreadPoolExecutor | None = None

    @property
    def stages(self) -> bool:
        """Whether objects are staged (invisible until :meth:`publish`)."""
        return self._local is not None

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)`` in one of the copy's threads."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(STAGED_GETS, thread_name_prefix="backup-copy")
        return self._pool.submit(fn, *args)

    async def disk(self, key: str, work: Awaitable[T]) -> T:
        """``work`` (a file write or sync of ``key``'s staged file), an OSError named."""
        try:
            return await work
        except OSError as exc:
            raise Unavailable(
                f"cannot write {object_url(self._dst.url, key)}: {exc.strerror or exc}"
            ) from exc

    async def sweep(self, refs: dict[str, SSTableRef]) -> None:
        """Remove the staged files a killed copy left in the directories this one writes."""
        if self._local is not None:
            await self._local.sweep_staged(refs)

    async def open(self, key: str) -> Staging:
        """A staged file for ``key`` (invisible: listings skip it, so there is no need to
        wait for the manifest until :meth:`publish`, which runs after it is written)."""
        assert self._local is not None
        return await _settled(self._local.stage_open(key), self._abort)

    async def close(self, staging: Staging) -> None:
        """``staging`` whole: synced, and published with the others."""
        close = asyncio.wrap_future(self.submit(staging.close))
        self._staged.append(await _settled(self.disk(staging.key, close), self._drop))

    async def _abort(self, staging: Staging) -> None:
        await asyncio.to_thread(staging.abort)

    async def _drop(self, staged: Staged) -> None:
        assert self._local is not None
        await self._local.discard([staged])

    async def create(self, key: str, parts: Sequence[bytes]) -> None:
        """Create ``key`` in ``dst`` once the manifest pins it (not staged)."""
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
            # Kept until published: a publish that fails before it starts (a fault injected
            # by a wrapper) leaves them to :meth:`discard`.
            await self._local.publish(self._staged)
            self._staged = []

    async def discard(self) -> None:
        """Remove what was staged and not published (a copy that failed), and the threads."""
        if self._local is not None and self._staged:
            staged, self._staged = self._staged, []
            await self._local.discard(staged)
        if self._pool is not None:
            self._pool.shutdown(wait=False)


async def _copy_object(
    src: ObjectStore,
    dst: ObjectStore,
    ref: SSTableRef,
    expected: str | None,
    sink: _Sink,
    in_dst: Known,
    in_src: Known,
) -> str:
    """Copy one SSTable object into ``sink`` unless ``dst`` has it already; returns its
    checksum ("" when it was there already and none was recorded). ``in_dst``/``in_src``:
    what listings found of the copy's objects (:func:`look_up`); others are looked up here."""
    copying = sink.copying if ref.size <= SERVER_COPY_BYTES else None
    origin: ObjectInfo | None = None
    if copying is not None and expected is None:
        there, origin = await asyncio.gather(
            _found(dst, ref.key, in_dst), _found(src, ref.key, in_src)
        )
    else:
        # With a recorded checksum a server-side copy needs no look at its source first:
        # the copy fails NotFound without one, and the SHA-256 the server returns settles
        # its size and bytes (a copy that differs is deleted).
        there = await _found(dst, ref.key, in_dst)
    if there is not None and there.size == ref.size:
        # Seen before the manifest pinned it: garbage collection may have deleted it since;
        # once the manifest exists, what is there stays.
        await sink.pinned.wait()
        there = await dst.head(ref.key)
        if there is not None and there.size == ref.size:
            return expected or ""
    if there is not None:
        raise Corruption(
            f"{object_url(dst.url, ref.key)} exists with {there.size} bytes, not the "
            f"{ref.size} the backup records: not overwriting it"
        )
    if copying is not None:
        return await _server_copy(src, copying, ref, expected, sink, origin)
    if sink.stages:
        # What is staged stays invisible unless the checksum matches: it is published only
        # when the whole copy is checked.
        got = await _stream(src, ref, sink)
        _check_sum(src, ref, expected, got)
        return got
    parts = await _fetch(src, ref)
    if parts is None:
        raise _missing(src, ref)
    size = sum(len(p) for p in parts)
    if size != ref.size:
        raise _wrong_size(src, ref, size)
    got = await asyncio.to_thread(checksum, parts)  # off the event loop
    _check_sum(src, ref, expected, got)
    await sink.create(ref.key, parts)
    return got


async def _server_copy(
    src: ObjectStore,
    dst: CopyingStore,
    ref: SSTableRef,
    expected: str | None,
    sink: _Sink,
    origin: ObjectInfo | None,
) -> str:
    """Copy ``ref`` from ``src`` to ``dst`` server-side (module docstring), ``origin`` being
    what a HEAD of it in ``src`` returned (when no checksum is ``expected``: its size is then
    all there is to check it against, before the copy); returns its checksum."""
    if expected is None:
        if origin is None:
            raise _missing(src, ref)
        if origin.size != ref.size:
            raise _wrong_size(src, ref, origin.size)
    await sink.pinned.wait()
    try:
        got = await dst.copy_from(src, ref.key)
    except NotFound:
        raise _missing(src, ref) from None
    if got is None:  # The server computed none: the copy is read back and hashed here.
        parts = await _fetch(dst, ref)
        if parts is None:
            raise _missing(dst, ref)
        got = await asyncio.to_thread(checksum, parts)
    if expected is not None and got != expected:
        # Not left for a later copy to take as the object (it would match by size alone).
        with contextlib.suppress(TabletStoreError):
            await dst.delete(ref.key)
    _check_sum(src, ref, expected, got)
    return got


async def _found(store: ObjectStore, key: str, known: Known) -> ObjectInfo | None:
    """What a listing found of ``key`` in ``store`` (:func:`look_up`), else what a HEAD does."""
    if key in known:
        return known[key]
    return await store.head(key)


def _check_sum(src: ObjectStore, ref: SSTableRef, expected: str | None, got: str) -> None:
    if expected is not None and got != expected:
        raise Corruption(f"{object_url(src.url, ref.key)} does not match its recorded checksum")


def _missing(src: ObjectStore, ref: SSTableRef) -> NotFound:
    return NotFound(
        f"the backup names {object_url(src.url, ref.key)}, which does not exist: the "
        "backup is damaged (nothing was restored or copied from it)"
    )


def _wrong_size(src: ObjectStore, ref: SSTableRef, size: int | str) -> Corruption:
    """``size``: the object's size, or how it compares (``more than N``)."""
    return Corruption(
        f"{object_url(src.url, ref.key)} has {size} bytes, the backup recorded {ref.size}"
    )


def _spans(size: int, part: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the equal parts of about ``part`` bytes an object of ``size``
    bytes is read in (one empty part for an empty object)."""
    count = max(1, -(-size // part))
    step = max(1, -(-size // count))
    return [(o, min(step, size - o)) for o in range(0, size, step)] or [(0, 0)]


async def _stream(src: ObjectStore, ref: SSTableRef, sink: _Sink) -> str:
    """Read ``ref`` from ``src`` into a staged file of ``sink`` in ranged parts, each written
    at its offset as it arrives and hashed in order; stage it once whole. Returns its
    checksum; the staged file is removed if anything fails."""
    spans = _spans(ref.size, STAGED_PART_BYTES)
    digest = hashlib.sha256()
    arrived: dict[int, bytes] = {}
    hashed = 0
    turn = asyncio.Lock()
    staging = await sink.open(ref.key)
    writes: list[Future[None]] = []

    async def part(offset: int, length: int, last: bool) -> None:
        nonlocal hashed
        try:
            # The last part asks for a byte more: an object longer than recorded returns it.
            data = await src.get_range(ref.key, offset, length + 1 if last else length)
            if data is None:
                raise _missing(src, ref)
            if len(data) != length:
                more = "more" if len(data) > length else "fewer"
                raise _wrong_size(src, ref, f"{more} than {ref.size}")
            write = sink.submit(staging.write_at, offset, data)
            writes.append(write)
            await sink.disk(ref.key, asyncio.wrap_future(write))
            arrived[offset] = data
            async with turn:  # in order: whichever part completes a run hashes it
                run = []
                while hashed in arrived:
                    chunk = arrived.pop(hashed)
                    run.append(chunk)
                    hashed += len(chunk)
                    if not chunk:  # the one part of an empty object
                        break
                if run:
                    await asyncio.wrap_future(sink.submit(_update, digest, run))
        finally:
            sink.gets.release()

    try:
        try:
            async with asyncio.TaskGroup() as tg:
                for i, (offset, length) in enumerate(spans):
                    await sink.gets.acquire()
                    try:
                        tg.create_task(part(offset, length, i == len(spans) - 1))
                    except BaseException:
                        sink.gets.release()
                        raise
        except* TabletStoreError as group:
            raise _first(group) from None
    except BaseException:
        # A write still running in a thread must end before its file is closed and removed
        # (a closed descriptor's number is reused).
        for write in writes:
            write.cancel()
        await asyncio.shield(asyncio.to_thread(_abort, writes, staging))
        raise
    await sink.close(staging)
    return "sha256:" + digest.hexdigest()


def _abort(writes: list[Future[None]], staging: Staging) -> None:
    wait(writes)
    staging.abort()


def _first(group: BaseExceptionGroup[TabletStoreError]) -> TabletStoreError:
    """The first error of a (nested) group: a copy fails with one error, named."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, TabletStoreError)
    return first


async def _settled(work: Awaitable[T], undo: Callable[[T], Awaitable[None]]) -> T:
    """``work``'s result. If the caller is cancelled meanwhile, ``work`` (a file created or
    synced in a thread, which goes on regardless) is still awaited to its end and its result
    undone, so a failed copy leaves no staged file behind."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await undo(await task)
        raise


def _update(digest: Any, chunks: list[bytes]) -> None:
    for chunk in chunks:
        digest.update(chunk)


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


async def look_up(store: ObjectStore, keys: Iterable[str]) -> Known:
    """What ``store`` holds of the SSTables ``keys``, from listings instead of a HEAD each:
    one LIST per table prefix (of at most :data:`LISTED_TABLES` tables), from just before
    its first key to its last, stopped after :data:`LISTED_OBJECTS` objects. A key in the
    span listed is there (its size) or absent (None); a key past where a listing stopped, or
    of a table not listed, is left out (the caller looks it up by HEAD). S3's listings are
    strongly consistent, so absent from one is as good as a HEAD's 404."""
    tables: dict[str, list[str]] = {}
    for k in keys:
        try:
            table_id = layout.parse_sstable_key(k).table_id
        except InvalidArgument:
            continue  # not an SSTable key: no listing for it (none is named by a manifest)
        tables.setdefault(table_id, []).append(k)
    found: dict[str, ObjectInfo | None] = {}

    async def one(table_id: str, wanted: list[str]) -> None:
        wanted.sort()
        seen: dict[str, ObjectInfo] = {}
        covered = wanted[-1]  # listed up to here
        # A key's own prefix sorts just before it: the listing starts at the first key.
        async for info in store.list(layout.tables_prefix(table_id), start_after=wanted[0][:-1]):
            if info.key > wanted[-1]:
                break
            seen[info.key] = info
            if len(seen) >= LISTED_OBJECTS:
                covered = info.key
                break
        for k in wanted:
            if k in seen or k <= covered:
                found[k] = seen.get(k)

    picked = sorted(tables.items(), key=lambda item: -len(item[1]))[:LISTED_TABLES]
    await asyncio.gather(*(one(table_id, wanted) for table_id, wanted in picked))
    return found


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
