"""Watching the processes a test or the chaos harness started itself (never any other):
whether a pid still runs, and reaping it once it has exited."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["gone", "reap"]


def gone(pid: int) -> bool:
    """The pid no longer runs (absent, or a zombie nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def reap(pid: int) -> None:
    """Collect an exited child's status, so the pid table stays clean. A pid that is not our
    child (or was reaped already) raises ChildProcessError: nothing to do then."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
