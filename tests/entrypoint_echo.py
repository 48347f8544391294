"""A Lambda handler for tests/integration/test_entrypoint.py: answers with what it was given."""

from __future__ import annotations

from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return {"echo": event, "request_id": context.aws_request_id}
