"""The log-sort Lambda function (functions/log_sort.py) and its executor
(master/sort_lambda.py).

The handler runs as Lambda runs it: a fresh Python process that imports the module, calls
``handler(event, None)`` with the event JSON and prints the answer. The executor's invoke goes
through boto3 to moto's Lambda API (in-process ``mock_aws``). moto runs a function's code only
in Docker, which does not run here, so moto is used without Docker ("lambda-simple"): it
checks the function exists and the request is well formed, and answers what the test queued —
the answer the handler gave in its own process, against the same store, so the executor
returns the manifest the function really wrote. A function error goes through a boto3 Stubber.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
from botocore.response import StreamingBody
from botocore.stub import Stubber
from moto import mock_aws

from tabletstore.commitlog.runs import SortManifest
from tabletstore.commitlog.sorting import plan_sort, task_done
from tabletstore.errors import Corruption, Unavailable
from tabletstore.master.sort_lambda import LambdaSortExecutor, sort_event
from tabletstore.storage_s3 import open_store
from tests.unit.commitlog.test_commitlog_sorting import INC, TABLETS, W, write_log

ROOT = Path(__file__).resolve().parents[2]
RUN_AS_LAMBDA = (
    "import json, sys\n"
    "from functions.log_sort import handler\n"
    "print(json.dumps(handler(json.loads(sys.stdin.read()), None)))\n"
)


def invoke_in_fresh_process(event: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", RUN_AS_LAMBDA],
        input=json.dumps(event),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


async def _planned(tmp_path: Path) -> tuple[str, Any]:
    url = f"file://{tmp_path}"
    store = open_store(url)
    await write_log(store)  # type: ignore[arg-type]
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    await store.close()
    return url, plan


async def test_handler_in_a_fresh_process_sorts_and_answers_json(tmp_path: Path) -> None:
    url, plan = await _planned(tmp_path)
    task = plan.tasks[1]
    answer = invoke_in_fresh_process(sort_event(url, plan, task))
    assert answer["ok"] is True
    manifest = SortManifest.from_bytes(json.dumps(answer["manifest"]).encode())
    assert (manifest.first, manifest.stop) == (task.first, task.stop) and manifest.runs
    store = open_store(url)
    assert await task_done(store, plan, task)
    await store.close()
    # Run twice (Lambda retries): the same answer.
    assert invoke_in_fresh_process(sort_event(url, plan, task)) == answer
    # A bad event is refused by validation, named, without touching anything.
    bad = invoke_in_fresh_process({"store_url": url, "worker_id": W, "incarnation": -1})
    assert bad["ok"] is False and bad["error"] == "InvalidArgument"
    assert "incarnation" in bad["message"] and "first_segment" in bad["message"]
    # A task of a log never planned: a clear error, not a crash.
    none = invoke_in_fresh_process({**sort_event(url, plan, task), "worker_id": "nobody"})
    assert none["ok"] is False and none["error"] == "Unavailable"


def _zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.write(ROOT / "functions" / "log_sort.py", "functions/log_sort.py")
    return out.getvalue()


async def test_executor_invokes_the_function_through_the_lambda_api(tmp_path: Path) -> None:
    url, plan = await _planned(tmp_path)
    answers = [invoke_in_fresh_process(sort_event(url, plan, t)) for t in plan.tasks]
    with mock_aws(config={"lambda": {"use_docker": False}}):
        await _invoke_through_moto(url, plan, answers)


def _deploy_and_queue(answers: list[dict[str, Any]]) -> Any:
    """Create the function in moto, check it is listed, queue ``answers``; the client."""
    region = "us-east-1"
    iam = boto3.client("iam", region_name=region)
    role = iam.create_role(RoleName="sorter", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    client = boto3.client("lambda", region_name=region)
    client.create_function(
        FunctionName="tabletstore-log-sort",
        Runtime="python3.11",
        Role=role,
        Handler="functions.log_sort.handler",
        Code={"ZipFile": _zip()},
        Timeout=900,
        MemorySize=1024,
    )
    names = [f["FunctionName"] for f in client.list_functions()["Functions"]]
    assert names == ["tabletstore-log-sort"]
    queued = requests.post(
        "http://motoapi.amazonaws.com/moto-api/static/lambda-simple/response",
        json={"results": [json.dumps(a) for a in answers], "region": region},
        timeout=10,
    )
    assert queued.status_code == 201
    return client


async def _invoke_through_moto(url: str, plan: Any, answers: list[dict[str, Any]]) -> None:
    client = _deploy_and_queue(answers)
    store = open_store(url)
    executor = LambdaSortExecutor("tabletstore-log-sort", store, url, client=client)
    manifests = [await executor.run(plan, t) for t in plan.tasks]
    assert [m.first for m in manifests] == [t.first for t in plan.tasks]
    # Once the queue is used up moto answers a canned text: refused, never taken as done.
    with pytest.raises(Unavailable, match=r"not a log-sort answer|no JSON"):
        await executor.run(plan, plan.tasks[0])
    await store.close()


def _payload(body: bytes) -> StreamingBody:
    return StreamingBody(io.BytesIO(body), len(body))


async def test_executor_maps_function_errors_and_error_answers(tmp_path: Path) -> None:
    url, plan = await _planned(tmp_path)
    client = boto3.client("lambda", region_name="us-east-1")
    expected = {
        "FunctionName": "f",
        "InvocationType": "RequestResponse",
        "Payload": json.dumps(sort_event(url, plan, plan.tasks[0])).encode(),
    }
    store = open_store(url)
    executor = LambdaSortExecutor("f", store, url, client=client)
    with Stubber(client) as stub:
        stub.add_response(
            "invoke",
            {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": _payload(b'{"x":1}')},
            expected,
        )
        with pytest.raises(Unavailable, match="failed"):
            await executor.run(plan, plan.tasks[0])
        answer = {"ok": False, "error": "Corruption", "message": "segment 3 is missing"}
        stub.add_response(
            "invoke",
            {"StatusCode": 200, "Payload": _payload(json.dumps(answer).encode())},
            expected,
        )
        with pytest.raises(Corruption, match="segment 3"):
            await executor.run(plan, plan.tasks[0])
    await store.close()
