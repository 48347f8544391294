"""The container image's entrypoint (docker/entrypoint.sh), run directly, as the image runs it.

No Docker daemon is needed: the script is what the image executes, with the same arguments
compose.yaml and the cluster Terraform module give it. A master and a worker started through it
serve a real cluster (etcd on loopback, a local-directory store) that the CLI then uses; its
``health`` role answers for them; and its ``function`` role runs a handler under the Lambda
runtime interface client against a small stand-in of Lambda's Runtime API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tabletstore.cli.localstack import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


def wait_for(condition: Callable[[], bool], *, deadline: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"{what}: not within {deadline}s")
        time.sleep(0.1)


def _env(tmp_path: Path, role: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TABLETSTORE_PYTHON": sys.executable,
        "TABLETSTORE_ADVERTISE_HOST": "127.0.0.1",
        "TABLETSTORE_HEALTH_FILE": str(tmp_path / f"{role}.health"),
        **extra,
    }


def _health(tmp_path: Path, role: str) -> bool:
    result = subprocess.run(
        ["sh", str(ENTRYPOINT), "health"], env=_env(tmp_path, role), capture_output=True
    )
    return result.returncode == 0


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:  # only the pids this test started
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_master_and_worker_roles_serve_a_cluster(
    etcd_url: str, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    store = (tmp_path / "objects").as_uri()
    env = {"TABLETSTORE_URL": etcd_url}
    assert not _health(tmp_path, "master")  # nothing recorded yet
    master_port, worker_port = free_port(), free_port()
    for role, args in (
        ("master", ["--store", store, "--port", str(master_port)]),
        ("worker", ["--port", str(worker_port), "--lease-ttl", "3"]),
    ):
        log = open(tmp_path / f"{role}.log", "wb")
        started.append(
            subprocess.Popen(
                ["sh", str(ENTRYPOINT), role, *args],
                env=_env(tmp_path, role, **env),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
        wait_for(lambda r=role: _health(tmp_path, r), deadline=60, what=f"{role} healthy")
        assert (tmp_path / f"{role}.health").read_text().split() == [
            "127.0.0.1",
            str(master_port if role == "master" else worker_port),
        ]

    def cli(*args: str) -> str:
        result = subprocess.run(
            ["sh", str(ENTRYPOINT), "--url", etcd_url, *args],
            env=_env(tmp_path, "cli", COLUMNS="300"),  # rich's table, unsqueezed
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"{args}: {result.stderr}"
        return result.stdout

    cli("createtable", "t", "families=f")
    cli("set", "t", "r1", "f:c=through-the-entrypoint")
    assert '"through-the-entrypoint"' in cli("lookup", "t", "r1")
    # The worker advertises the address the entrypoint chose, never 0.0.0.0.
    status = cli("status")
    assert f"master: 127.0.0.1:{master_port}" in status
    assert f"127.0.0.1:{worker_port}" in status

    for process in started:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0  # exec'd: the signal reached tabletstore itself


class _RuntimeApi(BaseHTTPRequestHandler):
    """The two calls of Lambda's Runtime API a successful invocation makes."""

    event = b'{"kind": "probe"}'
    served = threading.Event()
    response: bytes = b""

    def do_GET(self) -> None:
        if self.path != "/2018-06-01/runtime/invocation/next" or self.served.is_set():
            self.served.wait(timeout=120)  # a second 'next' waits until the test ends
            self.send_error(500)
            return
        self.send_response(200)
        self.send_header("Lambda-Runtime-Aws-Request-Id", "req-1")
        self.send_header("Lambda-Runtime-Deadline-Ms", "9999999999999")
        self.send_header(
            "Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:1:function:f"
        )
        # Every header real Lambda sends: awslambdaric's native client crashes (SIGSEGV) on a
        # missing trace id.
        self.send_header("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.event)))
        self.end_headers()
        self.wfile.write(self.event)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        if self.path == "/2018-06-01/runtime/invocation/req-1/response":
            type(self).response = body
        else:
            type(self).response = b"ERROR " + self.path.encode() + b" " + body
        self.send_response(202)
        self.end_headers()
        type(self).served.set()

    def log_message(self, *args: object) -> None:
        return  # quiet


def test_function_role_runs_a_handler_under_the_lambda_runtime_client(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RuntimeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = _env(
            tmp_path,
            "function",
            AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{server.server_address[1]}",
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        )
        started.append(
            subprocess.Popen(
                ["sh", str(ENTRYPOINT), "function", "tests.entrypoint_echo.handler"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_for(_RuntimeApi.served.is_set, deadline=60, what="the handler's response")
        assert json.loads(_RuntimeApi.response) == {
            "echo": {"kind": "probe"},
            "request_id": "req-1",
        }
    finally:
        _RuntimeApi.served.set()
        server.shutdown()
        server.server_close()


def test_a_master_starts_where_the_health_file_cannot_be_written(
    etcd_url: str, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    """Fargate's task volumes are root-owned and the root is read-only: the health file is a
    convenience, never a reason not to start; `health PORT` (the task definitions' check)
    works without it."""
    port = free_port()
    env = _env(
        tmp_path,
        "master",
        TABLETSTORE_URL=etcd_url,
        TABLETSTORE_HEALTH_FILE=str(tmp_path / "missing-dir" / "master.health"),
    )
    log = tmp_path / "master.log"
    with log.open("wb") as out:
        started.append(
            subprocess.Popen(
                ["sh", str(ENTRYPOINT), "master", "--store", (tmp_path / "o").as_uri(),
                 "--port", str(port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )  # fmt: skip

    def healthy() -> bool:
        assert started[0].poll() is None, log.read_text()
        check = ["sh", str(ENTRYPOINT), "health", str(port)]
        return subprocess.run(check, env=env, capture_output=True).returncode == 0

    wait_for(healthy, deadline=60, what="the master healthy by its port")
    assert "cannot write" in log.read_text()
