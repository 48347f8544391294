"""The benchmark target for a tabletstore cluster on this machine (§7's "N servers").

``cluster:N:file``, ``cluster:N:moto`` and ``cluster:N:seaweedfs`` start, in a fresh temporary
directory, the local stack of :mod:`tabletstore.cli.localstack` with ``N`` tablet-server workers
as real processes (etcd, a master, the workers; with ``moto`` also moto's S3 server, which then
is the object store, in memory; with ``seaweedfs`` SeaweedFS's S3 server, its data on disk
under the directory; with ``file`` the store is a directory, ``file:///<tmp>/store``). The benchmark client
is this process, through :func:`tabletstore.embedded.connect_async` on the stack's
``etcd://`` URL: every request crosses a process boundary, as in the paper's cluster.

Contracts (on top of :mod:`bench.targets`'):

* ``cluster:NxP:...``: each of the N workers is a group of P processes (``worker
  --processes P``, ``local-stack up --worker-processes``), and tables get ``2 * N * P``
  tablets;
* every table is created pre-split into ``2 * N`` tablets at equal steps of the key space the
  benchmark writes (:func:`bench.targets.row_key` ``0 .. rows-1``; ``mem_rows`` for the
  in-memory table), so the master spreads the load over all workers (§5.2 assigns tablets,
  not rows);
* :meth:`ClusterTarget.stats` sums the ``tabletstore_object_store_{requests,bytes}_total``
  counters of every worker's Prometheus endpoint (the workers run with ``--metrics-port 0``
  and print its URL in their log); the master's own store traffic (GC, its METADATA reads go
  through workers) is not included;
* :meth:`ClusterTarget.close` always stops the stack (:func:`tabletstore.cli.localstack.down`
  stops exactly the processes it started, by pid) and removes the directory.

Each worker's block cache is ``block_cache_bytes`` (``--block-cache-bytes``; the benchmark's
scaled cache, as the embedded target's). Unlike the embedded target, ``to_sstables`` does not
restart the workers; the blocks of the SSTables a major compaction writes are in no cache
until first read, so the reads that follow still start cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench.targets import FAMILY, TabletstoreTarget, row_key
from tabletstore.cli import localstack
from tabletstore.data.schema import ColumnFamily, LocalityGroup
from tabletstore.errors import InvalidArgument, Unavailable
from tabletstore.options import WorkerOptions
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.instrumented import OpStats, StoreStats

__all__ = [
    "ClusterTarget",
    "children_of",
    "cpu_seconds",
    "descendants_of",
    "parse_cluster_spec",
    "processes_of",
    "scrape_store_stats",
    "split_keys",
]

STORES = ("file", "moto", "seaweedfs")
#: Seconds to wait for a worker to print its metrics URL after it started serving.
METRICS_DEADLINE = 30.0
#: The workers' lease (``--lease-ttl``), long: no failure is measured here.
LEASE_TTL = 20.0
#: Seconds the first table's creation waits for the cluster to serve METADATA.
CREATE_DEADLINE = 120.0
_METRICS_LINE = re.compile(r"metrics on (\S+)/metrics")
_SAMPLE = re.compile(
    r'^tabletstore_object_store_(requests|bytes)_total\{op="([A-Z_]+)"\}\s+(\S+)$', re.M
)


def parse_cluster_spec(spec: str) -> tuple[int, str]:
    """``cluster:N:file`` / ``cluster:N:moto`` (``:tls`` appended: the stack over mutual TLS,
    ``local-stack up --tls``) -> (N, store kind); InvalidArgument otherwise. ``N`` may be
    ``NxP``: N workers of P processes each (:func:`processes_of`)."""
    parts = spec.removesuffix(":tls").split(":")
    count = parts[1].split("x", 1)[0] if len(parts) == 3 else ""
    if len(parts) != 3 or parts[0] != "cluster" or not count.isdigit() or parts[2] not in STORES:
        raise InvalidArgument(
            f"bad cluster target {spec!r}: expected cluster:N:file, cluster:N:moto or "
            "cluster:N:seaweedfs (N >= 1, or NxP: P processes per worker)"
        )
    workers = int(count)
    if workers < 1 or processes_of(spec) < 1:
        raise InvalidArgument(f"bad cluster target {spec!r}: cluster:N:file needs N >= 1")
    return workers, parts[2]


def processes_of(spec: str) -> int:
    """P of ``cluster:NxP:...`` (each worker a group of P processes, ``worker --processes``),
    else 1."""
    count = spec.split(":")[1] if spec.count(":") >= 2 else ""
    _, _, processes = count.partition("x")
    if not processes:
        return 1
    if not processes.isdigit():
        raise InvalidArgument(f"bad cluster target {spec!r}: NxP needs a number P")
    return int(processes)


def split_keys(rows: int, tablets: int) -> list[bytes]:
    """Keys cutting ``row_key(0 .. rows-1)`` into ``tablets`` near-equal ranges (none empty)."""
    tablets = max(1, min(tablets, rows))
    return [row_key(rows * t // tablets) for t in range(1, tablets)]


def scrape_store_stats(metrics_text: str) -> StoreStats:
    """Object-store counters from one worker's Prometheus exposition text."""
    requests: dict[Op, int] = {}
    nbytes: dict[Op, int] = {}
    for what, op_name, value in _SAMPLE.findall(metrics_text):
        try:
            op = Op(op_name)
        except ValueError:
            continue  # a kind this bench does not report
        (requests if what == "requests" else nbytes)[op] = int(float(value))
    return StoreStats(
        {op: OpStats(requests.get(op, 0), nbytes.get(op, 0)) for op in set(requests) | set(nbytes)}
    )


def _metrics_urls(log: str, processes: int, deadline: float) -> list[str]:
    """The /metrics URLs the ``processes`` processes of a worker printed in ``log``."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            found = _METRICS_LINE.findall(Path(log).read_text(errors="replace"))
        except OSError:
            found = []
        if len(set(found)) >= processes:
            return [f"{url}/metrics" for url in dict.fromkeys(found)]
        time.sleep(0.1)
    raise Unavailable(f"not {processes} 'metrics on URL' lines in {log} within {deadline}s")


def _fetch(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        body: bytes = response.read()
    return body.decode()


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` and the processes below it used so far
    (a running child's own counters: a parent's count its children only once they exit)."""
    total = 0.0
    for one in (pid, *descendants_of(pid)):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{one}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def children_of(pid: int) -> list[int]:
    """The running processes whose parent is ``pid`` (from /proc)."""
    return _parents().get(pid, [])


def descendants_of(pid: int) -> list[int]:
    """The running processes below ``pid``: its children, theirs, and so on (a worker's
    compaction processes are children of its forkserver)."""
    parents = _parents()
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _parents() -> dict[int, list[int]]:
    """Parent pid -> its running children's pids (from /proc)."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            out.setdefault(parent, []).append(int(entry.name))
    return out


class ClusterTarget(TabletstoreTarget):
    """A local cluster of ``workers`` worker processes (see the module docstring)."""

    def __init__(
        self,
        spec: str,
        *,
        rows: int,
        mem_rows: int,
        block_cache_bytes: int = WorkerOptions().block_cache_bytes,
        block_size: int | None = None,
        worker_args: Sequence[str] = (),
        master_args: Sequence[str] = (),
        lease_ttl: float = LEASE_TTL,
    ) -> None:
        self.workers, self.store_kind = parse_cluster_spec(spec)
        #: Appended to every worker's arguments (e.g. ``--split-bytes``).
        self.worker_args = tuple(worker_args)
        #: Appended to the master's arguments (e.g. ``--gc-grace``).
        self.master_args = tuple(master_args)
        self.lease_ttl = lease_ttl
        #: The stack once it is up (its process records: roles, pids, logs).
        self.stack: localstack.Stack | None = None
        self.processes = processes_of(spec)
        super().__init__(
            url="", block_cache_bytes=block_cache_bytes, block_size=block_size, name=spec
        )
        self._embedded = False  # the URL is the stack's etcd:// one, known once it is up
        self.rows = rows
        self.mem_rows = mem_rows
        self._dir: Path | None = None
        self._metrics_urls: list[str] = []
        self._pids: list[int] = []
        self.tls = spec.endswith(":tls")
        self._ssl: ssl.SSLContext | None = None

    async def open(self) -> None:
        fresh = self._dir is None
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="tabletstore-bench-cluster-"))
            try:
                await self._start(self._dir)
            except BaseException:
                await self.close()  # whatever did start is stopped
                raise
        await super().open()
        if fresh:
            await self._all_workers_registered()

    async def _all_workers_registered(self) -> None:
        """Wait until every worker process has registered: a port answers before its process
        registers, and tables created meanwhile would all go to the first ones, then move
        (balancing) in the middle of a benchmark."""
        want = self.workers * self.processes
        end = time.monotonic() + CREATE_DEADLINE
        while True:
            with contextlib.suppress(Unavailable):
                if len((await self._db.status()).workers) >= want:
                    return
            if time.monotonic() > end:
                raise Unavailable(f"not {want} workers registered within {CREATE_DEADLINE}s")
            await asyncio.sleep(0.5)

    async def _start(self, directory: Path) -> None:
        store_url = f"file://{directory / 'store'}" if self.store_kind == "file" else None
        stack = await asyncio.to_thread(
            localstack.up,
            directory,
            workers=self.workers,
            store_url=store_url,
            s3="seaweedfs" if self.store_kind == "seaweedfs" else "moto",
            tls=self.tls,
            worker_processes=self.processes,
            worker_args=(
                # A loaded machine stalls processes for seconds; a worker that loses its lease
                # mid-benchmark would restart (a group's process) or end the run.
                "--lease-ttl",
                str(self.lease_ttl),
                "--metrics-port",
                "0",
                "--block-cache-bytes",
                str(self.block_cache_bytes),
                *self.worker_args,
            ),
            master_args=self.master_args,
        )
        self.stack = stack
        assert stack.cluster_url is not None  # workers >= 1
        self.url = stack.cluster_url
        self.client_tls = stack.tls("client")
        self._ssl = self.client_tls.client_context() if self.client_tls is not None else None
        self._pids = [record.pid for record in stack.processes]
        self._metrics_urls = [
            url
            for record in stack.processes
            if record.role.startswith("worker-")
            for url in await asyncio.to_thread(
                _metrics_urls, record.log, record.processes, METRICS_DEADLINE
            )
        ]

    async def create(self, table: str, *, in_memory: bool = False) -> None:
        # A stack just up may not serve the root tablet yet (the master assigns it once the
        # workers register): the first create waits for it.
        end = time.monotonic() + CREATE_DEADLINE
        while True:
            try:
                await self._create(table, in_memory=in_memory)
                return
            except Unavailable:
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.5)

    async def _create(self, table: str, *, in_memory: bool = False) -> None:
        splits = split_keys(
            self.mem_rows if in_memory else self.rows, 2 * self.workers * self.processes
        )
        if in_memory:
            self._tables[table] = await self._db.create_table(
                table,
                [ColumnFamily(name=FAMILY, locality_group="mem")],
                split_keys=splits,
                locality_groups=[LocalityGroup(name="mem", in_memory=True)],
            )
        elif self.block_size is not None:
            self._tables[table] = await self._db.create_table(
                table,
                [FAMILY],
                split_keys=splits,
                locality_groups=[LocalityGroup(name="default", block_size=self.block_size)],
            )
        else:
            self._tables[table] = await self._db.create_table(table, [FAMILY], split_keys=splits)

    async def to_sstables(self, tables: Sequence[str]) -> None:
        for table in tables:
            await self._db.flush(table)
            await self._db.compact(table)

    def stats(self) -> StoreStats | None:
        total = StoreStats()
        for url in self._metrics_urls:
            one = scrape_store_stats(_fetch(url, self._ssl))
            total = StoreStats({op: total[op] + one[op] for op in Op})
        return total if self._metrics_urls else None

    def server_cpu_seconds(self) -> float:
        """CPU seconds (user + system) the stack's processes (etcd, master, workers, and the
        processes of a worker group) used so far, from /proc: the cost of the benchmark on
        the servers' side."""
        return sum(cpu_seconds(pid) for pid in self._pids)

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._dir is not None:
                directory, self._dir = self._dir, None
                try:
                    if (directory / localstack.STACK_FILE).exists():  # up() got that far
                        await asyncio.to_thread(localstack.down, directory)
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
