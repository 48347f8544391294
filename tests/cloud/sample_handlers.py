"""Lambda handlers for tests/cloud/test_lambda_runtime.py (run under the real awslambdaric)."""

from __future__ import annotations

from typing import Any


def echo(event: Any, context: Any) -> dict[str, Any]:
    return {"echo": event, "request_id": context.aws_request_id}


def fail(event: Any, context: Any) -> dict[str, Any]:
    raise ValueError(f"refused {event!r}")
