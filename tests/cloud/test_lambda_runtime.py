"""The Lambda stand-in (tests/cloud/lambda_runtime.py) driven by the real runtime interface
client (awslambdaric, as the image's `function` role runs it) and the real boto3 client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from tests.cloud.lambda_runtime import FunctionError, InitError, InvokeApi, RuntimeApi

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runtime(request: pytest.FixtureRequest) -> Iterator[tuple[RuntimeApi, subprocess.Popen[bytes]]]:
    """A RuntimeApi and awslambdaric polling it for the handler the test names (indirect)."""
    api = RuntimeApi("sample")
    env = {
        **os.environ,
        "AWS_LAMBDA_RUNTIME_API": api.address,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    client = subprocess.Popen(
        [sys.executable, "-m", "awslambdaric", request.param],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield api, client
    finally:
        client.kill()
        client.wait()
        api.close()


@pytest.mark.parametrize("runtime", ["tests.cloud.sample_handlers.echo"], indirect=True)
def test_invocations_through_the_invoke_api_reach_the_handler_in_order(
    runtime: tuple[RuntimeApi, subprocess.Popen[bytes]],
) -> None:
    api, _ = runtime
    invoke = InvokeApi({"sample": api}, timeout=60)
    try:
        client = boto3.client(
            "lambda",
            endpoint_url=invoke.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(retries={"max_attempts": 1}),
        )
        for i in range(3):
            answer = client.invoke(FunctionName="sample", Payload=json.dumps({"i": i}).encode())
            assert "FunctionError" not in answer
            body = json.loads(answer["Payload"].read())
            assert body["echo"] == {"i": i}
            assert body["request_id"] == api.invocations[i].request_id
        with pytest.raises(client.exceptions.ResourceNotFoundException):
            client.invoke(FunctionName="missing", Payload=b"{}")
    finally:
        invoke.close()
    assert [json.loads(i.payload) for i in api.invocations] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert api.polls >= 3


@pytest.mark.parametrize("runtime", ["tests.cloud.sample_handlers.fail"], indirect=True)
def test_a_handler_error_is_a_function_error(
    runtime: tuple[RuntimeApi, subprocess.Popen[bytes]],
) -> None:
    api, _ = runtime
    with pytest.raises(FunctionError) as raised:
        api.invoke(b'{"x": 1}', timeout=60)
    assert raised.value.document["errorType"] == "ValueError"
    assert "refused {'x': 1}" in raised.value.document["errorMessage"]
    invoke = InvokeApi({"sample": api}, timeout=60)
    try:
        client = boto3.client(
            "lambda",
            endpoint_url=invoke.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        answer = client.invoke(FunctionName="sample", Payload=b"{}")
        assert answer["FunctionError"] == "Unhandled"
        assert json.loads(answer["Payload"].read())["errorType"] == "ValueError"
    finally:
        invoke.close()


@pytest.mark.parametrize("runtime", ["tests.cloud.no_such_module.handler"], indirect=True)
def test_a_handler_that_cannot_be_imported_is_an_init_error(
    runtime: tuple[RuntimeApi, subprocess.Popen[bytes]],
) -> None:
    api, _ = runtime
    with pytest.raises(InitError) as raised:
        api.invoke(b"{}", timeout=60)
    assert "no_such_module" in str(raised.value)


def test_an_unanswered_invocation_times_out_naming_it() -> None:
    api = RuntimeApi("idle")
    try:
        with pytest.raises(TimeoutError, match="never asked for it"):
            api.invoke(b"{}", timeout=0.5)
    finally:
        api.close()
