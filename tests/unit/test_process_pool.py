"""Process pools end with their owner (process_pool.py): a worker SIGKILLed while its
compaction pool runs must not leave the pool's process (and its forkserver) behind. And a pool
outlives the loss of one of its processes: ProcessPool replaces a broken pool."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tabletstore.errors import Unavailable
from tabletstore.pid_liveness import alive
from tabletstore.process_pool import AUTOGROUP, ProcessPool, autogroup_enabled, process_pool

_OWNER = """
import os, sys
from tabletstore.process_pool import process_pool
pool = process_pool(1)
print(pool.submit(os.getpid).result(timeout=60), flush=True)
sys.stdin.read()  # until killed
"""


def _wait_gone(pid: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_pool_process_exits_once_its_owner_is_killed() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        assert child != owner.pid and alive(child)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=30)
        assert _wait_gone(child, time.monotonic() + 30), f"pool process {child} outlived its owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_a_pool_still_runs_work_while_its_owner_lives() -> None:
    with process_pool(1) as pool:
        assert pool.submit(pow, 2, 10).result(timeout=60) == 1024


def test_alive_answers_for_this_process_and_a_reaped_one() -> None:
    assert alive(os.getpid())
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert not alive(done.pid)


def _die_once(marker: str) -> int:
    """In a pool process: exit abruptly the first time (as a process the OOM killer takes),
    answer 42 after."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(9)
    return 42


def _die(code: int) -> int:
    os._exit(code)


async def test_a_call_whose_process_dies_runs_again_in_a_new_pool(tmp_path: Path) -> None:
    pool = ProcessPool(1, name="test")
    try:
        first = pool.pool
        assert await pool.run(functools.partial(_die_once, str(tmp_path / "died"))) == 42
        assert pool.renewals == 1 and pool.pool is not first
        assert await pool.run(functools.partial(pow, 2, 10)) == 1024
    finally:
        pool.shutdown()


async def test_a_call_that_kills_two_pools_fails_unavailable_and_the_pool_lives_on() -> None:
    pool = ProcessPool(1, name="test")
    try:
        with pytest.raises(Unavailable, match="test process died"):
            await pool.run(functools.partial(_die, 9))
        assert pool.renewals == 2
        assert await pool.run(functools.partial(pow, 3, 2)) == 9
    finally:
        pool.shutdown()


async def test_a_pool_runs_its_processes_below_its_owners_priority_after_a_renewal_too(
    tmp_path: Path,
) -> None:
    """Compaction processes are background work: ``nice`` steps below the worker, and still
    so in the pool that replaces one whose process died."""
    own = os.nice(0)
    pool = ProcessPool(1, name="test", nice=5)
    try:
        assert await pool.run(functools.partial(os.nice, 0)) == min(19, own + 5)
        assert await pool.run(functools.partial(_die_once, str(tmp_path / "died"))) == 42
        assert pool.renewals == 1
        assert await pool.run(functools.partial(os.nice, 0)) == min(19, own + 5)
    finally:
        pool.shutdown()
    with process_pool(1) as plain:
        assert plain.submit(os.nice, 0).result(timeout=60) == own


def _session() -> tuple[int, int, str]:
    """A process's session, process group and scheduling group ("" with no autogroup, or in
    the default group)."""
    try:
        group = Path(AUTOGROUP).read_text()
    except OSError:
        group = ""
    return os.getsid(0), os.getpgrp(), group


async def test_a_niced_pool_process_is_background_work_against_other_sessions_too() -> None:
    """Where the kernel schedules by session groups (autogroup), nice only orders a process
    within its session: a niced pool process leaves its owner's session for a group of its
    own, niced as much (elsewhere nice alone is enough, and it stays). A pool without nice
    stays in its owner's session."""
    own_sid, _, own_group = _session()
    pool = ProcessPool(1, name="test", nice=7)
    try:
        sid, pgrp, group = await pool.run(_session)
        child = await pool.run(os.getpid)
        if autogroup_enabled():
            assert sid == pgrp == child != own_sid, "a session of its own"
            assert group.split()[1:] == ["nice", "7"], group
            # The kernel prints nothing for a process in the default group (one whose session
            # was never given a group of its own, as under some container runtimes).
            assert group.split()[0] != (own_group.split() or ["default"])[0], "a group of its own"
        else:
            assert sid == own_sid
    finally:
        pool.shutdown()
    with process_pool(1) as plain:
        assert plain.submit(os.getsid, 0).result(timeout=60) == own_sid


async def test_a_pool_whose_idle_process_was_killed_is_replaced_at_the_next_call() -> None:
    pool = ProcessPool(1, name="test")
    try:
        child = await pool.run(os.getpid)
        os.kill(child, signal.SIGKILL)
        assert _wait_gone(child, time.monotonic() + 30)
        assert await pool.run(functools.partial(pow, 2, 3)) == 8
        assert await pool.run(os.getpid) != child
    finally:
        pool.shutdown()
