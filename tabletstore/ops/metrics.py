"""Prometheus metrics of the cluster processes: what each worker and master counts.

Bigtable's operators watched every tablet server's request rates, latencies and compactions
(§5.2: the master "periodically asks each tablet server for the status of its lock"; §6:
caches, commit logs and compactions are what decide performance). Each process here owns one
:class:`prometheus_client.CollectorRegistry` (never the global one, so a test can hold several
processes' worth in one interpreter) and exposes it on ``GET /metrics``
(:mod:`tabletstore.ops.status_http`).

Two ways of counting, chosen so that no engine module is edited or slowed down:

* **Wrapped RPC handlers** (:meth:`ProcessMetrics.instrument`): each handler of a service's
  dispatch table (``rpc.services.Service.handlers``) served by an ``RpcServer`` (or the
  in-process transport) is wrapped, unary and streaming alike, counting requests by method
  (the name the service's Protocol declares) and outcome and observing their latency.
* **Scrape-time collectors** read state the engine keeps anyway: the tablets served (memtable
  and SSTable sizes), :meth:`BlockCache.stats`, :class:`CommitLogStats`, and the compaction
  events each tablet's record carries (§5.4: minor, merging, major).

Metric names (``tabletstore_`` prefix; counters end in ``_total``):

======================================================  ========  ===========================
rpc_requests_total{method, outcome}                      counter   outcome: ok, cancelled, an
                                                                   error class, internal
rpc_latency_seconds{method}                              histogram a stream: until it ends
permission_denied_total{method, permission}              counter   requests refused by the
                                                                   servers' authorization
tablets_served, memtable_bytes, sstables, sstable_bytes  gauge     worker
block_cache_{hits,misses,evictions}_total                counter   worker
block_cache_{entries,bytes,capacity_bytes}               gauge     worker
compactions_total{kind}                                  counter   minor, merging, major
commit_log_{appends,segments,bytes}_total                counter   worker's log incarnation
commit_log_last_put_seconds                              gauge     worker
commit_log_put_seconds                                   histogram worker: each segment PUT
                                                                   (group commit) that succeeded
heap_{in_use,free}_bytes                                 gauge     worker: glibc's heap at the
                                                                   last trim check
heap_trims_total, heap_trim_released_bytes_total         counter   worker
object_store_{requests,bytes,errors}_total{op}           counter   S3 request kinds (GET, PUT..)
lease_remaining_seconds                                  gauge     worker, master
master_leading                                           gauge     1 while elected
master_assignment_rounds_total{outcome}                  counter   ok, failed
master_tablets_assigned_total                            counter
master_last_assignment_timestamp_seconds                 gauge     wall clock
gc_rounds_total, gc_deleted_{objects,bytes}_total        counter   :meth:`MasterMetrics.gc_round`
replication_lag_seconds{table}                           gauge     master: how far a replica
                                                                   table is behind its source
replication_applied_changes_total{table}                 counter   master: changes it applied
replication_errors{table}                                gauge     master: 1 while its
                                                                   replicator reports an error
======================================================  ========  ===========================
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from bisect import bisect_left
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from tabletstore.client.replication_plan import Progress
from tabletstore.clock import monotonic, stopwatch, wall_time
from tabletstore.commitlog.spill import SpillStats
from tabletstore.commitlog.writer import PUT_SECONDS_BUCKETS, CommitLogStats
from tabletstore.coordination.base import Lease
from tabletstore.engine.tablet import Tablet
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.metadata.record import TabletEvent
from tabletstore.ops.gc_pauses import GC_PAUSE_BUCKETS
from tabletstore.ops.loop_lag import LAG_BUCKETS
from tabletstore.rpc.rpc_server import RpcServer
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Handler, Method, Transport
from tabletstore.sstable.block_cache import BlockCache, CacheStats

__all__ = [
    "AssignmentRound",
    "CompactionCounter",
    "GcRound",
    "MasterMetrics",
    "ObservedWorker",
    "ProcessMetrics",
    "WorkerMetrics",
    "WorkerSources",
    "compaction_kind",
    "outcome_of",
]

PREFIX = "tabletstore"
#: The worker methods counted specially: unloads sweep compaction events, loads count as assigned.
_UNLOAD = TABLET.method(TabletService.unload_tablet)
_LOADS = (
    TABLET.method(TabletService.load_tablet),
    TABLET.method(TabletService.load_tablet_at),
)
#: Latency buckets (seconds): from an in-memory read to a compaction or a slow S3 PUT.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
#: Tablet event kinds that are compactions, ``<kind>_compaction`` (tablet.py writes them).
_COMPACTION_SUFFIX = "_compaction"


class _Count:
    """One counter, bumped in place (read when scraped)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class _Latencies:
    """One method's latency histogram: a count per bucket (not cumulative) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        # Prometheus buckets are upper bounds, inclusive: the first bound >= seconds.
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds


class _RpcCounts:
    """``rpc_requests_total`` and ``rpc_latency_seconds``, counted in place and exported
    when scraped: prometheus_client's Counter and Histogram take a lock per increment and walk
    the buckets in Python, a few µs of every request.
    Used from the event loop; a scrape from another thread reads plain ints."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], _Count] = {}
        self.latency: dict[str, _Latencies] = {}

    def describe(self) -> list[Metric]:
        return self.collect()

    def collect(self) -> list[Metric]:
        requests = CounterMetricFamily(
            f"{PREFIX}_rpc_requests",
            "RPC requests served, by method and outcome",
            labels=["method", "outcome"],
        )
        for (method, outcome), count in list(self.requests.items()):
            requests.add_metric([method, outcome], count.value)
        latency = HistogramMetricFamily(
            f"{PREFIX}_rpc_latency_seconds",
            "RPC handling time, by method (a stream: until its last item was taken)",
            labels=["method"],
        )
        bounds = [*map(floatToGoString, LATENCY_BUCKETS), "+Inf"]
        for method, hist in list(self.latency.items()):
            cumulative = list(itertools.accumulate(hist.counts))
            latency.add_metric([method], list(zip(bounds, cumulative, strict=True)), hist.total)
        return [requests, latency]


class _RequestCounter:
    """``rpc_requests`` with prometheus_client's Counter interface (``labels().inc()``)."""

    def __init__(self, counts: _RpcCounts) -> None:
        self._counts = counts.requests

    def labels(self, *, method: str, outcome: str) -> _Count:
        count = self._counts.get((method, outcome))
        if count is None:
            count = self._counts[(method, outcome)] = _Count()
        return count


class _LatencyHistogram:
    """``rpc_latency`` with prometheus_client's Histogram interface (``labels().observe()``)."""

    def __init__(self, counts: _RpcCounts) -> None:
        self._latency = counts.latency

    def labels(self, *, method: str) -> _Latencies:
        hist = self._latency.get(method)
        if hist is None:
            hist = self._latency[method] = _Latencies()
        return hist


def outcome_of(exc: BaseException) -> str:
    """The ``outcome`` label of a request that raised ``exc``: the tabletstore error class
    (bounded: one hierarchy, errors.py), ``cancelled`` when the caller went away, else
    ``internal`` (the server turns those into Indeterminate on the wire)."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return outcome_of(exc.exceptions[0])
    if isinstance(exc, TabletStoreError):
        return type(exc).__name__
    if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
        return "cancelled"
    return "internal"


class ProcessMetrics:
    """One process's registry with the RPC metrics every process has."""

    def __init__(self, role: str, process_id: str) -> None:
        self.role = role
        self.registry = CollectorRegistry()
        rpc = _RpcCounts()
        self.registry.register(rpc)
        #: ``rpc_requests.labels(method=, outcome=).inc()``, as a prometheus Counter.
        self.rpc_requests = _RequestCounter(rpc)
        #: ``rpc_latency.labels(method=).observe(seconds)``, as a prometheus Histogram.
        self.rpc_latency = _LatencyHistogram(rpc)
        self.permission_denied = Counter(
            f"{PREFIX}_permission_denied",
            "Requests (or entries of a batch) refused by authorization, by method and permission",
            ["method", "permission"],
            registry=self.registry,
        )
        self.info = Gauge(
            f"{PREFIX}_process_info",
            "Always 1; the labels say which process this is",
            ["role", "id"],
            registry=self.registry,
        )
        self._process_id = ""
        self.process_id = process_id
        self._lease: Callable[[], Lease | None] = lambda: None
        self._monotonic: Callable[[], float] = monotonic
        Gauge(
            f"{PREFIX}_lease_remaining_seconds",
            "Seconds until this process's coordinator lease ends without a keep-alive",
            registry=self.registry,
        ).set_function(lambda: self.lease_remaining() or 0.0)

    @property
    def process_id(self) -> str:
        """The worker id, or the master's address (known once its RPC server listens)."""
        return self._process_id

    @process_id.setter
    def process_id(self, value: str) -> None:
        self._process_id = value
        self.info.clear()
        self.info.labels(role=self.role, id=value).set(1)

    def watch_lease(
        self, lease: Callable[[], Lease | None], *, monotonic: Callable[[], float] = monotonic
    ) -> None:
        """Report ``lease()``'s remaining time; ``monotonic`` must be the lease's clock."""
        self._lease = lease
        self._monotonic = monotonic

    def lease_remaining(self) -> float | None:
        """Seconds until the lease ends without a keep-alive (0 once expired), or None."""
        lease = self._lease()
        if lease is None:
            return None
        if lease.expired:
            return 0.0
        return max(0.0, lease.last_renewed + lease.ttl - self._monotonic())

    def denied(self, method: str, permission: str) -> None:
        """Count one authorization refusal (``worker/tablet_service_guard.py``,
        ``master/master_service_guard.py``)."""
        self.permission_denied.labels(method=method, permission=permission).inc()

    def instrument(self, handlers: Mapping[str, Handler]) -> dict[str, Handler]:
        """The same handlers, each counting its requests and observing its latency."""
        return {name: self.wrap(name, fn) for name, fn in handlers.items()}

    def observe_rpc(self, server: RpcServer) -> None:
        """Report the RPC server's resource caps at work (rpc/admission.py): connections
        open and refused, bytes buffered, connections waiting for the byte budget."""
        self.registry.register(_RpcServerCollector(server))

    def wrap(self, method: str, fn: Handler) -> Handler:
        """``fn`` instrumented as ``method``; an async generator stays an async generator (the
        RPC server picks unary or streaming by the handler's kind)."""
        latency = self.rpc_latency.labels(method=method)
        ok = self.rpc_requests.labels(method=method, outcome="ok")
        requests = self.rpc_requests

        def done(started: float, outcome: str | None) -> None:
            latency.observe(stopwatch() - started)
            if outcome is None:
                ok.value += 1
            else:
                requests.labels(method=method, outcome=outcome).inc()

        if inspect.isasyncgenfunction(fn):
            # An async generator function returns an async generator (which has aclose).
            gen_fn = cast(Callable[[Any], AsyncGenerator[Any, None]], fn)

            async def stream(request: Any) -> AsyncIterator[Any]:
                started = stopwatch()
                outcome: str | None = None
                try:
                    async with contextlib.aclosing(gen_fn(request)) as items:
                        async for item in items:
                            yield item
                except BaseException as exc:
                    outcome = outcome_of(exc)
                    raise
                finally:
                    done(started, outcome)

            return stream

        unary_fn: Callable[[Any], Any] = fn

        async def unary(request: Any) -> Any:
            started = stopwatch()
            outcome: str | None = None
            try:
                return await unary_fn(request)
            except BaseException as exc:
                outcome = outcome_of(exc)
                raise
            finally:
                done(started, outcome)

        return unary

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (what ``GET /metrics`` returns)."""
        return generate_latest(self.registry)


class _RpcServerCollector(Collector):
    def __init__(self, server: RpcServer) -> None:
        self._server = server

    def collect(self) -> Iterable[Metric]:
        gate, budget = self._server.gate, self._server.budget
        pending = self._server.unauthenticated
        yield GaugeMetricFamily(
            f"{PREFIX}_rpc_connections_open", "RPC connections open", value=gate.open
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_rpc_connections_unauthenticated",
            "RPC connections open that have not proven who they are yet",
            value=pending.open,
        )
        refused = CounterMetricFamily(
            f"{PREFIX}_rpc_connections_refused",
            "RPC connections refused or closed by a cap, by reason: total or peer (connection "
            "caps), unauthenticated_total, _peer or _handshake (before authentication), "
            "tls_total, _peer or _handshake (before or in the TLS handshake), handshake, stalled, slow, paused or idle (timeouts)",
            labels=["reason"],
        )
        for reason in ("total", "peer", "handshake", "stalled", "slow", "paused", "idle"):
            refused.add_metric([reason], gate.refused.get(reason, 0))
        for reason in ("total", "peer"):
            refused.add_metric([f"unauthenticated_{reason}"], pending.refused.get(reason, 0))
        refused.add_metric(["unauthenticated_handshake"], pending.refused.get("handshake", 0))
        tls = self._server.handshaking
        for reason in ("total", "peer", "handshake"):
            refused.add_metric([f"tls_{reason}"], tls.refused.get(reason, 0))
        yield refused
        yield GaugeMetricFamily(
            f"{PREFIX}_rpc_connections_handshaking",
            "RPC connections in their TLS handshake (admitted before it by the "
            "max_unauthenticated caps)",
            value=tls.open,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_rpc_buffered_bytes",
            "Bytes held by RPC connections: frames being received (as they arrive) and request "
            "bodies being handled",
            value=budget.used,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_rpc_buffered_bytes_peak",
            "The most bytes RPC connections held at once since the server started",
            value=budget.peak,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_rpc_connections_waiting",
            "RPC connections not read until the byte budget has room for their next frame",
            value=budget.waiting,
        )


# ---------------------------------------------------------------------------- workers


def compaction_kind(event_kind: str) -> str | None:
    """``minor`` for ``minor_compaction`` and so on; None for other tablet events."""
    if event_kind.endswith(_COMPACTION_SUFFIX):
        return event_kind[: -len(_COMPACTION_SUFFIX)]
    return None


def _new_events(seen: Sequence[TabletEvent], current: Sequence[TabletEvent]) -> int:
    """How many events at the end of ``current`` are not in ``seen``.

    A record keeps its last few events (a sliding window), so ``current`` is a suffix of
    ``seen`` followed by new events; the longest such overlap is taken. With no overlap every
    event is new (more happened between two looks than the window holds; those are lost)."""
    for start in range(len(seen) + 1):
        tail = seen[start:]
        if tuple(current[: len(tail)]) == tuple(tail):
            return len(current) - len(tail)
    return len(current)  # unreachable: the empty tail always matches


#: Tablet events that start a new tablet's history on the record of its parent or parents.
_BIRTHS = frozenset({"split", "merged"})


class CompactionCounter:
    """Compactions this worker ran, counted from the events its tablets' records carry.

    Tablet events are the engine's own log of compactions (tablet.py appends one to the
    record it commits), so nothing in the write path is touched. A tablet seen for the first
    time counts only the events after the last ``assigned`` event naming this worker or the
    last ``split`` or ``merged`` event (its birth: a child's record carries its parent's
    events, which were its parent's compactions, counted as the parent's if they ran here).
    The ones before were run by earlier owners or tablets. Call :meth:`sweep` at every scrape
    and right after a tablet is unloaded (its closing minor compaction happens then)."""

    def __init__(self, worker_id: str) -> None:
        self._worker_id = worker_id
        self._seen: dict[tuple[str, str], tuple[TabletEvent, ...]] = {}
        self.totals: dict[str, int] = {}

    def sweep(self, key: tuple[str, str], events: Sequence[TabletEvent]) -> None:
        seen = self._seen.get(key)
        if seen is None:
            seen = self._before_ours(events)
        fresh = events[len(events) - _new_events(seen, events) :]
        for event in fresh:
            kind = compaction_kind(event.kind)
            if kind is not None:
                self.totals[kind] = self.totals.get(kind, 0) + 1
        self._seen[key] = tuple(events)

    def forget(self, live: Iterable[tuple[str, str]]) -> None:
        """Drop the memory of tablets no longer served (a reload starts from its
        ``assigned`` event again)."""
        keep = set(live)
        for key in [k for k in self._seen if k not in keep]:
            del self._seen[key]

    def _before_ours(self, events: Sequence[TabletEvent]) -> tuple[TabletEvent, ...]:
        for i in range(len(events) - 1, -1, -1):
            kind = events[i].kind
            if kind in _BIRTHS or (kind == "assigned" and events[i].detail == self._worker_id):
                return tuple(events[: i + 1])
        return ()


@dataclass(frozen=True, slots=True)
class WorkerSources:
    """Where a worker's collector reads its numbers (callables: read at scrape time)."""

    tablets: Callable[[], Mapping[tuple[str, str], Tablet]]
    block_cache: Callable[[], CacheStats] | None = None
    commit_log: Callable[[], CommitLogStats | None] | None = None
    sort_spill: Callable[[], SpillStats] | None = None
    heap: Callable[[], ObservedHeap | None] | None = None


class _WorkerCollector(Collector):
    def __init__(self, sources: WorkerSources, compactions: CompactionCounter) -> None:
        self._sources = sources
        self._compactions = compactions

    def collect(self) -> Iterable[Metric]:
        tablets = dict(self._sources.tablets())
        yield from self._tablet_metrics(tablets)
        for key, tablet in tablets.items():
            self._compactions.sweep(key, tablet.record.events)
        self._compactions.forget(tablets)
        compactions = CounterMetricFamily(
            f"{PREFIX}_compactions", "Compactions run by this worker, by kind", labels=["kind"]
        )
        for kind in ("minor", "merging", "major"):
            compactions.add_metric([kind], self._compactions.totals.get(kind, 0))
        for kind, n in sorted(self._compactions.totals.items()):
            if kind not in ("minor", "merging", "major"):
                compactions.add_metric([kind], n)
        yield compactions
        if self._sources.block_cache is not None:
            yield from _cache_metrics(self._sources.block_cache())
        if self._sources.commit_log is not None:
            yield from _commit_log_metrics(self._sources.commit_log())
        if self._sources.sort_spill is not None:
            yield from _spill_metrics(self._sources.sort_spill())
        heap = self._sources.heap() if self._sources.heap is not None else None
        if heap is not None:
            yield from _heap_metrics(heap)

    def _tablet_metrics(self, tablets: Mapping[tuple[str, str], Tablet]) -> Iterable[Metric]:
        memtable = sstables = sstable_bytes = 0
        for tablet in tablets.values():
            state = tablet.state
            memtable += state.memtable.approximate_size
            memtable += sum(m.approximate_size for m in state.frozen)
            sstables += sum(len(refs) for refs in state.record.sstables.values())
            sstable_bytes += state.record.size
        for name, doc, value in (
            ("tablets_served", "Tablets this worker serves", len(tablets)),
            ("memtable_bytes", "Approximate bytes in memtables (active and frozen)", memtable),
            ("sstables", "SSTables of the tablets served", sstables),
            ("sstable_bytes", "Bytes of the SSTables of the tablets served", sstable_bytes),
        ):
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _cache_metrics(stats: CacheStats) -> Iterable[Metric]:
    for name, doc, value in (
        ("hits", "Block cache lookups that found the block", stats.hits),
        ("misses", "Block cache lookups that had to read the object store", stats.misses),
        ("evictions", "Blocks evicted from the block cache", stats.evictions),
    ):
        yield CounterMetricFamily(f"{PREFIX}_block_cache_{name}", doc, value=value)
    for name, doc, value in (
        ("entries", "Blocks in the block cache", stats.entries),
        ("bytes", "Bytes charged to the block cache", stats.bytes),
        ("capacity_bytes", "The block cache's byte bound", stats.capacity_bytes),
    ):
        yield GaugeMetricFamily(f"{PREFIX}_block_cache_{name}", doc, value=value)


def _commit_log_metrics(stats: CommitLogStats | None) -> Iterable[Metric]:
    """The current log incarnation's counters (zero before the log is opened)."""
    appends = stats.appends if stats is not None else 0
    segments = stats.segments if stats is not None else 0
    nbytes = stats.bytes if stats is not None else 0
    last_put = stats.last_put_seconds if stats is not None else 0.0
    yield CounterMetricFamily(
        f"{PREFIX}_commit_log_appends", "Records appended to the commit log", value=appends
    )
    yield CounterMetricFamily(
        f"{PREFIX}_commit_log_segments", "Commit-log segments PUT (group commits)", value=segments
    )
    yield CounterMetricFamily(
        f"{PREFIX}_commit_log_bytes", "Bytes of commit-log segments PUT", value=nbytes
    )
    yield GaugeMetricFamily(
        f"{PREFIX}_commit_log_last_put_seconds",
        "Duration of the last commit-log segment PUT",
        value=last_put,
    )
    counts = stats.put_counts if stats is not None else [0] * (len(PUT_SECONDS_BUCKETS) + 1)
    bounds = [*map(floatToGoString, PUT_SECONDS_BUCKETS), "+Inf"]
    yield HistogramMetricFamily(
        f"{PREFIX}_commit_log_put_seconds",
        "Duration of each commit-log segment PUT (a group commit): what every write waited for",
        buckets=list(zip(bounds, itertools.accumulate(counts), strict=True)),
        sum_value=stats.put_seconds if stats is not None else 0.0,
    )


def _spill_metrics(stats: SpillStats) -> Iterable[Metric]:
    """The sorted runs a worker keeps for its own replay (``commitlog.spill``, §5.4)."""
    kept = CounterMetricFamily(
        f"{PREFIX}_sort_spill_runs",
        "Sorted runs offered to the spill, by where they were kept",
        labels=["tier"],
    )
    kept.add_metric(["memory"], stats.kept_in_memory)
    kept.add_metric(["disk"], stats.kept_on_disk)
    kept.add_metric(["not_kept"], stats.not_kept)
    yield kept
    for name, doc, value in (
        ("hits", "Runs replayed from the spill instead of the object store", stats.hits),
        ("hit_bytes", "Bytes of the runs replayed from the spill", stats.hit_bytes),
        (
            "bad_copies",
            "Kept copies found missing or damaged (read from the store)",
            stats.bad_copies,
        ),
    ):
        yield CounterMetricFamily(f"{PREFIX}_sort_spill_{name}", doc, value=value)
    held = GaugeMetricFamily(
        f"{PREFIX}_sort_spill_bytes", "Bytes of sorted runs the spill holds", labels=["tier"]
    )
    held.add_metric(["memory"], stats.memory_bytes)
    held.add_metric(["disk"], stats.disk_bytes)
    yield held


def _heap_metrics(heap: ObservedHeap) -> Iterable[Metric]:
    """The heap trimmer's last reading (none before its first check) and its trims."""
    last = heap.last
    if last is not None:
        yield GaugeMetricFamily(
            f"{PREFIX}_heap_in_use_bytes",
            "Bytes the C heap had allocated at the last trim check (mallinfo2)",
            value=last.in_use,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_heap_free_bytes",
            "Bytes free inside the C heap's arenas at the last trim check (mallinfo2)",
            value=last.free,
        )
    yield CounterMetricFamily(
        f"{PREFIX}_heap_trims", "Heap trims (malloc_trim) made", value=heap.trims
    )
    yield CounterMetricFamily(
        f"{PREFIX}_heap_trim_released_bytes",
        "Free heap bytes the trims released",
        value=heap.released,
    )


class HeapReading(Protocol):
    """A reading of the C heap (``worker.heap_trim.HeapStats``)."""

    @property
    def in_use(self) -> int: ...

    @property
    def free(self) -> int: ...


class ObservedHeap(Protocol):
    """What a worker's metrics read of its heap trimmer (``worker.heap_trim.HeapTrimmer``)."""

    @property
    def last(self) -> HeapReading | None: ...

    @property
    def trims(self) -> int: ...

    @property
    def released(self) -> int: ...


class ObservedWorker(Protocol):
    """What a worker's metrics read (``worker.TabletServer`` has it)."""

    @property
    def tablets(self) -> Mapping[tuple[str, str], Tablet]: ...

    @property
    def block_cache(self) -> BlockCache: ...

    @property
    def commit_log_stats(self) -> CommitLogStats | None: ...

    @property
    def sort_spill_stats(self) -> SpillStats: ...

    @property
    def lease(self) -> Lease | None: ...

    @property
    def heap_trimmer(self) -> ObservedHeap | None: ...


class WorkerMetrics(ProcessMetrics):
    """A tablet server's metrics. Pass :attr:`registry` to ``open_store`` for the object-store
    counters, wrap the handlers with :meth:`instrument`, then :meth:`observe_server`."""

    def __init__(self, worker_id: str) -> None:
        super().__init__("worker", worker_id)
        self.compactions = CompactionCounter(worker_id)
        #: The event loop's lag (``ops/loop_lag.py``): ``loop_lag.observe(seconds)``.
        self.loop_lag = Histogram(
            f"{PREFIX}_event_loop_lag_seconds",
            "How much later than asked the worker's event loop woke a timer: what every "
            "request waited behind whatever held the loop",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        #: The cyclic garbage collector's pauses (``ops/gc_pauses.py``), by generation.
        self.gc_pauses = Histogram(
            f"{PREFIX}_gc_pause_seconds",
            "How long each of the worker's cyclic garbage collections stopped it, by "
            "generation (2: a full collection)",
            ["generation"],
            buckets=GC_PAUSE_BUCKETS,
            registry=self.registry,
        )
        self._sources: WorkerSources | None = None

    def observe_gc(self, generation: int, seconds: float) -> None:
        """One collection's pause (``GcPauses``' callback)."""
        self.gc_pauses.labels(generation=str(generation)).observe(seconds)

    def observe_server(self, server: ObservedWorker) -> None:
        """Observe a tablet server: its tablets, block cache, commit log, sort spill, heap and
        lease."""
        self.watch_lease(lambda: server.lease)
        self.observe(
            WorkerSources(
                tablets=lambda: server.tablets,
                block_cache=lambda: server.block_cache.stats(),
                commit_log=lambda: server.commit_log_stats,
                sort_spill=lambda: server.sort_spill_stats,
                heap=lambda: server.heap_trimmer,
            )
        )

    def observe(self, sources: WorkerSources) -> None:
        """Register the scrape-time collector over ``sources`` (once)."""
        if self._sources is not None:
            raise InvalidArgument("WorkerMetrics.observe was already called for this worker")
        self._sources = sources
        self.registry.register(_WorkerCollector(sources, self.compactions))

    def instrument(self, handlers: Mapping[str, Handler]) -> dict[str, Handler]:
        """As :meth:`ProcessMetrics.instrument`; an unloaded tablet's events (its closing
        minor compaction) are also counted before the tablet is forgotten."""
        wrapped = super().instrument(handlers)
        unload = wrapped.get(_UNLOAD.name)
        if unload is not None:
            wrapped[_UNLOAD.name] = self._sweeping_unload(unload)
        return wrapped

    def _sweeping_unload(self, unload: Handler) -> Handler:
        call: Callable[[Any], Any] = unload

        async def unload_tablet(request: Any) -> Any:
            key = (request.table_id, request.tablet_id)
            tablet = self._sources.tablets().get(key) if self._sources is not None else None
            try:
                return await call(request)
            finally:
                if tablet is not None:
                    self.compactions.sweep(key, tablet.record.events)

        return unload_tablet


# ---------------------------------------------------------------------------- master


@dataclass(frozen=True, slots=True)
class AssignmentRound:
    """The last assignment round: when it ended (wall clock), how many tablets it assigned,
    and its error if it failed."""

    at: float
    assigned: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class GcRound:
    """A garbage-collection round: when it was reported (wall clock) and what it deleted."""

    at: float
    deleted_objects: int
    deleted_bytes: int
    listed_objects: int | None = None


#: GC rounds a master remembers for its status page.
RECENT_GC_ROUNDS = 20


class MasterMetrics(ProcessMetrics):
    """The master's metrics: assignment rounds, leadership, and the garbage collector's hook
    (:meth:`gc_round`)."""

    def __init__(self, address: str = "", *, clock: Callable[[], float] = wall_time) -> None:
        super().__init__("master", address)
        self._time = clock
        self.last_round: AssignmentRound | None = None
        #: The last few GC rounds, oldest first (the status page's events).
        self.gc_history: deque[GcRound] = deque(maxlen=RECENT_GC_ROUNDS)
        self._leading: Callable[[], bool] = lambda: False
        Gauge(
            f"{PREFIX}_master_leading",
            "1 while this master holds the master lock, else 0",
            registry=self.registry,
        ).set_function(lambda: 1.0 if self._leading() else 0.0)
        self.rounds = Counter(
            f"{PREFIX}_master_assignment_rounds",
            "Assignment rounds run while leading, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.assigned = Counter(
            f"{PREFIX}_master_tablets_assigned",
            "Tablets this master had a worker load (load_tablet(_at) calls that succeeded)",
            registry=self.registry,
        )
        self.last_round_at = Gauge(
            f"{PREFIX}_master_last_assignment_timestamp_seconds",
            "Wall-clock time the last assignment round ended",
            registry=self.registry,
        )
        self.gc_rounds = Counter(
            f"{PREFIX}_gc_rounds", "Garbage-collection rounds run", registry=self.registry
        )
        self.gc_objects = Counter(
            f"{PREFIX}_gc_deleted_objects",
            "Objects (SSTables, commit-log segments) deleted by garbage collection",
            registry=self.registry,
        )
        self.gc_bytes = Counter(
            f"{PREFIX}_gc_deleted_bytes",
            "Bytes of the objects deleted by garbage collection",
            registry=self.registry,
        )
        for outcome in ("ok", "failed"):
            self.rounds.labels(outcome=outcome)
        #: The replica tables' progress as last read from the coordinator (the status
        #: server's replication sampler refreshes it); the lag is computed at scrape time.
        self.replication: dict[str, Progress] = {}
        self.registry.register(_ReplicationCollector(self))

    def watch_leading(self, leading: Callable[[], bool]) -> None:
        self._leading = leading

    @property
    def leading(self) -> bool:
        return self._leading()

    def count_loads(self, transport: Transport) -> Transport:
        """``transport`` counting each load (``load_tablet[_at]``) that succeeded: the tablets this
        master assigned, in rounds or right after creating a table."""
        return _LoadCounting(transport, self.assigned)

    def assignment_round(self, assigned: int) -> None:
        """Record a finished assignment round that loaded ``assigned`` tablets."""
        self.rounds.labels(outcome="ok").inc()
        self._round(AssignmentRound(self._time(), assigned))

    def assignment_failed(self, error: BaseException) -> None:
        """Record an assignment round that raised ``error``."""
        self.rounds.labels(outcome="failed").inc()
        self._round(AssignmentRound(self._time(), 0, f"{type(error).__name__}: {error}"))

    def _round(self, done: AssignmentRound) -> None:
        self.last_round = done
        self.last_round_at.set(done.at)

    def gc_round(
        self, *, deleted_objects: int, deleted_bytes: int, listed_objects: int | None = None
    ) -> None:
        """The garbage collector's hook: call once per round with what it deleted (and how
        many objects it listed, if known)."""
        if deleted_objects < 0 or deleted_bytes < 0:
            raise InvalidArgument(
                f"a GC round deletes a non-negative amount, got {deleted_objects} objects, "
                f"{deleted_bytes} bytes"
            )
        self.gc_rounds.inc()
        self.gc_objects.inc(deleted_objects)
        self.gc_bytes.inc(deleted_bytes)
        self.gc_history.append(
            GcRound(self._time(), deleted_objects, deleted_bytes, listed_objects)
        )


class _ReplicationCollector(Collector):
    """Each replica table's lag (now minus its applied watermark: it grows while its
    replicator is stopped or stalled), changes applied and whether it reports an error."""

    def __init__(self, metrics: MasterMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        now = self._metrics._time()
        lag = GaugeMetricFamily(
            f"{PREFIX}_replication_lag_seconds",
            "Seconds a replica table is behind its source (writes acknowledged there before "
            "now minus this are applied here)",
            labels=["table"],
        )
        applied = CounterMetricFamily(
            f"{PREFIX}_replication_applied_changes",
            "Changes of its source a replica table applied",
            labels=["table"],
        )
        errors = GaugeMetricFamily(
            f"{PREFIX}_replication_errors",
            "1 while a replica table's replicator reports an error (the source unreachable...)",
            labels=["table"],
        )
        for table, p in sorted(self._metrics.replication.items()):
            if p.state != "following":
                continue
            lag.add_metric([table], p.lag(now))
            applied.add_metric([table], p.applied_changes)
            errors.add_metric([table], 1.0 if p.error else 0.0)
        return [lag, applied, errors]


class _LoadCounting:
    """A transport that counts the loads (``load_tablet``, ``load_tablet_at``) that succeeded."""

    def __init__(self, inner: Transport, assigned: Counter) -> None:
        self.inner = inner
        self._assigned = assigned

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (passed on: the Transport contract)
    ) -> Any:
        response = await self.inner.call(address, method, request, timeout=timeout)
        if method in _LOADS:
            self._assigned.inc()
        return response

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        return self.inner.stream(address, method, request, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()
