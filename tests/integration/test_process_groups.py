"""Server process groups on one host (``--processes N``, ``cli/supervisor.py``), as real
processes against a real cluster:

* ``worker --processes 2``: two workers of their own (ids ``<id>-0``, ``<id>-1``) serve the
  tablets; one SIGKILLed is restarted as a new worker (``<id>-0-r<n>``) and every row is read
  back; SIGTERM to the supervisor drains both (each exits 0: a worker that lost its lease
  exits 1), and a fresh worker then serves every row;
* ``bigtable-api --processes 2``: connections to the one port land on both processes; one
  SIGKILLed, calls on new connections still succeed, and the supervisor starts it again.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tabletstore import connect_async
from tabletstore.cli import localstack
from tabletstore.client.client import AsyncClient
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.testing.processes import gone
from tests.integration.cluster_harness import PROCESS_ENV, Cluster, eventually, placement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Long enough that a loaded machine's stalls do not end a worker's lease mid-test.
LEASE = 10.0
ROWS = [b"row%03d" % i for i in range(60)]
SPLITS = [b"row015", b"row030", b"row045"]


@pytest.fixture
def cluster(etcd_server: str, s3_server: str, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster.on(etcd_server, s3_server, tmp_path, "group", lease_ttl=LEASE)
    try:
        made.start_master()
        yield made
    finally:
        made.close()
        assert not made.alive(), f"left running: {made.alive()}"


def _started(log: str, slot: int) -> list[int]:
    """The pids the supervisor logged for ``slot``, oldest first."""
    text = Path(log).read_text(errors="replace")
    return [int(pid) for pid in re.findall(rf" {slot} started \(pid (\d+)\)", text)]


async def _load(client: AsyncClient) -> None:
    # Until the master has assigned METADATA the create is refused as Unavailable (not applied).
    table = await eventually(
        lambda: client.create_table("t", ["cf"], split_keys=SPLITS),
        deadline=120,
        what="the table created",
    )
    await table.mutate_rows([RowMutation(k, [SetCell("cf", b"q", k, 1000)]) for k in ROWS])


async def _all_rows(client: AsyncClient) -> bool:
    rows = [row async for row in client.table("t").read_rows()]
    assert [row.key for row in rows] == ROWS
    return True


async def test_a_worker_group_restarts_a_killed_process_and_drains_on_sigterm(
    cluster: Cluster,
) -> None:
    group = localstack.start_worker(
        cluster.directory, cluster.url, 0, env=PROCESS_ENV, processes=2,
        extra_args=("--lease-ttl", str(LEASE), "--worker-id", "grp"),
    )  # fmt: skip
    cluster.records.append(group)
    client = await connect_async(cluster.url)
    try:
        await _load(client)

        async def both_serve() -> bool:
            served = placement(await client.status())
            return all(
                any(w.startswith(f"grp-{slot}") and t for w, t in served.items()) for slot in (0, 1)
            )

        await eventually(both_serve, deadline=60, what="both worker processes serve tablets")
        # The last start of slot 0 (a loaded machine may already have restarted it once).
        before = _started(group.log, 0)
        os.kill(before[-1], signal.SIGKILL)  # a process of the group this test started
        await eventually(
            lambda: asyncio.sleep(0, len(_started(group.log, 0)) > len(before)),
            deadline=60,
            what="the supervisor restarts the killed worker process",
        )

        async def restarted_serves() -> bool:
            served = placement(await client.status())
            return any(w.startswith("grp-0-r") and t for w, t in served.items())

        await eventually(restarted_serves, deadline=90, what="the restarted worker serves")
        await eventually(lambda: _all_rows(client), deadline=60, what="every row read back")

        children = [_started(group.log, 0)[-1], _started(group.log, 1)[-1]]
        assert cluster.terminate(group, deadline=90), "the group did not drain within 90 s"
        assert all(gone(pid) for pid in children)
        log = await asyncio.to_thread(Path(group.log).read_text, errors="replace")
        for slot, pid in enumerate(children):
            assert f"worker {slot} (pid {pid}) stopped (exit status 0)" in log, log[-3000:]
        # Drained, not crashed: a lone worker started now serves every row.
        cluster.start_worker()
        await eventually(lambda: _all_rows(client), deadline=90, what="rows after the drain")
    finally:
        await client.close()


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _established(pid: int, port: int) -> int:
    """Connections to local ``port`` that process ``pid`` holds (from /proc)."""
    inodes = _socket_inodes(pid)
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
                    count += 1
    return count


def _read_row(address: str, key: bytes) -> tuple[object, bytes]:
    """A channel of its own (its own connection) and one ReadRows of ``key``: (the channel,
    the value read)."""
    import grpc
    from google.cloud.bigtable_v2.types import bigtable as bt
    from google.cloud.bigtable_v2.types import data

    # A private subchannel pool: otherwise channels to one address share one connection.
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    call = channel.unary_stream(
        "/google.bigtable.v2.Bigtable/ReadRows",
        request_serializer=bt.ReadRowsRequest.serialize,
        response_deserializer=bt.ReadRowsResponse.deserialize,
    )
    request = bt.ReadRowsRequest(
        table_name="projects/p/instances/plain/tables/t", rows=data.RowSet(row_keys=[key])
    )
    chunks = [chunk for response in call(request, timeout=60) for chunk in response.chunks]
    return channel, b"".join(chunk.value for chunk in chunks)


def _read_row_retrying(address: str, key: bytes, *, deadline: float) -> bytes:
    """``_read_row`` on fresh connections, again while it fails UNAVAILABLE, as the official
    clients retry: a connection the kernel had queued for a process as it was killed, or
    handed to the restarted one as it binds, is reset."""
    import grpc

    end = time.monotonic() + deadline
    while True:
        try:
            channel, value = _read_row(address, key)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > end:
                raise
            time.sleep(0.2)
            continue
        channel.close()  # type: ignore[attr-defined]
        return value


def _until(check: Callable[[], bool], *, deadline: float, what: str) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline}s: {what}")
        time.sleep(0.1)


async def _load_cluster(url: str) -> None:
    client = await connect_async(url)
    try:
        await _load(client)
    finally:
        await client.close()


def test_a_front_door_group_shares_its_port_and_survives_a_killed_process(
    cluster: Cluster,
) -> None:
    pytest.importorskip("google.cloud.bigtable")
    cluster.start_worker()
    asyncio.run(_load_cluster(cluster.url))
    log = cluster.directory / "front-door.log"
    argv = [
        sys.executable, "-m", "tabletstore.cli.main", "bigtable-api", "--url", cluster.url,
        "--port", "0", "--plain-instance", "plain", "--processes", "2",
    ]  # fmt: skip
    with open(log, "w") as err:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **PROCESS_ENV}
        )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: [lines.put(x) for x in stdout], daemon=True).start()
    try:
        first = lines.get(timeout=180)
        assert first.startswith("bigtable-api listening on 127.0.0.1:"), first
        assert "(2 processes)" in first
        address = first.split()[3]
        port = int(address.rsplit(":", 1)[1])
        kids = [_started(str(log), 0)[-1], _started(str(log), 1)[-1]]

        channels = []
        for i in range(16):
            channel, value = _read_row(address, ROWS[i])
            assert value == ROWS[i]
            channels.append(channel)
        held = [_established(pid, port) for pid in kids]
        assert sum(held) == 16 and all(held), f"connections per process: {held}"
        for channel in channels:
            channel.close()  # type: ignore[attr-defined]

        os.kill(kids[0], signal.SIGKILL)  # a process of the group this test started
        _until(lambda: gone(kids[0]), deadline=30, what="the killed process gone")
        for i in range(8):  # new connections reach the survivor (or the restarted one)
            assert _read_row_retrying(address, ROWS[i], deadline=60) == ROWS[i]
        restarted = "bigtable-api 0 (pid {}) serving"
        _until(
            lambda: (
                len(_started(str(log), 0)) == 2
                and restarted.format(_started(str(log), 0)[1]) in log.read_text(errors="replace")
            ),
            deadline=120,
            what="the supervisor restarts the killed front-door process and it serves",
        )
        proc.send_signal(signal.SIGTERM)  # our own child, by its handle
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_group_whose_processes_cannot_start_fails_as_one_process_would() -> None:
    """A bad setting every restart would meet again ends the group at once, not in a loop of
    restarts."""
    done = subprocess.run(
        [sys.executable, "-m", "tabletstore.cli.main", "--url", "memory://x", "worker",
         "--processes", "2"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "--url must be the cluster's etcd://host:port/namespace URL" in done.stderr
    assert "worker 0 (pid" in done.stderr and "failed to start" in done.stderr
    assert "restarting" not in done.stderr
