"""Whether a process runs: the one question about other processes that the worker's sort
pools (`process_pool.py`) and its run spill (`commitlog/spill.py`) both ask of a pid
they recorded."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # "pid (comm) state ...": comm may hold spaces and parentheses; state follows the last ')'.
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc: kill(0) answered
