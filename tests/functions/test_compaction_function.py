"""The major-compaction Lambda function (functions/compaction.py) and its executor
(master/compaction_lambda.py), against a real cluster: etcd, moto's S3 server, a master and a
worker as processes.

The handler runs as Lambda runs it: a fresh Python process that imports the module, calls
``handler(event, None)`` with the event JSON and prints the answer. It rewrites the tablet
from the bucket and the worker serving it adopts the output. The executor's invoke goes
through boto3 to moto's Lambda API (in-process ``mock_aws``, without Docker: moto checks the
function exists and the request is well formed, and answers what the test queued, an answer
of the shape the real handler gives), driven by the master's §5.4 cycle. Error answers go
through a boto3 Stubber.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
from botocore.response import StreamingBody
from botocore.stub import Stubber
from moto import mock_aws

from tabletstore import connect_async
from tabletstore.cli import localstack
from tabletstore.client.client import AsyncClient
from tabletstore.data.model import DeleteRow, RowMutation, SetCell
from tabletstore.errors import Fenced, NotServing, PreconditionFailed, Unavailable
from tabletstore.master.compaction_cycle import MajorCompactionCycle
from tabletstore.master.compaction_lambda import LambdaCompactionExecutor, compaction_event
from tabletstore.metadata.record import SSTableRef, TabletRecord
from tests.integration.cluster_harness import PROCESS_ENV, Cluster, eventually, table_id_of
from tests.plugins.s3_server import boto3_client

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
RUN_AS_LAMBDA = (
    "import json, sys\n"
    "from functions.compaction import handler\n"
    "print(json.dumps(handler(json.loads(sys.stdin.read()), None)))\n"
)


def invoke_in_fresh_process(event: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", RUN_AS_LAMBDA],
        input=json.dumps(event),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **PROCESS_ENV},
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.fixture
def cluster(etcd_server: str, s3_server: str, tmp_path: Path) -> Iterator[Cluster]:
    """A master (its cycle set to run compactions in its own process: the flag is parsed and
    the executor built at start-up) and one worker."""
    name = f"compactfn-{uuid.uuid4().hex[:12]}"
    boto3_client(s3_server).create_bucket(Bucket=name)
    c = Cluster(
        url=f"etcd://{etcd_server}/{name}",
        store_url=f"s3://{name}/data?endpoint_url={s3_server}&region=us-east-1",
        directory=tmp_path,
        lease_ttl=5.0,
    )
    try:
        c.records.append(
            localstack.start_master(
                tmp_path,
                c.url,
                c.store_url,
                env=PROCESS_ENV,
                extra_args=("--lease-ttl", "5.0", "--compaction-executor", "local"),
            )
        )
        c.start_worker()
        yield c
    finally:
        c.close()


async def _records(client: AsyncClient, table_id: str) -> dict[bytes, TabletRecord]:
    """The table's tablets by start row."""
    return {r.start_row: r for r in await client.catalog.list_tablets(table_id)}


async def _rows(client: AsyncClient) -> dict[bytes, bytes]:
    return {r.key: r.cells[0].value async for r in client.table("t").read_rows()}


async def _filled(client: AsyncClient) -> str:
    """Table t in two tablets ([, m) and [m, )), three SSTables each, rows a00, n00 deleted."""
    await client.create_table("t", ["f"], split_keys=[b"m"])
    table_id = await table_id_of(client, "t")

    async def served() -> bool:
        return all(r.location for r in (await _records(client, table_id)).values())

    await eventually(served, deadline=120, what="both tablets served")
    table = client.table("t")
    for flush in range(2):
        await table.mutate_rows(
            [
                RowMutation(b"%s%02d" % (p, i), (SetCell("f", b"c", b"v%d" % flush),))
                for p in (b"a", b"n")
                for i in range(10)
            ]
        )
        await client.flush("t")
    await table.mutate_rows(
        [RowMutation(b"a00", (DeleteRow(),)), RowMutation(b"n00", (DeleteRow(),))]
    )
    await client.flush("t")
    return table_id


async def test_the_function_compacts_a_tablet_as_lambda_runs_it_and_refuses_stale_work(
    cluster: Cluster,
) -> None:
    client = await connect_async(cluster.url)
    try:
        table_id = await _filled(client)
        before = await _records(client, table_id)
        left, right = before[b""], before[b"m"]
        assert len(left.sstables["default"]) == 3
        rows = await _rows(client)
        assert b"a00" not in rows and len(rows) == 18

        answer = await asyncio.to_thread(
            invoke_in_fresh_process, compaction_event(cluster.url, left)
        )
        assert answer["ok"] is True, answer
        assert (answer["tablet_id"], answer["inputs"], answer["epoch"]) == (
            left.tablet_id,
            3,
            left.epoch,
        )
        after = (await _records(client, table_id))[b""]
        assert [r.key for r in after.sstables["default"]] == answer["outputs"]
        assert after.events[-1].kind == "major_compaction"
        assert (await _records(client, table_id))[b"m"].sstables == right.sstables
        assert await _rows(client) == rows  # the same reads: a00 stays deleted

        # A stale request (another epoch than the record's) is refused before any work.
        stale = {**compaction_event(cluster.url, right), "epoch": right.epoch + 7}
        refused = await asyncio.to_thread(invoke_in_fresh_process, stale)
        assert refused["ok"] is False and refused["error"] == "Fenced", refused
        # A bad event is refused by validation, the problem named.
        bad = await asyncio.to_thread(
            invoke_in_fresh_process, {"cluster_url": "http://x", "table_id": ""}
        )
        assert bad["ok"] is False and bad["error"] == "InvalidArgument"
        assert "cluster_url" in bad["message"] and "tablet_id" in bad["message"]
        unknown = {**compaction_event(cluster.url, right), "tablet_id": "nope", "epoch": None}
        missing = await asyncio.to_thread(invoke_in_fresh_process, unknown)
        assert missing["ok"] is False and missing["error"] == "NotFound", missing
        assert (await _records(client, table_id))[b"m"].sstables == right.sstables

        # And the other tablet: the same answer's shape the Lambda test below queues.
        ran = await asyncio.to_thread(invoke_in_fresh_process, compaction_event(cluster.url, right))
        assert ran["ok"] is True and ran["inputs"] == 3, ran
        assert set(ran) == set(ANSWER), ran
        final = (await _records(client, table_id))[b"m"]
        assert [r.key for r in final.sstables["default"]] == ran["outputs"]
        assert await _rows(client) == rows
    finally:
        await client.close()


#: A success answer of the function (the keys the test above checks the real one has).
ANSWER = {
    "ok": True,
    "table_id": "t-1",
    "tablet_id": "t00001",
    "epoch": 5,
    "inputs": 3,
    "outputs": ["tables/t-1/t00001/default/0a.parquet"],
    "bytes_read": 4269,
    "bytes_written": 1536,
}


async def test_the_cycle_invokes_the_function_through_the_lambda_api() -> None:
    """Through moto's Lambda API (in-process: it must not share a test with the moto S3
    server a cluster uses, as leaving ``mock_aws`` resets every moto backend)."""
    ref = SSTableRef("tables/t-1/t00001/default/s.parquet", 100, 3, 1, 3, b"a", b"c")
    record = TabletRecord("t-1", "t00001", b"", None, sstables={"default": (ref,)}, epoch=5)
    with mock_aws(config={"lambda": {"use_docker": False}}):
        await _cycle_through_moto("etcd://127.0.0.1:2379/ns", record, ANSWER)


def _zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name in ("__init__.py", "_common.py", "compaction.py"):
            z.write(ROOT / "functions" / name, f"functions/{name}")
    return out.getvalue()


def _deploy_and_queue(answers: list[dict[str, Any]]) -> Any:
    region = "us-east-1"
    iam = boto3.client("iam", region_name=region)
    role = iam.create_role(RoleName="compactor", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    client = boto3.client("lambda", region_name=region)
    client.create_function(
        FunctionName="tabletstore-compaction",
        Runtime="python3.11",
        Role=role,
        Handler="functions.compaction.handler",
        Code={"ZipFile": _zip()},
        Timeout=900,
        MemorySize=2048,
    )
    queued = requests.post(
        "http://motoapi.amazonaws.com/moto-api/static/lambda-simple/response",
        json={"results": [json.dumps(a) for a in answers], "region": region},
        timeout=10,
    )
    assert queued.status_code == 201
    return client


async def _cycle_through_moto(url: str, record: TabletRecord, answer: dict[str, Any]) -> None:
    client = _deploy_and_queue([answer])
    executor = LambdaCompactionExecutor("tabletstore-compaction", url, client=client)

    async def records() -> list[TabletRecord]:
        return [record]

    cycle = MajorCompactionCycle(period=1e-6, records=records, executor=executor, now=lambda: 1.0)
    assert await cycle.scan() == 1
    await cycle.wait()
    assert cycle.finished == 1 and executor.done == [answer]
    # Once the queue is used up moto answers a canned text: never taken as done.
    with pytest.raises(Unavailable, match=r"not a compaction answer|no JSON"):
        await executor.compact(record)
    await cycle.close()


def _payload(body: bytes) -> StreamingBody:
    return StreamingBody(io.BytesIO(body), len(body))


async def test_the_executor_maps_function_errors_and_refusals() -> None:
    record = TabletRecord("t-1", "t00001", b"", None, epoch=5)
    url = "etcd://127.0.0.1:2379/ns"
    client = boto3.client("lambda", region_name="us-east-1")
    expected = {
        "FunctionName": "f",
        "InvocationType": "RequestResponse",
        "Payload": json.dumps(compaction_event(url, record)).encode(),
    }
    executor = LambdaCompactionExecutor("f", url, client=client)
    with Stubber(client) as stub:
        stub.add_response(
            "invoke",
            {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": _payload(b'{"x":1}')},
            expected,
        )
        with pytest.raises(Unavailable, match="failed"):
            await executor.compact(record)
        for kind, error in [
            ("Fenced", Fenced),
            ("NotServing", NotServing),
            ("PreconditionFailed", PreconditionFailed),
            ("Corruption", Unavailable),
        ]:
            answer = {"ok": False, "error": kind, "message": "tablet t00001 moved"}
            stub.add_response(
                "invoke",
                {"StatusCode": 200, "Payload": _payload(json.dumps(answer).encode())},
                expected,
            )
            with pytest.raises(error, match="moved"):
                await executor.compact(record)
        other = {"ok": True, "tablet_id": "t00002"}
        stub.add_response(
            "invoke", {"StatusCode": 200, "Payload": _payload(json.dumps(other).encode())}, expected
        )
        with pytest.raises(Unavailable, match="another tablet"):
            await executor.compact(record)
    assert executor.done == []
