"""Builds the status API's documents (:mod:`tabletstore.ops.status_api`) from a live process.

A worker's status comes from its server's ``status()`` (what the ``server_status`` RPC answers)
and its registry; a master's from the catalog (tables, tablets and their event logs, §5.2), the
coordinator (the servers directory, claims, the master election's candidates, the status pages'
URLs) and the :class:`~tabletstore.ops.history.Sampler` that reads the workers' pages. Reads
only: building a page never changes the cluster.

Processes find each other's pages through the coordinator: each one that serves a page puts
its URL at ``status_pages/<role>/<id>`` attached to its lease (:func:`publish_page`), so a
dead process's link disappears with its lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import aiohttp

from tabletstore.client.replication_plan import Progress
from tabletstore.clock import wall_time
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator, Lease
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.metadata.catalog import Catalog, TableInfo
from tabletstore.metadata.record import TabletRecord
from tabletstore.ops.history import Reading, Sampler, request_totals, tablet_key
from tabletstore.ops.metrics import MasterMetrics, WorkerMetrics
from tabletstore.ops.status_api import (
    AssignmentInfo,
    ClusterView,
    EventInfo,
    MasterInfo,
    MasterStatus,
    ReplicationInfo,
    TabletInfo,
    TabletView,
    TableView,
    WorkerInfo,
    WorkerStatus,
    WorkerView,
    parse_status,
    text_key,
)
from tabletstore.rpc.messages import ServerStatusResponse

__all__ = [
    "DEFAULT_EVENTS",
    "MAX_TABLETS_SHOWN",
    "MasterLike",
    "WorkerLike",
    "cluster_view",
    "master_status",
    "page_urls",
    "publish_page",
    "scrape_workers",
    "worker_status",
    "worker_view",
]

#: Tablet events shown by a master's /status; events and tablets per table on its page.
DEFAULT_EVENTS = 20
PAGE_EVENTS = 40
MAX_TABLETS_SHOWN = 500
#: Seconds the master waits for one worker's /status before showing it as not answering.
SCRAPE_TIMEOUT = 2.0


class WorkerLike(Protocol):
    """What the worker's status reads (``worker.TabletServer`` has it)."""

    @property
    def worker_id(self) -> str: ...

    @property
    def address(self) -> str: ...

    def status(self) -> ServerStatusResponse: ...


class MasterLike(Protocol):
    """What the master's status reads (``master.Master`` has it)."""

    @property
    def catalog(self) -> Catalog: ...

    async def live_workers(self) -> dict[str, str]: ...


# ---------------------------------------------------------------------------- the pages' URLs


async def publish_page(
    coordinator: Coordinator, role: str, process_id: str, url: str, lease: Lease
) -> None:
    """Record ``url`` as the status page of ``role``/``process_id`` for as long as ``lease``."""
    if not url.startswith("http"):
        raise InvalidArgument(f"a status page URL is http(s), got {url!r}")
    await coordinator.put(paths.status_page(role, process_id), url.encode(), lease=lease)


async def page_urls(coordinator: Coordinator, role: str) -> dict[str, str]:
    """process id -> status page URL of every live process of ``role``."""
    kvs = await coordinator.get_prefix(paths.status_pages_prefix(role))
    return {paths.parse_status_page(kv.key)[1]: kv.value.decode() for kv in kvs}


# ---------------------------------------------------------------------------- /status


async def worker_status(
    server: WorkerLike, metrics: WorkerMetrics, *, metrics_url: str | None = None
) -> WorkerStatus:
    """A worker's status: its tablets as the ``server_status`` RPC reports them, its lease
    and its request counters."""
    st = server.status()
    tablets = [
        TabletInfo(
            table_id=t.table_id,
            tablet_id=t.tablet_id,
            start_row=text_key(t.start_row),
            end_row=text_key(t.end_row) if t.end_row is not None else None,
            sstables=t.sstables,
            sstable_bytes=t.sstable_bytes,
            memtable_bytes=t.memtable_bytes,
            requests=t.requests,
        )
        for t in st.tablets
    ]
    return WorkerStatus(
        id=st.worker_id,
        address=st.address,
        metrics_url=metrics_url,
        lease_remaining_seconds=metrics.lease_remaining(),
        tablets=tablets,
        memtable_bytes=sum(t.memtable_bytes for t in tablets),
        sstable_bytes=sum(t.sstable_bytes for t in tablets),
        totals=request_totals(metrics.registry),
    )


async def master_status(
    master: MasterLike,
    metrics: MasterMetrics,
    *,
    address: str,
    metrics_url: str | None = None,
    events: int = DEFAULT_EVENTS,
    tables: Sequence[TableRecords] | None = None,
) -> MasterStatus:
    """A master's status: leadership, live workers, the last assignment round, and the most
    recent tablet events (read from the catalog, so a standby shows them too; ``tables``:
    already read)."""
    if tables is None:
        tables = await _read_tables(master.catalog)
    recent = _tablet_events(tables)
    last = metrics.last_round
    return MasterStatus(
        id=metrics.process_id,
        address=address,
        metrics_url=metrics_url,
        leading=metrics.leading,
        lease_remaining_seconds=metrics.lease_remaining(),
        live_workers=await master.live_workers(),
        last_assignment=(
            AssignmentInfo(at=last.at, assigned=last.assigned, error=last.error)
            if last is not None
            else None
        ),
        recent_events=recent[-events:] if events > 0 else [],
    )


#: A table and its tablets' records, as the catalog lists them.
TableRecords = tuple[TableInfo, list[TabletRecord]]


async def _read_tables(catalog: Catalog) -> list[TableRecords]:
    """Every user table with its tablets' records (one METADATA scan per table)."""
    return [
        (info, await catalog.list_tablets(info.table_id))
        for info in sorted(await catalog.list_tables(), key=lambda i: i.schema.name)
    ]


def _tablet_events(tables: Sequence[TableRecords], *, durations: bool = False) -> list[EventInfo]:
    """Every event the tablet records carry, oldest first. ``durations``: a ``loaded`` event's
    detail also says how long after its ``assigned`` event it came (the load, the recovery's
    log replay included, §5.2)."""
    recent: list[EventInfo] = []
    for info, records in tables:
        for rec in records:
            name = f"{info.schema.name}/{rec.tablet_id}"
            assigned: float | None = None
            for e in rec.events:
                detail = e.detail
                if e.kind == "assigned":
                    assigned = e.at
                elif e.kind == "loaded" and durations and assigned is not None:
                    detail = f"{detail} ({e.at - assigned:.2f} s after its assignment)"
                    assigned = None
                recent.append(EventInfo(at=e.at, tablet=name, kind=e.kind, detail=detail))
    recent.sort(key=lambda e: e.at)
    return recent


# ---------------------------------------------------------------------------- the master's page


async def scrape_workers(
    master: MasterLike,
    coordinator: Coordinator,
    session: Callable[[], aiohttp.ClientSession],
    *,
    deadline: float = SCRAPE_TIMEOUT,
) -> Reading:
    """Each live worker's /status, read from the page it published (or why not)."""
    workers = await master.live_workers()
    pages = await page_urls(coordinator, "worker")

    async def one(worker_id: str) -> tuple[str | None, WorkerStatus | str]:
        url = pages.get(worker_id)
        if url is None:
            return None, "serves no status page (start it with --metrics-port)"
        try:
            async with session().get(
                f"{url}/status", timeout=aiohttp.ClientTimeout(total=deadline)
            ) as response:
                body = await response.read()
                if response.status != 200:
                    return url, f"/status answered {response.status}"
            status = parse_status(body)
        except TimeoutError:
            return url, f"no answer within {deadline:g} s"
        except aiohttp.ClientError as exc:
            return url, f"unreachable: {exc}"
        except InvalidArgument as exc:
            return url, str(exc)
        if not isinstance(status, WorkerStatus):
            return url, "its /status is not a worker's"
        return url, status

    ids = sorted(workers)
    answers = await asyncio.gather(*(one(w) for w in ids))
    return dict(zip(ids, answers, strict=True))


async def _masters(coordinator: Coordinator, this: str) -> list[MasterInfo]:
    """The master election's candidates, the leader (oldest key) first (election.py)."""
    kvs = await coordinator.get_prefix(paths.election_prefix(paths.MASTER_ELECTION))
    kvs.sort(key=lambda kv: kv.create_revision)
    pages = await page_urls(coordinator, "master")
    out = []
    for i, kv in enumerate(kvs):
        address = kv.value.decode()
        out.append(
            MasterInfo(
                address=address,
                leading=i == 0,
                page_url=pages.get(address),
                this_page=address == this,
            )
        )
    return out


def _worker_infos(live: Mapping[str, str], sampler: Sampler) -> list[WorkerInfo]:
    out = []
    for worker_id, address in sorted(live.items()):
        page, status, at = sampler.latest.get(worker_id, (None, "not read yet", 0.0))
        history = sampler.histories.get(worker_id)
        ok = status if isinstance(status, WorkerStatus) else None
        out.append(
            WorkerInfo(
                id=worker_id,
                address=address,
                page_url=page,
                lease_remaining_seconds=ok.lease_remaining_seconds if ok else None,
                tablets=len(ok.tablets) if ok else 0,
                memtable_bytes=ok.memtable_bytes if ok else 0,
                sstable_bytes=ok.sstable_bytes if ok else 0,
                requests_per_second=history.requests_per_second() if history else None,
                error=None if ok else str(status),
                sampled_at=at or None,
            )
        )
    return out


async def _tables(
    tables: Sequence[TableRecords],
    coordinator: Coordinator,
    sampler: Sampler,
    pages: Mapping[str, str],
) -> list[TableView]:
    kvs = await coordinator.get_prefix(paths.claims_prefix())
    claims = {paths.parse_claim(kv.key): kv.value.decode() for kv in kvs}
    served: dict[str, TabletInfo] = {}
    rates: dict[str, float] = {}
    for worker_id, (_, status, _) in sampler.latest.items():
        if isinstance(status, WorkerStatus):
            served.update({tablet_key(t.table_id, t.tablet_id): t for t in status.tablets})
            history = sampler.histories.get(worker_id)
            if history is not None:
                rates.update(history.tablet_rates())
    out = []
    for info, records in tables:
        views = []
        for rec in records[:MAX_TABLETS_SHOWN]:
            key = tablet_key(rec.table_id, rec.tablet_id)
            worker = claims.get((rec.table_id, rec.tablet_id))
            live = served.get(key)
            views.append(
                TabletView(
                    tablet_id=rec.tablet_id,
                    start_row=text_key(rec.start_row),
                    end_row=text_key(rec.end_row) if rec.end_row is not None else None,
                    worker=worker,
                    worker_page_url=pages.get(worker) if worker is not None else None,
                    sstables=sum(len(refs) for refs in rec.sstables.values()),
                    sstable_bytes=rec.size,
                    memtable_bytes=live.memtable_bytes if live is not None else None,
                    requests_per_second=rates.get(key),
                )
            )
        hidden = max(0, len(records) - MAX_TABLETS_SHOWN)
        out.append(
            TableView(
                name=info.schema.name, table_id=info.table_id, tablets=views, hidden_tablets=hidden
            )
        )
    return out


def _gc_events(metrics: MasterMetrics) -> list[EventInfo]:
    return [
        EventInfo(
            at=r.at,
            tablet="(garbage collector)",
            kind="gc_round",
            detail=(
                f"deleted {r.deleted_objects} objects ({r.deleted_bytes} bytes)"
                + (f" of {r.listed_objects} listed" if r.listed_objects is not None else "")
            ),
        )
        for r in metrics.gc_history
    ]


async def cluster_view(
    master: MasterLike,
    coordinator: Coordinator,
    metrics: MasterMetrics,
    sampler: Sampler,
    *,
    address: str,
    metrics_url: str | None = None,
) -> ClusterView:
    """Everything on the master's page."""
    tables = await _read_tables(master.catalog)
    status = await master_status(
        master, metrics, address=address, metrics_url=metrics_url, tables=tables
    )
    pages = await page_urls(coordinator, "worker")
    events = [*_tablet_events(tables, durations=True), *_gc_events(metrics)]
    events.sort(key=lambda e: e.at, reverse=True)
    return ClusterView(
        generated_at=wall_time(),
        master=status,
        masters=await _masters(coordinator, address),
        workers=_worker_infos(status.live_workers, sampler),
        tables=await _tables(tables, coordinator, sampler, pages),
        events=events[:PAGE_EVENTS],
        replication=replication_infos(metrics.replication, wall_time()),
    )


def replication_infos(progress: Mapping[str, Progress], now: float) -> list[ReplicationInfo]:
    """The page's replication section: each replica table's state and lag at ``now``."""
    return [
        ReplicationInfo(
            table=name,
            source=p.source,
            source_table=p.table,
            state="promoted" if p.state == "promoted" else "following",
            lag_seconds=p.lag(now),
            applied_watermark=p.applied_watermark(),
            partitions=len(p.partitions),
            applied_changes=p.applied_changes,
            error=p.error,
            updated_at=p.updated_at,
        )
        for name, p in sorted(progress.items())
    ]


# ---------------------------------------------------------------------------- a worker's page


async def worker_view(
    status: WorkerStatus, sampler: Sampler, coordinator: Coordinator | None
) -> WorkerView:
    """Everything on a worker's page: its status, each tablet's request rate, the masters'
    pages to link back to."""
    history = sampler.histories.get(status.id)
    masters: dict[str, str] = {}
    if coordinator is not None:
        try:
            masters = await page_urls(coordinator, "master")
        except TabletStoreError:
            masters = {}  # the coordinator is unreachable: the page shows the worker anyway
    return WorkerView(
        generated_at=wall_time(),
        status=status,
        tablet_requests_per_second=history.tablet_rates() if history is not None else {},
        master_pages=masters,
    )
