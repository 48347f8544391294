"""A group of identical server processes on one host: ``--processes N`` of ``tabletstore
worker`` and ``tabletstore bigtable-api``.

One Python process serves on one core (its event loop, and the interpreter's lock around
everything else). A host with several cores runs several processes: :class:`Supervisor` starts
``count`` children, each the same command line with ``--processes 1`` and its place in the
group (:func:`group_options`: its slot number, how many times the slot was started, and a pipe
to say it serves), restarts a child that dies, and on SIGTERM or SIGINT forwards SIGTERM to
every child and waits for them all (each drains as one process would: a worker flushes and
hands back its tablets, the front door finishes its calls in flight). It serves nothing itself
and holds no database state: a child's death costs what one process's crash costs, and only
that child's share.

A child that dies before it first served (a bad store URL, a port taken, a certificate that
cannot be read) ends the whole group with a failure, as one process would end; a child that
served and then died is restarted. A slot whose child dies within :data:`STEADY_SECONDS` of
starting is restarted after a delay that doubles each time (from :data:`FIRST_DELAY` up to
:data:`MAX_DELAY`): a slot that keeps failing does not spin. A child that lasted longer is
restarted after :data:`FIRST_DELAY`. On Linux a child also gets SIGTERM when the supervisor
exits, however it exits: children never serve on unsupervised.

Children are started afresh (``python -m tabletstore.cli.main``), not forked from the
supervisor: gRPC, loaded by the verbs, breaks in a forked child (a worker's etcd lease
keep-alive stopped within seconds).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import click

from tabletstore.clock import monotonic

__all__ = [
    "FIRST_DELAY",
    "MAX_DELAY",
    "STEADY_SECONDS",
    "GroupPlace",
    "Supervisor",
    "cores",
    "group_options",
    "group_place",
    "process_count",
    "processes_option",
]

#: Seconds before restarting a slot whose child died.
FIRST_DELAY = 0.5
#: The longest wait before restarting a slot that keeps dying at start.
MAX_DELAY = 30.0
#: A child that ran this long was serving: its slot's delay starts again from FIRST_DELAY.
STEADY_SECONDS = 60.0


def cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset``
    narrow), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def process_count(value: str) -> int:
    """``--processes``: a positive number, or ``auto`` for one per core (:func:`cores`)."""
    if value == "auto":
        return cores()
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise click.BadParameter(f"must be a positive number or 'auto', got {value!r}")
    return count


def processes_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--processes N|auto`` option of a server verb; ``what`` says what each process
    has of its own."""
    return click.option(
        "--processes",
        "processes",
        default="1",
        show_default=True,
        metavar="N|auto",
        callback=lambda ctx, param, value: process_count(value),
        help=f"Server processes on this host (auto: one per core), each {what}; a supervisor "
        "restarts one that dies and forwards SIGTERM to all.",
    )


@dataclass(frozen=True)
class GroupPlace:
    """A child's place in its group: ``slot`` in ``0..count-1``, ``start`` the number of
    earlier starts of that slot, and the pipe on which :meth:`serving` tells the supervisor."""

    slot: int
    start: int
    ready_fd: int

    def serving(self) -> None:
        """Tell the supervisor this child serves (a note far below PIPE_BUF: written whole)."""
        with contextlib.suppress(OSError):
            os.write(self.ready_fd, f"{self.slot}\n".encode())
            os.close(self.ready_fd)


def group_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The hidden options a supervisor gives its children (``group_slot``, ``group_start``,
    ``group_ready_fd``; :func:`group_place` makes them one value)."""
    fn = click.option("--group-slot", type=int, default=None, hidden=True)(fn)
    fn = click.option("--group-start", type=int, default=0, hidden=True)(fn)
    return click.option("--group-ready-fd", type=int, default=None, hidden=True)(fn)


def group_place(slot: int | None, start: int, ready_fd: int | None) -> GroupPlace | None:
    """A child's :class:`GroupPlace` from :func:`group_options`' values; None for a process
    that is no group's child."""
    if slot is None or ready_fd is None:
        return None
    return GroupPlace(slot, start, ready_fd)


@dataclass
class _Slot:
    index: int
    child: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    starts: int = 0
    delay: float = FIRST_DELAY
    restart_at: float | None = None
    #: Its current child said it serves.
    serving: bool = False


@dataclass
class Supervisor:
    """``count`` children of the command line ``argv`` (this process's arguments, without the
    program) with ``--processes 1`` and their :class:`GroupPlace` added (the last value of an
    option wins). ``serving`` is called once every slot's first child said it serves.
    ``name`` labels the supervisor's lines on standard error."""

    count: int
    argv: Sequence[str]
    name: str = "process"
    serving: Callable[[], None] | None = None
    _slots: list[_Slot] = field(default_factory=list)
    _stopping: bool = False
    _ready_read: int = -1
    _ready_write: int = -1
    _readies: set[int] = field(default_factory=set)
    _notes: bytes = b""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"a process group needs at least 1 process, got {self.count}")
        self._slots = [_Slot(i) for i in range(self.count)]

    @property
    def pids(self) -> list[int]:
        """The running children's pids."""
        return [slot.child.pid for slot in self._slots if slot.child is not None]

    def serve(self) -> int:
        """Run the group until SIGTERM or SIGINT (or a child that fails before it first served);
        then every child is told to stop and waited for. Returns 0 when every child's last
        exit was clean, else 1."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        failed = False
        self._ready_read, self._ready_write = os.pipe()
        os.set_blocking(self._ready_read, False)
        try:
            for slot in self._slots:
                self._start(slot)
            while not self._stopping or self.pids:
                self._count_readies()
                failed |= self._reap()
                if not self._stopping:
                    self._restart_due()
                # Not a sleep on an event loop: the supervisor runs none. Wakes early for a
                # readiness note; children's exits are polled at this pace.
                select.select([self._ready_read], [], [], 0.05)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(self._ready_read)
            os.close(self._ready_write)
        return 1 if failed else 0

    # ------------------------------------------------------------------ internals

    def _say(self, text: str) -> None:
        print(f"{self.name} supervisor: {text}", file=sys.stderr, flush=True)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Every child drains as a lone process would; a second signal is forwarded too (a
        # child told twice still stops once).
        self._stopping = True
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _count_readies(self) -> None:
        try:
            notes = os.read(self._ready_read, 4096)
        except BlockingIOError:
            return
        *lines, self._notes = (self._notes + notes).split(b"\n")
        before = len(self._readies)
        for line in lines:
            slot = self._slots[int(line)]
            self._readies.add(slot.index)
            if slot.child is not None and not slot.serving:
                slot.serving = True
                self._say(f"{self.name} {slot.index} (pid {slot.child.pid}) serving")
        if before < self.count == len(self._readies) and self.serving is not None:
            self.serving()

    def _start(self, slot: _Slot) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        argv = [
            sys.executable, "-m", "tabletstore.cli.main", *self.argv, "--processes", "1",
            "--group-slot", str(slot.index), "--group-start", str(slot.starts),
            "--group-ready-fd", str(self._ready_write),
        ]  # fmt: skip
        slot.child = subprocess.Popen(
            argv, pass_fds=(self._ready_write,), preexec_fn=_stop_with_parent
        )
        slot.started, slot.restart_at, slot.serving = monotonic(), None, False
        slot.starts += 1
        self._say(f"{self.name} {slot.index} started (pid {slot.child.pid})")

    def _reap(self) -> bool:
        """Collect exited children; True if one failed while stopping or before it served."""
        failed = False
        for slot in self._slots:
            if slot.child is None or (code := slot.child.poll()) is None:
                continue
            pid, slot.child = slot.child.pid, None
            how = f"exit status {code}" if code >= 0 else f"signal {-code}"
            if self._stopping:
                # SIGTERM's default action ends a child still starting: it had nothing to drain.
                failed |= code != 0 and (code != -signal.SIGTERM or slot.serving)
                self._say(f"{self.name} {slot.index} (pid {pid}) stopped ({how})")
                continue
            if slot.starts == 1 and slot.index not in self._readies:
                # It never served: a bad setting (store, port, certificate) that every
                # restart would meet again. The group ends as one process would.
                self._say(f"{self.name} {slot.index} (pid {pid}) failed to start ({how})")
                self._on_signal(signal.SIGTERM, None)
                failed = True
                continue
            lived = monotonic() - slot.started
            slot.delay = FIRST_DELAY if lived >= STEADY_SECONDS else slot.delay
            slot.restart_at = monotonic() + slot.delay
            self._say(
                f"{self.name} {slot.index} (pid {pid}) exited ({how}) after {lived:.1f}s; "
                f"restarting in {slot.delay:.1f}s"
            )
            slot.delay = min(MAX_DELAY, slot.delay * 2)
        return failed

    def _restart_due(self) -> None:
        now = monotonic()
        for slot in self._slots:
            if slot.child is None and slot.restart_at is not None and slot.restart_at <= now:
                self._start(slot)


#: prctl(2)'s option: the signal a process gets when its parent exits.
_PR_SET_PDEATHSIG = 1


def _stop_with_parent() -> None:
    """In a child before it runs the command: SIGTERM it when the supervisor exits, however
    it exits (SIGKILL included), so that it drains. Linux only; elsewhere children outlive a
    killed supervisor."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
