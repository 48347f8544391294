"""The runs a worker sorted, kept where it can read them back without the object store
(§6 "Commit-log implementation"; docs/architecture/design.md §7).

Paper §6: the tablet servers sort a dead server's log, and each new owner then reads only its
part. Here the master gives every tablet of a dead log to one worker (owner affinity), which
sorts every task of it; the runs it writes (create-only PUTs, as every sorter does: other
sorters, retries, a new master and the garbage collector see the same objects) are the runs
its own tablets replay next. :class:`RunSpill` keeps them for that replay, so the log's records
cross the network once: in memory up to ``memory_bytes``, then in files of a private local
directory up to ``disk_bytes`` (the owner's bound is local disk, not RAM). A run kept nowhere
(both budgets full) is read back from the store, as a run another worker wrote is; so is one
the disk had no room for (a full disk is logged, and what was written of that file removed).

A kept copy is only ever a shortcut: each one's crc32c is held in memory and checked when it is
read back, and a file that is missing, short or damaged is dropped and reported as absent, so
the caller reads the run from the store (whose copy is checksummed too). Nothing is skipped.

A log's runs go ``keep`` seconds after their last use (its tablets have replayed by then), and
all of them when the worker stops (:meth:`RunSpill.close`). The directory is named after the
process (``tabletstore-runs-<pid>-...``): a worker killed before it could remove its own leaves
it behind, and the next spill made in the same parent removes those of processes that are gone
(:func:`sweep_stale`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

from crc32c import crc32c

from tabletstore.clock import Clock, SystemClock
from tabletstore.errors import InvalidArgument
from tabletstore.limits import MiB
from tabletstore.pid_liveness import alive

__all__ = ["DIRECTORY_PREFIX", "RunSpill", "SpillStats", "sweep_stale"]

log = logging.getLogger(__name__)

#: The name every spill directory starts with, then ``<pid>-``.
DIRECTORY_PREFIX = "tabletstore-runs-"
#: Seconds a log's kept runs stay after the last time one of them was kept or read.
KEEP_SECONDS = 120.0


@dataclass(slots=True)
class _Kept:
    log: str
    size: int
    crc: int
    #: In memory, or None when the copy is the file at ``path``.
    data: bytes | None
    path: str | None


@dataclass(slots=True)
class SpillStats:
    """What a spill holds and did (status pages, the benchmark, tests)."""

    memory_bytes: int = 0
    disk_bytes: int = 0
    #: Runs kept, in memory and on disk; runs not kept (both budgets full).
    kept_in_memory: int = 0
    kept_on_disk: int = 0
    not_kept: int = 0
    #: Runs read back from memory or disk, and their bytes.
    hits: int = 0
    hit_bytes: int = 0
    #: Kept copies found missing or damaged (the caller read the store instead).
    bad_copies: int = 0


def _log_of(key: str) -> str:
    """The log a recovery key belongs to: ``recovery/<worker>/<incarnation>/``."""
    parts = key.split("/", 3)
    return "/".join(parts[:3]) + "/"


class RunSpill:
    """Runs this worker wrote, by key: memory, then local files, then nothing (module
    docstring). Serves one object store (the worker's)."""

    def __init__(
        self,
        *,
        memory_bytes: int = 64 * MiB,
        disk_bytes: int = 1024 * MiB,
        directory: str | None = None,
        keep: float = KEEP_SECONDS,
        clock: Clock | None = None,
    ) -> None:
        """``directory``: the parent of the private directory the files go in (None: the
        system's temporary directory); ``disk_bytes`` 0 keeps runs in memory only."""
        if memory_bytes < 0 or disk_bytes < 0 or keep <= 0:
            raise InvalidArgument(
                f"spill budgets must be >= 0 and keep > 0, got memory_bytes={memory_bytes}, "
                f"disk_bytes={disk_bytes}, keep={keep}"
            )
        if directory is not None and not os.path.isdir(directory):
            raise InvalidArgument(f"the sort spill directory {directory!r} does not exist")
        self._memory_budget = memory_bytes
        self._disk_budget = disk_bytes
        self._parent = directory
        self._keep = keep
        self._clock = clock or SystemClock()
        self._kept: dict[str, _Kept] = {}
        self._last_used: dict[str, float] = {}
        self._dir: str | None = None
        self._files = 0
        self._writing: set[str] = set()
        self._closed = False
        self.stats = SpillStats()

    @property
    def directory(self) -> str | None:
        """The private directory of the files, once the first run was spilled to disk."""
        return self._dir

    def holds(self, key: str) -> bool:
        return key in self._kept

    async def keep(self, key: str, data: bytes) -> None:
        """Keep ``data``, the bytes just written to ``key`` create-only (or found there byte
        for byte), for this worker's replay: in memory while it fits, else on disk while that
        fits, else not at all. A disk that fails is logged and the run not kept."""
        self._expire()
        if self._closed or key in self._kept or key in self._writing:
            return
        name = _log_of(key)
        self._last_used[name] = self._clock.monotonic()
        size, crc = len(data), crc32c(data)
        stats = self.stats
        if stats.memory_bytes + size <= self._memory_budget:
            self._kept[key] = _Kept(name, size, crc, data, None)
            stats.memory_bytes += size
            stats.kept_in_memory += 1
            return
        if stats.disk_bytes + size > self._disk_budget:
            stats.not_kept += 1
            return
        stats.disk_bytes += size  # reserved now: concurrent keeps do not overshoot
        self._writing.add(key)
        try:
            path = await asyncio.to_thread(_write, self._directory(), self._next_name(), data)
        except OSError as exc:
            stats.disk_bytes -= size
            stats.not_kept += 1
            log.warning("sort spill: could not keep %s on disk (%s); it is read back", key, exc)
            return
        finally:
            self._writing.discard(key)
        if self._closed:  # closed while writing
            with contextlib.suppress(OSError):
                os.unlink(path)
            return
        self._kept[key] = _Kept(name, size, crc, None, path)
        stats.kept_on_disk += 1

    async def get(self, key: str) -> bytes | None:
        """The kept copy of ``key``, checked against its crc32c; None when it is not kept or
        the copy is missing or damaged (then it is dropped: the caller reads the store)."""
        self._expire()
        kept = self._kept.get(key)
        if kept is None:
            return None
        self._last_used[kept.log] = self._clock.monotonic()
        data = kept.data
        if data is None:
            assert kept.path is not None
            try:
                data = await asyncio.to_thread(_read, kept.path)
            except OSError as exc:
                self._bad(key, f"unreadable ({exc})")
                return None
        if len(data) != kept.size or crc32c(data) != kept.crc:
            self._bad(key, f"damaged ({len(data)} of {kept.size} bytes, checksum mismatch)")
            return None
        self.stats.hits += 1
        self.stats.hit_bytes += len(data)
        return data

    def drop(self, key: str) -> None:
        """Forget ``key``'s copy (and remove its file)."""
        kept = self._kept.pop(key, None)
        if kept is None:
            return
        if kept.path is None:
            self.stats.memory_bytes -= kept.size
            return
        self.stats.disk_bytes -= kept.size
        with contextlib.suppress(OSError):
            os.unlink(kept.path)

    def bad_copy(self, key: str, why: str) -> None:
        """A copy :meth:`get` returned turned out not to decode: drop it (the caller reads
        the store)."""
        self._bad(key, why)

    def close(self) -> None:
        """Forget every copy and remove the directory (the worker stops)."""
        self._closed = True
        self._kept.clear()
        self._last_used.clear()
        self.stats.memory_bytes = self.stats.disk_bytes = 0
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _bad(self, key: str, why: str) -> None:
        log.warning("sort spill: the kept copy of %s is %s; reading it from the store", key, why)
        self.stats.bad_copies += 1
        self.drop(key)

    def _expire(self) -> None:
        now = self._clock.monotonic()
        idle = {name for name, used in self._last_used.items() if now - used > self._keep}
        if not idle:
            return
        for key in [k for k, kept in self._kept.items() if kept.log in idle]:
            self.drop(key)
        for name in idle:
            del self._last_used[name]

    def _directory(self) -> str:
        """The private directory, made at the first file (stale ones swept then)."""
        if self._dir is None:
            parent = self._parent or tempfile.gettempdir()
            sweep_stale(parent)
            self._dir = tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-", dir=parent)
        return self._dir

    def _next_name(self) -> str:
        self._files += 1
        return f"{self._files:010d}.run"


def _write(directory: str, name: str, data: bytes) -> str:
    """Write one file (in a thread); its path. A write that fails (a full disk: ENOSPC)
    removes what it wrote, so a run that did not fit takes no space from the next one."""
    path = os.path.join(directory, name)
    with open(path, "xb") as f:
        try:
            f.write(data)
            f.flush()
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
    return path


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def sweep_stale(parent: str) -> list[str]:
    """Remove the spill directories under ``parent`` of processes that are gone (a worker
    killed before it removed its own); the removed paths."""
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(DIRECTORY_PREFIX):
            continue
        pid_text = name[len(DIRECTORY_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or alive(int(pid_text)):
            continue
        path = os.path.join(parent, name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
