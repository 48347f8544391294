"""The chaos run's replica and its check (``python -m bench.chaos --replicate``).

With ``--replicate`` a second cluster, :class:`ReplicaCluster` (its own etcd, its own S3
server and bucket, a master and a worker), follows the chaos table through a ``tabletstore
replicate`` process (``client/replicator.py``) for the whole run, while the nemesis kills,
pauses and cuts off the *source* cluster's workers and masters, restarts its etcd and faults
its S3 (the replicator reads the source's change stream through the same fault proxy as the
workers write it). The replica cluster itself is left alone: what is tested is that the
source's faults neither lose nor repeat a change on the way. A replicator process that exits
is started again, as its supervisor would (:meth:`ReplicaCluster.supervise`).

The replica table keeps the source's change retention, so its own change stream is the list
of every write the replicator applied. At the end, once the writers stopped, the cluster
healed and the replica's progress is past the final instant, :func:`check_replica` (pure)
compares:

* the source's change stream (what the run's :class:`~.change_follower.ChangeFollower` read,
  itself checked against the history) with the replica's: a source change the replica never
  applied is **lost**, one applied more than once **repeated** (a retried write whose first
  attempt had landed, logged twice in a row with the same cells, is counted apart as in the
  change-stream check: the cell holds one version); a replica change no source change
  explains is **not from the source**;
* a scan of both tables, cell for cell (row, column, timestamp, value): any cell at one and
  not the other is a **differing cell**.

Changes are matched by their row and cells, not their ``seq`` (each cluster numbers its own):
a deletion's own timestamp is the applying worker's clock, so deletions match by their range.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.change_plan import Change
from tabletstore.client.client import AsyncClient
from tabletstore.client.replicator import load_progress
from tabletstore.errors import TabletStoreError, Unavailable
from tabletstore.keys import TS_MAX, decode_ts_range
from tabletstore.testing.chaos.change_follower import finding_lines
from tabletstore.testing.processes import ProcessGroup

__all__ = ["ReplicaCluster", "ReplicaVerdict", "check_replica", "scan_cells"]

#: A scanned cell: (row, family, qualifier, timestamp, value).
ScannedCell = tuple[bytes, str, bytes, int, bytes]
_DELETIONS = {"delete_column", "delete_family", "delete_row"}


class ReplicaCluster(ProcessGroup):
    """The replica cluster of a chaos run, under ``directory``: :meth:`start` its etcd, S3
    server, master and worker; :meth:`start_replicator` the follower of ``table`` at
    ``source_url``; :meth:`close` stops every process it started."""

    def __init__(
        self,
        directory: Path,
        source_url: str,
        table: str,
        *,
        env: dict[str, str],
        deadline: float = 120.0,
        poll: float = 0.5,
    ) -> None:
        self.directory = directory.resolve()
        self.source_url = source_url
        self.table = table
        self.env = env
        self.deadline = deadline
        self.poll = poll
        self.records: list[ProcessRecord] = []
        self.url = ""
        self.replicator: ProcessRecord | None = None
        #: Replicator processes started (the first one and each restart).
        self.replicators_started = 0

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            etcd, port = localstack.start_etcd(
                self.directory / "etcd", log=self.directory / "etcd.log", fast_leases=True
            )
            self.records.append(etcd)
            self.url = f"etcd://127.0.0.1:{port}/replica"
            s3 = localstack.start_moto(self.directory / "s3.log")
            self.records.append(s3)
            store = f"s3://{localstack.BUCKET}/replica?endpoint_url={s3.url}&region=us-east-1"
            self.records.append(
                localstack.start_master(
                    self.directory, self.url, store, env=self.env, deadline=self.deadline
                )
            )
            self.records.append(
                localstack.start_worker(self.directory, self.url, 1, env=self.env,
                                        deadline=self.deadline)
            )  # fmt: skip
        except BaseException:
            self.close()
            raise

    def start_replicator(self) -> ProcessRecord:
        """``tabletstore --url REPLICA replicate --source SOURCE TABLE`` (its log:
        ``replicator-N.log``)."""
        self.replicators_started += 1
        role = f"replicator-{self.replicators_started}"
        argv = [
            sys.executable, "-m", "tabletstore.cli.main", "--url", self.url, "replicate",
            "--source", self.source_url, "--poll", str(self.poll), self.table,
        ]  # fmt: skip
        record = localstack.spawn(
            role, argv, log=self.directory / f"{role}.log", url="", env=self.env
        )
        self.records.append(record)
        self.replicator = record
        return record

    async def supervise(self, interval: float = 2.0) -> None:
        """Start the replicator again whenever it exited (until cancelled)."""
        while True:
            await asyncio.sleep(interval)
            if self.replicator is not None and not self.running(self.replicator):
                await asyncio.to_thread(self.start_replicator)

    async def caught_up(self, client: AsyncClient, instant: float, deadline: float) -> bool:
        """Whether the replica's progress (its applied watermark) passed ``instant`` within
        ``deadline`` seconds."""
        end = time.monotonic() + deadline
        while True:
            with contextlib.suppress(TabletStoreError, OSError, TimeoutError):
                progress = await load_progress(client, self.table)
                if progress is not None and progress.applied_watermark() >= instant:
                    return True
            if time.monotonic() > end:
                return False
            await asyncio.sleep(0.5)

    async def wait_table(self, client: AsyncClient, deadline: float) -> None:
        """Until the replicator made the replica table."""
        end = time.monotonic() + deadline
        while True:
            with contextlib.suppress(TabletStoreError, OSError, TimeoutError):
                info = await client._info(self.table, refresh=True)
                if info.schema.replica_of is not None:
                    return
            if time.monotonic() > end:
                raise Unavailable(f"the replicator did not make table {self.table!r} in time")
            await asyncio.sleep(0.5)


async def scan_cells(client: AsyncClient, table: str, *, attempts: int = 5) -> list[ScannedCell]:
    """Every cell of ``table`` (a full scan, retried whole on an error), sorted."""
    for attempt in range(attempts):
        try:
            out: list[ScannedCell] = []
            async for row in client.table(table).read_rows():
                for c in row.cells:
                    out.append((row.key, c.family, c.qualifier, c.timestamp, c.value))
            return sorted(out)
        except (TabletStoreError, OSError, TimeoutError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


@dataclass
class ReplicaVerdict:
    """What :func:`check_replica` found (each list holds a line per finding)."""

    source_changes: int = 0
    applied: int = 0
    lost: list[str] = field(default_factory=list)
    repeated: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    #: Replica changes logged twice in a row by a retried write (harmless: one version).
    retried: int = 0
    source_cells: int = 0
    replica_cells: int = 0
    differing: list[str] = field(default_factory=list)
    #: Set by the runner: the replica did not catch up, or a follower was not complete.
    incomplete: str | None = None
    replicators_started: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.repeated or self.foreign or self.differing or self.incomplete)

    def lines(self) -> list[str]:
        out = [
            f"replication: {self.applied} changes applied for {self.source_changes} source "
            f"changes; lost {len(self.lost)}, repeated {len(self.repeated)}, not from the "
            f"source {len(self.foreign)} (logged twice by a retried write: {self.retried}; "
            f"replicator processes {self.replicators_started})",
            f"replica equals source: {'yes' if not self.differing else 'NO'} "
            f"({self.source_cells} cells at the source, {self.replica_cells} at the replica, "
            f"{len(self.differing)} differing)",
        ]
        if self.incomplete:
            out.append(f"  REPLICA INCOMPLETE {self.incomplete}")
        out += finding_lines(
            ("REPLICA LOST", self.lost),
            ("REPLICA REPEATED", self.repeated),
            ("REPLICA NOT FROM SOURCE", self.foreign),
            ("REPLICA CELL DIFFERS", self.differing),
        )
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "source_changes": self.source_changes,
            "applied": self.applied,
            "lost": self.lost,
            "repeated": self.repeated,
            "not_from_source": self.foreign,
            "retried": self.retried,
            "source_cells": self.source_cells,
            "replica_cells": self.replica_cells,
            "differing": self.differing,
            "incomplete": self.incomplete,
            "replicators_started": self.replicators_started,
        }


_Key = tuple[bytes, tuple[tuple[object, ...], ...]]


def _key(c: Change) -> _Key:
    """A change by its row and cells, as both clusters log it (module docstring)."""
    mods: list[tuple[object, ...]] = []
    for m in c.mods:
        if m.kind == "delete_column":
            start, end = decode_ts_range(m.value)
            mods.append((m.kind, m.family, m.qualifier, start, min(end, TS_MAX)))
        elif m.kind in _DELETIONS:
            mods.append((m.kind, m.family, m.qualifier))
        else:
            mods.append((m.kind, m.family, m.qualifier, m.timestamp, m.value))
    return c.row, tuple(mods)


def _once(changes: Iterable[Change]) -> list[Change]:
    """Each log record once (a follower that delivered one twice is the change check's
    finding, not the replica's), each row's in ``seq`` order."""
    seen: dict[tuple[bytes, int], Change] = {}
    for c in changes:
        seen.setdefault((c.row, c.seq), c)
    return sorted(seen.values(), key=lambda c: (c.row, c.seq))


def _describe(key: _Key) -> str:
    row, mods = key
    return f"{row!r} {', '.join(str(m[:3]) for m in mods)}"[:200]


def check_replica(
    source: Sequence[Change],
    replica: Sequence[Change],
    source_cells: Sequence[ScannedCell],
    replica_cells: Sequence[ScannedCell],
) -> ReplicaVerdict:
    """Compare the replica's applied changes and cells with the source's (module docstring)."""
    verdict = ReplicaVerdict()
    wanted = Counter(_key(c) for c in _once(source))
    applied = _once(replica)
    verdict.source_changes = sum(wanted.values())
    verdict.applied = len(applied)
    got: Counter[_Key] = Counter()
    previous: _Key | None = None
    for c in applied:
        key = _key(c)
        if key == previous and got[key] >= wanted[key] > 0:
            verdict.retried += 1  # the same cells again, at once: a retried write
            continue
        got[key] += 1
        previous = key
    for key in sorted(set(wanted) | set(got)):
        want, have = wanted[key], got[key]
        if want == 0:
            verdict.foreign.append(f"{_describe(key)} x{have}")
        elif have < want:
            verdict.lost.append(f"{_describe(key)}: applied {have} of {want}")
        elif have > want:
            verdict.repeated.append(f"{_describe(key)}: applied {have} times, {want} at the source")
    verdict.source_cells, verdict.replica_cells = len(source_cells), len(replica_cells)
    at_source, at_replica = Counter(source_cells), Counter(replica_cells)
    for cell in sorted((at_source - at_replica) + (at_replica - at_source)):
        where = (
            "only at the source" if at_source[cell] > at_replica[cell] else "only at the replica"
        )
        row, family, qualifier, ts, value = cell
        verdict.differing.append(f"{row!r} {family}:{qualifier!r} @{ts} {value[:40]!r} {where}")
    return verdict
