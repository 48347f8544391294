"""One synchronous invocation of a tabletstore Lambda function, answer checked
(docs/architecture/design.md §7).

The serverless jobs (``functions/log_sort.py``, ``functions/compaction.py``) answer
``{"ok": true, ...}`` or ``{"ok": false, "error": KIND, "message": ...}``
(``functions/_common.py``). :class:`LambdaFunction` invokes one with boto3's ``lambda.invoke``
(``InvocationType=RequestResponse``) in a thread, at most ``parallel`` at once, and returns a
successful answer; a refusal whose kind the caller names is raised as that error, anything else
that is not a success (the function failed, answered no JSON, or answered something else) as
:class:`~tabletstore.errors.Unavailable`. This is the one module that talks to the Lambda API
(the import-linter contract lists it next to ``storage_s3.s3``); ``master.sort_lambda`` and
``master.compaction_lambda`` build the events and read the answers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import boto3

from tabletstore.errors import InvalidArgument, TabletStoreError, Unavailable

__all__ = ["LambdaFunction"]


class LambdaFunction:
    """The deployed function ``name``, invoked with :meth:`call`."""

    def __init__(self, name: str, *, client: Any | None = None, parallel: int = 16) -> None:
        if not name:
            raise InvalidArgument("a Lambda executor needs a function name")
        self.name = name
        self._client = client
        # Lambda scales out by itself; this only bounds the threads blocked in invoke().
        self._slots = asyncio.Semaphore(parallel)

    def _lambda(self) -> Any:
        if self._client is None:
            self._client = boto3.client("lambda")
        return self._client

    async def call(
        self,
        event: Mapping[str, Any],
        *,
        on: str,
        answer_of: str,
        refusals: Mapping[str, type[TabletStoreError]],
    ) -> dict[str, Any]:
        """Invoke with ``event``; the successful answer. ``on`` names the work in errors
        ("on w-1/0@12"), ``answer_of`` the kind of answer expected ("a log-sort answer")."""
        payload = json.dumps(dict(event)).encode()
        async with self._slots:
            response = await asyncio.to_thread(
                self._lambda().invoke,
                FunctionName=self.name,
                InvocationType="RequestResponse",
                Payload=payload,
            )
        body = response["Payload"].read()
        where = f"Lambda {self.name} on {on}"
        if response.get("FunctionError"):
            raise Unavailable(f"{where} failed: {body[:500]!r}")
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise Unavailable(f"{where} answered no JSON: {body[:200]!r}") from exc
        if not isinstance(answer, dict) or "ok" not in answer:
            raise Unavailable(f"{where} answered {body[:200]!r}, not {answer_of}")
        if not answer["ok"]:
            kind = str(answer.get("error"))
            raise refusals.get(kind, Unavailable)(f"{where}: {kind}: {answer.get('message')}")
        return answer
