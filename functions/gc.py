"""Lambda handler: one garbage-collection round of a cluster's bucket (§5.2, §5.4).

Event (validated)::

    {"cluster_url": "etcd://host:2379/namespace", "grace": 3600.0, "dry_run": false}

It reads the store URL the cluster recorded, lists the bucket, marks from METADATA and the
coordinator and deletes what ``tabletstore.master.gc_plan`` finds garbage — exactly what
``tabletstore gc`` does once (the master also collects while it leads; two collections at once
are safe: each deletes only what it alone found unreferenced past the grace period).
Answer: ``{"ok": true, "listed", "deleted", "deleted_bytes", "dry_run", "unknown"}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from functions._common import handle
from functions.rpc_tls import rpc_tls
from tabletstore.client.cluster import ClusterClient
from tabletstore.clock import SystemClock
from tabletstore.master.gc import collect
from tabletstore.master.gc_plan import DEFAULT_GRACE
from tabletstore.metadata.catalog import ClusterSettings
from tabletstore.storage_s3 import open_store


class GcEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster_url: str = Field(pattern=r"^etcd://")
    grace: float = Field(default=DEFAULT_GRACE, ge=0)
    dry_run: bool = False


async def _collect(event: GcEvent) -> dict[str, Any]:
    async with await ClusterClient.open(event.cluster_url, tls=rpc_tls()) as client:
        settings = await ClusterSettings.load(client.coordinator)
        store = open_store(settings.store_url)
        try:
            report = await collect(
                store,
                client.catalog,
                client.coordinator,
                clock=SystemClock(),
                grace=event.grace,
                dry_run=event.dry_run,
            )
        finally:
            await store.close()
    return {
        "listed": report.listed,
        "deleted": report.deleted,
        "deleted_bytes": report.deleted_bytes,
        "dry_run": report.dry_run,
        "unknown": list(report.unknown),
    }


def handler(event: Any, context: Any) -> dict[str, Any]:
    return handle(GcEvent, event, _collect)
