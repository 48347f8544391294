"""Process pools whose processes end with the process that made them (§5.4, §6: the worker's
compactions and the master's sorters run in pools of processes).

A ``ProcessPoolExecutor`` process waits on its call queue, whose pipe it holds both ends of,
so it never sees the end of a parent that was SIGKILLed: it, and the forkserver it came from
(which stays while any of its children holds its keep-alive pipe), would outlive a killed
worker forever, one pair per kill. :func:`process_pool` starts each pool process with a
watcher thread that ends it (``os._exit``) once the process that made the pool is gone.
forkserver, never fork: the processes that make pools run threads.

A pool may run its processes at a lower CPU priority (``nice``): the worker's compaction
processes do (``WorkerOptions.compaction_nice``), so that on a host whose cores are all busy the
requests the worker serves get them first, and its compactions take what is left. Where the
kernel groups processes by session for scheduling (Linux's autogroup,
``/proc/sys/kernel/sched_autogroup_enabled``, on by default on most distributions), a process's
nice value only orders it against the processes of its own session: a session's processes
together get the same share of the CPU as another session's (sched(7)). A worker runs in a
session of its own under most supervisors, so its compactions, niced within it, took their
worker's share from its requests and an equal share against every other server on the host
(the other workers, the master, etcd, the clients). So a pool process with ``nice`` starts a
session of its own (``os.setsid``) and gives that session's group the same nice value
(``/proc/self/autogroup``): background work against every process on the host. It still ends
with its owner (the watcher below), not with its owner's process group.

A pool process that dies (the OOM killer, a ``kill -9``) breaks a ``ProcessPoolExecutor`` for
good: the calls it was running and every call after fail with ``BrokenProcessPool``.
:class:`ProcessPool` replaces a broken pool with a new one and runs the calls the dead process
took down once more there (the work given to it is a pure function of its arguments, so running
it twice is harmless); a call that breaks its second pool as well fails with Unavailable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from tabletstore.errors import Unavailable
from tabletstore.pid_liveness import alive

__all__ = ["WATCH_INTERVAL", "ProcessPool", "autogroup_enabled", "process_pool"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between a pool process's checks that its owner is still there.
WATCH_INTERVAL = 1.0


def process_pool(max_workers: int, *, nice: int = 0) -> concurrent.futures.ProcessPoolExecutor:
    """A forkserver process pool whose processes exit once this process is gone, each run
    ``nice`` steps below this process's CPU priority (``os.nice``: background work)."""
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=max_workers,
        mp_context=multiprocessing.get_context("forkserver"),
        initializer=_start,
        initargs=(os.getpid(), nice),
    )


class ProcessPool(concurrent.futures.Executor):
    """A :func:`process_pool` that replaces itself when a process of it dies (module
    docstring): what :meth:`run` runs survives the loss of one pool."""

    def __init__(self, max_workers: int, *, name: str = "process", nice: int = 0) -> None:
        self._max_workers = max_workers
        self._name = name
        self._nice = nice
        self._pool = process_pool(max_workers, nice=nice)
        self._shut = False
        #: Pools replaced because a process of theirs died.
        self.renewals = 0

    @property
    def pool(self) -> concurrent.futures.ProcessPoolExecutor:
        """The pool calls go to now."""
        return self._pool

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a pool process; run again in a new pool if its process dies."""
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            pool = self._pool
            try:
                return await loop.run_in_executor(pool, fn)
            except concurrent.futures.BrokenExecutor as exc:
                if self._shut:
                    raise Unavailable(f"the {self._name} pool is shut down") from exc
                self._renew(pool, exc)
                if attempt == 2:
                    raise Unavailable(
                        f"a {self._name} process died running this call twice ({exc}); "
                        "the pool is replaced, the call may be tried again"
                    ) from exc
        raise AssertionError("unreachable")

    def _renew(self, broken: concurrent.futures.ProcessPoolExecutor, exc: BaseException) -> None:
        if self._pool is not broken:
            return  # another call renewed it already
        log.warning("a %s process died (%s): replacing the pool", self._name, exc)
        self._pool = process_pool(self._max_workers, nice=self._nice)
        self.renewals += 1
        broken.shutdown(wait=False, cancel_futures=True)

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """Submit to the current pool (no replacement: :meth:`run` is what survives one)."""
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._shut = True
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)


#: Where Linux's scheduler groups a session's processes (module docstring), if it does.
AUTOGROUP = "/proc/self/autogroup"


def _start(owner: int, nice: int) -> None:
    """In a pool process: lower its CPU priority by ``nice`` (module docstring: in a session
    and scheduling group of its own where the kernel groups by session) and start the thread
    that ends it when ``owner`` is gone."""
    if nice > 0:
        os.nice(nice)
        _background_group(nice)
    threading.Thread(target=_exit_when_gone, args=(owner,), daemon=True, name="owner").start()


def _background_group(nice: int) -> None:
    """Where the kernel schedules by session groups, move this process to a session of its
    own and lower that group's priority by ``nice``; elsewhere do nothing."""
    if not autogroup_enabled():
        return
    try:
        os.setsid()
        with open(AUTOGROUP, "w") as group:
            group.write(str(min(19, nice)))
    except OSError as exc:  # a leader of its group already, or /proc read-only: nice alone
        log.debug("no scheduling group of its own for a pool process: %s", exc)


def autogroup_enabled() -> bool:
    """Whether Linux's scheduler groups processes by session here (sched(7), "autogroup")."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1" and os.path.exists(AUTOGROUP)
    except OSError:
        return False


def _exit_when_gone(owner: int) -> None:
    pause = threading.Event()
    while alive(owner):
        pause.wait(WATCH_INTERVAL)
    os._exit(0)
