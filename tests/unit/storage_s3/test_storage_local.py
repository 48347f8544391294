"""LocalObjectStore specifics: crash safety of create, key limits, URL parsing, pruning."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from tabletstore.errors import InvalidArgument, PreconditionFailed
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.local import (
    INLINE_READ_LIMIT,
    SMALL_CREATE_LIMIT,
    TEMP_PREFIX,
    LocalObjectStore,
    path_from_url,
)
from tabletstore.storage_s3.retrying import RetryingObjectStore
from tabletstore.testing.store_conformance import collect


async def test_objects_are_plain_files_under_the_root(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.create("tables/t/x.parquet", b"data")
    assert (tmp_path / "tables" / "t" / "x.parquet").read_bytes() == b"data"
    assert not [p for p in (tmp_path / "tables" / "t").iterdir() if p.name.startswith(TEMP_PREFIX)]


async def test_a_crashed_create_leaves_nothing_visible(tmp_path: Path) -> None:
    """A crash before the link leaves only a temp file: never listed, never readable."""
    store = LocalObjectStore(tmp_path)
    await store.create("logs/1.log", b"whole")
    (tmp_path / "logs" / f"{TEMP_PREFIX}abc").write_bytes(b"half-writ")
    (tmp_path / f"{TEMP_PREFIX}dir").mkdir()
    (tmp_path / f"{TEMP_PREFIX}dir" / "x").write_bytes(b"")
    assert [info.key for info in await collect(store, "")] == ["logs/1.log"]
    with pytest.raises(InvalidArgument):
        await store.get(f"logs/{TEMP_PREFIX}abc")


async def test_failed_create_cleans_up_its_temp_file(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.create("k", b"first")
    with pytest.raises(PreconditionFailed):
        await store.create("k", b"second")
    assert sorted(os.listdir(tmp_path)) == ["k"]
    assert await store.get("k") == b"first"


async def test_a_create_names_its_bytes_only_once_they_are_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create writes an unnamed file: no temporary name ever appears in the directory, the
    object's name is absent while its bytes are synced, and the directory is synced once the
    name is there."""
    from tabletstore.storage_s3 import local

    store = LocalObjectStore(tmp_path)
    await store.create("logs/w/0.log", b"first")  # the directory exists: the usual case
    seen: list[tuple[str, list[str]]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), sorted(os.listdir(tmp_path / "logs/w"))))
        real_fsync(fd)

    monkeypatch.setattr(local.os, "fsync", fsync)
    await store.create("logs/w/1.log", b"second")
    assert await store.get("logs/w/1.log") == b"second"
    directory = str(tmp_path / "logs/w")
    assert [names for _, names in seen] == [["0.log"], ["0.log", "1.log"]]
    assert seen[0][0].endswith("(deleted)") and seen[1][0] == directory


async def test_a_create_falls_back_to_a_named_temp_file_without_unnamed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the filesystem refuses ``O_TMPFILE``, creates use a named temporary file (and
    stop trying the unnamed one), with the same results."""
    from tabletstore.storage_s3 import local

    real_open = os.open
    refused: list[int] = []

    def no_tmpfile(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if local._O_TMPFILE and flags & local._O_TMPFILE == local._O_TMPFILE:
            refused.append(flags)
            raise OSError(errno.EOPNOTSUPP, "not supported")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(local.os, "open", no_tmpfile)
    store = LocalObjectStore(tmp_path)
    await store.create("a/b/k", b"one")
    await store.create("a/b/j", b"two")
    with pytest.raises(PreconditionFailed):
        await store.create("a/b/k", b"again")
    assert [await store.get(k) for k in ("a/b/k", "a/b/j")] == [b"one", b"two"]
    assert sorted(os.listdir(tmp_path / "a/b")) == ["j", "k"]
    assert len(refused) == (1 if local._O_TMPFILE else 0)


async def test_ranged_reads_keep_the_file_open_and_see_deletes_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeated ranged reads of a key open its file once; a delete by another store (another
    process) makes the key read as missing, and a key created anew reads its new bytes."""
    from tabletstore.storage_s3 import local

    reader, other = LocalObjectStore(tmp_path), LocalObjectStore(tmp_path)
    await other.create("t/s.sst", b"0123456789")
    real_open = os.open
    opened: list[str] = []

    def counting_open(path: str, flags: int, *args: object, **kwargs: object) -> int:
        opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(local.os, "open", counting_open)
    assert [await reader.get_range("t/s.sst", i, 2) for i in (0, 4, 8)] == [b"01", b"45", b"89"]
    assert opened == [str(tmp_path / "t/s.sst")]
    await other.delete("t/s.sst")
    assert await reader.get_range("t/s.sst", 0, 2) is None
    await other.create("t/s.sst", b"abcdefghij")
    assert await reader.get_range("t/s.sst", 2, 3) == b"cde"
    await reader.delete("t/s.sst")
    assert await reader.get_range("t/s.sst", 0, 1) is None
    assert await reader.get_range("t", 0, 1) is None  # a prefix directory, not an object
    await other.create("t/u", b"u")
    assert await reader.get_range("t", 0, 1) is None


def _uncache(path: Path) -> None:
    """Drop a file's (clean, synced) pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def test_a_small_create_does_not_wait_for_the_default_executors_threads(
    tmp_path: Path,
) -> None:
    """A commit-log segment's create must not queue behind the default executor's work
    (minor compactions' encoding, SSTables' fsyncs): with every one of its threads held, a
    small create still completes; a large one runs there, once a thread is free."""
    import concurrent.futures
    import threading

    loop = asyncio.get_running_loop()
    busy = concurrent.futures.ThreadPoolExecutor(1)
    loop.set_default_executor(busy)
    release = threading.Event()
    held = loop.run_in_executor(None, release.wait)
    store = LocalObjectStore(tmp_path)
    try:
        small = b"s" * SMALL_CREATE_LIMIT
        await asyncio.wait_for(store.create("logs/w/1/00000001.log", small), timeout=30)
        large = asyncio.ensure_future(store.create("tables/t/x.parquet", small + b"!"))
        await asyncio.sleep(0)
        assert not large.done()
    finally:
        release.set()
        await held
    await large
    assert (tmp_path / "logs" / "w" / "1" / "00000001.log").read_bytes() == small
    assert (tmp_path / "tables" / "t" / "x.parquet").stat().st_size == SMALL_CREATE_LIMIT + 1
    await store.close()


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="non-blocking reads are Linux's")
async def test_a_read_that_would_wait_for_the_disk_runs_on_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads from the page cache stay on the event loop; one that would wait for the disk
    goes to a thread (inline, a busy disk held a worker's loop for hundreds of ms)."""
    from tabletstore.storage_s3 import local

    threaded: list[object] = []
    real = asyncio.to_thread

    async def to_thread(fn: Any, *args: Any) -> Any:
        threaded.append(fn)
        return await real(fn, *args)

    monkeypatch.setattr(local.asyncio, "to_thread", to_thread)
    store = LocalObjectStore(tmp_path)
    data = os.urandom(256 * 1024)
    await store.create("tables/t/x.parquet", data)
    _uncache(tmp_path / "tables" / "t" / "x.parquet")
    threaded.clear()  # the create's
    assert await store.get_range("tables/t/x.parquet", 100_000, 8192) == data[100_000:108_192]
    assert threaded == [] and store._readers is not None  # on the store's read threads
    # Now cached: inline.
    reads = store._readers
    store._readers = None
    assert await store.get_range("tables/t/x.parquet", 100_000, 8192) == data[100_000:108_192]
    assert store._readers is None
    store._readers = reads
    # Ends and lengths as before: the bytes there are, b"" past the end.
    size = len(data)
    assert await store.get_range("tables/t/x.parquet", size - 10, 10) == data[-10:]
    _uncache(tmp_path / "tables" / "t" / "x.parquet")
    assert await store.get_range("tables/t/x.parquet", 0, size) == data
    assert await store.get_range("tables/t/x.parquet", 4096, size - 4096) == data[4096:]


async def test_without_non_blocking_reads_small_reads_stay_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tabletstore.storage_s3 import local

    store = LocalObjectStore(tmp_path)
    data = os.urandom(64 * 1024)
    await store.create("k", data)
    real_preadv = os.preadv

    def unsupported(*args: Any) -> int:
        raise OSError(errno.EOPNOTSUPP, "not on this file system")

    threaded: list[object] = []

    async def to_thread(fn: Any, *args: Any) -> Any:
        threaded.append(fn)
        return fn(*args)

    monkeypatch.setattr(local.asyncio, "to_thread", to_thread)
    monkeypatch.setattr(local, "_NOWAIT", getattr(os, "RWF_NOWAIT", 8))
    monkeypatch.setattr(local.os, "preadv", unsupported)  # an old kernel
    assert await store.get_range("k", 10, 1000) == data[10:1010]
    monkeypatch.setattr(local, "_NOWAIT", 0)  # a platform without the flag
    monkeypatch.setattr(local.os, "preadv", real_preadv)
    assert await store.get_range("k", 0, 5) == data[:5]
    assert await store.get_range("k", 0, 0) == b""
    assert threaded == []


@pytest.mark.parametrize("key", ["a//b", "/a", "a/", "a/./b", "a/../b", "..", "a\x00b", "x" * 256])
async def test_keys_a_filesystem_cannot_hold_are_invalid(tmp_path: Path, key: str) -> None:
    store = LocalObjectStore(tmp_path / "root")
    with pytest.raises(InvalidArgument):
        await store.create(key, b"x")
    with pytest.raises(InvalidArgument):
        await store.get(key)
    assert not (tmp_path / "b").exists()


async def test_listing_never_leaves_the_root(tmp_path: Path) -> None:
    (tmp_path / "outside").write_bytes(b"secret")
    store = LocalObjectStore(tmp_path / "root")
    await store.create("in", b"x")
    assert await collect(store, "../") == []
    assert await collect(store, "a//") == []
    assert [i.key for i in await collect(store, "")] == ["in"]


async def test_deletes_prune_empty_directories(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.create("a/b/c/one", b"1")
    await store.create("a/two", b"2")
    await store.delete("a/b/c/one")
    assert not (tmp_path / "a" / "b").exists()
    assert (tmp_path / "a" / "two").exists()
    await store.delete_many(["a/two"])
    assert os.listdir(tmp_path) == []
    await store.create("a/b/c/one", b"again")  # Directories come back on demand.
    assert await store.get("a/b/c/one") == b"again"


async def test_large_objects_round_trip(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    data = os.urandom(INLINE_READ_LIMIT + 12345)
    await store.create("big", data)
    assert await store.get("big") == data
    assert (
        await store.get_range("big", 1000, INLINE_READ_LIMIT + 1)
        == data[1000 : INLINE_READ_LIMIT + 1001]
    )


async def test_a_prefix_directory_is_not_an_object(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.create("dir/obj", b"x")
    assert await store.get("dir") is None
    assert await store.get_range("dir", 0, 1) is None
    assert await store.head("dir") is None
    await store.delete("dir")
    assert await store.get("dir/obj") == b"x"


def test_file_urls(tmp_path: Path) -> None:
    assert path_from_url("file:///var/lib/db") == Path("/var/lib/db")
    assert path_from_url("file://localhost/var/my%20db") == Path("/var/my db")
    for bad in ["file://host/x", "file:relative", "file:///x?y=1", "s3://b/x"]:
        with pytest.raises(InvalidArgument, match="file"):
            path_from_url(bad)


async def test_open_store_file_url_and_check(tmp_path: Path) -> None:
    url = (tmp_path / "new" / "db").as_uri()
    store = open_store(url)
    assert isinstance(store, RetryingObjectStore)
    assert store.url == url
    await store.check()
    assert (tmp_path / "new" / "db").is_dir()
    await store.close()


def test_root_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(InvalidArgument, match="not a directory"):
        LocalObjectStore(tmp_path / "file")


async def test_staged_objects_appear_only_when_published_each_synced_before_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stage`` writes and syncs invisible temporary files (no directory sync); ``publish``
    links them (every file synced before any name appears), then syncs each directory that
    gained an entry once (not once per object); a key that exists keeps its object and is
    reported; the temporary files are gone afterwards, and ``discard`` removes unpublished
    ones."""
    from tabletstore.storage_s3 import local

    store = LocalObjectStore(tmp_path)
    await store.create("tables/t/old.parquet", b"first")
    events: list[tuple[str, str]] = []
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def link(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(("link", str(src)))
        real_link(src, dst)

    monkeypatch.setattr(local.os, "fsync", fsync)
    monkeypatch.setattr(local.os, "link", link)
    keys = [f"tables/t/a{i}/g/{i}.parquet" for i in range(3)] + ["tables/t/old.parquet"]
    staged = [await store.stage(k, [b"part ", str(i).encode()]) for i, k in enumerate(keys)]
    # Staging syncs each file's bytes, and no directory.
    assert sorted(p for _, p in events) == sorted(str(s.tmp) for s in staged)
    assert [i.key for i in await collect(store, "tables/")] == ["tables/t/old.parquet"]
    existed = await store.publish(staged)
    assert existed == ["tables/t/old.parquet"]
    assert await store.get("tables/t/old.parquet") == b"first"
    assert [await store.get(k) for k in keys[:3]] == [f"part {i}".encode() for i in range(3)]
    first_link = next(i for i, e in enumerate(events) if e[0] == "link")
    synced_files = {p for kind, p in events[:first_link] if kind == "fsync"}
    assert {str(s.tmp) for s in staged} <= synced_files  # every file synced before any name
    after = [p for kind, p in events[first_link:] if kind == "fsync"]
    assert sorted(after) == sorted(set(after))  # each directory once
    dirs = {str(tmp_path / "tables/t"), *(str(tmp_path / f"tables/t/a{i}/g") for i in range(3))}
    assert dirs <= set(after)
    assert not await asyncio.to_thread(lambda: list(tmp_path.rglob(f"{TEMP_PREFIX}*")))
    dropped = await store.stage("tables/t/x/y.parquet", [b"never"])
    await store.discard([dropped])
    assert not dropped.tmp.exists()
    assert await store.head("tables/t/x/y.parquet") is None
