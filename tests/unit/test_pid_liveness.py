"""pid_liveness.alive: the liveness check the sort pools and the run spill share."""

from __future__ import annotations

import os
import subprocess
import sys

from tabletstore.pid_liveness import alive


def test_a_running_process_is_alive() -> None:
    assert alive(os.getpid())


def test_an_exited_but_unreaped_child_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Until it is reaped the exited child is a zombie: kill(0) still succeeds on it.
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert not alive(child.pid)
    finally:
        child.wait()


def test_a_reaped_process_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not alive(child.pid)
