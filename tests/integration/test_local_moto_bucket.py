"""``start_moto`` creates its bucket even when the first PUTs get no answer in time.

moto loads its S3 backend on the first S3 request, which on a loaded machine takes longer than
one PUT's 2 s timeout. Before, one unanswered PUT failed the whole start ("could not create
bucket"), and with it ``bench.chaos`` and ``local-stack up`` on a busy machine.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tabletstore.cli import localstack

pytestmark = pytest.mark.timeout(120)


def test_the_bucket_is_created_after_puts_that_timed_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = urllib.request.urlopen
    timed_out: list[str] = []

    def slow_first_puts(request: Any, *args: Any, **kwargs: Any) -> Any:
        url = request.full_url if isinstance(request, urllib.request.Request) else str(request)
        method = request.get_method() if isinstance(request, urllib.request.Request) else "GET"
        if method == "PUT" and url.endswith(f"/{localstack.BUCKET}") and len(timed_out) < 2:
            timed_out.append(url)
            raise TimeoutError("timed out")  # as a PUT moto answers after the 2 s timeout
        return real(request, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", slow_first_puts)
    record = localstack.start_moto(tmp_path / "s3.log")
    try:
        assert len(timed_out) == 2
        request = urllib.request.Request(f"{record.url}/{localstack.BUCKET}", method="HEAD")
        with real(request, timeout=10) as response:
            assert response.status == 200
    finally:
        localstack.stop(record)
