"""Process pools end with their owner (engine/process_pool.py): a worker SIGKILLed while its
compaction pool runs must not leave the pool's process (and its forkserver) behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tabletstore.engine.process_pool import process_pool
from tabletstore.pid_liveness import alive

_OWNER = """
import os, sys
from tabletstore.engine.process_pool import process_pool
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
