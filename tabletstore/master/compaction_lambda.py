"""The major-compaction cycle's compactions run as AWS Lambda functions (§5.4;
docs/architecture/design.md §7).

:class:`LambdaCompactionExecutor` is a
:class:`~tabletstore.master.compaction_cycle.CompactionExecutor` that invokes the function
deployed from ``functions/compaction.py`` once per due tablet, synchronously
(``InvocationType=RequestResponse``) with boto3's ``lambda.invoke`` in a thread. The event is
``{"cluster_url", "table_id", "tablet_id", "epoch"}``: the function reads the record, the
schema and the SSTables itself and hands its output to the serving worker
(``master/remote_compaction.py``), so the event stays small. An answer refusing the work
(the tablet moved, split, changed or is not served: ``Fenced``, ``NotServing``,
``PreconditionFailed``, ``NotFound``) is raised as that error, and anything else that is not a
success as Unavailable: the cycle tries the tablet again at a later round either way. The
invocation and its answer's checks are ``master.lambda_invoke``'s.
"""

from __future__ import annotations

from typing import Any

from tabletstore.errors import (
    Fenced,
    InvalidArgument,
    NotFound,
    NotServing,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)
from tabletstore.master.lambda_invoke import LambdaFunction
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
        if not cluster_url.startswith("etcd://"):
            raise InvalidArgument(
                f"a Lambda compaction executor needs the cluster's etcd:// URL, not {cluster_url!r}"
            )
        self._function = LambdaFunction(function_name, client=client, parallel=parallel)
        self.function_name = function_name
        self._url = cluster_url
        #: The answers of the compactions done (for tests and status).
        self.done: list[dict[str, Any]] = []

    async def compact(self, record: TabletRecord) -> None:
        where = f"{record.table_id}/{record.tablet_id}"
        answer = await self._function.call(
            compaction_event(self._url, record),
            on=where,
            answer_of="a compaction answer",
            refusals=_REFUSALS,
        )
        if answer.get("tablet_id") != record.tablet_id:
            raise Unavailable(
                f"Lambda {self.function_name} on {where} answered for another tablet: {answer!r}"
            )
        self.done.append(answer)

    async def close(self) -> None:
        """Nothing held: an invocation in flight finishes on its own, and its output is
        adopted or refused by the tablet's worker whatever this process does."""
