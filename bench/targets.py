"""What a benchmark runs against: a pluggable "target" (one database behind a small interface).

The §7 benchmarks (:mod:`bench.paper`) only ever call the :class:`Target` methods below, so the
same workload runs against

* ``file:///dir`` and ``memory://name``: the embedded tabletstore (master, one worker and the
  client in this process; requests still go client -> in-process transport -> worker);
* ``etcd://host:port/namespace``: a tabletstore cluster, through the same
  ``tabletstore.embedded.connect_async(url)`` client (object-store counters then live in the
  worker processes and are not reported here);
* ``cluster:N:file`` / ``cluster:N:moto``: a cluster of N worker processes this target starts
  and stops itself (:mod:`bench.cluster_target`; tables pre-split over the workers, object-store
  counters scraped from the workers' Prometheus endpoints);
* SlateDB (:mod:`bench.slatedb_target`), for the operations it has.

A target holds several *tables*, each a separate key space. Row keys and values are bytes; one
1000-byte value per row, in family ``f`` qualifier ``q`` (the paper's "single string under each
row key").

Contracts every target keeps: ``put``/``put_batch`` return only once the write is durable (the
paper's writes are acknowledged after the commit log); ``to_sstables`` leaves the table's data
in SSTables (minor + major compaction) with a cold block cache, so following reads go to the
object store as the paper's reads go to GFS; ``stats`` is a cumulative snapshot of object-store
requests, or None where the target cannot count them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tabletstore.clock import SystemClock
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.data.schema import ColumnFamily, LocalityGroup
from tabletstore.options import IN_PROCESS_LEASE, WorkerOptions
from tabletstore.storage_s3 import find_layer
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore, StoreStats

__all__ = ["FAMILY", "QUALIFIER", "TabletstoreTarget", "Target", "open_target", "row_key"]

FAMILY = "f"
QUALIFIER = b"q"


def row_key(i: int) -> bytes:
    """The paper's row names 0 .. R-1, zero-padded so byte order is numeric order."""
    return b"%010d" % i


class Target(Protocol):
    """One database under test (see the module docstring for the contracts)."""

    name: str

    async def create(self, table: str, *, in_memory: bool = False) -> None: ...

    async def put(self, table: str, key: bytes, value: bytes) -> None: ...

    async def put_batch(self, table: str, pairs: list[tuple[bytes, bytes]]) -> None: ...

    async def get(self, table: str, key: bytes) -> bytes | None: ...

    async def scan(self, table: str, start: bytes, end: bytes) -> int:
        """Values in ``[start, end)`` read with the target's scan API; returns their count."""
        ...

    async def flush(self, table: str) -> None:
        """Minor compaction: the memtable becomes an SSTable (counted as part of a write)."""
        ...

    async def to_sstables(self, tables: Sequence[str]) -> None: ...

    def stats(self) -> StoreStats | None: ...

    async def close(self) -> None: ...


@dataclass
class TabletstoreTarget:
    """tabletstore through its asyncio client (embedded for file:// and memory://)."""

    url: str
    block_cache_bytes: int = WorkerOptions().block_cache_bytes
    #: SSTable block size of the benchmark tables (None: the locality group default, 64 KiB).
    block_size: int | None = None
    name: str = "tabletstore"

    def __post_init__(self) -> None:
        self._db: Any = None
        self._tables: dict[str, Any] = {}
        self._embedded = not self.url.startswith("etcd://")
        # Counters survive reopening (each open builds a fresh instrumented store).
        self._carried = StoreStats()
        # memory:// databases are shared by name and must be reopened with the same clock.
        self._clock = SystemClock()

    async def open(self) -> None:
        if self._embedded:
            from tabletstore.embedded import Database

            self._db = await Database.open(
                self.url,
                clock=self._clock,
                instrument=True,
                worker_options=WorkerOptions(
                    lease=IN_PROCESS_LEASE,
                    block_cache_bytes=self.block_cache_bytes,
                ),
            )
        else:
            from tabletstore.embedded import connect_async

            # A cluster target over TLS (bench.cluster_target) names its client certificate.
            tls = getattr(self, "client_tls", None)
            self._db = await connect_async(self.url, tls=tls)
        self._tables = {name: self._db.table(name) for name in self._tables}

    async def create(self, table: str, *, in_memory: bool = False) -> None:
        if in_memory:
            self._tables[table] = await self._db.create_table(
                table,
                [ColumnFamily(name=FAMILY, locality_group="mem")],
                locality_groups=[LocalityGroup(name="mem", in_memory=True)],
            )
        elif self.block_size is not None:
            self._tables[table] = await self._db.create_table(
                table,
                [FAMILY],
                locality_groups=[LocalityGroup(name="default", block_size=self.block_size)],
            )
        else:
            self._tables[table] = await self._db.create_table(table, [FAMILY])

    async def put(self, table: str, key: bytes, value: bytes) -> None:
        await self._tables[table].mutate_row(key, [SetCell(FAMILY, QUALIFIER, value)])

    async def put_batch(self, table: str, pairs: list[tuple[bytes, bytes]]) -> None:
        await self._tables[table].mutate_rows(
            [RowMutation(k, (SetCell(FAMILY, QUALIFIER, v),)) for k, v in pairs]
        )

    async def get(self, table: str, key: bytes) -> bytes | None:
        row = await self._tables[table].read_row(key)
        return None if row is None else row.cells[0].value

    async def scan(self, table: str, start: bytes, end: bytes) -> int:
        n = 0
        async for row in self._tables[table].read_rows(start=start, end=end):
            n += len(row.cells)
        return n

    async def flush(self, table: str) -> None:
        await self._db.flush(table)

    async def to_sstables(self, tables: Sequence[str]) -> None:
        for table in tables:
            await self._db.flush(table)
            await self._db.compact(table)
        if self._embedded:
            # Reopen: a cold block cache, as if the reads came after a restart. In-memory
            # locality groups are loaded whole again when their tablets load (§6).
            self._carried = self.stats() or StoreStats()
            await self._db.close()
            await self.open()

    def _layer(self) -> InstrumentedObjectStore | None:
        store = getattr(self._db, "store", None)
        return None if store is None else find_layer(store, InstrumentedObjectStore)

    def stats(self) -> StoreStats | None:
        layer = self._layer()
        if layer is None:
            return None
        now = layer.stats()
        return StoreStats({op: self._carried[op] + now[op] for op in Op})

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None


async def open_target(
    spec: str,
    *,
    block_cache_bytes: int | None = None,
    block_size: int | None = None,
    slatedb_flush_interval: str | None = None,
    rows: int | None = None,
    mem_rows: int | None = None,
) -> Target:
    """A target from a spec: a tabletstore URL, ``cluster:N:file|moto`` (``rows`` and
    ``mem_rows``: the key spaces its tables are pre-split over), or ``slatedb:///dir`` (see
    the module docstring)."""
    if spec.startswith("slatedb://"):
        from bench.slatedb_target import SlateDBTarget

        sdb = SlateDBTarget(spec[len("slatedb://") :], flush_interval=slatedb_flush_interval)
        await sdb.open()
        return sdb
    if spec.startswith("cluster:"):
        from bench.cluster_target import ClusterTarget

        if rows is None or mem_rows is None:
            raise ValueError(f"{spec}: a cluster target needs rows= and mem_rows= to pre-split")
        cluster = ClusterTarget(
            spec,
            rows=rows,
            mem_rows=mem_rows,
            block_cache_bytes=block_cache_bytes or WorkerOptions().block_cache_bytes,
            block_size=block_size,
        )
        await cluster.open()
        return cluster
    if not spec.startswith(("file://", "memory://", "etcd://")):
        raise ValueError(
            f"unsupported target {spec!r}: expected file:///dir, memory://name, "
            "etcd://host:port/namespace, cluster:N:file, cluster:N:moto or slatedb:///dir"
        )
    target = TabletstoreTarget(
        spec,
        block_cache_bytes=block_cache_bytes or WorkerOptions().block_cache_bytes,
        block_size=block_size,
    )
    await target.open()
    return target
