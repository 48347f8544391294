"""Sort tasks run as AWS Lambda functions (§6; DESIGN.md §7): the cloud's sorters.

:class:`LambdaSortExecutor` is a :class:`~tabletstore.master.recovery.SortExecutor` that
invokes the function deployed from ``functions/log_sort.py`` once per task, synchronously
(``InvocationType=RequestResponse``) with boto3's ``lambda.invoke`` in a thread, and reads the
task's manifest from the answer. The event is
``{"store_url", "worker_id", "incarnation", "first_segment"}``: the function reads the plan from
the bucket itself, so the event stays small and a retried invocation (Lambda retries, or this
executor's caller) does the same idempotent task. This is the one module that talks to the
Lambda API (the import-linter contract lists it next to ``storage_s3.s3``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import boto3

from tabletstore.commitlog.runs import SortManifest, SortPlan, SortTask
from tabletstore.errors import Corruption, InvalidArgument, Unavailable
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["LambdaSortExecutor", "sort_event"]


def sort_event(store_url: str, plan: SortPlan, task: SortTask) -> dict[str, Any]:
    """The event ``functions/log_sort.py`` takes for one task."""
    return {
        "store_url": store_url,
        "worker_id": plan.worker_id,
        "incarnation": plan.incarnation,
        "first_segment": task.first,
    }


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
        if not function_name:
            raise InvalidArgument("a Lambda sort executor needs a function name")
        self.function_name = function_name
        self._store = store
        self._url = store_url
        self._client = client
        # Lambda scales out by itself; this only bounds the threads blocked in invoke().
        self._slots = asyncio.Semaphore(parallel)

    def _lambda(self) -> Any:
        if self._client is None:
            self._client = boto3.client("lambda")
        return self._client

    async def run(self, plan: SortPlan, task: SortTask) -> SortManifest:
        payload = json.dumps(sort_event(self._url, plan, task)).encode()
        async with self._slots:
            response = await asyncio.to_thread(
                self._lambda().invoke,
                FunctionName=self.function_name,
                InvocationType="RequestResponse",
                Payload=payload,
            )
        body = response["Payload"].read()
        where = f"Lambda {self.function_name} on {plan.worker_id}/{plan.incarnation}@{task.first}"
        if response.get("FunctionError"):
            raise Unavailable(f"{where} failed: {body[:500]!r}")
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise Unavailable(f"{where} answered no JSON: {body[:200]!r}") from exc
        if not isinstance(answer, dict) or "ok" not in answer:
            raise Unavailable(f"{where} answered {body[:200]!r}, not a log-sort answer")
        if not answer["ok"]:
            kind = answer.get("error")
            error = Corruption if kind == "Corruption" else Unavailable
            raise error(f"{where}: {kind}: {answer.get('message')}")
        return SortManifest.from_bytes(json.dumps(answer["manifest"]).encode(), where=where)

    async def close(self) -> None:
        """Nothing held: invocations in flight finish on their own (they are idempotent)."""
