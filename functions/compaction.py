"""Lambda handler: a major compaction of one tablet (§5.4), adopted by its worker.

Event (validated)::

    {"cluster_url": "etcd://host:2379/namespace", "table_id": "t-1a2b", "tablet_id": "0003",
     "epoch": 812}

``epoch`` (optional) is the record's epoch the caller saw: a tablet at another epoch has
moved since, and the request is refused (``Fenced``) before anything is read. The function
reads the store URL the cluster recorded, the tablet's record from METADATA and its table's
schema, rewrites every SSTable the record lists into one per locality group (deletions and
GC rules applied), writes them with create-only PUTs, and hands them to the worker serving
the tablet, which commits them with its own epoch-conditional record update -- or refuses
them (the tablet moved, split, or its SSTables or schema changed since the read: a zombie
invocation's output is never adopted, and GC deletes it). All of it is
``tabletstore.master.remote_compaction``.

Answer: ``{"ok": true, "table_id", "tablet_id", "epoch", "inputs", "outputs", "bytes_read",
"bytes_written"}`` or ``{"ok": false, "error": "Fenced" | "NotServing" |
"PreconditionFailed" | "Unavailable" | "InvalidArgument" | ..., "message"}``. Invoked by
``tabletstore.master.compaction_lambda.LambdaCompactionExecutor``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from functions._common import handle
from functions.rpc_tls import rpc_tls
from tabletstore.client.cluster import ClusterClient
from tabletstore.clock import SystemClock
from tabletstore.master.remote_compaction import compact_remotely
from tabletstore.metadata.catalog import ClusterSettings
from tabletstore.storage_s3 import open_store


class CompactionEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster_url: str = Field(pattern=r"^etcd://")
    table_id: str = Field(min_length=1, max_length=200)
    tablet_id: str = Field(min_length=1, max_length=200)
    epoch: int | None = Field(default=None, ge=0)


async def _compact(event: CompactionEvent) -> dict[str, Any]:
    async with await ClusterClient.open(event.cluster_url, tls=rpc_tls()) as client:
        settings = await ClusterSettings.load(client.coordinator)
        store = open_store(settings.store_url)
        try:
            done = await compact_remotely(
                client.catalog,
                store,
                client.tablet_server,
                event.table_id,
                event.tablet_id,
                clock=SystemClock(),
                epoch=event.epoch,
            )
        finally:
            await store.close()
    return done.to_json()


def handler(event: Any, context: Any) -> dict[str, Any]:
    return handle(CompactionEvent, event, _compact)
