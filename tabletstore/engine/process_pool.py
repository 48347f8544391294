"""Process pools whose processes end with the process that made them (§5.4, §6: the worker's
compactions and the master's sorters run in pools of processes).

A ``ProcessPoolExecutor`` process waits on its call queue, whose pipe it holds both ends of,
so it never sees the end of a parent that was SIGKILLed: it, and the forkserver it came from
(which stays while any of its children holds its keep-alive pipe), would outlive a killed
worker forever, one pair per kill. :func:`process_pool` starts each pool process with a
watcher thread that ends it (``os._exit``) once the process that made the pool is gone.
forkserver, never fork: the processes that make pools run threads.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import threading

from tabletstore.pid_liveness import alive

__all__ = ["WATCH_INTERVAL", "process_pool"]

#: Seconds between a pool process's checks that its owner is still there.
WATCH_INTERVAL = 1.0


def process_pool(max_workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """A forkserver process pool whose processes exit once this process is gone."""
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=max_workers,
        mp_context=multiprocessing.get_context("forkserver"),
        initializer=_watch_owner,
        initargs=(os.getpid(),),
    )


def _watch_owner(owner: int) -> None:
    """In a pool process: start the thread that ends this process when ``owner`` is gone."""
    threading.Thread(target=_exit_when_gone, args=(owner,), daemon=True, name="owner").start()


def _exit_when_gone(owner: int) -> None:
    pause = threading.Event()
    while alive(owner):
        pause.wait(WATCH_INTERVAL)
    os._exit(0)
