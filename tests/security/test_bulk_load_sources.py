"""Bulk load may not be pointed at anything but the caller's own staging area.

A real master and worker on loopback (the session's etcd and moto). A victim's table holds a
cell in an SSTable; the attacker, an ordinary client, owns another table and asks the master
to bulk-load into it:

- the victim's SSTables, by their URL in the database's bucket (``tables/<victim id>/...``):
  this used to copy every victim cell into the attacker's table;
- a URL in the same bucket but at another S3 endpoint, a small HTTP server of this test on
  127.0.0.1: the master used to send it requests (signed with the cluster's access key id);
- a local directory (``file://``): the master used to list and read it;
- another principal's staging area.

Each is now PermissionDenied naming the staging area the caller may use, the HTTP server sees
no request and the attacker's table stays empty; a load from the caller's own staging area
still works. Bounded: four refused calls and one load, each under a deadline; the HTTP
server answers at most 1,000 requests.
"""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from tabletstore import batch
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.cluster import ClusterClient
from tabletstore.data.model import SetCell
from tabletstore.errors import PermissionDenied
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import object_url
from tests.security.request_support import create_when_ready, processes, start_cluster

__all__ = ["processes"]  # the fixture, used by name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CALL_DEADLINE = 60.0


class _Counting(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def _answer(self) -> None:
        if len(self.seen) < 1000:
            self.seen.append(f"{self.command} {self.path} {self.headers.get('Authorization')}")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_PUT = do_POST = _answer

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def fake_endpoint() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 recording the requests it gets (answers 404)."""
    seen: list[str] = []
    handler = type("Handler", (_Counting,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


async def _refused(client: ClusterClient, table: str, url: str) -> str:
    with pytest.raises(PermissionDenied) as info:
        async with asyncio.timeout(CALL_DEADLINE):
            await client.bulk_load(table, url, load_id="attack")
    return str(info.value)


async def test_bulk_load_reads_only_the_callers_staging_area(
    etcd_url: str,
    s3_url: str,
    tmp_path: Path,
    processes: list[ProcessRecord],
    fake_endpoint: tuple[str, list[str]],
) -> None:
    await start_cluster(tmp_path, etcd_url, s3_url, processes)
    endpoint, seen = fake_endpoint
    async with await ClusterClient.open(etcd_url) as client:
        victim = await create_when_ready(client, "victim")
        await victim.mutate_row(b"secret", [SetCell("cf", b"q", b"victim's value")])
        await client.flush("victim")  # into an SSTable under tables/<victim id>/
        victim_id = (await client._info("victim")).table_id
        await create_when_ready(client, "mine")

        # Another table's objects in the database's own bucket.
        bucket_url = s3_url
        victim_objects = object_url(bucket_url, layout.tables_prefix(victim_id)).rstrip("/")
        refusals = [await _refused(client, "mine", victim_objects)]
        # The same bucket at an endpoint of the attacker's choosing.
        bucket, _, _ = s3_url.removeprefix("s3://").partition("/")
        elsewhere = f"s3://{bucket}/db/tables/{victim_id}?endpoint_url={endpoint}&region=us-east-1"
        refusals.append(await _refused(client, "mine", elsewhere))
        # A local directory of the master's machine.
        local = tmp_path / "local"
        local.mkdir()
        (local / "passwd").write_bytes(b"root:x:0:0")
        refusals.append(await _refused(client, "mine", f"file://{local}"))
        # Another principal's staging area.
        theirs = layout.staging_url(s3_url, "someone-else", "job")
        refusals.append(await _refused(client, "mine", theirs))

        area = layout.staging_url(s3_url, "anonymous", "LOAD-NAME")
        for message in refusals:
            assert area in message, message
        assert seen == [], seen
        assert [r async for r in client.table("mine").read_rows()] == []

        # The caller's own staging area still loads.
        url = await client.staging_url("job-1")
        assert url == layout.staging_url(s3_url, "anonymous", "job-1")
        await batch.awrite_sstables(
            pa.table(
                {
                    "row": pa.array([b"a", b"b"], pa.binary()),
                    "family": ["cf", "cf"],
                    "qualifier": pa.array([b"q", b"q"], pa.binary()),
                    "value": pa.array([b"1", b"2"], pa.binary()),
                }
            ),
            url,
        )
        async with asyncio.timeout(CALL_DEADLINE):
            assert await client.bulk_load("mine", "job-1") == (1, 2)
        rows = [r async for r in client.table("mine").read_rows()]
        assert [r.key for r in rows] == [b"a", b"b"]
