"""The chaos cluster: etcd, moto's S3 server behind the fault proxy, masters and workers, all
real processes on loopback that the harness starts, faults and stops by pid.

Processes are started with the local stack's helpers (:mod:`tabletstore.cli.localstack`: ``spawn``,
``start_etcd``, ``start_moto``, ``start_master``, ``start_worker``) and tracked by their
:class:`~tabletstore.cli.localstack.ProcessRecord` (pid, argv, start time), so only processes this
cluster started are ever signalled, and a reused pid never is. Everything lives under one
directory (etcd's data, every process's log).

Care taken so a fault is the fault and not data loss by the harness itself:

* moto keeps its objects in memory, so "the S3 server stops" is SIGSTOP/SIGCONT of moto's
  process (requests hang until the client's timeout), never a restart;
* an etcd restart stops etcd and starts it again with the same argv: same ports, same data
  directory, so leases, elections and records survive as they would on a real etcd;
* the store URL points at the fault proxy (:mod:`tabletstore.testing.chaos.s3proxy`) with a
  short ``read_timeout`` (so the proxy's "timeout" fault and a paused S3 are seen as timeouts
  within seconds); the harness's own checks read the bucket directly from moto.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.security import TlsConfig
from tabletstore.testing.processes import ProcessGroup

__all__ = ["ChaosCluster"]

ENV = {
    "AWS_ACCESS_KEY_ID": localstack.MOTO_CREDENTIALS[0],
    "AWS_SECRET_ACCESS_KEY": localstack.MOTO_CREDENTIALS[1],
    "AWS_DEFAULT_REGION": "us-east-1",
    "PYTHONUNBUFFERED": "1",
}
#: Seconds the workers' S3 client waits for an answer: short, so that a stalled request
#: (paused S3, the proxy's timeout fault) fails and is retried within the lease.
READ_TIMEOUT = 4.0
#: Tablets never split during a chaos run: the checker maps rows to tablets by fixed split keys.
NO_SPLIT_BYTES = 1 << 40


class ChaosCluster(ProcessGroup):
    """Start with :meth:`start`, stop everything with :meth:`close` (idempotent); crash,
    pause and resume its processes with :class:`~tabletstore.testing.processes.ProcessGroup`'s
    methods."""

    def __init__(
        self,
        directory: Path,
        *,
        workers: int = 3,
        masters: int = 2,
        lease_ttl: float = 3.0,
        seed: int = 0,
        tls: bool = False,
    ) -> None:
        self.directory = directory.resolve()
        #: Issue 16: mutual TLS everywhere and etcd's own users, as ``local-stack up --tls``.
        self.tls = tls
        self.tls_dir: Path | None = None
        #: What the harness's client uses: the read-only etcd user and the client certificate.
        self.client_url = ""
        self.workers_wanted = workers
        self.masters_wanted = masters
        self.lease_ttl = lease_ttl
        self.seed = seed
        self.records: list[ProcessRecord] = []
        self.etcd: ProcessRecord | None = None
        self.moto: ProcessRecord | None = None
        self.proxy: ProcessRecord | None = None
        self.masters: list[ProcessRecord] = []
        self.workers: list[ProcessRecord] = []
        self.url = ""
        self.store_url = ""
        #: The bucket straight from moto (no faults): for the harness's own checks.
        self.direct_store_url = ""
        self._numbers = 0

    # ------------------------------------------------------------------ starting

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            if self.tls:
                self.tls_dir = localstack.make_certs(self.directory / "tls")
            self.etcd, port = localstack.start_etcd(
                self.directory / "etcd",
                log=self.directory / "etcd.log",
                fast_leases=True,
                tls=self._files("etcd"),
            )
            self.records.append(self.etcd)
            self.url = self.client_url = f"etcd://127.0.0.1:{port}/chaos"
            if self.tls_dir is not None:
                users = localstack.etcd_auth(
                    self.directory,
                    self.tls_dir,
                    localstack.with_tls(self.etcd.url, self._files("master")),
                    namespaces=("chaos",),
                )
                self.client_url = localstack.with_tls(
                    localstack.with_user(self.url, users, localstack.READER_USER),
                    self._files("client"),
                )
                self.url = localstack.with_user(self.url, users, localstack.CLUSTER_USER)
            self.moto = localstack.start_moto(self.directory / "s3.log")
            self.records.append(self.moto)
            proxy_port = localstack.free_port()
            argv = [
                sys.executable,
                "-m",
                "tabletstore.testing.chaos.s3proxy",
                "--upstream",
                self.moto.url,
                "--port",
                str(proxy_port),
                "--seed",
                str(self.seed),
            ]
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            self.proxy = localstack.spawn(
                "s3proxy", argv, log=self.directory / "s3proxy.log", url=proxy_url, env=ENV
            )
            self.records.append(self.proxy)
            localstack.wait_healthy(
                self.proxy, lambda: localstack._port_open(proxy_port), localstack.HEALTH_DEADLINE
            )
            bucket = localstack.BUCKET
            self.store_url = (
                f"s3://{bucket}/data?endpoint_url={proxy_url}&region=us-east-1"
                f"&read_timeout={READ_TIMEOUT}&connect_timeout=2"
            )
            self.direct_store_url = (
                f"s3://{bucket}/data?endpoint_url={self.moto.url}&region=us-east-1"
            )
            for _ in range(self.masters_wanted):
                self.start_master()
            with ThreadPoolExecutor(self.workers_wanted) as pool:
                list(pool.map(lambda _: self.start_worker(), range(self.workers_wanted)))
        except BaseException:
            self.close()
            raise

    def _files(self, name: str) -> TlsConfig | None:
        return localstack._tls_files(self.tls_dir, name) if self.tls_dir is not None else None

    @property
    def process_url(self) -> str:
        """The etcd URL of the cluster's processes (with ``tls``: the cluster's etcd user and
        the worker certificate)."""
        return localstack.with_tls(self.url, self._files("worker"))

    @property
    def client_tls(self) -> TlsConfig | None:
        """The harness client's TLS files (None without ``tls``)."""
        return self._files("client")

    def _role(self, kind: str) -> str:
        self._numbers += 1
        return f"{kind}-{self._numbers}"

    def start_master(self) -> ProcessRecord:
        record = localstack.start_master(
            self.directory,
            self.url,
            self.store_url,
            env=ENV,
            role=self._role("master"),
            extra_args=("--lease-ttl", str(self.lease_ttl)),
            tls=self._files("master"),
        )
        self.records.append(record)
        self.masters.append(record)
        return record

    def start_worker(self) -> ProcessRecord:
        self._numbers += 1
        record = localstack.start_worker(
            self.directory,
            self.url,
            self._numbers,
            env=ENV,
            extra_args=("--lease-ttl", str(self.lease_ttl), "--split-bytes", str(NO_SPLIT_BYTES)),
            tls=self._files("worker"),
        )
        self.records.append(record)
        self.workers.append(record)
        return record

    # ------------------------------------------------------------------ faults

    def live_workers(self) -> list[ProcessRecord]:
        return [r for r in self.workers if self.running(r)]

    def live_masters(self) -> list[ProcessRecord]:
        return [r for r in self.masters if self.running(r)]

    def restart_etcd(self, *, down: float = 1.0) -> float:
        """Stop etcd (SIGKILL: a crash), wait ``down`` seconds, start it again with the same
        ports and data directory; return the seconds it was unreachable."""
        old = self.etcd
        assert old is not None
        started = time.monotonic()
        self.kill(old)
        time.sleep(down)
        record = localstack.spawn("etcd", old.argv, log=Path(old.log), url=old.url)
        self.records.append(record)
        self.etcd = record
        localstack.wait_healthy(
            record, lambda: localstack.etcd_answers(record), localstack.HEALTH_DEADLINE
        )
        return time.monotonic() - started

    def s3_faults(self, **rates: float) -> dict[str, float]:
        """Set the proxy's fault probabilities (unnamed ones become 0)."""
        assert self.proxy is not None
        request = urllib.request.Request(
            f"{self.proxy.url}/__chaos__/faults", data=json.dumps(rates).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, float] = json.loads(response.read())
            return answer

    def s3_stats(self) -> dict[str, int]:
        assert self.proxy is not None
        with urllib.request.urlopen(f"{self.proxy.url}/__chaos__/stats", timeout=10) as resp:
            stats: dict[str, int] = json.loads(resp.read())
            return stats
