"""Structured concurrency: a worker's background tasks belong to its
TaskGroup, so a background task that fails in a way nobody handles is not lost in a log line:
the task that started the worker is cancelled and stopping the worker raises the error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.engine.compaction_runner import CompactionRunner
from tabletstore.options import TabletOptions


class _Bug(Exception):
    pass


async def test_an_unhandled_background_failure_cancels_the_owner_and_is_raised_by_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: asyncio.Future[Database] = asyncio.get_running_loop().create_future()

    async def owner() -> None:
        """Opens the database (the worker's TaskGroup is entered here) and waits."""
        options = TabletOptions(memtable_flush_bytes=4096)
        opened.set_result(await Database.open(f"file://{tmp_path}", tablet_options=options))
        await asyncio.Event().wait()

    task = asyncio.create_task(owner())
    db = await opened
    table = await db.create_table("t", ["f"])

    async def merge_with_a_bug(self: CompactionRunner) -> None:
        raise _Bug("a bug in a background compaction")

    monkeypatch.setattr(CompactionRunner, "merge_if_needed", merge_with_a_bug)
    for i in range(100):  # past memtable_flush_bytes: a background compaction starts
        await table.mutate_row(b"r%03d" % i, [SetCell("f", b"q", b"x" * 100)])
    await asyncio.wait([task], timeout=60)
    assert task.cancelled(), "the worker's TaskGroup cancels the task that started it"
    with pytest.raises(ExceptionGroup) as info:
        await db.close()
    assert info.value.subgroup(_Bug) is not None
    # Nothing acknowledged was lost: the database reopens with every row.
    monkeypatch.undo()
    async with await Database.open(f"file://{tmp_path}") as again:
        rows = [r.key async for r in again.table("t").read_rows()]
    assert rows == [b"r%03d" % i for i in range(100)]
