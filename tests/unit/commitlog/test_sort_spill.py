"""The runs a worker sorted, kept for its own replay (commitlog/spill.py): memory first, then
local files, then nothing (read back from the store); a kept copy that is missing or damaged
falls back to the store's copy, never a skipped record; a log's copies go after their last use
and all of them when the worker stops; directories of dead processes are swept."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tabletstore.clock import ManualClock
from tabletstore.commitlog.sorting import ReplayStats, SharedSorts, plan_sort
from tabletstore.commitlog.spill import DIRECTORY_PREFIX, RunSpill, sweep_stale
from tabletstore.errors import InvalidArgument
from tabletstore.keys import Cell
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore, Op
from tabletstore.storage_s3.memory import MemoryObjectStore
from tests.unit.commitlog.test_commitlog_sorting import (
    INC,
    TABLETS,
    W,
    direct,
    owned_replay,
    write_log,
)


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _flip(path: Path, at: int | None) -> None:
    """Flip one bit of the file at ``path`` (at byte ``at``, or its middle)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x40
    path.write_bytes(bytes(data))


def _key(task: int, tablet: str) -> str:
    return layout.recovery_run_key(W, INC, task, "t1", tablet)


async def test_runs_go_to_memory_then_disk_then_nowhere(tmp_path: Path) -> None:
    spill = RunSpill(memory_bytes=100, disk_bytes=250, directory=str(tmp_path))
    await spill.keep(_key(0, "a"), b"m" * 80)  # memory
    await spill.keep(_key(0, "b"), b"d" * 120)  # memory full: disk
    await spill.keep(_key(0, "c"), b"e" * 120)  # disk
    await spill.keep(_key(0, "d"), b"n" * 20)  # fits in memory still
    await spill.keep(_key(0, "e"), b"x" * 120)  # neither: read back from the store
    s = spill.stats
    assert (s.kept_in_memory, s.kept_on_disk, s.not_kept) == (2, 2, 1)
    assert (s.memory_bytes, s.disk_bytes) == (100, 240)
    assert spill.directory is not None
    assert os.path.dirname(spill.directory) == str(tmp_path)
    assert len(os.listdir(spill.directory)) == 2
    assert await spill.get(_key(0, "a")) == b"m" * 80
    assert await spill.get(_key(0, "b")) == b"d" * 120
    assert await spill.get(_key(0, "c")) == b"e" * 120
    assert await spill.get(_key(0, "e")) is None
    assert (s.hits, s.hit_bytes) == (3, 320)
    directory = spill.directory
    spill.close()
    assert not _exists(directory)
    assert await spill.get(_key(0, "a")) is None
    await spill.keep(_key(1, "a"), b"late")  # after close: not kept
    assert not spill.holds(_key(1, "a"))


async def test_a_damaged_or_missing_file_is_dropped_and_reported_absent(tmp_path: Path) -> None:
    spill = RunSpill(memory_bytes=0, disk_bytes=1000, directory=str(tmp_path))
    for tablet in "abc":
        await spill.keep(_key(0, tablet), tablet.encode() * 50)
    assert spill.directory is not None
    files = sorted(os.listdir(spill.directory))
    assert len(files) == 3
    # One bit flipped, one truncated, one removed.
    _flip(Path(spill.directory, files[0]), 10)
    _write(Path(spill.directory, files[1]), b"b" * 49)
    os.unlink(Path(spill.directory, files[2]))
    for tablet in "abc":
        assert await spill.get(_key(0, tablet)) is None
        assert not spill.holds(_key(0, tablet))
    assert spill.stats.bad_copies == 3 and spill.stats.disk_bytes == 0
    assert os.listdir(spill.directory) == []


async def test_a_logs_copies_go_after_their_last_use(tmp_path: Path) -> None:
    clock = ManualClock()
    spill = RunSpill(
        memory_bytes=10, disk_bytes=1000, directory=str(tmp_path), keep=60, clock=clock
    )
    other = layout.recovery_run_key("w8", 1, 0, "t1", "a")
    await spill.keep(_key(0, "a"), b"a" * 8)
    await spill.keep(_key(0, "b"), b"b" * 20)  # on disk
    await spill.keep(other, b"o" * 20)
    clock.advance(40)
    assert await spill.get(_key(0, "a")) == b"a" * 8  # w9's log used again
    clock.advance(40)  # w8's log idle 80 s, w9's 40 s
    assert await spill.get(other) is None
    assert await spill.get(_key(0, "b")) == b"b" * 20
    assert spill.stats.disk_bytes == 20 and spill.stats.bad_copies == 0
    assert spill.directory is not None and len(os.listdir(spill.directory)) == 1
    spill.close()


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="budgets"):
        RunSpill(memory_bytes=-1)
    with pytest.raises(InvalidArgument, match="does not exist"):
        RunSpill(directory=str(tmp_path / "nowhere"))


def test_directories_of_dead_processes_are_swept(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead_pid = int(gone.stdout)
    stale = tmp_path / f"{DIRECTORY_PREFIX}{dead_pid}-abc"
    stale.mkdir()
    (stale / "0000000001.run").write_bytes(b"x")
    mine = tmp_path / f"{DIRECTORY_PREFIX}{os.getpid()}-def"
    mine.mkdir()
    unrelated = tmp_path / "something-else"
    unrelated.mkdir()
    assert sweep_stale(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and mine.exists() and unrelated.exists()


async def _owner_replay(
    store: InstrumentedObjectStore, shared: SharedSorts, stats: ReplayStats
) -> list[list[Cell]]:
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    reserved = {t.first for t in plan.tasks}
    replays = (owned_replay(store, plan, t, reserved, shared, stats) for t in TABLETS)
    return list(await asyncio.wait_for(asyncio.gather(*replays), 60))


async def test_an_owner_past_its_memory_replays_from_disk_and_reads_the_log_once(
    tmp_path: Path,
) -> None:
    mem = MemoryObjectStore(shared=False)
    await write_log(mem, segments=16)
    store = InstrumentedObjectStore(mem)
    spill = RunSpill(memory_bytes=4000, disk_bytes=10**7, directory=str(tmp_path))
    stats = ReplayStats()
    got = await _owner_replay(store, SharedSorts(spill=spill), stats)
    for t, cells in zip(TABLETS, got, strict=True):
        assert cells == await direct(mem, t)
    assert spill.stats.kept_in_memory > 0 and spill.stats.kept_on_disk > 0
    assert spill.stats.not_kept == 0 and spill.stats.bad_copies == 0
    assert stats.local_runs == stats.runs > 0 and stats.local_bytes == stats.run_bytes
    # Only the segments (and each task's check for a manifest and the plan): no run read back.
    gets = store.stats()[Op.GET]
    log_bytes = sum(
        [len(await mem.get(layout.log_segment_key(W, INC, n)) or b"") for n in range(16)]
    )
    assert gets.bytes == log_bytes
    spill.close()


async def test_damaged_spilled_runs_are_read_from_the_store_instead(tmp_path: Path) -> None:
    """Every kept file damaged after the sort (and memory too small to keep any): each run is
    read from the store, checksummed, and every record is still replayed."""
    mem = MemoryObjectStore(shared=False)
    await write_log(mem, segments=16)
    store = InstrumentedObjectStore(mem)
    spill = RunSpill(memory_bytes=0, disk_bytes=10**7, directory=str(tmp_path))
    shared = SharedSorts(spill=spill)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    await asyncio.gather(*(shared.run(store, plan, t) for t in plan.tasks))
    assert spill.directory is not None
    for name in os.listdir(spill.directory):
        _flip(Path(spill.directory, name), None)
    store.reset()
    stats = ReplayStats()
    got = await _owner_replay(store, shared, stats)
    for t, cells in zip(TABLETS, got, strict=True):
        assert cells == await direct(mem, t)
    assert stats.local_runs == 0 and stats.runs > 0
    # (The runs of table t3, which no tablet here reads, are left alone.)
    assert 0 < spill.stats.bad_copies <= spill.stats.kept_on_disk
    assert store.stats()[Op.GET].requests >= stats.runs
    spill.close()


async def test_a_run_the_spill_could_not_keep_is_read_from_the_store(tmp_path: Path) -> None:
    mem = MemoryObjectStore(shared=False)
    await write_log(mem, segments=16)
    store = InstrumentedObjectStore(mem)
    spill = RunSpill(memory_bytes=0, disk_bytes=0, directory=str(tmp_path))
    stats = ReplayStats()
    got = await _owner_replay(store, SharedSorts(spill=spill), stats)
    for t, cells in zip(TABLETS, got, strict=True):
        assert cells == await direct(mem, t)
    assert spill.stats.not_kept > 0 and stats.local_runs == 0 and stats.runs > 0
    assert spill.directory is None  # nothing was written to disk


async def test_a_full_spill_disk_keeps_nothing_half_written_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk under the spill directory fills up: the run that does not fit is not kept
    (its replay reads the store's copy), no partial file is left taking the space, the runs
    kept before still read back, and runs are kept on disk again once there is room."""
    from tabletstore.commitlog import spill as spill_module
    from tests.full_disk import FullDisk

    disk = FullDisk(tmp_path, limit=1000)
    disk.patch(monkeypatch, spill_module)
    # The spill's own logger, not the root's: another test in this process may have left the
    # package's loggers not propagating (the CLI configures logging).
    warned: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    spill_module.log.addHandler(handler)
    monkeypatch.setattr(spill_module.log, "disabled", False)
    monkeypatch.setattr(spill_module.log, "level", logging.NOTSET)
    spill = RunSpill(memory_bytes=0, disk_bytes=1 << 20, directory=str(tmp_path))
    try:
        await spill.keep(_key(0, "a"), b"a" * 600)
        await spill.keep(_key(0, "b"), b"b" * 600)  # 400 bytes fit: ENOSPC
        assert disk.refused and spill.stats.kept_on_disk == 1 and spill.stats.not_kept == 1
        assert any("No space left on device" in w for w in warned), warned
        assert not spill.holds(_key(0, "b"))
        assert disk.used() == 600, "the run that did not fit left a partial file behind"
        assert await spill.get(_key(0, "a")) == b"a" * 600
        disk.resize(10_000)
        await spill.keep(_key(0, "c"), b"c" * 600)
        assert spill.holds(_key(0, "c")) and await spill.get(_key(0, "c")) == b"c" * 600
    finally:
        spill_module.log.removeHandler(handler)
        spill.close()
