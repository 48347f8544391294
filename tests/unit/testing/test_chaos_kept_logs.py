"""The double-serving evidence outlives garbage collection: the S3 fault proxy keeps a copy of
every commit-log segment the S3 server accepted (and nothing else), and the attribution reads
those copies together with what is left in the bucket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from tabletstore.commitlog.format import encode_record, encode_segment
from tabletstore.keys import Cell, CellKind
from tabletstore.storage_s3 import layout, open_store
from tabletstore.testing.chaos.runner import attribute_values
from tabletstore.testing.chaos.s3proxy import make_app
from tabletstore.testing.chaos.workload import FAMILY, QUALIFIER


def _segment(worker: str, number: int, value: bytes) -> bytes:
    cell = Cell(b"row", FAMILY, QUALIFIER, 0, number, CellKind.PUT, value)
    return encode_segment(worker, 0, number, [encode_record("t1", b"row", [cell])])


def test_the_proxy_keeps_only_accepted_segments(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    segment = _segment("w-a", 1, b"v1")

    async def upstream(request: web.Request) -> web.Response:
        await request.read()
        # A create-only PUT of a number already taken is refused: nothing landed.
        return web.Response(status=412 if "00000000000000000002" in request.path else 200)

    async def run() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", upstream)
        async with TestServer(app) as up:
            proxy = TestServer(make_app(str(up.make_url("")).rstrip("/"), 0, kept))
            async with proxy:
                async with aiohttp.ClientSession() as http:
                    base = str(proxy.make_url("/bucket/data/logs/w-a/00000000000000000000/"))
                    for name, body in [
                        ("00000000000000000001.log", segment),  # accepted
                        ("00000000000000000002.log", segment),  # refused (412)
                        ("00000000000000000003.log", b""),  # a fence: holds no writes
                    ]:
                        async with http.put(base + name, data=body) as resp:
                            await resp.read()
                    url = str(proxy.make_url("/bucket/data/tables/t1/x.sst"))
                    async with http.put(url, data=b"not a log") as resp:
                        await resp.read()

    asyncio.run(run())
    files = sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file())
    assert files == ["w-a/00000000000000000000/00000000000000000001.log"]
    assert (kept / files[0]).read_bytes() == segment


def test_attribution_reads_the_bucket_and_the_kept_copies(tmp_path: Path) -> None:
    store_url = (tmp_path / "bucket").as_uri()
    kept = tmp_path / "kept"

    async def run() -> None:
        store = open_store(store_url)
        try:
            # Still in the bucket: w-a's segment 1. Deleted by GC, kept by the proxy: w-b's
            # segment 1. In both (not yet collected): w-a's segment 2.
            await store.create(
                layout.log_segment_key("w-a", 0, 1), _segment("w-a", 1, b"in-bucket")
            )
            both = _segment("w-a", 2, b"in-both")
            await store.create(layout.log_segment_key("w-a", 0, 2), both)
        finally:
            await store.close()
        for worker, number, data in [
            ("w-b", 1, _segment("w-b", 1, b"collected")),
            ("w-a", 2, both),
        ]:
            key = layout.log_segment_key(worker, 0, number)
            path = kept / key.removeprefix(layout.LOGS)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

        found, bad = await attribute_values(store_url, kept)
        assert bad == 0
        assert found == {
            b"in-bucket": frozenset({"w-a"}),
            b"collected": frozenset({"w-b"}),
            b"in-both": frozenset({"w-a"}),
        }
        # Without the copies, the collected segment's write has no evidence.
        found, _ = await attribute_values(store_url)
        assert b"collected" not in found

    asyncio.run(run())
