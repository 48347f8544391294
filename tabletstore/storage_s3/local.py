"""A local directory as an ObjectStore (``file:///path``): the embedded default's GFS (§4).

Each key is a file under the root directory, its ``/``-separated parts being directories.

Durability and atomicity of ``create``: the bytes are written to an unnamed file
(``O_TMPFILE``) in the object's own directory and fsynced, then linked to the final name
(``linkat`` of ``/proc/self/fd/N``), and the directory is fsynced. ``link`` never replaces an
existing name, so it is the create-only condition (``FileExistsError`` -> PreconditionFailed),
and a crash at any point leaves either no object or the whole object, never a half-written
one; an unnamed file a crash interrupts is freed by the filesystem, so nothing is left behind.
Where the kernel or filesystem has no ``O_TMPFILE`` (or ``/proc`` is not mounted), the file is
a named temporary file instead, linked the same way and then unlinked. The unnamed file spares
a create the temporary name's directory entry and its removal: about a sixth of the kernel
CPU of a create (the commit log makes one per group commit). Temporary files carry a reserved
name prefix (:data:`TEMP_PREFIX`) that listings skip; keys may not use it.

Staged creates (:meth:`LocalObjectStore.stage_open`, :meth:`LocalObjectStore.publish`): a
copy of many objects (a backup brought in for a restore, metadata/backup_copy.py) writes each
one to its temporary file as its parts arrive, at their offsets, in any order (invisible; the
disk writes overlap the rest of the copy), fsyncs it when it is whole
(:meth:`LocalObjectStore.stage_close`), then publishes them all at once: each linked to its
name, then every directory that gained an entry (the objects' own, and the parents of
directories made for them) fsynced once, in parallel. The guarantee per object is
``create``'s (a name only ever appears for bytes already on disk); what is saved is a
directory sync per object and per new directory, each in turn. When ``publish`` returns every
object is durable; a crash before that leaves none of them, or some, each whole. The wrappers
over this store forward staged creates (base.py ``StagingStore``): a publish counts as a PUT
per object, and faults injected into PUTs apply to it.

A staged temporary file's name carries its process id
(``.tabletstore-tmp-stage-<pid>-<random>``): a copy killed before it published or discarded
them leaves them behind, and :meth:`LocalObjectStore.sweep_staged` (which the next copy into
those directories calls) removes those whose process no longer runs. A local store is one
host's directory, so a pid names a process of this host.

Limits that S3 does not have (the key layout, ``layout.py``, never hits them): a key part may
not be empty, ``.`` or ``..``, longer than 255 bytes in UTF-8, or start with
:data:`TEMP_PREFIX`; and a key cannot be both an object and a prefix directory of another key
(``a`` and ``a/b``). Each is reported as InvalidArgument naming the key.

Threading: a ranged read of up to :data:`INLINE_READ_LIMIT` bytes whose bytes are all in the
page cache runs on the event loop; one that would wait for the disk (``preadv`` with
``RWF_NOWAIT`` says so without waiting) runs on one of the store's own read threads (not
behind the creates' fsyncs); a create of at most :data:`SMALL_CREATE_LIMIT` bytes (a
commit-log segment: a group commit lingers for at most 512 KiB) runs on the store's own create
threads; larger reads and creates, and every listing and delete, run in the default executor's
threads. Measured on the build machine: a 100-byte or 64 KiB read takes
10-13 µs inline but 150-170 µs through ``asyncio.to_thread``; a 4 MiB read 300 µs inline vs
520 µs threaded; a create with fsync about 400 µs (milliseconds on a real disk). So cached
reads are cheaper inline than the thread hand-off, while reads from the disk and fsyncs would
stall every other request on the loop: in a soak whose compactions kept the disk busy, single
reads inline held a worker's loop for up to 426 ms. Where ``RWF_NOWAIT`` is missing (not
Linux, or a file system without it) every small read runs inline, as before. Small creates
have their own threads for the same reason: the default executor's threads also encode minor
compactions (about a second each) and create SSTables (fsyncs of MBs), and in a round of
splits the commit log's segments queued behind them for up to 2.5 s, holding every write
acknowledged in them.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import stat
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tabletstore.errors import Closed, InvalidArgument, PreconditionFailed, Unavailable
from tabletstore.pid_liveness import alive
from tabletstore.storage_s3.base import ObjectInfo, check_key, check_range, object_url

__all__ = [
    "INLINE_READ_LIMIT",
    "SMALL_CREATE_LIMIT",
    "STAGE_PREFIX",
    "TEMP_PREFIX",
    "LocalObjectStore",
    "Staged",
    "Staging",
    "path_from_url",
]

#: Reads at most this large are served on the event loop (see the module docstring).
INLINE_READ_LIMIT = 1 << 20
#: Creates at most this large run on the store's own threads (see the module docstring).
SMALL_CREATE_LIMIT = 1 << 20
#: Keys whose checked file path a store remembers for ranged reads.
_FILE_CACHE = 4096
#: Files a store keeps open for ranged reads (a tablet server's SSTables being read).
_OPEN_FILES = 128
#: Name prefix of in-flight temporary files; never a key part.
TEMP_PREFIX = ".tabletstore-tmp-"
#: Name prefix of a staged object's temporary file: ``<this><pid>-<random>``.
STAGE_PREFIX = f"{TEMP_PREFIX}stage-"
_MAX_PART_BYTES = 255
#: A delete may remove a directory between create's mkdir and its temp-file open; retry that.
_CREATE_TRIES = 5
#: Directories :meth:`LocalObjectStore.publish` fsyncs at once.
_SYNC_THREADS = 16

#: ``os.O_TMPFILE`` where the platform has it (Linux), else 0: creates use named temp files.
_O_TMPFILE: int = getattr(os, "O_TMPFILE", 0)
#: Errors of an ``O_TMPFILE`` open on a filesystem or kernel without unnamed files.
_NO_TMPFILE_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})


class _NoUnnamedFiles(Exception):
    """This store's filesystem (or a missing ``/proc``) cannot link an unnamed file."""


# Aliases: inside the store class, ``list`` names its method, not the builtin.
_Infos = list[ObjectInfo]
_KeyPaths = list[tuple[str, Path]]


def path_from_url(url: str) -> Path:
    """The directory of a ``file:///abs/path`` URL; InvalidArgument naming the URL otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "file":
        raise InvalidArgument(f"not a file:// URL: {url!r}")
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise InvalidArgument(
            f"file URL {url!r} must look like file:///absolute/path (no host, query or fragment)"
        )
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise InvalidArgument(f"file URL {url!r} must name an absolute path")
    return Path(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, chunks: Sequence[bytes]) -> None:
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]


@dataclass(frozen=True, slots=True)
class Staging:
    """An object being written to its temporary file (:meth:`LocalObjectStore.stage_open`):
    parts are written at their offsets with :meth:`write_at`, then :meth:`close` syncs it or
    :meth:`abort` removes it (each blocking: call them in a thread)."""

    key: str
    path: Path
    tmp: Path
    fd: int
    new_dirs: tuple[Path, ...]

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` of the temporary file (blocking)."""
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, offset)
            view = view[written:]
            offset += written

    def close(self) -> Staged:
        """Fsync and close the file (blocking): the object is staged, ready for
        :meth:`LocalObjectStore.publish` and still invisible. A failure removes the file."""
        try:
            size = os.fstat(self.fd).st_size
            _sync_close(self.fd)
        except BaseException:
            _unlink_all([self.tmp])
            raise
        return Staged(key=self.key, path=self.path, tmp=self.tmp, new_dirs=self.new_dirs, size=size)

    def abort(self) -> None:
        """Close and remove the file (blocking)."""
        _close_unlink(self.fd, self.tmp)


@dataclass(frozen=True, slots=True)
class Staged:
    """An object written to a temporary file beside its name by :meth:`LocalObjectStore.stage`:
    neither durable nor visible until :meth:`LocalObjectStore.publish`."""

    key: str
    path: Path
    tmp: Path
    #: Directories made for it (each one's parent gains an entry to sync).
    new_dirs: tuple[Path, ...]
    #: Its bytes.
    size: int


class LocalObjectStore:
    """Objects as files under ``root``; see the module docstring for the guarantees."""

    def __init__(self, root: str | os.PathLike[str], *, url: str | None = None) -> None:
        self.root = Path(root).absolute()
        self.url = url if url is not None else self.root.as_uri()
        self._closed = False
        #: Checked keys -> file paths, for ranged reads (a point read's hot path).
        self._files: dict[str, str] = {}
        #: Keys -> their files kept open for ranged reads (:meth:`_opened`).
        self._open: dict[str, _OpenFile] = {}
        #: Whether creates may use unnamed files (cleared the first time they cannot).
        self._unnamed = True
        #: Threads of the small reads that must wait for the disk, made at the first: apart
        #: from the default executor's, where creates' fsyncs, whole-object reads and deletes
        #: would queue them behind seconds of compaction I/O.
        self._readers: ThreadPoolExecutor | None = None
        #: Threads of the small creates (commit-log segments), made at the first: apart from
        #: the default executor's, for the same reason.
        self._creators: ThreadPoolExecutor | None = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except FileExistsError as exc:
            raise InvalidArgument(f"{self.url} exists and is not a directory") from exc
        except PermissionError as exc:
            raise InvalidArgument(f"cannot create the store directory for {self.url}") from exc

    @classmethod
    def from_url(cls, url: str) -> LocalObjectStore:
        return cls(path_from_url(url), url=url)

    # Helpers --------------------------------------------------------------------------------

    def _live(self) -> None:
        if self._closed:
            raise Closed(f"object store {self.url} is closed")

    def _path(self, key: str) -> Path:
        """The file of ``key``; InvalidArgument for keys a filesystem cannot hold."""
        self._live()
        check_key(self.url, key)
        for part in key.split("/"):
            if part in ("", ".", "..") or "\0" in part or part.startswith(TEMP_PREFIX):
                raise InvalidArgument(
                    f"object key {key!r} has a part ({part!r}) a local store cannot hold "
                    f"({self.url})"
                )
            if len(part.encode("utf-8", "surrogatepass")) > _MAX_PART_BYTES:
                raise InvalidArgument(
                    f"object key {key!r} has a part longer than {_MAX_PART_BYTES} bytes "
                    f"({self.url})"
                )
        return self.root.joinpath(*key.split("/"))

    def _os_error(self, exc: OSError, key: str, what: str) -> Exception:
        """Map an unexpected OSError to a public error naming the object."""
        name = object_url(self.url, key)
        if exc.errno in (errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG):
            return InvalidArgument(
                f"cannot {what} {name}: a key cannot be both an object and a prefix of another "
                f"key on a local store ({exc.strerror})"
            )
        return Unavailable(f"cannot {what} {name}: {exc.strerror or exc}")

    # Reads ----------------------------------------------------------------------------------

    @staticmethod
    def _read(path: Path, offset: int, length: int | None) -> bytes | None:
        try:
            with open(path, "rb") as f:
                if offset:
                    f.seek(offset)
                return f.read() if length is None else f.read(length)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IsADirectoryError:
            # A prefix "directory" of other keys is not an object.
            return None

    async def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            size = os.stat(path).st_size
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._os_error(exc, key, "read") from exc
        return await self._read_sized(path, key, 0, None, size)

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        check_range(self.url, key, offset, length)
        if length <= INLINE_READ_LIMIT:
            # The point-read path: one pread on a file kept open, no file object or Path;
            # on the loop when the page cache holds it, else on a thread (module docstring).
            try:
                opened = self._opened(key)
                if opened is None:
                    return None
                cached = _read_cached(opened.fd, offset, length)
                if cached is not None:
                    return cached
                if self._readers is None:
                    self._readers = ThreadPoolExecutor(
                        _READ_THREADS, thread_name_prefix="tabletstore-read"
                    )
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._readers, _pread_all, opened, offset, length)
            except IsADirectoryError:
                self._open.pop(key, None)
                return None  # A prefix "directory" of other keys is not an object.
            except OSError as exc:
                raise self._os_error(exc, key, "read") from exc
        return await self._read_sized(self._path(key), key, offset, length, length)

    def _opened(self, key: str) -> _OpenFile | None:
        """``key``'s file, open for ranged reads, or None if there is no such object.

        The file stays open for the next ranged read of the key (a point read's open and close
        were a tenth of its CPU): objects are never rewritten in place, so an open file reads
        its object's bytes while the object exists, and one whose last name is gone (deleted,
        by this process or another: ``st_nlink`` 0) is opened again, so a key deleted and
        created anew reads its new bytes and a deleted key reads as missing. Files are closed
        when dropped from the bounded cache and no read holds them (:class:`_OpenFile`)."""
        self._live()
        opened = self._open.get(key)
        if opened is None or not os.fstat(opened.fd).st_nlink:
            opened = self._open_file(key)
        return opened

    def _open_file(self, key: str) -> _OpenFile | None:
        """``key``'s file opened and kept for ranged reads, or None if there is none."""
        try:
            opened = _OpenFile(os.open(self._file(key), os.O_RDONLY))
        except (FileNotFoundError, NotADirectoryError):
            self._open.pop(key, None)
            return None
        files = self._open
        if len(files) >= _OPEN_FILES:
            files.clear()
        files[key] = opened
        return opened

    def _file(self, key: str) -> str:
        """``str(self._path(key))``, remembered (bounded) for repeated reads of a key."""
        self._live()
        path = self._files.get(key)
        if path is None:
            path = str(self._path(key))
            if len(self._files) >= _FILE_CACHE:
                self._files.clear()
            self._files[key] = path
        return path

    async def _read_sized(
        self, path: Path, key: str, offset: int, length: int | None, expected: int
    ) -> bytes | None:
        try:
            if expected <= INLINE_READ_LIMIT:
                return self._read(path, offset, length)
            return await asyncio.to_thread(self._read, path, offset, length)
        except OSError as exc:
            raise self._os_error(exc, key, "read") from exc

    async def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._os_error(exc, key, "stat") from exc
        if not stat.S_ISREG(st.st_mode):  # A prefix directory of other keys.
            return None
        return ObjectInfo(key=key, size=st.st_size, last_modified=st.st_mtime)

    # Create ---------------------------------------------------------------------------------

    async def create(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            if len(data) > SMALL_CREATE_LIMIT:
                await asyncio.to_thread(self._create, path, bytes(data))
            else:
                if self._creators is None:
                    self._creators = ThreadPoolExecutor(
                        _CREATE_THREADS, thread_name_prefix="tabletstore-create"
                    )
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._creators, self._create, path, bytes(data))
        except FileExistsError as exc:
            if path.is_dir():
                raise InvalidArgument(
                    f"cannot create {object_url(self.url, key)}: it is a prefix of other keys, "
                    "and a local store cannot hold a key that is both"
                ) from exc
            raise PreconditionFailed(f"object {object_url(self.url, key)} already exists") from exc
        except OSError as exc:
            raise self._os_error(exc, key, "create") from exc

    @staticmethod
    def _make_dirs(directory: Path) -> list[Path]:
        """Create ``directory`` and its missing parents; returns those it found missing (each
        one's parent gained an entry, not yet synced)."""
        missing: list[Path] = []
        probe = directory
        while not probe.is_dir():
            missing.append(probe)
            probe = probe.parent
        for new in reversed(missing):
            try:
                new.mkdir()
            except FileExistsError:
                # Another create made it first (fine), or a file of that name exists: the
                # temp-file open then fails with ENOTDIR, reported as InvalidArgument.
                pass
        return missing

    def _ensure_dir(self, directory: Path) -> None:
        """Create ``directory`` and its missing parents, fsyncing each new entry's parent."""
        for new in reversed(self._make_dirs(directory)):
            _fsync_dir(new.parent)

    def _open_temp(self, path: Path, prefix: str, *, sync: bool) -> tuple[Path, int, list[Path]]:
        """A new temporary file beside ``path`` named ``prefix<random>``, open for writing,
        and the directories made for it (their entries fsynced when ``sync``)."""
        for attempt in range(_CREATE_TRIES):
            made = self._make_dirs(path.parent)
            if sync:
                for new in reversed(made):
                    _fsync_dir(new.parent)
            tmp = path.parent / f"{prefix}{secrets.token_hex(8)}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileNotFoundError:
                # A concurrent delete pruned the (then empty) directory; make it again.
                if attempt + 1 == _CREATE_TRIES:
                    raise
                continue
            return tmp, fd, made
        raise AssertionError("unreachable: the last try raises")

    def _create(self, path: Path, data: bytes) -> None:
        if self._unnamed and _O_TMPFILE:
            try:
                self._create_unnamed(path, data, _O_TMPFILE)
                return
            except _NoUnnamedFiles:
                self._unnamed = False
        self._create_named(path, data)

    def _create_unnamed(self, path: Path, data: bytes, flag: int) -> None:
        """:meth:`_create` through an unnamed file (module docstring); _NoUnnamedFiles where
        the kernel, the filesystem or a missing ``/proc`` does not allow it."""
        for attempt in range(_CREATE_TRIES):
            last = attempt + 1 == _CREATE_TRIES
            try:
                dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                if last:
                    raise
                self._ensure_dir(path.parent)
                continue
            try:
                try:
                    fd = os.open(".", os.O_WRONLY | flag, 0o644, dir_fd=dfd)
                except OSError as exc:
                    if exc.errno in _NO_TMPFILE_ERRNOS:
                        raise _NoUnnamedFiles from exc
                    if exc.errno == errno.ENOENT and not last:
                        continue  # A concurrent delete pruned the (then empty) directory.
                    raise
                try:
                    _write_all(fd, (data,))
                    os.fsync(fd)
                    source = f"/proc/self/fd/{fd}"
                    try:
                        # dst_dir_fd makes it linkat, which follows the /proc link to the file.
                        os.link(source, path.name, dst_dir_fd=dfd, follow_symlinks=True)
                    except FileNotFoundError as exc:
                        if not os.path.exists(source):
                            raise _NoUnnamedFiles from exc
                        if last:
                            raise
                        continue  # The directory was pruned after it was opened.
                finally:
                    os.close(fd)
                os.fsync(dfd)
                return
            finally:
                os.close(dfd)
        raise AssertionError("unreachable: the last try raises")

    def _create_named(self, path: Path, data: bytes) -> None:
        tmp, fd, _ = self._open_temp(path, TEMP_PREFIX, sync=True)
        try:
            _write_all(fd, (data,))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        try:
            os.link(tmp, path)  # FileExistsError if the key exists: create-only.
        finally:
            os.unlink(tmp)
        _fsync_dir(path.parent)

    # Staged creates -------------------------------------------------------------------------

    async def stage(self, key: str, chunks: Sequence[bytes]) -> Staged:
        """Write the object ``key`` (the concatenation of ``chunks``) to a temporary file and
        fsync it; invisible until :meth:`publish` (module docstring)."""
        staging = await self.stage_open(key)
        try:
            offset = 0
            for chunk in chunks:
                await asyncio.to_thread(staging.write_at, offset, chunk)
                offset += len(chunk)
        except BaseException:
            await self.stage_abort(staging)
            raise
        return await self.stage_close(staging)

    async def stage_open(self, key: str) -> Staging:
        """A temporary file for the object ``key``, its parts to be written at their offsets
        (:meth:`Staging.write_at`), then closed (:meth:`Staging.close`, or
        :meth:`stage_close`) or removed (:meth:`Staging.abort`, :meth:`stage_abort`)."""
        path = self._path(key)
        prefix = f"{STAGE_PREFIX}{os.getpid()}-"
        try:
            tmp, fd, made = await asyncio.to_thread(self._open_temp, path, prefix, sync=False)
        except OSError as exc:
            raise self._os_error(exc, key, "create") from exc
        return Staging(key=key, path=path, tmp=tmp, fd=fd, new_dirs=tuple(made))

    async def stage_close(self, staging: Staging) -> Staged:
        """:meth:`Staging.close` in a thread, its failure named as ``create``'s."""
        try:
            return await asyncio.to_thread(staging.close)
        except OSError as exc:
            raise self._os_error(exc, staging.key, "create") from exc

    async def stage_abort(self, staging: Staging) -> None:
        """:meth:`Staging.abort` in a thread."""
        await asyncio.to_thread(staging.abort)

    async def sweep_staged(self, prefixes: Iterable[str]) -> int:
        """Remove the staged temporary files in the directories of ``prefixes`` (keys or key
        prefixes ending in ``/``) whose process no longer runs: what a copy killed before it
        published them left. Returns how many were removed."""
        dirs = {self._dir_of(p) for p in prefixes}
        return await asyncio.to_thread(_sweep, sorted(d for d in dirs if d is not None))

    def _dir_of(self, prefix: str) -> Path | None:
        directory = prefix.rpartition("/")[0]
        parts = directory.split("/") if directory else []
        if any(part in ("", ".", "..") for part in parts):
            return None
        return self.root.joinpath(*parts)

    async def publish(self, staged: Sequence[Staged]) -> list[str]:
        """Make every staged object durable and visible: each (its bytes synced when staged)
        linked to its name, then each directory that gained an entry fsynced once. Returns the keys
        that existed already (create-only: the existing object is kept, as ``create``'s
        PreconditionFailed). The temporary files are removed whatever happens."""
        self._live()
        try:
            return await asyncio.to_thread(self._publish, list(staged))
        finally:
            await self.discard(staged)

    def _publish(self, staged: list[Staged]) -> list[str]:
        if not staged:
            return []
        existed: list[str] = []
        dirs: set[Path] = set()
        with ThreadPoolExecutor(_SYNC_THREADS) as pool:
            for s in staged:
                try:
                    os.link(s.tmp, s.path)
                except FileExistsError as exc:
                    if s.path.is_dir():
                        raise InvalidArgument(
                            f"cannot create {object_url(self.url, s.key)}: it is a prefix of "
                            "other keys, and a local store cannot hold a key that is both"
                        ) from exc
                    existed.append(s.key)
                    continue
                except OSError as exc:
                    raise self._os_error(exc, s.key, "create") from exc
                dirs.add(s.path.parent)
                dirs.update(new.parent for new in s.new_dirs)
            list(pool.map(_fsync_dir, sorted(dirs)))
        return existed

    async def discard(self, staged: Iterable[Staged]) -> None:
        """Remove the temporary files of staged objects (published or not)."""
        tmps = [s.tmp for s in staged]
        if tmps:
            await asyncio.to_thread(_unlink_all, tmps)

    # Listing --------------------------------------------------------------------------------

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        self._live()
        infos = await asyncio.to_thread(self._list, prefix, start_after)
        for info in infos:
            yield info

    def _list(self, prefix: str, start_after: str | None) -> _Infos:
        """Every object under ``prefix`` after ``start_after``, sorted by key.

        Only the deepest directory that every matching key must be under is walked. Code-point
        order of Python strings equals the UTF-8 byte order S3 lists in.
        """
        directory, slash, _ = prefix.rpartition("/")
        parts = directory.split("/") if slash else []
        if any(part in ("", ".", "..") for part in parts):
            return []  # No key a local store holds has such a part (and never walk outside).
        base = self.root.joinpath(*parts)
        infos: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(base):
            rel = os.path.relpath(dirpath, self.root)
            rel_prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            # Prune directories that cannot hold a match.
            dirnames[:] = [
                d
                for d in dirnames
                if _may_match(rel_prefix + d + "/", prefix) and not d.startswith(TEMP_PREFIX)
            ]
            for name in filenames:
                key = rel_prefix + name
                if name.startswith(TEMP_PREFIX) or not key.startswith(prefix):
                    continue
                if start_after is not None and key <= start_after:
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # Deleted while listing: it is no longer there to list.
                infos.append(ObjectInfo(key=key, size=st.st_size, last_modified=st.st_mtime))
        infos.sort(key=lambda info: info.key)
        return infos

    # Deletes --------------------------------------------------------------------------------

    async def delete(self, key: str) -> None:
        path = self._path(key)
        self._open.pop(key, None)
        await asyncio.to_thread(self._delete_paths, [(key, path)])

    async def delete_many(self, keys: Iterable[str]) -> None:
        paths = [(key, self._path(key)) for key in keys]
        for key, _ in paths:
            self._open.pop(key, None)
        if paths:
            await asyncio.to_thread(self._delete_paths, paths)

    def _delete_paths(self, paths: _KeyPaths) -> None:
        """Unlink each file, then prune directories left empty (up to, not including, root).

        Deletes are not fsynced: a delete lost in a crash leaves garbage that garbage
        collection deletes again, which is harmless because deletes are idempotent.
        """
        for key, path in paths:
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError):
                continue  # Already gone: deletes are idempotent.
            except IsADirectoryError:
                continue  # A prefix of other keys, not an object: nothing to delete.
            except OSError as exc:
                raise self._os_error(exc, key, "delete") from exc
            self._prune(path.parent)

    def _prune(self, directory: Path) -> None:
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return  # Not empty (or already gone): stop pruning.
            directory = directory.parent

    # Lifecycle ------------------------------------------------------------------------------

    async def check(self) -> None:
        """Raise unless the root directory exists and is writable."""
        self._live()
        if not self.root.is_dir():
            raise InvalidArgument(f"{self.url} is not a directory")
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise InvalidArgument(f"{self.url} is not writable")

    async def close(self) -> None:
        self._closed = True
        self._open.clear()
        for threads in (self._readers, self._creators):
            if threads is not None:
                threads.shutdown(wait=False)


#: Threads reading from the disk what the page cache does not hold (:meth:`get_range`).
_READ_THREADS = 4
#: Threads of the small creates (:meth:`create`): a worker's commit log has at most this
#: many segment PUTs in flight by default.
_CREATE_THREADS = 4


#: ``preadv``'s flag to fail with EAGAIN rather than wait for the disk (Linux 4.14+), or 0
#: where this platform has none (every small read then runs inline).
_NOWAIT: int = getattr(os, "RWF_NOWAIT", 0)


def _read_cached(fd: int, offset: int, length: int) -> bytes | None:
    """``length`` bytes of ``fd`` from ``offset`` (fewer at its end) if reading them needs no
    wait for the disk, else None. Without ``RWF_NOWAIT``: the bytes, waiting if it must."""
    if not _NOWAIT or not length:
        return _pread_fd(fd, offset, length)
    view = _read_buffer()[:length]  # a buffer of this thread's: no allocation, no zero-fill
    try:
        got = os.preadv(fd, [view], offset, _NOWAIT)
    except BlockingIOError:
        return None  # not (all) in the page cache
    except OSError as exc:
        if exc.errno != errno.EOPNOTSUPP:
            raise
        # Not for this file (a directory: the plain read names it) or on this kernel.
        return _pread_fd(fd, offset, length)
    if got == length or not got:
        return bytes(view[:got])  # all of it, or b"" at or past the end
    # Short: the end of the file, or only the first pages cached. The rest decides.
    head = bytes(view[:got])
    rest = _read_cached(fd, offset + got, length - got)
    return None if rest is None else head + rest


_BUFFERS = threading.local()


def _read_buffer() -> memoryview:
    """This thread's buffer of :data:`INLINE_READ_LIMIT` bytes for non-blocking reads."""
    buf: memoryview | None = getattr(_BUFFERS, "view", None)
    if buf is None:
        buf = _BUFFERS.view = memoryview(bytearray(INLINE_READ_LIMIT))
    return buf


def _pread_fd(fd: int, offset: int, length: int) -> bytes:
    """Up to ``length`` bytes of ``fd`` from ``offset`` (fewer at its end), waiting if it must."""
    parts = []
    while length:
        got = os.pread(fd, length, offset)
        if not got:
            break
        parts.append(got)
        offset += len(got)
        length -= len(got)
    return parts[0] if len(parts) == 1 else b"".join(parts)  # b"" for no parts


def _pread_all(opened: _OpenFile, offset: int, length: int) -> bytes:
    """:func:`_pread_fd` on a worker thread, holding ``opened`` (so its descriptor stays open)."""
    return _pread_fd(opened.fd, offset, length)


class _OpenFile:
    """A file descriptor closed when the last reference to it goes: a read that took it from
    the cache keeps it open while another drops it from there (no descriptor is closed under
    a read, nor its number reused by another file meanwhile)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _sync_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _close_unlink(fd: int, path: Path) -> None:
    try:
        os.close(fd)
    finally:
        _unlink_all([path])


def _sweep(dirs: Iterable[Path]) -> int:
    """Unlink the staged temporary files in ``dirs`` whose writer's pid no longer runs."""
    removed = 0
    for directory in dirs:
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if not name.startswith(STAGE_PREFIX):
                continue
            pid = name[len(STAGE_PREFIX) :].partition("-")[0]
            if not pid.isdigit() or alive(int(pid)):
                continue
            try:
                os.unlink(directory / name)
            except FileNotFoundError:
                continue
            removed += 1
    return removed


def _unlink_all(paths: Iterable[Path]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue


def _may_match(dir_prefix: str, prefix: str) -> bool:
    """Whether keys under ``dir_prefix`` (ending in '/') can start with ``prefix``."""
    return dir_prefix.startswith(prefix) or prefix.startswith(dir_prefix)
