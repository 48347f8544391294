"""``python -m bench.soak``: the local stack under mixed traffic for half an hour or more, sampled.

The paper measures minutes on a fresh table (§7). What an operator needs before trusting a
store with data is the long run: does a worker's memory stay bounded while the data grows, does
p99 grow with it, do compactions (§5.4) keep up with the writes, do splits (§5) and the master's
balancing (§5.2) keep the tablets even. This runs a cluster of real processes on this machine
(:class:`bench.cluster_target.ClusterTarget`: etcd, a master and ``--workers`` workers, with
splits, merges and compactions at their production settings) and drives it from this process
with four kinds of traffic at once until ``--gb`` of data is written or ``--minutes`` pass:

* ``batch``: writers each sending ``--batch-rows`` rows of consecutive keys (one tablet);
* ``write``: single-row writers;
* ``read``: point reads of rows already acknowledged, each value checked;
* ``scan``: scans of ``--scan-rows`` rows from a row already acknowledged, each value checked.

By default every client runs flat out (a closed loop): on a saturated machine its latency is
mostly queueing, and it rises as throughput falls. ``--rate KIND=N`` paces a kind instead (an
open loop, as wrk2 and YCSB's target rate do): N operations a second, each timed from its slot
in that schedule rather than from when a client got to it, so a stall counts against every
operation it delayed. The kind's clients bound how many are in flight.

Rows are ``--value-bytes`` random (incompressible) values whose first 16 bytes are a BLAKE2b
digest of the row key and the rest, so a read detects a lost write (an acknowledged row read as
missing) and a wrong value. The table's key space is cut into blocks of ``--batch-rows`` keys
placed by a fixed permutation, so the writes land all over the table while each batch stays in
one tablet. The table starts pre-split into two tablets per worker (``ClusterTarget``'s
contract) and grows by splits.

Every ``--interval`` seconds a sample records: operations per second and p50/p99/max per kind;
each process's RSS (a worker's compaction processes apart) and CPU, and each worker's C heap
(in use and free); tablets, SSTables per
tablet (mean and max: compaction debt), memtable bytes and compactions by kind (the workers'
``/status`` and ``/metrics``); the workers' event loop lag (their ``/metrics``) and this
process's own (``ops/loop_lag.py``), which tell a stalled loop from queueing, with
``--report-stalls`` the workers' logs saying where a loop was held; the workers' commit-log
segment PUTs (each group commit, what every write waited for); the workers' time in the
cyclic garbage collector, by generation; object-store requests by
kind (workers and master) and per client
operation; bytes written (logical), bytes the store holds (on disk, by prefix: SSTables,
commit logs, the rest) and bytes the tablets' SSTables add up to (live); free disk; and the
machine's load average, without which a shared machine's chart cannot be read.

Writes stop at ``--gb``, or when free disk at the data directory falls within
:data:`WRITE_MARGIN_GB` of ``--min-free-gb`` (compactions still write after the writes stop, and
the master collects nothing younger than ``--gc-grace``); the run ends if it falls under
``--min-free-gb``. At the end a sample of ``--verify-rows``
acknowledged rows is read back. Outputs (``--out DIR``): ``soak.json`` (rewritten at every
sample, so a run cut short keeps what it measured), ``soak.png`` (redrawn every few minutes),
``soak.md`` (one table of the run in windows) and the processes' logs. The cluster is always
stopped (by pid) and its data removed, on failure and on SIGTERM too. ``--quick``: a minute
and about 50 MB, splits at 4 MiB, for tests.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import bisect
import contextlib
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.cluster_target import LEASE_TTL, ClusterTarget, _fetch, cpu_seconds, descendants_of
from bench.targets import FAMILY, QUALIFIER, row_key
from tabletstore.cli import localstack
from tabletstore.client.mutate_rows import MutationsFailed
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.ops.loop_lag import LAG_BUCKETS, LoopLag

__all__ = [
    "Cumulative",
    "Histogram",
    "KeySpace",
    "Ledger",
    "Pacer",
    "SoakConfig",
    "check_value",
    "draw",
    "main",
    "make_value",
    "parse_rates",
    "run_soak",
    "summarize",
    "window_table",
]

TABLE = "soak"
KINDS = ("batch", "write", "read", "scan")
DIGEST = 16
GB = 10**9
MB = 10**6
#: Errors of each kind whose message is kept as an event (the rest are only counted).
KEPT_ERRORS = 5
#: Writes stop this many GB above ``--min-free-gb``: room for the compactions still to come.
WRITE_MARGIN_GB = 5.0
#: Samples between two redraws of the chart during the run.
DRAW_EVERY = 30


@dataclass(frozen=True)
class SoakConfig:
    """One soak run (see the module docstring for each knob)."""

    minutes: float = 35.0
    gb: float = 10.0
    workers: int = 3
    store: str = "file"
    batch_writers: int = 4
    single_writers: int = 4
    readers: int = 8
    scanners: int = 2
    batch_rows: int = 100
    scan_rows: int = 100
    value_bytes: int = 1000
    interval: float = 10.0
    #: Workers split tablets past this many bytes; None: the production default.
    split_bytes: int | None = None
    min_free_gb: float = 20.0
    #: The workers' lease (``worker --lease-ttl``): longer than the production default, as
    #: ClusterTarget's, because a shared machine stalls processes for many seconds.
    lease_ttl: float = LEASE_TTL
    #: The master's garbage-collection grace (``master --gc-grace``): 5 minutes rather than
    #: production's hour, so that a run of half an hour collects what its compactions replaced
    #: and trims the commit logs, as a cluster that has run for hours does, and the store holds
    #: about the live data rather than several times what was written.
    gc_grace: float = 300.0
    verify_rows: int = 5_000
    seed: int = 1
    #: Operations a second per paced kind (``--rate``); a kind not named runs flat out.
    rates: dict[str, float] = field(default_factory=dict)
    #: The workers' ``--report-stalls`` (seconds): their logs, kept in ``--out``, then name
    #: where each loop was held that long. None: no reports (the lag is sampled either way).
    report_stalls: float | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> SoakConfig:
        """A minute and about 50 MB on two workers, splitting at 4 MiB (the master keeps its
        default merge thresholds: merges wait 10 minutes, so none happens in a minute)."""
        base: dict[str, Any] = dict(
            minutes=1.0,
            gb=0.05,
            workers=2,
            batch_writers=2,
            single_writers=2,
            readers=4,
            scanners=1,
            interval=2.0,
            split_bytes=4 * 1024 * 1024,
            min_free_gb=2.0,
            verify_rows=500,
        )
        base.update(overrides)
        return cls(**base)

    def __post_init__(self) -> None:
        if min(self.minutes, self.gb, self.interval, self.lease_ttl) <= 0:
            raise ValueError("--minutes, --gb, --interval and --lease-ttl must be positive")
        if self.gc_grace < 60:
            raise ValueError(
                "--gc-grace must be at least 60 s: a grace shorter than a compaction's "
                "upload-to-commit time on a loaded machine could delete a new SSTable"
            )
        if self.workers < 1 or self.batch_rows < 1 or self.scan_rows < 1:
            raise ValueError("--workers, --batch-rows and --scan-rows must be at least 1")
        if self.value_bytes <= DIGEST:
            raise ValueError(f"--value-bytes must be more than {DIGEST} (the digest)")
        if min(self.batch_writers, self.single_writers, self.readers, self.scanners) < 0:
            raise ValueError("client counts must be >= 0")
        if self.batch_writers + self.single_writers == 0:
            raise ValueError("a soak needs at least one writer")
        for kind, rate in self.rates.items():
            if kind not in KINDS:
                raise ValueError(f"--rate: unknown kind {kind!r} (one of {', '.join(KINDS)})")
            if not rate > 0 or math.isinf(rate):
                raise ValueError(f"--rate {kind}: the rate must be a positive number, got {rate}")

    @property
    def rows(self) -> int:
        """Rows to write: ``gb`` of values."""
        return max(self.batch_rows, round(self.gb * GB / self.value_bytes))


# ---------------------------------------------------------------------------- rows and values


def make_value(key: bytes, size: int) -> bytes:
    """``size`` bytes: a digest of ``key`` and the random rest, then the rest."""
    body = os.urandom(size - DIGEST)
    return hashlib.blake2b(key + body, digest_size=DIGEST).digest() + body


def check_value(key: bytes, value: bytes) -> bool:
    """True if ``value`` is one :func:`make_value` made for ``key``."""
    body = value[DIGEST:]
    return hashlib.blake2b(key + body, digest_size=DIGEST).digest() == value[:DIGEST]


class KeySpace:
    """Row ``i`` -> its key: ``block_rows`` consecutive rows form a block of consecutive keys,
    and blocks are placed over the key space ``row_key(0 .. blocks * block_rows - 1)`` by a
    fixed permutation (``b -> b * stride mod blocks``, ``stride`` coprime to ``blocks``)."""

    def __init__(self, rows: int, block_rows: int) -> None:
        self.block_rows = block_rows
        self.blocks = max(1, -(-rows // block_rows))
        stride = max(1, int(self.blocks * 0.6180339887)) | 1
        while math.gcd(stride, self.blocks) != 1:
            stride += 1
        self._stride = stride

    @property
    def size(self) -> int:
        return self.blocks * self.block_rows

    def key(self, i: int) -> bytes:
        block, offset = divmod(i, self.block_rows)
        return row_key((block * self._stride) % self.blocks * self.block_rows + offset)


class Ledger:
    """Which rows are written and acknowledged: blocks are handed out in order; each
    acknowledged run of rows is recorded, and :meth:`pick` draws one acknowledged row
    uniformly."""

    def __init__(self, space: KeySpace) -> None:
        self.space = space
        self._next_block = 0
        self._starts = array.array("q")
        self._ends = array.array("q")  # cumulative acknowledged rows after each run
        self.acked = 0

    def block(self) -> int | None:
        """The next unwritten block's first row, or None once every block is handed out."""
        if self._next_block >= self.space.blocks:
            return None
        self._next_block += 1
        return (self._next_block - 1) * self.space.block_rows

    def ack(self, start: int, count: int) -> None:
        if count <= 0:
            return
        self.acked += count
        self._starts.append(start)
        self._ends.append(self.acked)

    def pick(self, rng: random.Random) -> int | None:
        if not self.acked:
            return None
        r = rng.randrange(self.acked)
        run = bisect.bisect_right(self._ends, r)
        before = self._ends[run - 1] if run else 0
        return self._starts[run] + (r - before)


class Histogram:
    """Latencies in log buckets 5 % apart from 10 µs: mergeable, so a window's percentiles
    come from its samples' histograms (within 5 %)."""

    BASE_MS = 0.01
    STEP = math.log(1.05)

    def __init__(self, counts: dict[int, int] | None = None) -> None:
        self.counts: dict[int, int] = dict(counts or {})

    def add(self, ms: float) -> None:
        b = max(0, int(math.log(max(ms, self.BASE_MS) / self.BASE_MS) / self.STEP))
        self.counts[b] = self.counts.get(b, 0) + 1

    def merge(self, other: Histogram) -> None:
        for b, n in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def quantile(self, q: float) -> float:
        """The upper edge (ms) of the bucket holding quantile ``q``; 0 if empty."""
        total = self.total
        if not total:
            return 0.0
        rank = max(1, math.ceil(q * total))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return self.BASE_MS * math.exp((b + 1) * self.STEP)
        return 0.0  # unreachable


@dataclass
class _Interval:
    """One kind's operations since the last sample."""

    count: int = 0
    rows: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)


class Recorder:
    """Operations per kind, taken and reset at each sample; errors and findings as events."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.now: dict[str, _Interval] = {k: _Interval() for k in KINDS}
        self.events: list[dict[str, Any]] = []
        self.errors: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.lost = 0
        self.wrong = 0
        #: This process's loop lag (ms) since the last sample.
        self.lag: list[float] = []

    def loop_lag(self, seconds: float) -> None:
        """How late this process's own loop woke (``ops/loop_lag.py``): a client stall."""
        self.lag.append(seconds * 1000.0)

    def take_lag(self) -> dict[str, Any]:
        """This process's loop lag since the last sample (p99, max, histogram)."""
        lag, self.lag = sorted(self.lag), []
        hist = Histogram()
        for ms in lag:
            hist.add(ms)
        return {
            "p99_ms": _nearest(lag, 0.99),
            "max_ms": lag[-1] if lag else 0.0,
            "histogram": {str(b): n for b, n in sorted(hist.counts.items())},
        }

    def done(self, kind: str, seconds: float, rows: int) -> None:
        one = self.now[kind]
        one.count += 1
        one.rows += rows
        one.latencies.append(seconds * 1000.0)

    def event(self, what: str, **detail: Any) -> None:
        entry = {"t": round(time.monotonic() - self.started, 1), "event": what, **detail}
        self.events.append(entry)
        print(f"[soak t={entry['t']}s] {what} {detail if detail else ''}", flush=True)

    def error(self, kind: str, exc: BaseException) -> None:
        self.now[kind].errors += 1
        self.errors[kind] += 1
        if self.errors[kind] <= KEPT_ERRORS:
            self.event("error", kind=kind, error=f"{type(exc).__name__}: {exc}"[:500])

    def lost_write(self, kind: str, index: int, key: bytes) -> None:
        self.lost += 1
        self.event("LOST WRITE", kind=kind, row=index, key=key.decode())

    def wrong_value(self, kind: str, key: bytes) -> None:
        self.wrong += 1
        self.event("WRONG VALUE", kind=kind, key=key.decode("utf-8", "backslashreplace"))

    def take(self, seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind, one in self.now.items():
            hist = Histogram()
            for ms in one.latencies:
                hist.add(ms)
            lat = sorted(one.latencies)
            out[kind] = {
                "count": one.count,
                "rows": one.rows,
                "errors": one.errors,
                "per_second": one.count / seconds,
                "rows_per_second": one.rows / seconds,
                "p50_ms": _nearest(lat, 0.50),
                "p99_ms": _nearest(lat, 0.99),
                "max_ms": lat[-1] if lat else 0.0,
                "histogram": {str(b): n for b, n in sorted(hist.counts.items())},
            }
        self.now = {k: _Interval() for k in KINDS}
        return out


def _nearest(sorted_ms: Sequence[float], q: float) -> float:
    if not sorted_ms:
        return 0.0
    return sorted_ms[min(len(sorted_ms) - 1, max(0, math.ceil(q * len(sorted_ms)) - 1))]


# ---------------------------------------------------------------------------- the traffic


class Pacer:
    """Start times ``rate`` a second apart for one kind of operation (``--rate``): the
    first slot is the first call's; each later call takes the next slot, waiting for it if
    it is ahead, or at once (with a slot in the past) if the clients fell behind."""

    def __init__(self, rate: float) -> None:
        self._gap = 1.0 / rate
        self._next: float | None = None

    async def slot(self) -> float:
        """The next slot, on ``time.perf_counter``'s clock, once it has come."""
        now = time.perf_counter()
        slot = now if self._next is None else self._next
        self._next = slot + self._gap
        if slot > now:
            await asyncio.sleep(slot - now)
        return slot


class Traffic:
    """The clients: writers, readers and scanners on one table, sharing one ledger."""

    def __init__(self, table: Any, cfg: SoakConfig, ledger: Ledger, rec: Recorder) -> None:
        self.table = table
        self.cfg = cfg
        self.ledger = ledger
        self.rec = rec
        self.writing = True
        self.running = True
        self._single_block: tuple[int, int] | None = None  # (first row, rows left)
        self._pacers = {kind: Pacer(rate) for kind, rate in cfg.rates.items()}

    async def _start(self, kind: str) -> float:
        """When an operation of ``kind`` starts, for its latency: now, or for a paced kind
        its slot in the schedule, once that has come."""
        pacer = self._pacers.get(kind)
        return time.perf_counter() if pacer is None else await pacer.slot()

    def tasks(self) -> list[asyncio.Task[None]]:
        rng = random.Random(self.cfg.seed)
        loops: list[Callable[[random.Random], Any]] = (
            [self._batch_writer] * self.cfg.batch_writers
            + [self._single_writer] * self.cfg.single_writers
            + [self._reader] * self.cfg.readers
            + [self._scanner] * self.cfg.scanners
        )
        return [
            asyncio.create_task(loop(random.Random(rng.random())), name=f"soak-{i}")
            for i, loop in enumerate(loops)
        ]

    async def _guarded(self, kind: str, op: Callable[[], Any]) -> None:
        try:
            await op()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.rec.error(kind, exc)
            await asyncio.sleep(0.2)  # an outage is not a busy loop

    async def _batch_writer(self, rng: random.Random) -> None:
        size = self.cfg.value_bytes
        while self.running and self.writing:
            start = self.ledger.block()
            if start is None:
                self.writing = False
                return
            keys = [self.ledger.space.key(start + j) for j in range(self.cfg.batch_rows)]
            entries = [
                RowMutation(k, (SetCell(FAMILY, QUALIFIER, make_value(k, size)),)) for k in keys
            ]

            async def write(start: int = start, entries: list[RowMutation] = entries) -> None:
                began = await self._start("batch")
                try:
                    await self.table.mutate_rows(entries)
                except MutationsFailed as exc:
                    failed = {f.index for f in exc.failures}
                    for j in range(len(entries)):
                        if j not in failed:
                            self.ledger.ack(start + j, 1)
                    raise
                self.rec.done("batch", time.perf_counter() - began, len(entries))
                self.ledger.ack(start, len(entries))

            await self._guarded("batch", write)

    def _next_single(self) -> int | None:
        if self._single_block is None or self._single_block[1] == 0:
            start = self.ledger.block()
            if start is None:
                return None
            self._single_block = (start, self.ledger.space.block_rows)
        first, left = self._single_block
        self._single_block = (first + 1, left - 1)
        return first

    async def _single_writer(self, rng: random.Random) -> None:
        size = self.cfg.value_bytes
        while self.running and self.writing:
            index = self._next_single()
            if index is None:
                self.writing = False
                return
            key = self.ledger.space.key(index)
            value = make_value(key, size)

            async def write(index: int = index, key: bytes = key, value: bytes = value) -> None:
                began = await self._start("write")
                await self.table.mutate_row(key, [SetCell(FAMILY, QUALIFIER, value)])
                self.rec.done("write", time.perf_counter() - began, 1)
                self.ledger.ack(index, 1)

            await self._guarded("write", write)

    async def _reader(self, rng: random.Random) -> None:
        await self._reading(rng, "read", lambda index: self.read_one("read", index))

    async def _scanner(self, rng: random.Random) -> None:
        await self._reading(rng, "scan", self._scan_one)

    async def _reading(self, rng: random.Random, kind: str, op: Callable[[int], Any]) -> None:
        """``op`` on acknowledged rows drawn uniformly, until the run ends."""
        while self.running:
            index = self.ledger.pick(rng)
            if index is None:
                await asyncio.sleep(0.1)  # nothing acknowledged yet
                continue
            await self._guarded(kind, lambda index=index: op(index))

    async def read_one(self, kind: str, index: int) -> None:
        """Read acknowledged row ``index`` and check it (a miss is a lost write)."""
        key = self.ledger.space.key(index)
        began = await self._start(kind)
        row = await self.table.read_row(key)
        self.rec.done(kind, time.perf_counter() - began, 1)
        if row is None:
            self.rec.lost_write(kind, index, key)
        elif not check_value(key, row.cells[0].value):
            self.rec.wrong_value(kind, key)

    async def _scan_one(self, index: int) -> None:
        start = self.ledger.space.key(index)
        began = await self._start("scan")
        rows = 0
        last = b""
        async for row in self.table.read_rows(start=start, limit=self.cfg.scan_rows):
            if rows == 0 and row.key != start:
                self.rec.lost_write("scan", index, start)  # the first row is acknowledged
            if row.key <= last or not check_value(row.key, row.cells[0].value):
                self.rec.wrong_value("scan", row.key)
            last = row.key
            rows += 1
        if rows == 0:
            self.rec.lost_write("scan", index, start)
        self.rec.done("scan", time.perf_counter() - began, rows)


# ---------------------------------------------------------------------------- observing


def _rss_bytes(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> ``name`` or ``name{label=value}`` (one label) -> value."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith(("_bucket", "_created")):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out


#: The cyclic collector's generations, as the workers' ``tabletstore_gc_pause_seconds`` labels
#: them (``ops/gc_pauses.py``).
GC_GENERATIONS = ("0", "1", "2")

#: The workers' loop-lag histogram (``ops/loop_lag.py``), cumulative per bucket.
LAG_METRIC = "tabletstore_event_loop_lag_seconds"


#: The workers' commit-log segment PUT histogram (``commitlog/writer.py``): what every
#: acknowledged write waited for.
PUT_METRIC = "tabletstore_commit_log_put_seconds"


#: The workers' RPC handling time by method (``ops/metrics.py``): the time a request spent
#: in the worker, from its arrival to its answer, apart from the client and the network.
RPC_METRIC = "tabletstore_rpc_latency_seconds"
#: The RPC methods behind the soak's writes (single rows and batches, coalesced by the
#: client into requests for one tablet or several) and reads (one row or several).
WRITE_METHODS = ("mutate_rows", "mutate_tablets")
READ_METHODS = ("read_row", "read_points")


def histogram_buckets(
    text: str, metric: str, methods: Sequence[str] | None = None
) -> dict[str, float]:
    """A histogram from a process's Prometheus text: upper edge (``le``, seconds, ``+Inf``
    last) -> cumulative count; of the RPC ``methods`` only (summed; a method is the label's
    last dotted or slashed part), when given."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for s in family.samples:
            if s.name != f"{metric}_bucket":
                continue
            if methods is not None:
                label = s.labels.get("method", "")
                if label.replace("/", ".").rsplit(".", 1)[-1] not in methods:
                    continue
            le = s.labels["le"]
            out[le] = out.get(le, 0.0) + float(s.value)
    return out


def lag_buckets(text: str) -> dict[str, float]:
    """A worker's loop-lag histogram (:func:`histogram_buckets`)."""
    return histogram_buckets(text, LAG_METRIC)


def _per_bucket(cumulative: dict[str, float]) -> dict[str, float]:
    """Cumulative bucket counts (in order of their edges) as counts per bucket."""
    out: dict[str, float] = {}
    below = 0.0
    for le, count in cumulative.items():
        out[le] = count - below
        below = count
    return out


def lag_quantiles(buckets: Iterable[dict[str, int]], q: float) -> tuple[float, float]:
    """``(quantile q, max)`` in ms of summed per-interval bucket counts: each the upper edge
    of the bucket holding it (``inf`` past the last edge); ``(0, 0)`` when empty."""
    counts: dict[float, int] = {}
    for b in buckets:
        for le, n in b.items():
            counts[float(le)] = counts.get(float(le), 0) + n
    total = sum(counts.values())
    if not total:
        return 0.0, 0.0
    rank = max(1, math.ceil(q * total))
    seen, quantile = 0, 0.0
    for le in sorted(counts):
        seen += counts[le]
        if seen >= rank:
            quantile = le * 1000.0
            break
    top = max(le for le, n in counts.items() if n) * 1000.0
    return quantile, top


def store_bytes(root: Path) -> dict[str, int]:
    """Bytes of the files under ``root`` by first key part: SSTables (``tables``), commit
    logs (``logs``) and everything else."""
    out = {"tables": 0, "logs": 0, "other": 0}
    for top, _, files in os.walk(root):
        rel = Path(top).relative_to(root).parts
        part = rel[0] if rel and rel[0] in ("tables", "logs") else "other"
        for name in files:
            with contextlib.suppress(OSError):
                out[part] += os.stat(os.path.join(top, name)).st_size
    out["total"] = sum(out.values())
    return out


class Cumulative:
    """Counters summed over processes, each process's last scraped values kept: a process that
    misses a scrape or exits neither loses what it counted nor makes the sum drop."""

    def __init__(self) -> None:
        self._last: dict[str, dict[str, float]] = {}

    def update(self, source: str, values: dict[str, float]) -> None:
        self._last[source] = values

    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for values in self._last.values():
            for name, value in values.items():
                out[name] = out.get(name, 0.0) + value
        return out


class Observer:
    """Everything a sample holds besides the client's own counts (module docstring)."""

    def __init__(self, cluster: ClusterTarget, directory: Path) -> None:
        stack = cluster.stack
        assert stack is not None
        self.records = stack.processes
        self.worker_metrics = list(cluster._metrics_urls)
        #: Whose each of ``worker_metrics`` is (a worker group's processes: ``role/k``).
        self.worker_names = [
            r.role if r.processes == 1 else f"{r.role}/{k}"
            for r in stack.processes
            if r.role.startswith("worker-")
            for k in range(r.processes)
        ]
        master = [r for r in stack.processes if r.role == "master"]
        self.master_metrics = [f"{u}/metrics" for r in master for u in localstack.metrics_urls(r)]
        self.directory = directory
        # The file store's directory, or SeaweedFS's data (its volumes: no key prefixes).
        self.store_root = directory / ("store" if cluster.store_kind == "file" else "seaweedfs")
        self._s3 = Cumulative()
        self._compactions = Cumulative()
        self._gc = Cumulative()
        #: The workers' time in the cyclic garbage collector, by generation.
        self._collector = Cumulative()
        self._last_s3: dict[str, float] = {}
        self._last_ops = 0
        #: Each worker's last loop-lag counts per bucket (since it started).
        #: Per histogram, per worker URL: its per-bucket counts at the last sample.
        self._last_lag: dict[str, dict[str, dict[str, float]]] = {}

    async def _get(self, url: str) -> str | None:
        try:
            return await asyncio.to_thread(_fetch, url)
        except Exception:
            return None  # a stalled or restarting process: this sample goes without it

    def _interval(
        self, metric: str, texts: Sequence[str | None], methods: Sequence[str] | None = None
    ) -> dict[str, int]:
        """A histogram of the workers' since the last sample (of some RPC ``methods``', when
        given): counts per bucket (not cumulative), summed over the workers."""
        got: dict[str, int] = {}
        for url, text in zip(self.worker_metrics, texts, strict=False):
            if not text:
                continue
            now = _per_bucket(histogram_buckets(text, metric, methods))
            last = self._last_lag.setdefault(f"{metric} {methods}", {})
            before = last.get(url, {})
            for le, n in now.items():
                if n > before.get(le, 0.0):  # (a restarted worker or log counts from zero)
                    got[le] = got.get(le, 0) + int(n - before.get(le, 0.0))
            last[url] = now
        return got

    async def sample(self, client_ops: int) -> dict[str, Any]:
        urls = self.worker_metrics + self.master_metrics
        texts = await asyncio.gather(*(self._get(u) for u in urls))
        statuses = await asyncio.gather(
            *(self._get(u.removesuffix("/metrics") + "/status") for u in self.worker_metrics)
        )
        metrics = [parse_metrics(t) if t else {} for t in texts]
        workers = metrics[: len(self.worker_metrics)]
        out: dict[str, Any] = {"load": list(os.getloadavg())}
        out["rss_mb"] = {r.role: _rss_bytes(r.pid) / MB for r in self.records}
        out["children_rss_mb"] = {
            r.role: sum(_rss_bytes(c) for c in descendants_of(r.pid)) / MB
            for r in self.records
            if r.role.startswith("worker-")
        }
        out["cpu_s"] = {r.role: cpu_seconds(r.pid) for r in self.records}
        out["alive"] = {r.role: localstack.is_running(r) for r in self.records}
        out["workers_answered"] = sum(1 for t in texts[: len(self.worker_metrics)] if t)
        per_tablet: list[int] = []
        for text in statuses:
            if not text:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                for tablet in json.loads(text)["tablets"]:
                    if not tablet["table_id"].startswith("!"):  # METADATA and root apart
                        per_tablet.append(int(tablet["sstables"]))
        out["tablets"] = len(per_tablet)
        out["sstables_per_tablet"] = {
            "mean": sum(per_tablet) / len(per_tablet) if per_tablet else 0.0,
            "max": max(per_tablet, default=0),
        }

        def total(name: str, among: Iterable[dict[str, float]] = workers) -> float:
            return sum(m.get(name, 0.0) for m in among)

        out["memtable_mb"] = total("tabletstore_memtable_bytes") / MB
        # glibc's heap as each worker's trimmer last read it: live objects against free
        # fragments, the two parts of a worker's RSS that its settings do not bound alike.
        out["heap_mb"] = {
            name: {
                "in_use": m["tabletstore_heap_in_use_bytes"] / MB,
                "free": m.get("tabletstore_heap_free_bytes", 0.0) / MB,
            }
            for name, m in zip(self.worker_names, workers, strict=False)
            if "tabletstore_heap_in_use_bytes" in m
        }
        # The workers' loop lag and log PUTs this interval: per bucket, summed over them.
        out["worker_loop_lag"] = self._interval(LAG_METRIC, texts)
        out["commit_log_put"] = self._interval(PUT_METRIC, texts)
        # The same requests as the workers timed them: what the clients' p99 owes to them.
        out["worker_write"] = self._interval(RPC_METRIC, texts, WRITE_METHODS)
        out["worker_read"] = self._interval(RPC_METRIC, texts, READ_METHODS)
        out["live_sstable_bytes"] = int(total("tabletstore_sstable_bytes"))
        prefix = "tabletstore_object_store_requests_total{op="
        for url, m in zip(urls, metrics, strict=True):
            if not m:
                continue  # no answer: its last counts stand, its new ones come with the next
            self._s3.update(
                url, {n[len(prefix) : -1]: v for n, v in m.items() if n.startswith(prefix)}
            )
            if url in self.master_metrics:
                self._gc.update(
                    url,
                    {
                        "objects": m.get("tabletstore_gc_deleted_objects_total", 0.0),
                        "bytes": m.get("tabletstore_gc_deleted_bytes_total", 0.0),
                    },
                )
            if url in self.worker_metrics:
                self._compactions.update(
                    url,
                    {
                        kind: m.get(f"tabletstore_compactions_total{{kind={kind}}}", 0.0)
                        for kind in ("minor", "merging", "major")
                    },
                )
                self._collector.update(
                    url,
                    {
                        g: m.get(f"tabletstore_gc_pause_seconds_sum{{generation={g}}}", 0.0)
                        for g in GC_GENERATIONS
                    },
                )
        compactions = self._compactions.total()
        out["compactions"] = {
            k: int(compactions.get(k, 0.0)) for k in ("minor", "merging", "major")
        }
        collector = self._collector.total()
        out["collector_s"] = {g: collector.get(g, 0.0) for g in GC_GENERATIONS}
        out["collector_processes"] = len(self.worker_metrics)
        gc = self._gc.total()
        out["gc_deleted"] = {"objects": int(gc.get("objects", 0)), "bytes": int(gc.get("bytes", 0))}
        s3 = self._s3.total()
        out["s3_requests"] = {op: int(v) for op, v in sorted(s3.items())}
        delta = {op: v - self._last_s3.get(op, 0.0) for op, v in s3.items()}
        ops = client_ops - self._last_ops
        out["s3_interval"] = {op: int(v) for op, v in sorted(delta.items())}
        out["s3_per_op"] = sum(delta.values()) / ops if ops else 0.0
        self._last_s3, self._last_ops = s3, client_ops
        out["stored_bytes"] = await asyncio.to_thread(store_bytes, self.store_root)
        out["disk_free_bytes"] = shutil.disk_usage(self.directory).free
        return out


# ---------------------------------------------------------------------------- the run


@dataclass
class SoakRun:
    """What a run produced: its configuration, samples, events and verdict."""

    config: SoakConfig
    samples: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    #: The samples' JSON texts so far (:meth:`json_text`).
    _sample_texts: list[str] = field(default_factory=list, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "machine": self.machine,
            "summary": self.summary,
            "events": self.events,
            "samples": self.samples,
        }

    def json_text(self) -> str:
        """:meth:`to_json` as JSON text. A sample is encoded once, the first time it is saved
        (samples do not change once taken): the run is saved after every sample, on the
        client's event loop, and encoding every sample each time stalled the loop for a time
        that grew with the run (46 ms at 20 minutes), a stall in the tail the run measures."""
        texts = self._sample_texts
        texts.extend(json.dumps(sample) for sample in self.samples[len(texts) :])
        rest = {key: value for key, value in self.to_json().items() if key != "samples"}
        head = json.dumps(rest, indent=1)
        assert head.endswith("\n}")
        return head[:-2] + ',\n "samples": [\n' + ",\n".join(texts) + "\n ]\n}\n"


async def run_soak(cfg: SoakConfig, out: Path) -> SoakRun:
    """Start the cluster (its data in the system's temporary directory: ``TMPDIR``), run the
    traffic and the sampler, verify, stop; write ``out``."""
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    base = Path(tempfile.gettempdir())
    free = shutil.disk_usage(base).free
    if free < (cfg.min_free_gb + WRITE_MARGIN_GB) * GB:
        raise RuntimeError(
            f"{free / GB:.1f} GB free at {base}: not {WRITE_MARGIN_GB:g} GB more than "
            f"--min-free-gb {cfg.min_free_gb:g}, not starting"
        )
    run = SoakRun(
        cfg,
        machine={
            "cores": os.cpu_count(),
            "python": sys.version.split()[0],
            "disk_free_gb_at_start": round(free / GB, 1),
            "load_at_start": list(os.getloadavg()),
        },
    )
    space = KeySpace(cfg.rows, cfg.batch_rows)
    worker_args: tuple[str, ...] = ()
    if cfg.split_bytes:
        worker_args += ("--split-bytes", str(cfg.split_bytes))
    if cfg.report_stalls is not None:
        worker_args += ("--report-stalls", f"{cfg.report_stalls:g}")
    cluster = ClusterTarget(
        f"cluster:{cfg.workers}:{cfg.store}",
        rows=space.size,
        mem_rows=1,
        worker_args=worker_args,
        master_args=("--gc-grace", f"{cfg.gc_grace:g}"),
        lease_ttl=cfg.lease_ttl,
    )
    try:
        await cluster.open()
        await cluster.create(TABLE)  # waits for the cluster to serve METADATA
        await _traffic(run, cfg, cluster, cluster._tables[TABLE], space, out)
    finally:
        try:
            if run.samples and not run.summary:  # cut short: what it measured so far
                run.summary = summarize(run)
            _save(run, out)
            if run.samples:
                draw(run, out / "soak.png")
                (out / "soak.md").write_text(window_table(run) + "\n")
        finally:
            if cluster._dir is not None:
                _keep_logs(cluster._dir, out / "logs")
            await cluster.close()  # stops every process by pid, removes the data
    return run


async def _traffic(
    run: SoakRun, cfg: SoakConfig, cluster: ClusterTarget, table: Any, space: KeySpace, out: Path
) -> None:
    assert cluster._dir is not None
    started = time.monotonic()
    rec = Recorder(started)
    rec.events = run.events
    ledger = Ledger(space)
    traffic = Traffic(table, cfg, ledger, rec)
    observer = Observer(cluster, cluster._dir)
    rec.event(
        "started",
        workers=cfg.workers,
        store=cfg.store,
        rows=cfg.rows,
        directory=str(cluster._dir),
    )
    tasks = traffic.tasks()
    deadline = started + cfg.minutes * 60
    last = started
    ops_total = 0
    alive_before: dict[str, bool] = {}
    stopped = False
    try:
        async with LoopLag(rec.loop_lag):  # a stall of this process: a client-side tail
            while time.monotonic() < deadline:
                now = time.monotonic()
                await asyncio.sleep(max(0.0, min(cfg.interval - (now - last), deadline - now)))
                now = time.monotonic()
                ops = rec.take(now - last)
                last = now
                ops_total += sum(o["count"] for o in ops.values())
                sample = {
                    "t": round(now - started, 1),
                    "ops": ops,
                    "client_loop_lag": rec.take_lag(),
                }
                sample.update(await observer.sample(ops_total))
                sample.update(
                    rows_written=ledger.acked,
                    bytes_written=ledger.acked * cfg.value_bytes,
                    lost=rec.lost,
                    wrong=rec.wrong,
                    client_cpu_s=sum(os.times()[:2]),
                )
                run.samples.append(sample)
                for role, alive in sample["alive"].items():
                    if alive_before.get(role, True) and not alive:
                        rec.event("PROCESS EXITED", role=role)
                alive_before = sample["alive"]
                free = sample["disk_free_bytes"]
                if traffic.writing and free < (cfg.min_free_gb + WRITE_MARGIN_GB) * GB:
                    traffic.writing = False
                    rec.event("disk nearly full: writes stop", free_gb=round(free / GB, 1))
                if not traffic.writing and not stopped:
                    stopped = True
                    gb = round(ledger.acked * cfg.value_bytes / GB, 3)
                    rec.event("writes stopped", rows=ledger.acked, gb=gb)
                if free < cfg.min_free_gb * GB:
                    rec.event("disk under --min-free-gb: run ends", free_gb=round(free / GB, 1))
                    break
                _progress(sample)
                _save(run, out)
                if len(run.samples) % DRAW_EVERY == 0:
                    await asyncio.to_thread(draw, run, out / "soak.png")
    finally:
        traffic.running = False
        traffic.writing = False
        await _settle(tasks)
    await _verify(traffic, ledger, rec, cfg)
    run.summary = summarize(run)


async def _settle(tasks: Sequence[asyncio.Task[None]], wait: float = 30.0) -> None:
    """Let the clients finish the operation in hand (an acknowledged write is recorded),
    then cancel what still runs."""
    _, pending = await asyncio.wait(tasks, timeout=wait)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _verify(traffic: Traffic, ledger: Ledger, rec: Recorder, cfg: SoakConfig) -> None:
    """Read back ``verify_rows`` acknowledged rows (drawn uniformly) and check each."""
    rng = random.Random(cfg.seed + 1)
    rows = [
        i for _ in range(min(cfg.verify_rows, ledger.acked)) if (i := ledger.pick(rng)) is not None
    ]
    before = (rec.lost, rec.wrong, rec.errors["read"])
    sem = asyncio.Semaphore(16)

    async def one(index: int) -> None:
        async with sem:
            try:
                await traffic.read_one("read", index)
            except Exception as exc:
                rec.error("read", exc)

    await asyncio.gather(*(one(i) for i in rows))
    rec.take(1.0)  # not part of any sample
    rec.event(
        "verified",
        rows=len(rows),
        lost=rec.lost - before[0],
        wrong=rec.wrong - before[1],
        errors=rec.errors["read"] - before[2],
    )


def _progress(s: dict[str, Any]) -> None:
    ops = s["ops"]
    rss = " ".join(f"{v:.0f}" for r, v in s["rss_mb"].items() if r.startswith("worker-"))
    print(
        f"t={s['t']:>6.0f}s {s['bytes_written'] / GB:6.2f} GB written "
        f"w {ops['batch']['rows_per_second'] + ops['write']['rows_per_second']:6.0f} rows/s "
        f"r {ops['read']['per_second']:5.0f}/s p99 {ops['read']['p99_ms']:6.1f} ms "
        f"scan {ops['scan']['rows_per_second']:6.0f} rows/s | tablets {s['tablets']} "
        f"sst/tablet {s['sstables_per_tablet']['mean']:.1f} max {s['sstables_per_tablet']['max']} "
        f"| rss MB {rss} | stored {s['stored_bytes']['total'] / GB:.2f} GB "
        f"free {s['disk_free_bytes'] / GB:.0f} GB | load {s['load'][0]:.1f} "
        f"| lost {s['lost']} wrong {s['wrong']}",
        flush=True,
    )


def _save(run: SoakRun, out: Path) -> None:
    tmp = out / "soak.json.tmp"
    tmp.write_text(run.json_text())
    tmp.replace(out / "soak.json")


def _keep_logs(directory: Path, to: Path) -> None:
    to.mkdir(parents=True, exist_ok=True)
    for log in directory.glob("*.log"):
        with contextlib.suppress(OSError):
            shutil.copy(log, to / log.name)


# ---------------------------------------------------------------------------- reading a run


def _quarter(samples: Sequence[dict[str, Any]], q: int) -> list[dict[str, Any]]:
    n = len(samples)
    return list(samples[n * q // 4 : max(n * (q + 1) // 4, n * q // 4 + 1)])


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if v else 0.0


def _window_p(samples: Iterable[dict[str, Any]], kind: str, q: float) -> float:
    hist = Histogram()
    for s in samples:
        hist.merge(Histogram({int(b): n for b, n in s["ops"][kind]["histogram"].items()}))
    return hist.quantile(q)


def summarize(run: SoakRun) -> dict[str, Any]:
    """The run's verdict figures: what was reached, whether memory, p99 and compaction debt
    stayed flat (second quarter against last quarter, the first being warm-up)."""
    samples = run.samples
    if not samples:
        return {}
    last = samples[-1]
    workers = [r for r in last["rss_mb"] if r.startswith("worker-")]
    q2, q4 = _quarter(samples, 1), _quarter(samples, 3)
    tablets = [s["tablets"] for s in samples]
    rss = {
        w: {
            "max_mb": round(max(s["rss_mb"].get(w, 0.0) for s in samples), 1),
            "q2_median_mb": round(_median([s["rss_mb"].get(w, 0.0) for s in q2]), 1),
            "q4_median_mb": round(_median([s["rss_mb"].get(w, 0.0) for s in q4]), 1),
            "compaction_children_max_mb": round(
                max(s["children_rss_mb"].get(w, 0.0) for s in samples), 1
            ),
            "q4_heap_in_use_median_mb": round(
                _median([s.get("heap_mb", {}).get(w, {}).get("in_use", 0.0) for s in q4]), 1
            ),
            "q4_heap_free_median_mb": round(
                _median([s.get("heap_mb", {}).get(w, {}).get("free", 0.0) for s in q4]), 1
            ),
        }
        for w in workers
    }
    p99 = {
        kind: {
            "q2_ms": round(_window_p(q2, kind, 0.99), 2),
            "q4_ms": round(_window_p(q4, kind, 0.99), 2),
            "whole_run_ms": round(_window_p(samples, kind, 0.99), 2),
        }
        for kind in KINDS
    }
    count = {k: sum(s["ops"][k]["count"] for s in samples) for k in KINDS}
    rows = {k: sum(s["ops"][k]["rows"] for s in samples) for k in KINDS}
    return {
        "seconds": last["t"],
        "rows_written": last["rows_written"],
        "gb_written": round(last["bytes_written"] / GB, 3),
        "gb_stored_at_end": round(last["stored_bytes"]["total"] / GB, 3),
        "gb_stored_max": round(max(s["stored_bytes"]["total"] for s in samples) / GB, 3),
        "gc_deleted": last.get("gc_deleted", {"objects": 0, "bytes": 0}),
        "stored_at_end": last["stored_bytes"],
        "live_sstable_gb_at_end": round(last["live_sstable_bytes"] / GB, 3),
        "operations": count,
        "rows": rows,
        "errors": {k: sum(s["ops"][k]["errors"] for s in samples) for k in KINDS},
        "lost_writes": last["lost"],
        "wrong_values": last["wrong"],
        "verified": next((e for e in run.events if e["event"] == "verified"), None),
        "tablets": {"start": tablets[0], "end": tablets[-1], "max": max(tablets)},
        "tablet_count_rises": sum(max(0, b - a) for a, b in itertools.pairwise(tablets)),
        "tablet_count_falls": sum(max(0, a - b) for a, b in itertools.pairwise(tablets)),
        "compactions": last["compactions"],
        "sstables_per_tablet": {
            "max": max(s["sstables_per_tablet"]["max"] for s in samples),
            "q4_mean": round(_median([s["sstables_per_tablet"]["mean"] for s in q4]), 2),
            "q4_max_median": _median([s["sstables_per_tablet"]["max"] for s in q4]),
        },
        "worker_rss": rss,
        "p99": p99,
        "loop_lag_ms": {
            "workers": {
                "q2_p99": lag_quantiles([s.get("worker_loop_lag", {}) for s in q2], 0.99)[0],
                "q4_p99": lag_quantiles([s.get("worker_loop_lag", {}) for s in q4], 0.99)[0],
                # None: past the last bucket's edge (5 s).
                "max": _finite(
                    lag_quantiles([s.get("worker_loop_lag", {}) for s in samples], 1.0)[1]
                ),
            },
            "clients_max": max(s.get("client_loop_lag", {}).get("max_ms", 0.0) for s in samples),
        },
        "s3_requests": last["s3_requests"],
        "s3_per_op": round(sum(last["s3_requests"].values()) / max(1, sum(count.values())), 3),
        "load_average_1m": {
            "min": min(s["load"][0] for s in samples),
            "median": _median([s["load"][0] for s in samples]),
            "max": max(s["load"][0] for s in samples),
        },
        "processes_exited": [e["role"] for e in run.events if e["event"] == "PROCESS EXITED"],
    }


def window_table(run: SoakRun, windows: int = 8) -> str:
    """A Markdown table of the run in ``windows`` equal windows: rates, percentiles (from the
    windows' histograms), memory, compaction debt, requests and bytes."""
    samples = run.samples
    n = len(samples)
    cuts = sorted({n * w // windows for w in range(windows + 1)})
    columns = (
        "minutes", "GB written", "tablets", "rows/s written", "reads/s", "scanned rows/s",
        "read p50 / p99 ms", "write p99 ms", "batch p99 ms", "scan p99 ms",
        "in the workers: write / read p99 ms", "log PUT p99 / max ms", "loop lag p99 / max ms, workers",
        "loop lag p99 / max ms, clients",
        "collector ms/s per worker, generation 0 / 1 / 2", "worker RSS MB",
        "SSTables per tablet, mean / max", "S3 requests per op", "GB stored", "load 1m",
    )  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|" + "---:|" * len(columns)]
    for a, b in itertools.pairwise(cuts):
        w = samples[a:b]
        if not w:
            continue
        end = w[-1]
        secs = max(1e-9, end["t"] - (samples[a - 1]["t"] if a else 0.0))

        def rate(kind: str, what: str, w: list[dict[str, Any]] = w, secs: float = secs) -> float:
            return sum(s["ops"][kind][what] for s in w) / secs

        ops = sum(s["ops"][k]["count"] for s in w for k in KINDS)
        reqs = sum(sum(s["s3_interval"].values()) for s in w)
        rss = "/".join(
            f"{max(s['rss_mb'].get(r, 0.0) for s in w):.0f}"
            for r in end["rss_mb"]
            if r.startswith("worker-")
        )
        lines.append(
            f"| {end['t'] / 60:.1f} | {end['bytes_written'] / GB:.2f} | {end['tablets']} "
            f"| {rate('batch', 'rows') + rate('write', 'rows'):,.0f} "
            f"| {rate('read', 'count'):,.0f} | {rate('scan', 'rows'):,.0f} "
            f"| {_window_p(w, 'read', 0.5):.1f} / {_window_p(w, 'read', 0.99):.1f} "
            f"| {_window_p(w, 'write', 0.99):.1f} | {_window_p(w, 'batch', 0.99):.1f} "
            f"| {_window_p(w, 'scan', 0.99):.1f} | {_worker_cell(w)} "
            f"| {_lag_cell(w, 'commit_log_put')} "
            f"| {_lag_cell(w)} | {_client_lag_cell(w)} "
            f"| {_collector_cell(samples[a - 1] if a else None, end, secs)} | {rss} "
            f"| {_median([s['sstables_per_tablet']['mean'] for s in w]):.1f} / "
            f"{max(s['sstables_per_tablet']['max'] for s in w)} "
            f"| {reqs / ops if ops else 0.0:.2f} | {end['stored_bytes']['total'] / GB:.2f} "
            f"| {_median([s['load'][0] for s in w]):.1f} |"
        )
    cfg = run.config
    lines.append("")
    lines.append(
        f"{cfg.workers} workers (lease {cfg.lease_ttl:g} s), store {cfg.store} "
        f"(garbage-collection grace {cfg.gc_grace:g} s), "
        f"{cfg.value_bytes}-byte random values; "
        f"clients: {cfg.batch_writers} batch writers ({cfg.batch_rows} rows), "
        f"{cfg.single_writers} single-row writers, {cfg.readers} readers, {cfg.scanners} "
        f"scanners ({cfg.scan_rows} rows){_paced(cfg)}; each row a window of the run (percentiles from "
        f"its {cfg.interval:g}-s samples' histograms, RSS the window's largest per worker, "
        f"SSTables per tablet the median mean and the largest max). "
        f"Machine: {run.machine.get('cores')} cores, Python {run.machine.get('python')}."
    )
    return "\n".join(lines)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _lag_cell(window: Sequence[dict[str, Any]], key: str = "worker_loop_lag") -> str:
    """A workers' histogram in a window (their loop lag; ``commit_log_put``): p99 / max
    (bucket edges, ms); "-" unsampled."""
    buckets = [s[key] for s in window if s.get(key)]
    if not buckets:
        return "-"
    p99, top = lag_quantiles(buckets, 0.99)
    return f"{p99:g} / {top:g}" if math.isfinite(top) else f"{p99:g} / >{max(LAG_BUCKETS) * 1000:g}"


def _worker_cell(window: Sequence[dict[str, Any]]) -> str:
    """The workers' own p99 of the soak's writes (single rows and batches) and reads in a
    window (bucket edges, ms); "-" for runs that did not record them."""
    cells = []
    for key in ("worker_write", "worker_read"):
        buckets = [s[key] for s in window if s.get(key)]
        p99, _ = lag_quantiles(buckets, 0.99) if buckets else (math.nan, 0.0)
        cells.append("-" if math.isnan(p99) else f"{p99:g}")
    return " / ".join(cells)


def _collector_cell(before: dict[str, Any] | None, end: dict[str, Any], secs: float) -> str:
    """Milliseconds a second each worker process spent in the cyclic collector in a window, by
    generation; "-" for runs that did not record it."""
    if "collector_s" not in end:
        return "-"
    was = (before or {}).get("collector_s", {})
    workers = max(1, end.get("collector_processes", 1))
    return " / ".join(
        f"{(end['collector_s'][g] - was.get(g, 0.0)) * 1000 / secs / workers:.1f}"
        for g in GC_GENERATIONS
    )


def _client_lag_cell(window: Sequence[dict[str, Any]]) -> str:
    """This process's loop lag in a window: p99 / max ms; "-" unsampled."""
    lags = [s["client_loop_lag"] for s in window if s.get("client_loop_lag")]
    if not lags:
        return "-"
    hist = Histogram()
    for lag in lags:
        hist.merge(Histogram({int(b): n for b, n in lag["histogram"].items()}))
    return f"{hist.quantile(0.99):.0f} / {max(lag['max_ms'] for lag in lags):.0f}"


def _paced(cfg: SoakConfig) -> str:
    """The paced kinds for the table's footnote (empty when every client runs flat out)."""
    if not cfg.rates:
        return ""
    kinds = ", ".join(f"{kind} {rate:g}/s" for kind, rate in cfg.rates.items())
    return f", paced (open loop, latency from each operation's slot): {kinds}"


# ---------------------------------------------------------------------------- the chart


def draw(run: SoakRun, path: Path) -> None:
    """Nine panels over the run's minutes (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = run.samples
    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 3, figsize=(15, 10), sharex=True)
    (a_rate, a_lat, a_rss), (a_debt, a_tab, a_s3), (a_bytes, a_comp, a_load) = axes

    for kind, what, label in (
        ("batch", "rows_per_second", "batch writes, rows/s"),
        ("write", "rows_per_second", "single writes, rows/s"),
        ("read", "per_second", "point reads/s"),
        ("scan", "rows_per_second", "scanned rows/s"),
    ):
        a_rate.plot(t, [s["ops"][kind][what] for s in samples], label=label, linewidth=1)
    a_rate.set_title("throughput")
    a_rate.set_yscale("symlog", linthresh=10)

    def ms(kind: str, what: str) -> list[float]:  # an interval without requests: a gap
        return [s["ops"][kind][what] if s["ops"][kind]["count"] else math.nan for s in samples]

    for kind, color in zip(KINDS, ("C0", "C1", "C2", "C3"), strict=True):
        a_lat.plot(t, ms(kind, "p99_ms"), color=color, linewidth=1,
                   label=f"{kind} p99")  # fmt: skip
        a_lat.plot(t, ms(kind, "p50_ms"), color=color, linewidth=0.6,
                   linestyle=":", label=f"{kind} p50")  # fmt: skip
    a_lat.set_yscale("log")
    a_lat.set_title(f"latency per {run.config.interval:g} s, ms (p99 solid, p50 dotted)")

    roles = list(samples[-1]["rss_mb"])
    for role in roles:
        a_rss.plot(t, [s["rss_mb"].get(role, 0.0) for s in samples], label=role, linewidth=1)
    for role in [r for r in roles if r.startswith("worker-")]:
        a_rss.plot(t, [s["children_rss_mb"].get(role, 0.0) for s in samples], linewidth=0.6,
                   linestyle="--", label=f"{role} compaction procs")  # fmt: skip
        heap = [s.get("heap_mb", {}).get(role, {}).get("in_use") for s in samples]
        if any(v is not None for v in heap):  # runs before the heap gauges lack it
            a_rss.plot(t, [float("nan") if v is None else v for v in heap], linewidth=0.6,
                       linestyle=":", label=f"{role} C heap in use")  # fmt: skip
    a_rss.set_title("RSS, MB")

    a_debt.plot(t, [s["sstables_per_tablet"]["mean"] for s in samples], label="mean")
    a_debt.plot(t, [s["sstables_per_tablet"]["max"] for s in samples], label="max", linewidth=0.8)
    a_debt.set_title("compaction debt: SSTables per tablet")

    a_tab.plot(t, [s["tablets"] for s in samples], label="tablets (soak table)")
    a_tab2 = a_tab.twinx()
    a_tab2.plot(t, [s["memtable_mb"] for s in samples], color="C1", linewidth=0.8)
    a_tab2.set_ylabel("memtables, MB (orange)")
    a_tab.set_title("tablets; memtable MB")

    ops_kinds = sorted({op for s in samples for op in s["s3_interval"]})
    for op in ops_kinds:
        per = [
            s["s3_interval"].get(op, 0) / max(1, sum(o["count"] for o in s["ops"].values()))
            for s in samples
        ]
        a_s3.plot(t, per, label=op, linewidth=1)
    a_s3.set_title("object-store requests per client operation")

    gb = [s["bytes_written"] / GB for s in samples]
    a_bytes.plot(t, gb, label="written (logical)")
    a_bytes.plot(t, [s["live_sstable_bytes"] / GB for s in samples], label="live SSTables")
    for part in ("tables", "logs"):
        if any(s["stored_bytes"][part] for s in samples):
            a_bytes.plot(t, [s["stored_bytes"].get(part, 0) / GB for s in samples],
                         label=f"stored: {part}/", linewidth=0.8)  # fmt: skip
    a_bytes.plot(t, [s["stored_bytes"]["total"] / GB for s in samples], label="stored: total")
    if any(s.get("gc_deleted", {}).get("bytes") for s in samples):  # older runs lack it
        a_bytes.plot(t, [s.get("gc_deleted", {}).get("bytes", 0) / GB for s in samples],
                     label="deleted by GC (cumulative)", linestyle="--", linewidth=0.8)  # fmt: skip
    a_bytes.set_title("GB")

    for kind in ("minor", "merging", "major"):
        a_comp.plot(t, [s["compactions"][kind] for s in samples], label=kind)
    a_comp.set_title("compactions (cumulative)")

    a_load.plot(t, [s["load"][0] for s in samples], label="load average 1 min")
    a_load.plot(t, [s["load"][2] for s in samples], label="15 min", linewidth=0.8)
    a_load.axhline(run.machine.get("cores") or 1, color="grey", linestyle=":", label="cores")
    a_load.set_title("machine load (shared)")

    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left")
    for ax in axes[2]:
        ax.set_xlabel("minutes")
    cfg = run.config
    s = run.summary or {}
    fig.suptitle(
        f"Soak: {cfg.workers} workers ({cfg.store} store) on {run.machine.get('cores')} shared "
        f"cores, {samples[-1]['bytes_written'] / GB:.2f} GB written in {samples[-1]['t'] / 60:.0f} "
        f"min, lost writes {samples[-1]['lost']}, wrong values {samples[-1]['wrong']}"
        + (f", processes exited: {s['processes_exited']}" if s.get("processes_exited") else ""),
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


# ---------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    d = SoakConfig()
    parser.add_argument("--quick", action="store_true", help="a minute, ~50 MB, 2 workers")
    parser.add_argument("--minutes", type=float, help=f"run length (default {d.minutes})")
    parser.add_argument("--gb", type=float, help=f"data to write, GB (default {d.gb})")
    parser.add_argument("--workers", type=int, help=f"worker processes (default {d.workers})")
    parser.add_argument(
        "--store",
        choices=("file", "seaweedfs"),
        help="file: a directory (default); seaweedfs: SeaweedFS's S3 server, data on disk",
    )
    for name in (
        "batch_writers",
        "single_writers",
        "readers",
        "scanners",
        "batch_rows",
        "scan_rows",
        "value_bytes",
        "split_bytes",
        "verify_rows",
        "seed",
    ):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name)
    parser.add_argument("--interval", type=float, help="seconds between samples")
    parser.add_argument("--min-free-gb", type=float, dest="min_free_gb")
    parser.add_argument(
        "--lease-ttl",
        type=float,
        dest="lease_ttl",
        help=f"workers' lease (default {d.lease_ttl:g} s)",
    )
    parser.add_argument(
        "--gc-grace",
        type=float,
        dest="gc_grace",
        help=f"the master's garbage-collection grace (default {d.gc_grace:g} s; production "
        "keeps an hour)",
    )
    parser.add_argument(
        "--rate",
        action="append",
        metavar="KIND=N",
        help=f"pace KIND ({', '.join(KINDS)}) at N operations a second, each timed from its "
        "slot (an open loop; repeatable); unnamed kinds run flat out",
    )
    parser.add_argument(
        "--report-stalls",
        type=float,
        dest="report_stalls",
        metavar="SECONDS",
        help="the workers log where their event loop is held once it is this late (worker "
        "--report-stalls; their logs are kept in --out)",
    )
    parser.add_argument("--out", type=Path, default=Path("soak-out"), help="results directory")
    parser.add_argument(
        "--redraw",
        type=Path,
        metavar="DIR",
        help="draw soak.png and write soak.md again from DIR/soak.json (no cluster is started)",
    )
    args = parser.parse_args(argv)
    if args.redraw is not None:
        return redraw(args.redraw)
    given = {
        k: v for k, v in vars(args).items() if v is not None and k not in ("quick", "out", "rate")
    }
    try:
        if args.rate:
            given["rates"] = parse_rates(args.rate)
        cfg = SoakConfig.quick(**given) if args.quick else SoakConfig(**given)
    except ValueError as exc:
        parser.error(str(exc))
    run = asyncio.run(_main(cfg, args.out))
    print()
    print(window_table(run))
    print(json.dumps(run.summary, indent=1))
    print(f"results: {args.out}/soak.json, soak.png, soak.md, logs/")
    s = run.summary
    return 1 if s.get("lost_writes") or s.get("wrong_values") or s.get("processes_exited") else 0


def parse_rates(items: Sequence[str]) -> dict[str, float]:
    """``--rate`` values (``KIND=N``) as a dict; ValueError naming a malformed one."""
    rates: dict[str, float] = {}
    for item in items:
        kind, sep, number = item.partition("=")
        try:
            if not sep:
                raise ValueError
            rates[kind.strip()] = float(number)
        except ValueError:
            raise ValueError(f"--rate {item!r}: expected KIND=N, e.g. read=100") from None
    return rates


def redraw(directory: Path) -> int:
    """``--redraw``: the chart and the table of a saved run, with this version's drawing."""
    doc = json.loads((directory / "soak.json").read_text())
    run = SoakRun(
        SoakConfig(**doc["config"]), doc["samples"], doc["events"], doc["summary"], doc["machine"]
    )
    if not run.samples:
        print(f"no samples in {directory / 'soak.json'}", file=sys.stderr)
        return 2
    run.summary = run.summary or summarize(run)
    draw(run, directory / "soak.png")
    (directory / "soak.md").write_text(window_table(run) + "\n")
    print(window_table(run))
    return 0


async def _main(cfg: SoakConfig, out: Path) -> SoakRun:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)  # the finally clauses stop the cluster
    return await run_soak(cfg, out)


if __name__ == "__main__":
    sys.exit(main())
