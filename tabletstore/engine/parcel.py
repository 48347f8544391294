"""Large byte strings to and from pool processes without pickling them (§5.4: a worker's
merging and major compactions run in its compaction processes).

A ``ProcessPoolExecutor`` pickles a call's arguments in a thread of the calling process and
unpickles its result in another, holding the GIL all the while: the 2 × 64 MiB of SSTables of
one merge took about 90 ms to pickle and as long again for the 128 MiB result, and the worker's
event loop (its reads, its writes' acknowledgements, its lease keep-alives) waited that long,
several times per merge. A :class:`Parcel` carries the bytes in an anonymous in-memory file
(``memfd_create``) instead: the caller writes it, the pool process opens it by
``/proc/<caller pid>/fd/<fd>`` and reads it, and the result comes back the same way, into a
file the caller made for it. Every copy is a ``read`` or ``write`` system call, which releases
the GIL; the pickled call carries only numbers.

The files belong to the caller's :class:`Parcels` and go when it closes them, or when the
caller dies (a memfd is freed with its last descriptor), so a killed worker leaves nothing
behind. Linux only: :func:`supported` says whether this system has what it takes, and the
callers pickle the bytes as before where it does not.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Parcel", "Parcels", "Stowed", "supported"]

#: The largest single read or write: Linux moves at most 0x7ffff000 bytes per call.
_CHUNK = 1 << 30


def supported() -> bool:
    """True where parcels work: Linux's ``memfd_create`` and ``/proc/<pid>/fd``."""
    return (
        sys.platform == "linux"
        and hasattr(os, "memfd_create")
        and os.path.isdir(f"/proc/{os.getpid()}/fd")
    )


@dataclass(frozen=True, slots=True)
class Stowed:
    """``length`` bytes at ``offset`` of a parcel: what a pool process returns in place of
    bytes it wrote into the caller's result parcel."""

    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Parcel:
    """One anonymous file of the process ``pid``, as its descriptor ``fd``: what a call to a
    pool process carries in place of bytes (picklable, a few dozen bytes)."""

    pid: int
    fd: int

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"

    def read(self) -> bytes:
        """The parcel's whole content (in a pool process)."""
        with open(self.path, "rb", buffering=0) as f:
            return f.read()

    def writer(self) -> ParcelWriter:
        """Appends to this (empty) parcel (in a pool process)."""
        return ParcelWriter(os.open(self.path, os.O_WRONLY | os.O_CLOEXEC))


@dataclass(slots=True)
class ParcelWriter:
    """Bytes written one after another into a result parcel: ``with parcel.writer() as w``."""

    fd: int
    offset: int = 0

    def stow(self, data: bytes) -> Stowed:
        """Write ``data`` next; where it lies, to return to the caller."""
        stowed = Stowed(self.offset, len(data))
        _write_all(self.fd, data, self.offset)
        self.offset += len(data)
        return stowed

    def __enter__(self) -> ParcelWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


@dataclass(slots=True)
class Parcels:
    """The caller's side: the parcels of one call, closed together (``async with``)."""

    _fds: list[int] = field(default_factory=list)

    def _new(self, name: str) -> Parcel:
        fd = os.memfd_create(f"tabletstore-{name}", os.MFD_CLOEXEC)
        self._fds.append(fd)
        return Parcel(os.getpid(), fd)

    async def pack(self, data: bytes) -> Parcel:
        """A parcel holding ``data`` (written on a thread: the copy runs without the GIL)."""
        parcel = self._new("in")
        await asyncio.to_thread(_write_all, parcel.fd, data, 0)
        return parcel

    def result(self) -> Parcel:
        """An empty parcel for a pool process to write its result into."""
        return self._new("out")

    async def unpack(self, parcel: Parcel, stowed: Stowed) -> bytes:
        """The bytes a pool process stowed in ``parcel`` (read on a thread)."""
        return await asyncio.to_thread(_read_all, parcel.fd, stowed.offset, stowed.length)

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    async def __aenter__(self) -> Parcels:
        return self

    async def __aexit__(self, *exc: object) -> None:
        # On a thread: the last close of a file frees its pages, 10+ ms for 100 MB.
        await asyncio.to_thread(self.close)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    for start, stop in _chunks(len(view)):
        done = start
        while done < stop:
            done += os.pwrite(fd, view[done:stop], offset + done)


def _read_all(fd: int, offset: int, length: int) -> bytes:
    data = os.pread(fd, length, offset)  # one call, one buffer: the usual case
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        part = os.pread(fd, min(length - got, _CHUNK), offset + got)
        if not part:
            raise EOFError(f"parcel fd {fd}: {got} of {length} bytes at {offset}")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _chunks(n: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, _CHUNK):
        yield start, min(n, start + _CHUNK)
