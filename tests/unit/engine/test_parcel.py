"""Parcels (engine/parcel.py): bytes to and from a pool process through anonymous files, so
the call the pool pickles carries only numbers."""

from __future__ import annotations

import asyncio
import os
import pickle

import pytest

from tabletstore.engine.parcel import Parcel, Parcels, Stowed, supported
from tabletstore.process_pool import process_pool


def _reverse_each(inputs: list[Parcel], out: Parcel) -> list[Stowed]:
    """In a pool process: every input reversed, stowed one after another in ``out``."""
    with out.writer() as writer:
        return [writer.stow(p.read()[::-1]) for p in inputs]


def test_this_system_has_parcels() -> None:
    assert supported()  # Linux: the worker's compactions rely on them here


async def test_bytes_go_to_a_pool_process_and_come_back() -> None:
    blobs = [os.urandom(3 << 20), b"", os.urandom(10)]
    pool = process_pool(1)
    try:
        async with Parcels() as parcels:
            inputs = [await parcels.pack(b) for b in blobs]
            out = parcels.result()
            assert len(pickle.dumps((inputs, out))) < 1024
            loop = asyncio.get_running_loop()
            stowed = await loop.run_in_executor(pool, _reverse_each, inputs, out)
            assert [s.length for s in stowed] == [len(b) for b in blobs]
            assert [await parcels.unpack(out, s) for s in stowed] == [b[::-1] for b in blobs]
            fds = [p.fd for p in [*inputs, out]]
        for fd in fds:  # closed with the Parcels: the memory goes with them
            with pytest.raises(OSError):
                os.fstat(fd)
    finally:
        pool.shutdown()


async def test_unpacking_more_than_was_stowed_is_an_error() -> None:
    async with Parcels() as parcels:
        parcel = await parcels.pack(b"abc")
        assert await parcels.unpack(parcel, Stowed(1, 2)) == b"bc"
        with pytest.raises(EOFError):
            await parcels.unpack(parcel, Stowed(0, 4))
