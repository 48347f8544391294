"""Sort tasks run as AWS Lambda functions (§6; docs/architecture/design.md §7): the cloud's sorters.

:class:`LambdaSortExecutor` is a :class:`~tabletstore.master.log_recovery.SortExecutor` that
invokes the function deployed from ``functions/log_sort.py`` once per task, synchronously
(``InvocationType=RequestResponse``) with boto3's ``lambda.invoke`` in a thread, and reads the
task's manifest from the answer. The event is
``{"store_url", "worker_id", "incarnation", "first_segment"}`` (and ``"scope"`` for a
point-in-time restore's sort, whose plan lives under ``restores/<scope>/``): the function reads the plan from
the bucket itself, so the event stays small and a retried invocation (Lambda retries, or this
executor's caller) does the same idempotent task. The invocation and its answer's checks are
``master.lambda_invoke``'s.
"""

from __future__ import annotations

import json
from typing import Any

from tabletstore.commitlog.runs import SortManifest, SortPlan, SortTask
from tabletstore.errors import Corruption
from tabletstore.master.lambda_invoke import LambdaFunction
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["LambdaSortExecutor", "sort_event"]


def sort_event(store_url: str, plan: SortPlan, task: SortTask) -> dict[str, Any]:
    """The event ``functions/log_sort.py`` takes for one task (with ``scope`` for a
    restore's sort, ``SortPlan.scope``)."""
    event: dict[str, Any] = {
        "store_url": store_url,
        "worker_id": plan.worker_id,
        "incarnation": plan.incarnation,
        "first_segment": task.first,
    }
    if plan.scope is not None:
        event["scope"] = plan.scope
    return event


class LambdaSortExecutor:
    """Runs each sort task as one invocation of the Lambda function ``function_name``."""

    def __init__(
        self,
        function_name: str,
        store: ObjectStore,
        store_url: str,
        *,
        client: Any | None = None,
        parallel: int = 64,
    ) -> None:
        self._function = LambdaFunction(function_name, client=client, parallel=parallel)
        self.function_name = function_name
        self._store = store
        self._url = store_url

    async def run(self, plan: SortPlan, task: SortTask) -> SortManifest:
        where = f"{plan.worker_id}/{plan.incarnation}@{task.first}"
        answer = await self._function.call(
            sort_event(self._url, plan, task),
            on=where,
            answer_of="a log-sort answer",
            refusals={"Corruption": Corruption},
        )
        return SortManifest.from_bytes(
            json.dumps(answer["manifest"]).encode(), where=f"Lambda {self.function_name} on {where}"
        )

    async def close(self) -> None:
        """Nothing held: invocations in flight finish on their own (they are idempotent)."""
