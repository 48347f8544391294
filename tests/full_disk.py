"""A directory on a disk that fills up, for tests: a fault-injecting layer over the writes of
one module (a tmpfs or loop mount of a small size would need root, which CI may not have).

:class:`FullDisk` gives ``root`` a size: the bytes of the files under it may not exceed
``limit``. :meth:`FullDisk.patch` replaces, in one module only, ``open`` (files opened for
writing under ``root`` write what still fits and then fail) and ``os.write`` (the same for a
descriptor of a file under ``root``), as a full filesystem behaves: a write that does not fit
writes its first bytes and returns their count, and the next write fails with ``ENOSPC``.
:meth:`FullDisk.resize` makes room again (an operator freed space).
"""

from __future__ import annotations

import errno
import io
import os
import types
from pathlib import Path
from typing import Any

import pytest

__all__ = ["FullDisk"]


def _enospc(path: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


class FullDisk:
    def __init__(self, root: Path, limit: int) -> None:
        self.root = root.resolve()
        self.limit = limit
        #: Writes refused (or cut short) for want of space.
        self.refused = 0

    def resize(self, limit: int) -> None:
        self.limit = limit

    def used(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    pass
        return total

    def holds(self, path: str | os.PathLike[str]) -> bool:
        return Path(os.path.abspath(path)).is_relative_to(self.root)

    def fits(self, path: str, want: int) -> int:
        """How many of ``want`` bytes a write to ``path`` may write now; raises ENOSPC when
        none fit."""
        room = max(0, self.limit - self.used())
        if want and room == 0:
            self.refused += 1
            raise _enospc(path)
        if room < want:
            self.refused += 1
        return min(room, want)

    def patch(self, monkeypatch: pytest.MonkeyPatch, module: types.ModuleType) -> None:
        """Put this disk under ``module``'s ``open`` and ``os.write`` (its globals only)."""
        disk = self
        real_open = open
        real_os = os

        def limited_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            f = real_open(file, mode, *args, **kwargs)
            if any(c in mode for c in "wxa+") and disk.holds(file):
                return _LimitedFile(f, str(file), disk)
            return f

        class _Os(types.ModuleType):
            def __getattr__(self, name: str) -> Any:
                return getattr(real_os, name)

            @staticmethod
            def write(fd: int, data: Any) -> int:
                path = real_os.readlink(f"/proc/self/fd/{fd}")
                if not disk.holds(path):
                    return real_os.write(fd, data)
                n = disk.fits(path, len(data))
                return real_os.write(fd, memoryview(data)[:n])

        monkeypatch.setattr(module, "open", limited_open, raising=False)
        monkeypatch.setattr(module, "os", _Os("os"))


class _LimitedFile(io.RawIOBase):
    """A binary file whose writes stop where the disk is full."""

    def __init__(self, inner: Any, path: str, disk: FullDisk) -> None:
        super().__init__()
        self._inner = inner
        self._path = path
        self._disk = disk

    def write(self, data: Any) -> int:
        view = memoryview(data)
        n = self._disk.fits(self._path, len(view))
        self._inner.write(view[:n])
        self._inner.flush()
        if n < len(view):
            raise _enospc(self._path)
        return n

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._inner.read(size)
        return data

    def close(self) -> None:
        self._inner.close()
        super().close()

    def writable(self) -> bool:
        return True
