"""A merging or major compaction holds the tablet's compaction lock only at its cut and its
commit (``engine/compaction_runner.py``, "Locks"): minor compactions go on while it rewrites,
their SSTables stay in front of its output, and a tablet that closes meanwhile does not wait
for it (its output is left unreferenced).

The rewrite is held at its fetch of its inputs (:class:`GetGate`, which holds the whole-object
GETs of the SSTables there were when it shut): nothing else reads those whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import pytest

from tabletstore.data.model import DeleteRow, Mutation, SetCell
from tabletstore.data.query import RowRange
from tabletstore.engine.tablet import Tablet
from tabletstore.errors import NotServing
from tabletstore.options import TabletOptions
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore
from tests.tablet_harness import TabletHarness, TabletModel

OPTS = TabletOptions(memtable_flush_bytes=1 << 30, max_sstables_per_group=8)


class GetGate:
    """An object store whose whole-object GETs of the keys :meth:`shut` names wait until
    :meth:`open`; ``waiting`` is set once one waits."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self._held: set[str] = set()
        self._open = asyncio.Event()
        self._open.set()
        self.waiting = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def shut(self, keys: Iterable[str]) -> None:
        self._held = set(keys)
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def get(self, key: str) -> bytes | None:
        if not self._open.is_set() and key in self._held:
            self.waiting.set()
            await self._open.wait()
        return await self.inner.get(key)


async def write(h: TabletHarness, model: TabletModel, tag: bytes, rows: range) -> None:
    assert h.tablet is not None
    for i in rows:
        row = b"r%03d" % i
        muts: list[Mutation] = [SetCell("a", b"x", tag + b"%d" % i), SetCell("b", b"y", tag)]
        if i % 9 == 0:
            muts = [DeleteRow()]
        await h.tablet.apply(row, muts)
        model.apply(row, muts, h.now_micros())


async def scan(tablet: Tablet) -> list[object]:
    return [r async for r in tablet.scan(RowRange.all())]


def keys(tablet: Tablet) -> dict[str, list[str]]:
    return {g: [r.key for r in refs] for g, refs in tablet.record.sstables.items()}


@dataclass
class Gated:
    """A tablet on a :class:`GetGate` store, its harness and the model of what it holds."""

    store: GetGate
    h: TabletHarness
    tablet: Tablet
    model: TabletModel


@contextlib.asynccontextmanager
async def gated(options: TabletOptions, flushes: int) -> AsyncIterator[Gated]:
    """A tablet with ``flushes`` minor compactions' SSTables of overlapping rows; the gate
    is open again and the harness closed at the end."""
    store = GetGate(MemoryObjectStore())
    h = TabletHarness(store, options=options)  # type: ignore[arg-type]
    tablet = await h.start()
    try:
        model = TabletModel(h.schema)
        for n in range(flushes):
            await write(h, model, b"v%d-" % n, range(40))
            await tablet.minor_compact()
        yield Gated(store, h, tablet, model)
    finally:
        store.open()
        await h.close()


async def test_a_minor_compaction_completes_while_a_major_rewrite_runs() -> None:
    async with gated(OPTS, 3) as setup:
        store, h, tablet, model = setup.store, setup.h, setup.tablet, setup.model
        before = keys(tablet)
        store.shut(k for ks in before.values() for k in ks)
        major = asyncio.ensure_future(tablet.major_compact())
        async with asyncio.timeout(30):
            await store.waiting.wait()  # the rewrite is fetching its inputs
        await write(h, model, b"during-", range(20, 60))
        async with asyncio.timeout(10):  # before the change: until the major committed
            await tablet.minor_compact()
        flushed = {g: ks[0] for g, ks in keys(tablet).items()}
        assert all(flushed[g] not in before[g] for g in before), "a new SSTable in front"
        assert await scan(tablet) == model.scan(h.now_micros())
        store.open()
        async with asyncio.timeout(30):
            await major
        after = keys(tablet)
        for group, ks in after.items():
            # The minor compaction's SSTable in front of the major's one output.
            assert len(ks) == 2 and ks[0] == flushed[group], after
            assert not set(ks) & set(before[group])
        assert await scan(tablet) == model.scan(h.now_micros())
        stored = (await h.record()).sstables
        assert keys(tablet) == {g: [r.key for r in refs] for g, refs in stored.items()}
        await h.recover()
        assert h.tablet is not None
        assert await scan(h.tablet) == model.scan(h.now_micros())


async def test_the_background_minor_compaction_does_not_wait_for_a_merge() -> None:
    options = TabletOptions(memtable_flush_bytes=1 << 30, max_sstables_per_group=2)
    async with gated(options, 2) as setup:
        store, h, tablet, model = setup.store, setup.h, setup.tablet, setup.model
        await write(h, model, b"v2-", range(40))
        await tablet.minor_compact()
        store.shut(k for ks in keys(tablet).values() for k in ks)
        await write(h, model, b"v2b-", range(40))
        runner = tablet._compactions
        runner.spawn_flush()  # a minor compaction, then a merge of three SSTables per group
        async with asyncio.timeout(30):
            await store.waiting.wait()  # the merge is fetching its inputs
        await write(h, model, b"v3-", range(40))
        runner.spawn_flush()  # before the change: a no-op while the merge ran
        flushing = runner.flushing()
        assert flushing is not None
        async with asyncio.timeout(10):
            await flushing
        assert tablet._core.memtable_bytes() == 0, "written out while the merge runs"
        assert await scan(tablet) == model.scan(h.now_micros())
        store.open()
        async with asyncio.timeout(30):
            await runner.background_done()
        assert all(len(ks) <= 2 for ks in keys(tablet).values()), keys(tablet)
        assert await scan(tablet) == model.scan(h.now_micros())
        await h.recover()
        assert h.tablet is not None
        assert await scan(h.tablet) == model.scan(h.now_micros())


async def test_a_tablet_unloaded_during_a_major_rewrite_does_not_wait_for_it() -> None:
    async with gated(OPTS, 2) as setup:
        store, h, tablet, model = setup.store, setup.h, setup.tablet, setup.model
        store.shut(k for ks in keys(tablet).values() for k in ks)
        major = asyncio.ensure_future(tablet.major_compact())
        async with asyncio.timeout(30):
            await store.waiting.wait()
        await write(h, model, b"late-", range(10, 30))
        async with asyncio.timeout(10):  # before the change: until the major committed
            await tablet.close(flush=True)
        closed = keys(tablet)
        store.open()
        with pytest.raises(NotServing):
            async with asyncio.timeout(30):
                await major
        record = await h.record()
        assert {g: [r.key for r in refs] for g, refs in record.sstables.items()} == closed
        assert not record.logs, "every write in SSTables"
        await h.recover()
        assert h.tablet is not None
        assert await scan(h.tablet) == model.scan(h.now_micros())
