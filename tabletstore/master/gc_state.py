"""The garbage collector's memory across masters: when each held object was found deletable.

The master's collector deletes an object only once it has found it deletable for a whole grace
period (the dereference grace, :mod:`tabletstore.master.gc_plan`): a reader that took a tablet's
state before a compaction may still read what the compaction replaced. That memory (the
planner's ``since`` map) lived in the leading master's process, so every new leader started
from nothing and waited a whole grace period again. In a cluster whose master moves more often
than once a grace period (a rolling restart, a flapping network), nothing was ever collected.
The paper's master keeps no such state (§5.2: it rebuilds its view from Chubby and METADATA at
start); this is what collection needs from one master to the next.

So the leader saves the map after every collection, as the next version of a small object
(``gc/since/<version>.json.gz``, :func:`tabletstore.storage_s3.layout.gc_state_key`), and a master
that starts leading adopts the newest version if it was saved less than a grace period ago.

Why an adopted time is safe. An entry says: a collector found this key deletable at time
``t``, from a listing and mark of its own (:mod:`tabletstore.master.gc`). Every time is a wall
clock reading of the master that made it; the grace period's clock contract (skew small next
to the grace) already covers the masters' clocks. A key deletable at ``t`` was dereferenced
before ``t``, so a reader that took a tablet's state before the dereference has had
``now - t`` seconds when the new leader compares the entry with ``grace``, whichever master
measured ``t``. The new leader uses an entry only for a key its own plan finds deletable again
(the planner ignores the map for every other key), so an entry never deletes what a record,
a live log, a snapshot or a backup now needs. Between two observations, by one master or by
two, at most a grace period passes (older saves are not adopted): the same gap a single
master's rounds allow when it loses and regains the lead.

A deposed master that still saves (it has not yet seen its lease end) writes times it did
measure; two masters saving the same version collide on the create-only PUT and one save is
skipped. Losing a save, or failing to read one, costs only time: the leader starts the grace
over, as before. The format is JSON, gzip-compressed: ``{"format": 1, "saved_at": t,
"since": {key: t}}``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tabletstore.errors import Corruption, InvalidArgument, PreconditionFailed, TabletStoreError
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["FORMAT", "GcMemory", "SavedSince", "decode", "encode"]

log = logging.getLogger(__name__)

#: The version of the saved map's format this build writes and reads.
FORMAT = 1


@dataclass(frozen=True, slots=True)
class SavedSince:
    """One saved version: when it was saved and the map (key -> first found deletable)."""

    saved_at: float
    since: Mapping[str, float]


def encode(saved: SavedSince) -> bytes:
    """The object's bytes for ``saved``."""
    doc = {"format": FORMAT, "saved_at": saved.saved_at, "since": dict(saved.since)}
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), mtime=0)


def decode(data: bytes, *, name: str) -> SavedSince:
    """The inverse of :func:`encode`; Corruption naming ``name`` for anything else."""
    try:
        doc = json.loads(gzip.decompress(data))
    except (OSError, EOFError, ValueError) as exc:
        raise Corruption(f"collector state {name} is not gzip-compressed JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise Corruption(f"collector state {name} has format {found!r}, expected {FORMAT}")
    saved_at, since = doc.get("saved_at"), doc.get("since")
    if not isinstance(saved_at, (int, float)) or not _is_time(saved_at):
        raise Corruption(f"collector state {name} lacks a saved_at time")
    if not isinstance(since, dict):
        raise Corruption(f"collector state {name} lacks a since map")
    bad = next((k for k, t in since.items() if not _is_time(t)), None)
    if bad is not None:
        raise Corruption(f"collector state {name} has no valid time for {bad!r}")
    return SavedSince(float(saved_at), {k: float(t) for k, t in since.items()})


def _is_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class GcMemory:
    """The saved versions of one bucket's collector state, read and written by the leader.

    Never raises a TabletStoreError: a state that cannot be read or saved is logged and
    costs only time (see the module docstring)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        #: The newest version this process knows of (read or written); None: not known.
        self._version: int | None = None

    async def _newest(self) -> int | None:
        """The newest saved version (0: none yet), remembered; None if it cannot be listed."""
        try:
            versions = [
                layout.parse_gc_state_key(info.key)
                async for info in self._store.list(layout.gc_state_prefix())
            ]
        except InvalidArgument as exc:
            log.warning("collector state: an unexpected key: %s", exc)
            return None
        except TabletStoreError as exc:
            log.warning("collector state could not be listed: %s", exc)
            return None
        self._version = max(versions, default=0)
        return self._version

    async def adopt(self, now: float, max_age: float) -> dict[str, float]:
        """The newest saved map if it was saved less than ``max_age`` before ``now`` (or
        after it by less than that: clocks differ), else empty."""
        newest = await self._newest()
        if not newest:
            return {}
        key = layout.gc_state_key(newest)
        try:
            data = await self._store.get(key)
            if data is None:
                return {}  # replaced meanwhile: another master saves; start the grace over
            saved = await asyncio.to_thread(decode, data, name=key)
        except TabletStoreError as exc:
            log.warning("collector state %s not adopted: %s", key, exc)
            return {}
        age = now - saved.saved_at
        if not -max_age < age < max_age:
            log.info("collector state %s is %.0f s old; not adopted", key, age)
            return {}
        log.info("adopted collector state %s: %d held objects", key, len(saved.since))
        return dict(saved.since)

    async def save(self, since: Mapping[str, float], now: float) -> None:
        """Save ``since`` as the next version and delete the one before it (garbage
        collection deletes any older version a failed delete left, gc_plan rule 11)."""
        current = self._version if self._version is not None else await self._newest()
        if current is None:
            return
        key = layout.gc_state_key(current + 1)
        try:
            # Off the event loop: a map of 100,000 keys takes a while to encode.
            data = await asyncio.to_thread(encode, SavedSince(now, dict(since)))
            await self._store.create(key, data)
        except PreconditionFailed:
            # Another master saved this version: list again before the next save.
            self._version = None
            return
        except TabletStoreError as exc:
            log.warning("collector state %s not saved: %s", key, exc)
            self._version = None
            return
        self._version = current + 1
        if current:
            try:
                await self._store.delete(layout.gc_state_key(current))
            except TabletStoreError as exc:
                log.warning("old collector state not deleted (garbage collection will): %s", exc)
