"""What every handler shares: validating the event, the etcd client certificate of a function
that opens the cluster (functions/etcd_tls.py), running tabletstore's async code once,
and answering in JSON (``{"ok": true, ...}`` or ``{"ok": false, "error": <kind>, "message"}``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from functions.etcd_tls import ensure_etcd_tls
from tabletstore.errors import TabletStoreError

E = TypeVar("E", bound=BaseModel)


def handle(
    kind: type[E], event: Any, call: Callable[[E], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Validate ``event`` as ``kind``, run ``call`` on it, answer in JSON. A tabletstore error
    is an answer (its class name is the ``error``); anything else propagates, so Lambda
    reports a function error and may retry (every handler here is idempotent)."""
    try:
        parsed = kind.model_validate(event)
    except ValidationError as exc:
        return {"ok": False, "error": "InvalidArgument", "message": str(exc)}
    # A function that opens the cluster's etcd needs its client certificate in /tmp first.
    cluster_url = getattr(parsed, "cluster_url", None)
    if isinstance(cluster_url, str):
        ensure_etcd_tls(cluster_url)
    try:
        result = asyncio.run(call(parsed))
    except TabletStoreError as exc:
        return {"ok": False, "error": type(exc).__name__, "message": str(exc)}
    return {"ok": True, **result}
