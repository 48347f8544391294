"""moto's S3 server as the project runs it (cli/local_s3.py): its conditional writes decided
atomically, as S3 decides them. moto checks ``If-None-Match: *`` and then writes, in each
request's thread, so two concurrent creates of one key could both succeed (a conformance run
on a loaded CI machine saw two winners of eight)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tabletstore.errors import PreconditionFailed
from tabletstore.storage_s3.s3 import S3ObjectStore


async def test_concurrent_creates_of_one_key_have_one_winner_on_moto(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.s3.models import S3Backend

    stored = S3Backend.put_object

    def slow_put(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)  # every other create checks the key while this one writes it
        return stored(self, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "put_object", slow_put)
    store = S3ObjectStore(s3_url)
    try:
        results = await asyncio.gather(
            *(store.create("race/one", b"writer %d" % i) for i in range(8)),
            return_exceptions=True,
        )
    finally:
        await store.close()
    assert [r for r in results if r is not None and not isinstance(r, PreconditionFailed)] == []
    assert sum(r is None for r in results) == 1, results
