"""A durable in-process coordinator for the embedded default (a local directory, no servers).

The embedded database keeps schemas and tablet records in its coordinator, so that
coordinator must survive a process crash: this is the in-process one
(:mod:`~tabletstore.coordination.memory`) plus a journal file. Every committed change to a key
*not* attached to a lease is appended to the journal and fsynced before the call returns;
lease-attached keys (servers, claims, elections) are deliberately not journaled, because
leases end with the process that held them — exactly what etcd does when a holder dies.

Journal format (``coordination.journal`` in the database directory), one JSON object a line::

    {"r": revision, "p": key, "v": base64 value}      a put
    {"r": revision, "d": key}                          a delete

A torn last line (the process died mid-write) is ignored; a malformed line elsewhere is
Corruption. On open the journal is replayed and then rewritten as a compact snapshot (write a
temporary file, fsync, rename), so it never grows without bound across restarts.

Only one process may open a directory at a time; an exclusive ``flock`` on the journal
enforces it with a clear error. That is why the embedded database opens it with
``leases_bound_to_process``: no other process can take its worker's tablets, so its worker's
lease ends with the process, never because a keep-alive came late (``coordination/lease.py``).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
from pathlib import Path
from typing import IO

from tabletstore.clock import Clock, SystemClock
from tabletstore.coordination.base import EventType, Put, WatchEvent
from tabletstore.coordination.memory import MemoryCoordinator, MemoryState
from tabletstore.errors import Corruption, PreconditionFailed

__all__ = ["LocalCoordinator", "open_local_coordinator"]

JOURNAL = "coordination.journal"


class _JournaledState(MemoryState):
    """A MemoryState that journals every change to lease-free keys."""

    def __init__(self, clock: Clock, journal: IO[str]) -> None:
        super().__init__(clock)
        self._journal = journal

    def _commit(self, revision: int, events: list[WatchEvent]) -> None:
        lines = []
        for e in events:
            if e.type is EventType.PUT and e.kv.lease_id == 0:
                value = base64.b64encode(e.kv.value).decode()
                lines.append(json.dumps({"r": revision, "p": e.kv.key, "v": value}))
            elif e.type is EventType.DELETE and (e.prev_kv is None or e.prev_kv.lease_id == 0):
                lines.append(json.dumps({"r": revision, "d": e.kv.key}))
            elif e.type is EventType.PUT and e.prev_kv is not None and e.prev_kv.lease_id == 0:
                # A journaled key re-put under a lease: it must not come back after a restart.
                lines.append(json.dumps({"r": revision, "d": e.kv.key}))
        if lines:
            self._journal.write("\n".join(lines) + "\n")
            self._journal.flush()
            os.fsync(self._journal.fileno())
        super()._commit(revision, events)


def _read_journal(path: Path) -> tuple[dict[str, bytes], int]:
    kvs: dict[str, bytes] = {}
    revision = 1
    if not path.exists():
        return kvs, revision
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            entry = json.loads(line)
            revision = max(revision, int(entry["r"]))
            if "p" in entry:
                kvs[entry["p"]] = base64.b64decode(entry["v"])
            else:
                kvs.pop(entry["d"], None)
        except (ValueError, KeyError, TypeError) as exc:
            if i == len(lines) - 1 or (i == len(lines) - 2 and lines[-1] == ""):
                break  # a torn last line: the write was never acknowledged
            raise Corruption(
                f"coordinator journal {path} line {i + 1} is malformed: {exc}"
            ) from exc
    return kvs, revision


class LocalCoordinator(MemoryCoordinator):
    """The in-process coordinator, made durable by a journal in ``directory``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        leases_bound_to_process: bool = False,
    ) -> None:
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        path = root / JOURNAL
        self._lock_file = open(root / (JOURNAL + ".lock"), "a")
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock_file.close()
            raise PreconditionFailed(
                f"database directory {root} is open in another process"
            ) from exc
        kvs, revision = _read_journal(path)
        # Rewrite the journal as a snapshot of the live keys, atomically.
        tmp = root / (JOURNAL + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for key, value in sorted(kvs.items()):
                f.write(
                    json.dumps({"r": revision, "p": key, "v": base64.b64encode(value).decode()})
                )
                f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        journal = open(path, "a", encoding="utf-8")
        state = _JournaledState(clock or SystemClock(), journal)
        for key, value in sorted(kvs.items()):
            state._put_key(Put(key, value), revision)
        state.revision = revision
        state.history_floor = revision + 1
        self._journal = journal
        super().__init__(
            state, url=f"file://{root}", leases_bound_to_process=leases_bound_to_process
        )

    async def close(self) -> None:
        await super().close()
        if not self._journal.closed:
            self._journal.close()
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()


def open_local_coordinator(directory: str, *, clock: Clock | None = None) -> LocalCoordinator:
    """The durable embedded coordinator of a database directory."""
    return LocalCoordinator(directory, clock=clock)
