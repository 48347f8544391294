"""Lambda handler: sort one task of a dead worker's commit log into per-tablet runs (§6).

Event (validated)::

    {"store_url": "s3://bucket/prefix", "worker_id": "w-1", "incarnation": 3,
     "first_segment": 0}

plus ``"scope": "<restore-id>"`` for a task of a point-in-time restore's sort (its plan and
runs under ``restores/<restore-id>/``).

Answer: ``{"ok": true, "manifest": {...}}`` (``commitlog.runs.SortManifest`` as JSON) or
``{"ok": false, "error": "Corruption" | "Unavailable" | "InvalidArgument" | ..., "message"}``.
The task is idempotent: a retried invocation answers the same manifest. Invoked by
``tabletstore.master.sort_lambda.LambdaSortExecutor``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from functions._common import handle
from tabletstore.commitlog.sorting import sort_task_by_number
from tabletstore.storage_s3 import open_store


class LogSortEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    store_url: str = Field(min_length=1)
    worker_id: str = Field(min_length=1, max_length=200)
    incarnation: int = Field(ge=0)
    first_segment: int = Field(ge=0)
    scope: str | None = Field(default=None, min_length=1, max_length=200)


async def _sort(event: LogSortEvent) -> dict[str, Any]:
    store = open_store(event.store_url)
    try:
        manifest = await sort_task_by_number(
            store, event.worker_id, event.incarnation, event.first_segment, scope=event.scope
        )
    finally:
        await store.close()
    return {"manifest": json.loads(manifest.to_bytes())}


def handler(event: Any, context: Any) -> dict[str, Any]:
    return handle(LogSortEvent, event, _sort)
