"""The processes a test or the chaos harness started itself (never any other): whether a pid
still runs, reaping it once it has exited, and a group of them to crash, pause, stop and read
the logs of (:class:`ProcessGroup`, shared by the chaos cluster and the integration tests'
cluster)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.errors import Unavailable

__all__ = ["ProcessGroup", "gone", "reap"]


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


class ProcessGroup:
    """The processes a harness started, by their records: only these are ever signalled, and
    a reused pid never is (:func:`~tabletstore.cli.localstack.is_running` checks the recorded
    command). A subclass appends to :attr:`records` as it starts processes."""

    #: Every process started, oldest first.
    records: list[ProcessRecord]

    def running(self, record: ProcessRecord) -> bool:
        return localstack.is_running(record)

    def alive(self) -> list[ProcessRecord]:
        return [r for r in self.records if localstack.is_running(r)]

    def kill(self, record: ProcessRecord, *, deadline: float = 10.0) -> None:
        """SIGKILL a process this group started (a crash: no clean-up runs) and wait until it
        is gone."""
        if record not in self.records:
            raise ValueError(f"{record.role} was not started by this harness")
        if localstack.is_running(record):
            os.kill(record.pid, signal.SIGKILL)
        end = time.monotonic() + deadline
        while not gone(record.pid):
            reap(record.pid)
            if time.monotonic() > end:
                raise Unavailable(f"{record.role} (pid {record.pid}) survived SIGKILL")
            time.sleep(0.02)
        reap(record.pid)

    def pause(self, record: ProcessRecord) -> None:
        """SIGSTOP: the process keeps its sockets but runs nothing (a long GC pause, a VM
        migration) -- its lease expires while it still believes it serves."""
        if record not in self.records or not localstack.is_running(record):
            raise ValueError(f"{record.role} is not a running process of this harness")
        os.kill(record.pid, signal.SIGSTOP)

    def resume(self, record: ProcessRecord) -> None:
        if record not in self.records:
            raise ValueError(f"{record.role} was not started by this harness")
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop every process still running, newest first (paused ones are resumed first: a
        stopped process would not act on SIGTERM); never raises for one that is gone."""
        for record in reversed(self.records):
            if localstack.is_running(record):
                self.resume(record)
            with contextlib.suppress(Exception):
                localstack.stop(record, deadline=10.0)
            reap(record.pid)

    def logs(self, lines: int = 15) -> str:
        """The tail of every process's log, for assertion messages."""
        out = []
        for record in self.records:
            try:
                text = Path(record.log).read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                text = ["(no log)"]
            out.append(f"--- {record.role} (pid {record.pid}) {record.log}\n" + "\n".join(text))
        return "\n".join(out)
