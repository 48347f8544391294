"""The major-compaction cycle's compactions run as AWS Lambda functions (§5.4; DESIGN.md §7).

:class:`LambdaCompactionExecutor` is a
:class:`~tabletstore.master.compaction_cycle.CompactionExecutor` that invokes the function
deployed from ``functions/compaction.py`` once per due tablet, synchronously
(``InvocationType=RequestResponse``) with boto3's ``lambda.invoke`` in a thread. The event is
``{"cluster_url", "table_id", "tablet_id", "epoch"}``: the function reads the record, the
schema and the SSTables itself and hands its output to the serving worker
(``master/remote_compaction.py``), so the event stays small. An answer refusing the work
(the tablet moved, split, changed or is not served: ``Fenced``, ``NotServing``,
``PreconditionFailed``, ``NotFound``) is raised as that error, and anything else that is not a
success as Unavailable: the cycle tries the tablet again at a later round either way. This
module and ``master.sort_lambda`` are the ones that talk to the Lambda API (the import-linter
contract lists them next to ``storage_s3.s3``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import boto3

from tabletstore.errors import (
    Fenced,
    InvalidArgument,
    NotFound,
    NotServing,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)
from tabletstore.metadata.record import TabletRecord

__all__ = ["LambdaCompactionExecutor", "compaction_event"]

#: The refusals an answer may name, raised as themselves.
_REFUSALS: dict[str, type[TabletStoreError]] = {
    "Fenced": Fenced,
    "NotServing": NotServing,
    "PreconditionFailed": PreconditionFailed,
    "NotFound": NotFound,
    "InvalidArgument": InvalidArgument,
}


def compaction_event(cluster_url: str, record: TabletRecord) -> dict[str, Any]:
    """The event ``functions/compaction.py`` takes for ``record``'s tablet."""
    return {
        "cluster_url": cluster_url,
        "table_id": record.table_id,
        "tablet_id": record.tablet_id,
        "epoch": record.epoch,
    }


class LambdaCompactionExecutor:
    """Runs each major compaction as one invocation of the Lambda function ``function_name``."""

    def __init__(
        self,
        function_name: str,
        cluster_url: str,
        *,
        client: Any | None = None,
        parallel: int = 16,
    ) -> None:
        if not function_name:
            raise InvalidArgument("a Lambda compaction executor needs a function name")
        if not cluster_url.startswith("etcd://"):
            raise InvalidArgument(
                f"a Lambda compaction executor needs the cluster's etcd:// URL, not {cluster_url!r}"
            )
        self.function_name = function_name
        self._url = cluster_url
        self._client = client
        # Lambda scales out by itself; this only bounds the threads blocked in invoke().
        self._slots = asyncio.Semaphore(parallel)
        #: The answers of the compactions done (for tests and status).
        self.done: list[dict[str, Any]] = []

    def _lambda(self) -> Any:
        if self._client is None:
            self._client = boto3.client("lambda")
        return self._client

    async def compact(self, record: TabletRecord) -> None:
        payload = json.dumps(compaction_event(self._url, record)).encode()
        async with self._slots:
            response = await asyncio.to_thread(
                self._lambda().invoke,
                FunctionName=self.function_name,
                InvocationType="RequestResponse",
                Payload=payload,
            )
        body = response["Payload"].read()
        where = f"Lambda {self.function_name} on {record.table_id}/{record.tablet_id}"
        if response.get("FunctionError"):
            raise Unavailable(f"{where} failed: {body[:500]!r}")
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise Unavailable(f"{where} answered no JSON: {body[:200]!r}") from exc
        if not isinstance(answer, dict) or "ok" not in answer:
            raise Unavailable(f"{where} answered {body[:200]!r}, not a compaction answer")
        if not answer["ok"]:
            kind = str(answer.get("error"))
            raise _REFUSALS.get(kind, Unavailable)(f"{where}: {kind}: {answer.get('message')}")
        if answer.get("tablet_id") != record.tablet_id:
            raise Unavailable(f"{where} answered for another tablet: {body[:200]!r}")
        self.done.append(answer)

    async def close(self) -> None:
        """Nothing held: an invocation in flight finishes on its own, and its output is
        adopted or refused by the tablet's worker whatever this process does."""
