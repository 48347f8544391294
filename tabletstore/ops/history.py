"""The recent past of each worker, for the status pages' charts: a bounded ring of samples.

Bigtable's operators watched request rates and latencies per tablet server (§6, §7); a page
needs the last few minutes of them without a Prometheus server. A :class:`Sampler` reads each
worker's :class:`~tabletstore.ops.status_api.WorkerStatus` every ``interval`` seconds (the
master over HTTP from the workers' ``/status``, a worker from its own registry) and keeps, per
worker, a :class:`History`: at most ``capacity`` samples of its counters
(:class:`~tabletstore.ops.status_api.RequestTotals`) and of each tablet's request count. Memory
is bounded by ``capacity`` x workers x tablets per worker; a worker that leaves is forgotten.

Rates are taken between consecutive samples, pure functions of two samples
(:func:`point_between`): a counter that went down (the process restarted under the same id)
counts from zero, as Prometheus' ``rate`` does; the 99th percentile latency is interpolated in
the latency histogram's buckets, as Prometheus' ``histogram_quantile`` does
(:func:`quantile`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from tabletstore.clock import wall_time
from tabletstore.errors import InvalidArgument
from tabletstore.ops.metrics import LATENCY_BUCKETS, PREFIX
from tabletstore.ops.status_api import ChartPoint, Charts, ChartSeries, RequestTotals, WorkerStatus

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_INTERVAL",
    "History",
    "Sample",
    "Sampler",
    "point_between",
    "quantile",
    "request_totals",
]

log = logging.getLogger(__name__)

#: Seconds between samples, and samples kept per worker: six minutes of history.
DEFAULT_INTERVAL = 2.0
DEFAULT_CAPACITY = 180

_REQUESTS = f"{PREFIX}_rpc_requests_total"
_LATENCY = f"{PREFIX}_rpc_latency_seconds"
_S3_REQUESTS = f"{PREFIX}_object_store_requests_total"
_S3_ERRORS = f"{PREFIX}_object_store_errors_total"
#: Outcomes that are not errors: served, or the caller went away.
_NOT_ERRORS = ("ok", "cancelled")


def request_totals(registry: CollectorRegistry) -> RequestTotals:
    """A process's counters from its registry (only the collectors that own them are run)."""
    names = [_REQUESTS, f"{_LATENCY}_bucket", f"{_LATENCY}_sum", _S3_REQUESTS, _S3_ERRORS]
    requests = errors = s3_requests = s3_errors = 0.0
    latency_sum = 0.0
    bounds = [*(str(float(b)) for b in LATENCY_BUCKETS), "+Inf"]
    buckets = dict.fromkeys(bounds, 0.0)
    for family in registry.restricted_registry(names).collect():
        for s in family.samples:
            if s.name == _REQUESTS:
                requests += s.value
                if s.labels.get("outcome") not in _NOT_ERRORS:
                    errors += s.value
            elif s.name == f"{_LATENCY}_bucket":
                le = s.labels["le"]
                buckets[le if le == "+Inf" else str(float(le))] += s.value
            elif s.name == f"{_LATENCY}_sum":
                latency_sum += s.value
            elif s.name == _S3_REQUESTS:
                s3_requests += s.value
            elif s.name == _S3_ERRORS:
                s3_errors += s.value
    return RequestTotals(
        requests=int(requests),
        errors=int(errors),
        latency_sum_seconds=latency_sum,
        latency_buckets=[int(buckets[b]) for b in bounds],
        s3_requests=int(s3_requests),
        s3_errors=int(s3_errors),
    )


def quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """The ``q``-quantile of a histogram: ``counts[i]`` observations at most ``bounds[i]``
    (cumulative; one more count than bounds, for +Inf). Linear within the bucket it falls in,
    as Prometheus' ``histogram_quantile``; one in the +Inf bucket is reported as the largest
    bound. None when the histogram is empty."""
    if not 0 <= q <= 1:
        raise InvalidArgument(f"a quantile is in [0, 1], got {q}")
    if len(counts) != len(bounds) + 1:
        raise InvalidArgument(f"{len(bounds)} bounds need {len(bounds) + 1} counts")
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=False):
        if count >= rank:
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return float(bounds[-1])


def _delta(new: float, old: float) -> float:
    """How much a counter grew; a counter that went down restarted from zero."""
    return new - old if new >= old else new


@dataclass(frozen=True, slots=True)
class Sample:
    """A worker's counters at one moment (wall-clock ``at``) and each tablet's requests."""

    at: float
    totals: RequestTotals
    tablet_requests: Mapping[str, int]


def point_between(old: Sample, new: Sample) -> ChartPoint | None:
    """The rates between two samples; None if no time passed between them."""
    seconds = new.at - old.at
    if seconds <= 0:
        return None
    a, b = old.totals, new.totals
    restarted = b.requests < a.requests
    requests = _delta(b.requests, a.requests)
    if restarted:  # everything since its start
        counts = [float(c) for c in b.latency_buckets]
    else:
        pairs = zip(b.latency_buckets, a.latency_buckets, strict=False)
        counts = [_delta(nb, ob) for nb, ob in pairs]
    observed = counts[-1] if counts else 0
    latency = _delta(b.latency_sum_seconds, a.latency_sum_seconds)
    p99 = None
    if len(counts) == len(LATENCY_BUCKETS) + 1 == len(a.latency_buckets):
        p99 = quantile(0.99, LATENCY_BUCKETS, counts)
    return ChartPoint(
        at=new.at,
        requests_per_second=requests / seconds,
        errors_per_second=_delta(b.errors, a.errors) / seconds,
        latency_mean_ms=latency / observed * 1000 if observed else None,
        latency_p99_ms=p99 * 1000 if p99 is not None else None,
        s3_requests_per_second=_delta(b.s3_requests, a.s3_requests) / seconds,
    )


class History:
    """One worker's last ``capacity`` samples. Only the last two keep their per-tablet counts
    (all the tablets' rates need), so a worker with many tablets costs ``capacity`` small
    samples plus two tablet maps."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 2:
            raise InvalidArgument(f"a history keeps at least 2 samples, got {capacity}")
        self._samples: deque[Sample] = deque(maxlen=capacity)

    def add(self, sample: Sample) -> None:
        if len(self._samples) >= 2:
            older = self._samples[-2]
            self._samples[-2] = Sample(older.at, older.totals, {})
        self._samples.append(sample)

    def __len__(self) -> int:
        return len(self._samples)

    def points(self) -> list[ChartPoint]:
        samples = list(self._samples)
        found = (point_between(a, b) for a, b in itertools.pairwise(samples))
        return [p for p in found if p is not None]

    def requests_per_second(self) -> float | None:
        """Over the last interval; None with fewer than two samples."""
        if len(self._samples) < 2:
            return None
        point = point_between(self._samples[-2], self._samples[-1])
        return point.requests_per_second if point is not None else None

    def tablet_rates(self) -> dict[str, float]:
        """'table id/tablet id' -> requests/s over the last interval (tablets in both samples;
        a count that went down means the tablet was reloaded: counted from zero)."""
        if len(self._samples) < 2:
            return {}
        old, new = self._samples[-2], self._samples[-1]
        seconds = new.at - old.at
        if seconds <= 0:
            return {}
        return {
            key: _delta(n, old.tablet_requests.get(key, 0)) / seconds
            for key, n in new.tablet_requests.items()
        }


def tablet_key(table_id: str, tablet_id: str) -> str:
    return f"{table_id}/{tablet_id}"


#: What a sampler reads each round: worker id -> (its status page URL or None, its status or
#: why it could not be read).
Reading = Mapping[str, tuple[str | None, WorkerStatus | str]]


class Sampler:
    """Reads every worker's status each ``interval`` seconds into a :class:`History` each.

    ``read`` is the I/O (the master scrapes the workers' pages; a worker reads itself);
    :meth:`sample_once` is one round, :meth:`run` loops until cancelled."""

    def __init__(
        self,
        read: Callable[[], Awaitable[Reading]],
        *,
        interval: float = DEFAULT_INTERVAL,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = wall_time,
    ) -> None:
        if interval <= 0:
            raise InvalidArgument(f"a sampling interval is positive, got {interval}")
        self._read = read
        self.interval = interval
        self.capacity = capacity
        self._clock = clock
        self.histories: dict[str, History] = {}
        #: The last reading of each worker: (page URL, status or error, when).
        self.latest: dict[str, tuple[str | None, WorkerStatus | str, float]] = {}

    async def sample_once(self) -> None:
        reading = await self._read()
        now = self._clock()
        for gone in set(self.histories) - set(reading):
            del self.histories[gone]
        for gone in set(self.latest) - set(reading):
            del self.latest[gone]
        for worker, (page, status) in reading.items():
            self.latest[worker] = (page, status, now)
            if isinstance(status, str) or status.totals is None:
                continue
            tablets = {tablet_key(t.table_id, t.tablet_id): t.requests for t in status.tablets}
            history = self.histories.setdefault(worker, History(self.capacity))
            history.add(Sample(now, status.totals, tablets))

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled; a failed round is logged and
        the next one goes on (the page shows the last good samples meanwhile)."""
        while True:
            try:
                await self.sample_once()
            except Exception:  # a bug or an unexpected failure must not end the page's charts
                log.exception("sampling the workers' status failed")
            await asyncio.sleep(self.interval)

    def charts(self) -> Charts:
        series = [
            ChartSeries(
                process=worker,
                page_url=self.latest.get(worker, (None, "", 0.0))[0],
                points=history.points(),
            )
            for worker, history in sorted(self.histories.items())
        ]
        return Charts(
            interval_seconds=self.interval,
            window_seconds=self.interval * self.capacity,
            series=series,
        )
