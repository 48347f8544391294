"""A real cluster for integration tests: master(s) and workers as ``tabletstore`` processes.

:class:`Cluster` starts processes with the local stack's helpers
(:func:`tabletstore.cli.localstack.start_master` / ``start_worker``: ``python -m tabletstore.cli.main``
in their own session, output to ``<dir>/<role>.log``) against an etcd namespace and a bucket
the test fixtures provide, and keeps every :class:`~tabletstore.cli.localstack.ProcessRecord` it
started. It stops them only by pid (and only while the pid still runs the recorded command),
so :meth:`Cluster.close` leaves nothing behind even after a failed test.

Also here: a history of writes (:class:`WriteHistory`) for checking acknowledged writes after
a crash, treating an ambiguous outcome as "may have happened" (docs/architecture/conventions.md
convention 13), and polling with a deadline (:func:`eventually`) instead of bare sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tabletstore import connect_async
from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.client import AsyncClient, ClusterStatus
from tabletstore.metadata.rows import METADATA_TABLE_ID, table_range
from tabletstore.testing.processes import ProcessGroup
from tests.plugins.s3_server import boto3_client

T = TypeVar("T")

#: Seconds a process may take to listen once spawned: an interpreter's start (about a second of
#: CPU) stretches to half a minute at load 20 on 2 cores, past the local stack's own deadline.
START_DEADLINE = 120.0
#: Seconds a new cluster may take to serve METADATA (a master elected, the root tablet and a
#: METADATA tablet loaded): seconds on a quiet machine, up to a minute at load 20.
SERVING_DEADLINE = 120.0

#: moto accepts any credentials; the spawned processes must not look for real ones.
PROCESS_ENV = {
    "AWS_ACCESS_KEY_ID": localstack.MOTO_CREDENTIALS[0],
    "AWS_SECRET_ACCESS_KEY": localstack.MOTO_CREDENTIALS[1],
    "AWS_DEFAULT_REGION": "us-east-1",
    "PYTHONUNBUFFERED": "1",
}


@dataclass
class Cluster(ProcessGroup):
    """A master, standbys and workers as real processes sharing one etcd namespace and bucket;
    crash, pause, resume and stop them with :class:`~tabletstore.testing.processes.ProcessGroup`'s
    methods."""

    url: str
    store_url: str
    directory: Path
    lease_ttl: float = 3.0
    #: Every process serves its status page and /metrics on a free port (record.metrics_url).
    metrics: bool = False
    records: list[ProcessRecord] = field(default_factory=list)
    _numbers: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def on(
        cls, etcd_server: str, s3_server: str, directory: Path, prefix: str, **settings: Any
    ) -> Cluster:
        """A cluster (no process started yet) in a fresh etcd namespace and a fresh bucket of
        the session's etcd and S3 servers, both named ``<prefix>-<random>``."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        boto3_client(s3_server).create_bucket(Bucket=name)
        return cls(
            url=f"etcd://{etcd_server}/{name}",
            store_url=f"s3://{name}/data?endpoint_url={s3_server}&region=us-east-1",
            directory=directory,
            **settings,
        )

    # ------------------------------------------------------------------ starting

    def start_master(
        self, *, lease_ttl: float | None = None, extra_args: Sequence[str] = ()
    ) -> ProcessRecord:
        """A master process; the first one leads, later ones are standbys. ``extra_args`` go
        to the ``master`` verb."""
        role = f"master-{next(self._numbers)}"
        ttl = lease_ttl or self.lease_ttl
        record = localstack.start_master(
            self.directory,
            self.url,
            self.store_url,
            env=PROCESS_ENV,
            role=role,
            extra_args=("--lease-ttl", str(ttl), *extra_args),
            deadline=START_DEADLINE,
            metrics=self.metrics,
        )
        self.records.append(record)
        return record

    def start_worker(
        self,
        *,
        lease_ttl: float | None = None,
        split_bytes: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> ProcessRecord:
        """A worker process serving on a free loopback port (``extra_args`` go to the
        ``worker`` verb)."""
        args = ["--lease-ttl", str(lease_ttl or self.lease_ttl), *extra_args]
        if split_bytes is not None:
            args += ["--split-bytes", str(split_bytes)]
        record = localstack.start_worker(
            self.directory,
            self.url,
            next(self._numbers),
            env=PROCESS_ENV,
            extra_args=args,
            deadline=START_DEADLINE,
            metrics=self.metrics,
        )
        self.records.append(record)
        return record

    def wait_serving(self, *, deadline: float = SERVING_DEADLINE) -> None:
        """Block until the cluster serves METADATA: the root tablet answers a read and the
        METADATA tablet it names has a location, which every table creation or lookup needs
        first; and until every running worker this cluster started is registered (a worker
        listens before it warms up and takes its lease, so a test that counted workers right
        after they listen would miss one on a loaded machine). A test that assumed either
        instead would fail on a client's own deadline on a loaded machine, where a fresh
        cluster takes longer than that to get there. (Callable from a test's event loop: the
        wait runs on its own, in a thread.)"""
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, self._serving(deadline)).result()

    async def _serving(self, deadline: float) -> None:
        client = await connect_async(self.url)
        try:
            row = table_range("any-table")[1]  # a METADATA row key past the root's range
            await eventually(
                lambda: client.locations.locate(METADATA_TABLE_ID, row, refresh=True),
                deadline=deadline,
                what="the cluster serving METADATA",
            )
            await eventually(
                lambda: self._all_registered(client),
                deadline=deadline,
                what="every worker registered",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None
        finally:
            await client.close()

    async def _all_registered(self, client: AsyncClient) -> bool:
        running = {r.url for r in self.alive() if r.role.startswith("worker")}
        listed = {getattr(w, "address", None) for w in (await client.status()).workers.values()}
        return running <= listed

    # ------------------------------------------------------------------ stopping

    def terminate(self, record: ProcessRecord, *, deadline: float = 30.0) -> bool:
        """SIGTERM (a clean stop), SIGKILL after ``deadline``; True if it exited by itself."""
        assert record in self.records, "only processes this cluster started"
        started = time.monotonic()
        localstack.stop(record, deadline=deadline)
        return time.monotonic() - started < deadline


# ---------------------------------------------------------------------------- observing


async def eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    deadline: float,
    what: str,
    interval: float = 0.2,
) -> T:
    """Poll ``check`` until it returns something other than None/False; fail after
    ``deadline`` seconds saying ``what`` was awaited (and the last value or error seen)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    last: object = None
    while True:
        try:
            value = await check()
            if value is not None and value is not False:
                return value
            last = value
        except Exception as exc:  # reported below if the deadline passes; polling goes on
            last = exc
        if loop.time() > end:
            raise AssertionError(f"not within {deadline}s: {what} (last: {last!r})")
        await asyncio.sleep(interval)


async def rejoined_or_gone(client: AsyncClient, record: ProcessRecord, old_id: str) -> bool:
    """Whether a worker whose lease ended has stopped serving as ``old_id``: no worker of that
    id is listed, and its process either exited or serves again under a new id at its
    address (a worker rejoins by default, ``--no-rejoin`` exits)."""
    from tabletstore.testing.processes import gone

    workers = (await client.status()).workers
    if old_id in workers:
        return False
    again = any(getattr(w, "address", None) == record.url for w in workers.values())
    return again or gone(record.pid)


def placement(status: ClusterStatus, table_id: str | None = None) -> dict[str, set[str]]:
    """worker id -> ids of the tablets it serves (of ``table_id`` only, when given); a worker
    that did not answer its status call maps to an empty set."""
    out: dict[str, set[str]] = {}
    for worker_id, ws in status.workers.items():
        if isinstance(ws, str):
            out[worker_id] = set()
            continue
        out[worker_id] = {
            t.tablet_id for t in ws.tablets if table_id is None or t.table_id == table_id
        }
    return out


async def table_id_of(client: AsyncClient, name: str) -> str:
    """The table's id, as workers report it (``status``)."""
    return (await client._info(name)).table_id


# ---------------------------------------------------------------------------- write histories


@dataclass
class WriteHistory:
    """Outcomes of writes of distinct rows, for checking what reads back after faults.

    Each write is :meth:`begin` (row and value) then :meth:`ack` or :meth:`fail`. An acked
    write must be readable with its value. A write that failed with an error whose
    ``may_have_applied`` is true (``Indeterminate``) may or may not be there. Any other error
    promises the write was not applied (errors.py), so its row must be absent; a row never
    written must be absent too."""

    values: dict[bytes, bytes] = field(default_factory=dict)
    acked: set[bytes] = field(default_factory=set)
    maybe: set[bytes] = field(default_factory=set)
    rejected: set[bytes] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=dict)

    def begin(self, row: bytes, value: bytes) -> None:
        assert row not in self.values, f"rows are written once: {row!r}"
        self.values[row] = value

    def ack(self, row: bytes) -> None:
        self.acked.add(row)

    def fail(self, row: bytes, exc: BaseException) -> None:
        ambiguous = getattr(exc, "may_have_applied", True)
        (self.maybe if ambiguous else self.rejected).add(row)
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1

    def check(self, seen: dict[bytes, bytes]) -> list[str]:
        """Violations of the history by ``seen`` (row -> value read back); empty if none."""
        problems = []
        for row in sorted(self.acked):
            if seen.get(row) != self.values[row]:
                problems.append(
                    f"acknowledged write {row!r}={self.values[row]!r} reads as {seen.get(row)!r}"
                )
        for row, value in sorted(seen.items()):
            if row not in self.values:
                problems.append(f"row {row!r} was never written but reads as {value!r}")
            elif value != self.values[row]:
                problems.append(f"row {row!r} reads {value!r}, written as {self.values[row]!r}")
            elif row in self.rejected:
                problems.append(f"row {row!r} failed with a not-applied error but was applied")
        return problems
