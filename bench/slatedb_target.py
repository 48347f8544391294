"""SlateDB (PyPI ``slatedb``, the UniFFI binding of the Rust LSM on object storage) as a target.

Each table is its own SlateDB database under ``<directory>/<table>`` on SlateDB's local-file
object store (``ObjectStore.resolve("file:///")``), so it writes to the same disk as
tabletstore's ``file://`` target. Settings are SlateDB's defaults (notably ``flush_interval``
100 ms: a durable write waits for the next WAL flush, so throughput needs many writers in
flight, exactly as tabletstore's group commit does).

Mapping onto the :class:`~bench.targets.Target` contracts:

* ``put``: ``await db.put(k, v)`` then ``await handle.await_durable()`` (acknowledged once the
  WAL object is written, like tabletstore's commit log);
* ``put_batch``: one ``WriteBatch`` per call, then ``await_durable``;
* ``get``: ``await db.get(k)``; ``scan``: ``db.scan(KeyRange)`` drained with ``next_batch``;
* ``flush``/``to_sstables``: ``flush_with_options(MEM_TABLE)`` (SlateDB compacts L0 in the
  background; its binding has no major-compaction call), then the database is reopened so its
  block cache is cold;
* an "in-memory" table is simply never flushed, so its reads come from the memtable.

SlateDB's requests are not counted (``stats`` is None): the binding exposes no object-store
wrapper to count through.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["SlateDBTarget", "slatedb_available"]


def slatedb_available() -> bool:
    """True when the ``slatedb`` package (the ``bench`` extra) is importable."""
    try:
        import slatedb.uniffi  # noqa: F401
    except ImportError:
        return False
    return True


class SlateDBTarget:
    """SlateDB databases (one per table) in one local directory."""

    name = "slatedb"

    def __init__(self, directory: str, *, flush_interval: str | None = None) -> None:
        self.directory = os.path.abspath(directory)
        #: SlateDB's WAL ``flush_interval`` (e.g. "10ms"); None keeps its default (100 ms).
        self.flush_interval = flush_interval
        self._dbs: dict[str, Any] = {}
        self._store: Any = None
        self._in_memory: set[str] = set()

    async def open(self) -> None:
        import slatedb.uniffi as sdb

        os.makedirs(self.directory, exist_ok=True)
        self._store = sdb.ObjectStore.resolve("file:///")

    async def _build(self, table: str) -> Any:
        import slatedb.uniffi as sdb

        # Paths inside the file:/// store are relative to the filesystem root.
        path = os.path.join(self.directory, table).lstrip("/")
        builder = sdb.DbBuilder(path, self._store)
        if self.flush_interval is not None:
            settings = sdb.Settings.default()
            settings.set("flush_interval", json.dumps(self.flush_interval))
            builder.with_settings(settings)
        return await builder.build()

    async def create(self, table: str, *, in_memory: bool = False) -> None:
        if table in self._dbs:
            raise ValueError(f"SlateDB table {table!r} already exists")
        self._dbs[table] = await self._build(table)
        if in_memory:
            self._in_memory.add(table)

    async def put(self, table: str, key: bytes, value: bytes) -> None:
        handle = await self._dbs[table].put(key, value)
        await handle.await_durable()

    async def put_batch(self, table: str, pairs: list[tuple[bytes, bytes]]) -> None:
        import slatedb.uniffi as sdb

        batch = sdb.WriteBatch()
        for k, v in pairs:
            batch.put(k, v)
        handle = await self._dbs[table].write(batch)
        await handle.await_durable()

    async def get(self, table: str, key: bytes) -> bytes | None:
        value: bytes | None = await self._dbs[table].get(key)
        return value

    async def scan(self, table: str, start: bytes, end: bytes) -> int:
        import slatedb.uniffi as sdb

        it = await self._dbs[table].scan(
            sdb.KeyRange(start=start, start_inclusive=True, end=end, end_inclusive=False)
        )
        n = 0
        while batch := await it.next_batch(1000):
            n += len(batch)
        return n

    async def flush(self, table: str) -> None:
        import slatedb.uniffi as sdb

        await self._dbs[table].flush_with_options(
            sdb.FlushOptions(flush_type=sdb.FlushType.MEM_TABLE)
        )

    async def to_sstables(self, tables: Sequence[str]) -> None:
        for table in tables:
            if table in self._in_memory:
                continue  # Served from the memtable: SlateDB has no in-memory SSTables.
            await self.flush(table)
            await self._dbs[table].shutdown()
            self._dbs[table] = await self._build(table)

    def stats(self) -> None:
        return None

    async def close(self) -> None:
        for db in self._dbs.values():
            await db.shutdown()
        self._dbs.clear()
