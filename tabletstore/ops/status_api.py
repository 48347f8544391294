"""The status API: the JSON documents a process's HTTP endpoint serves, as pydantic models.

The status API is a boundary (docs/architecture/conventions.md convention 9): every document a
browser, a script or another process reads is a model here, validated when it is built and when it
is read back (:func:`parse_status`). The master's page (§5.2: the master tracks the live tablet
servers and the assignment of tablets) and each worker's page are rendered from the same models the
JSON endpoints return, so what a person sees and what a script reads cannot disagree.

========================  ==================================================================
``GET /status``           :class:`WorkerStatus` or :class:`MasterStatus` (``role`` tells)
``GET /api/cluster``      :class:`ClusterView`: the master's page (masters, workers, tables
                          with their tablets, recent events)
``GET /api/worker``       :class:`WorkerView`: a worker's page
``GET /api/charts``       :class:`Charts`: requests/s, latency and S3 requests per worker over
                          the last minutes (:mod:`tabletstore.ops.history`)
========================  ==================================================================

Row keys are shown as text (bytes that are not UTF-8 as ``\\xNN``), and only to a viewer that
may see the table's keys (:mod:`tabletstore.ops.status_redaction`): for any other table a
tablet's ``start_row`` is empty, its ``end_row`` None and its ``keys_hidden`` true, and its
events' details are empty. Times are wall-clock seconds since the epoch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tabletstore.errors import InvalidArgument

__all__ = [
    "AssignmentInfo",
    "ChartPoint",
    "ChartSeries",
    "Charts",
    "ClusterView",
    "EventInfo",
    "MasterInfo",
    "MasterStatus",
    "ProcessStatus",
    "ReplicationInfo",
    "RequestTotals",
    "TableView",
    "TabletInfo",
    "TabletView",
    "WorkerInfo",
    "WorkerStatus",
    "WorkerView",
    "parse_status",
    "text_key",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def text_key(key: bytes) -> str:
    """A row key as text: UTF-8, with the bytes that are not as ``\\xNN``."""
    return key.decode("utf-8", "backslashreplace")


# ---------------------------------------------------------------------------- /status


class RequestTotals(_Model):
    """A process's request counters since it started (what the charts take rates of)."""

    requests: int = Field(ge=0, description="RPC requests served, every method and outcome")
    errors: int = Field(ge=0, description="Requests that ended in an error (not cancelled)")
    latency_sum_seconds: float = Field(ge=0)
    latency_buckets: list[int] = Field(
        description="Cumulative request counts per latency bound (metrics.LATENCY_BUCKETS), "
        "then +Inf"
    )
    s3_requests: int = Field(ge=0, description="Object-store requests (GET, PUT, LIST...)")
    s3_errors: int = Field(ge=0)


class TabletInfo(_Model):
    """One served tablet."""

    table_id: str
    tablet_id: str
    start_row: str
    end_row: str | None = Field(description="None: the tablet runs to the end of the table")
    sstables: int = Field(ge=0)
    sstable_bytes: int = Field(ge=0)
    memtable_bytes: int = Field(ge=0)
    requests: int = Field(ge=0, description="Requests for this tablet since it was loaded")
    keys_hidden: bool = Field(
        default=False, description="True: its row keys are not the viewer's to see (blanked)"
    )


class WorkerStatus(_Model):
    role: Literal["worker"] = "worker"
    id: str
    address: str
    metrics_url: str | None
    lease_remaining_seconds: float | None = Field(ge=0)
    tablets: list[TabletInfo]
    memtable_bytes: int = Field(ge=0)
    sstable_bytes: int = Field(ge=0)
    totals: RequestTotals | None = Field(
        default=None, description="Counters for rates; None from a process that keeps none"
    )


class EventInfo(_Model):
    at: float = Field(description="Wall-clock seconds since the epoch")
    tablet: str = Field(description="table name / tablet id, or the process for a GC round")
    kind: str
    detail: str


class AssignmentInfo(_Model):
    at: float
    assigned: int = Field(ge=0)
    error: str | None


class MasterStatus(_Model):
    role: Literal["master"] = "master"
    id: str
    address: str
    metrics_url: str | None
    leading: bool = Field(description="False: a standby waiting for the master lock")
    lease_remaining_seconds: float | None = Field(ge=0)
    live_workers: dict[str, str] = Field(description="worker id -> RPC address")
    last_assignment: AssignmentInfo | None
    recent_events: list[EventInfo]


ProcessStatus = Annotated[WorkerStatus | MasterStatus, Field(discriminator="role")]
_STATUS: TypeAdapter[WorkerStatus | MasterStatus] = TypeAdapter(ProcessStatus)


def parse_status(body: bytes | str) -> WorkerStatus | MasterStatus:
    """A ``/status`` body validated into its model; InvalidArgument naming what is wrong."""
    try:
        return _STATUS.validate_json(body)
    except ValidationError as exc:
        raise InvalidArgument(f"not a tabletstore /status document: {exc}") from exc


# ---------------------------------------------------------------------------- charts


class ChartPoint(_Model):
    """Rates over the interval that ends at ``at`` (between two samples)."""

    at: float
    requests_per_second: float = Field(ge=0)
    errors_per_second: float = Field(ge=0)
    latency_mean_ms: float | None = Field(description="None: no request in the interval")
    latency_p99_ms: float | None = Field(
        description="Estimated from the latency histogram's buckets, as Prometheus' "
        "histogram_quantile does"
    )
    s3_requests_per_second: float = Field(ge=0)


class ChartSeries(_Model):
    process: str = Field(description="The worker id")
    page_url: str | None
    points: list[ChartPoint]


class Charts(_Model):
    interval_seconds: float = Field(gt=0, description="Seconds between samples")
    window_seconds: float = Field(gt=0, description="How far back samples are kept")
    series: list[ChartSeries]


# ---------------------------------------------------------------------------- the pages


class MasterInfo(_Model):
    """A master process: the leader or a standby (a candidate for the master lock, §5.2)."""

    address: str
    leading: bool
    page_url: str | None
    this_page: bool = Field(description="True for the master serving this page")


class WorkerInfo(_Model):
    """A live worker as the master sees it (servers directory) and as it last answered."""

    id: str
    address: str
    page_url: str | None
    lease_remaining_seconds: float | None = Field(ge=0)
    tablets: int = Field(ge=0)
    memtable_bytes: int = Field(ge=0)
    sstable_bytes: int = Field(ge=0)
    requests_per_second: float | None = Field(description="None: fewer than two samples yet")
    error: str | None = Field(description="Why its last status could not be read, if so")
    sampled_at: float | None = Field(description="When its status was last read")


class TabletView(_Model):
    tablet_id: str
    start_row: str
    end_row: str | None
    worker: str | None = Field(description="The worker id holding the tablet's claim")
    worker_page_url: str | None
    sstables: int = Field(ge=0)
    sstable_bytes: int = Field(ge=0)
    memtable_bytes: int | None = Field(description="None: its worker's status is not known")
    requests_per_second: float | None
    keys_hidden: bool = Field(
        default=False, description="True: its row keys are not the viewer's to see (blanked)"
    )


class TableView(_Model):
    name: str
    table_id: str
    tablets: list[TabletView]
    hidden_tablets: int = Field(ge=0, description="Tablets not listed (the page's bound)")


class ReplicationInfo(_Model):
    """A replica table of this cluster (client/replicator.py), or one promoted from replica."""

    table: str
    source: str = Field(description="The source cluster's URL")
    source_table: str
    state: Literal["following", "promoted"]
    lag_seconds: float = Field(ge=0, description="Now minus the applied watermark")
    applied_watermark: float = Field(description="Every source write before it is applied")
    partitions: int = Field(ge=0)
    applied_changes: int = Field(ge=0)
    error: str | None = Field(description="Why it stalls or stopped (the source unreachable...)")
    updated_at: float = Field(description="When its replicator last saved its progress")


class ClusterView(_Model):
    """Everything on the master's page."""

    generated_at: float
    master: MasterStatus
    masters: list[MasterInfo]
    workers: list[WorkerInfo]
    tables: list[TableView]
    events: list[EventInfo] = Field(description="Newest first")
    replication: list[ReplicationInfo] = Field(default_factory=list)


class WorkerView(_Model):
    """Everything on a worker's page."""

    generated_at: float
    status: WorkerStatus
    tablet_requests_per_second: dict[str, float] = Field(
        description="'table id/tablet id' -> requests/s over the last interval"
    )
    master_pages: dict[str, str] = Field(description="master address -> its status page URL")
