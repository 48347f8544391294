"""The chaos cluster: etcd, an S3 server (moto's, or SeaweedFS: ``store``) behind the fault
proxy, masters and workers, all real processes on loopback that the harness starts, faults and
stops by pid.

Processes are started with the local stack's helpers (:mod:`tabletstore.cli.localstack`: ``spawn``,
``start_etcd``, ``start_moto``, ``start_seaweedfs``, ``start_master``, ``start_worker``) and tracked by their
:class:`~tabletstore.cli.localstack.ProcessRecord` (pid, argv, start time), so only processes this
cluster started are ever signalled, and a reused pid never is. Everything lives under one
directory (etcd's data, every process's log).

Care taken so a fault is the fault and not data loss by the harness itself:

* moto keeps its objects in memory, so "the S3 server stops" is SIGSTOP/SIGCONT of the S3
  server's process (requests hang until the client's timeout), never a restart; SeaweedFS
  (``weed server``: master, volume server, filer and S3 gateway in one process) is paused the
  same way;
* an etcd restart stops etcd and starts it again with the same argv: same ports, same data
  directory, so leases, elections and records survive as they would on a real etcd;
* the store URL points at the fault proxy (:mod:`tabletstore.testing.chaos.s3proxy`) with a
  short ``read_timeout`` (so the proxy's "timeout" fault and a paused S3 are seen as timeouts
  within seconds); the harness's own checks read the bucket directly from the S3 server.

Partitions. Every master and worker reaches etcd through its own link of the partitioning
proxy (:mod:`tabletstore.testing.chaos.netproxy`), and every worker reaches the S3 fault
proxy through its own link too (its ``--store`` URL), so :meth:`ChaosCluster.cut` can cut one
process off from etcd or from S3 while the others still reach it. The harness's own client
and the masters' S3 traffic go direct.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.errors import Unavailable
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
#: The S3 servers a chaos cluster runs on (``ChaosCluster(store=...)``): moto keeps objects in
#: memory; SeaweedFS is a real object store (on disk, create-only PUTs honoured by its filer).
STORES = ("moto", "seaweedfs")
#: The masters' GC grace in a chaos run (the production default is an hour, longer than most
#: runs): objects a run makes garbage are deleted during it, by a master that leads for
#: longer than the grace (it counts from when that master found the object deletable).
GC_GRACE = 300.0
#: Seconds a master or worker gets to answer healthy: a chaos run shares a loaded machine,
#: where a Python process's start-up alone has taken over 30 s.
START_DEADLINE = 120.0
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
        etcd_members: int = 1,
        partitionable: bool = True,
        store: str = "moto",
        steppable_clocks: bool = False,
        gc_grace: float = GC_GRACE,
    ) -> None:
        if store not in STORES:
            raise ValueError(
                f"the chaos cluster's S3 server is one of {', '.join(STORES)}, not {store!r}"
            )
        if etcd_members not in (1, 3, 5):
            raise ValueError(f"etcd runs as 1, 3 or 5 members, not {etcd_members}")
        if etcd_members > 1 and tls:
            raise ValueError("a several-member etcd runs without TLS in the chaos cluster")
        self.directory = directory.resolve()
        #: Mutual TLS everywhere and etcd's own users, as ``local-stack up --tls``.
        self.tls = tls
        self.tls_dir: Path | None = None
        #: What the harness's client uses: the read-only etcd user and the client certificate.
        self.client_url = ""
        self.workers_wanted = workers
        self.masters_wanted = masters
        self.lease_ttl = lease_ttl
        #: The masters' garbage-collection grace (``master --gc-grace``): short enough that a
        #: run's compactions, trims and recoveries have their garbage deleted while the nemesis
        #: is at work, so a deletion that loses a needed object shows up as a lost write.
        self.gc_grace = gc_grace
        #: Where the S3 fault proxy keeps a copy of every log segment the workers wrote
        #: (s3proxy ``--keep-logs``): the double-serving check's evidence outlives GC.
        self.kept_logs = self.directory / "kept-logs"
        self.seed = seed
        self.records: list[ProcessRecord] = []
        self.etcd: ProcessRecord | None = None
        #: Workers read their wall clock's step from :meth:`clock_file` (``clock_jump``).
        self.steppable_clocks = steppable_clocks
        #: Which S3 server (:data:`STORES`), and its process.
        self.store = store
        self.s3: ProcessRecord | None = None
        self.proxy: ProcessRecord | None = None
        #: The partitioning proxy (netproxy.py): its control URL is ``net.url``.
        self.net: ProcessRecord | None = None
        #: Processes reach etcd and S3 through the partitioning proxy's links (``cut``); off,
        #: they connect directly, one hop fewer on a loaded machine (runs without partitions).
        self.partitionable = partitionable
        #: etcd's members (one unless ``etcd_members``), and their client addresses.
        self.etcd_members = etcd_members
        self.members: list[ProcessRecord] = []
        self._etcd_addresses: list[str] = []
        self._s3_address = ""
        self.masters: list[ProcessRecord] = []
        self.workers: list[ProcessRecord] = []
        self.url = ""
        self.store_url = ""
        #: The bucket straight from the S3 server (no faults): for the harness's own checks.
        self.direct_store_url = ""
        self._numbers = 0
        #: Members replaced so far (each fresh member's name: ``m<index>g<generation>``).
        self._generation = 0
        self._numbers_lock = threading.Lock()  # workers start from several threads

    # ------------------------------------------------------------------ starting

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            if self.tls:
                self.tls_dir = localstack.make_certs(self.directory / "tls")
            if self.etcd_members == 1:
                self.etcd, port = localstack.start_etcd(
                    self.directory / "etcd",
                    log=self.directory / "etcd.log",
                    fast_leases=True,
                    tls=self._files("etcd"),
                )
                self.records.append(self.etcd)
                self.members = [self.etcd]
                self._etcd_addresses = [f"127.0.0.1:{port}"]
            else:
                self._start_members()
                self.etcd = self.members[0]
            hosts = ",".join(self._etcd_addresses)
            self.url = self.client_url = f"etcd://{hosts}/chaos"
            if self.partitionable:
                self.net = self._start_net()
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
            if self.store == "seaweedfs":
                self.s3 = localstack.start_seaweedfs(
                    self.directory / "seaweedfs", log=self.directory / "s3.log"
                )
            else:
                self.s3 = localstack.start_moto(self.directory / "s3.log")
            self.records.append(self.s3)
            proxy_port = localstack.free_port()
            argv = [
                sys.executable,
                "-m",
                "tabletstore.testing.chaos.s3proxy",
                "--upstream",
                self.s3.url,
                "--port",
                str(proxy_port),
                "--seed",
                str(self.seed),
                "--keep-logs",
                str(self.kept_logs),
            ]
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            self._s3_address = f"127.0.0.1:{proxy_port}"
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
                f"s3://{bucket}/data?endpoint_url={self.s3.url}&region=us-east-1"
            )
            for _ in range(self.masters_wanted):
                self.start_master()
            with ThreadPoolExecutor(max(1, self.workers_wanted)) as pool:
                list(pool.map(lambda _: self.start_worker(), range(self.workers_wanted)))
        except BaseException:
            self.close()
            raise

    def top_up(self) -> list[str]:
        """Start masters and workers in place of those that died (killed; one that lost its
        lease rejoins in its own process), so the cluster keeps its size. A start that fails
        (a process not healthy in time is stopped) is returned as an error line, not raised:
        the next top-up tries again."""
        starts = [self.start_master] * (self.masters_wanted - len(self.live_masters()))
        starts += [self.start_worker] * (self.workers_wanted - len(self.live_workers()))
        if not starts:
            return []

        def start(one: Callable[[], ProcessRecord]) -> str | None:
            try:
                one()
            except Unavailable as exc:
                return f"top-up: {str(exc).splitlines()[0]}"
            return None

        with ThreadPoolExecutor(len(starts)) as pool:
            return [e for e in pool.map(start, starts) if e is not None]

    def _start_net(self) -> ProcessRecord:
        port = localstack.free_port()
        argv = [sys.executable, "-m", "tabletstore.testing.chaos.netproxy", "--port", str(port)]
        record = localstack.spawn(
            "netproxy",
            argv,
            log=self.directory / "netproxy.log",
            url=f"http://127.0.0.1:{port}",
            env=ENV,
        )
        self.records.append(record)
        localstack.wait_healthy(
            record, lambda: localstack._port_open(port), localstack.HEALTH_DEADLINE
        )
        return record

    def _net(self, path: str, body: dict[str, object]) -> dict[str, object]:
        if self.net is None:
            raise RuntimeError("this chaos cluster is not partitionable (no proxy links)")
        return _post_json(f"{self.net.url}/{path}", body)

    def _links(self, server: str) -> list[tuple[str, str]]:
        """(link suffix, upstream address) of each link a process has to ``server``."""
        if server == "etcd":
            return [(f"etcd{i}", a) for i, a in enumerate(self._etcd_addresses)]
        if server == "s3":
            return [("s3", self._s3_address)]
        raise ValueError(f"a process is cut from etcd or s3, not {server!r}")

    def _link(self, role: str, server: str) -> str:
        """``host:port,...`` of ``role``'s own links to ``server`` ("etcd": one per member,
        or "s3")."""
        ports = [
            self._net("links", {"name": f"{role}/{suffix}", "upstream": upstream})["port"]
            for suffix, upstream in self._links(server)
        ]
        return ",".join(f"127.0.0.1:{port}" for port in ports)

    def cut(self, record: ProcessRecord, server: str, *, cut: bool = True) -> None:
        """Partition ``record``'s process from ``server`` ("etcd": every member; "s3" for a
        worker), or heal that partition (``cut`` false): see netproxy.py for what a cut link
        does."""
        for suffix, _ in self._links(server):
            self._net("cut", {"name": f"{record.role}/{suffix}", "cut": cut})

    def heal_partitions(self) -> None:
        """Heal every cut link."""
        if self.net is None:
            return
        with urllib.request.urlopen(f"{self.net.url}/links", timeout=10) as response:
            links: dict[str, dict[str, object]] = json.loads(response.read())
        for name, link in links.items():
            if link["cut"]:
                self._net("cut", {"name": name, "cut": False})

    def _process_cluster_url(self, role: str) -> str:
        """The cluster URL of process ``role``: etcd through its own link (when
        ``partitionable``)."""
        if not self.partitionable:
            return self.url
        return self.url.replace(",".join(self._etcd_addresses), self._link(role, "etcd"), 1)

    # ------------------------------------------------------------------ etcd members

    def _start_members(self) -> None:
        """``etcd_members`` etcd processes forming one cluster, on free loopback ports."""
        binary = shutil.which("etcd")
        if binary is None:
            raise FileNotFoundError("etcd is not on PATH: install Debian's etcd-server package")
        n = self.etcd_members
        clients = [localstack.free_port() for _ in range(n)]
        peers = [localstack.free_port() for _ in range(n)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{peers[i]}" for i in range(n))
        records = []
        for i in range(n):
            client, peer = f"http://127.0.0.1:{clients[i]}", f"http://127.0.0.1:{peers[i]}"
            argv = [
                binary,
                f"--name=m{i}",
                f"--data-dir={self.directory / f'etcd-m{i}'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={initial}",
                "--initial-cluster-state=new",
                # As start_etcd's fast_leases: 1-second lease TTLs are accepted.
                "--heartbeat-interval=50",
                "--election-timeout=500",
            ]
            url = f"etcd://127.0.0.1:{clients[i]}/chaos"
            record = localstack.spawn(
                f"etcd-m{i}", argv, log=self.directory / f"etcd-m{i}.log", url=url
            )
            self.records.append(record)
            records.append(record)
        for record in records:  # members start together: none is healthy before a quorum
            localstack.wait_healthy(
                record,
                functools.partial(localstack.etcd_answers, record),
                localstack.HEALTH_DEADLINE,
            )
        self.members = records
        self._etcd_addresses = [f"127.0.0.1:{port}" for port in clients]

    def kill_members(self, indexes: Sequence[int]) -> None:
        """SIGKILL these etcd members (a crash)."""
        for i in indexes:
            self.kill(self.members[i])

    def restart_members(self, indexes: Sequence[int]) -> None:
        """Start these (killed) members again with the same argv: same ports and data, so
        each rejoins its cluster; wait until each answers healthy."""
        for i in indexes:
            old = self.members[i]
            record = localstack.spawn(old.role, old.argv, log=Path(old.log), url=old.url)
            self.records.append(record)
            self.members[i] = record
        for i in indexes:
            record = self.members[i]
            localstack.wait_healthy(
                record,
                functools.partial(localstack.etcd_answers, record),
                localstack.HEALTH_DEADLINE,
            )
        self.etcd = self.members[0]

    def replace_member(self, index: int) -> None:
        """Replace member ``index`` as an operator replaces a lost machine: crash it, remove
        it from the cluster through the member API, add a fresh member (new name, new data
        directory, new peer port, the same client port so the processes' URLs stay valid)
        and start it with ``--initial-cluster-state=existing``; it catches up from the
        leader. The cluster keeps its quorum throughout (three members, one replaced)."""
        if self.etcd_members < 3:
            raise RuntimeError("replacing a member needs etcd as three members or more")
        old = self.members[index]
        self.kill(old)
        other = next(i for i, r in enumerate(self.members) if i != index and self.running(r))
        api = f"http://{self._etcd_addresses[other]}/v3/cluster/member"
        client = f"http://{self._etcd_addresses[index]}"
        self._generation += 1
        name = f"m{index}g{self._generation}"
        peer = f"http://127.0.0.1:{localstack.free_port()}"
        _reconfigure(api, "remove", lambda m: client in m.get("clientURLs", []), present=False)
        added = _reconfigure(api, "add", lambda m: peer in m.get("peerURLs", []), peer=peer)
        initial = ",".join(f"{m.get('name') or name}={m['peerURLs'][0]}" for m in added)
        argv = [
            old.argv[0],
            f"--name={name}",
            f"--data-dir={self.directory / f'etcd-{name}'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={initial}",
            "--initial-cluster-state=existing",
            "--heartbeat-interval=50",
            "--election-timeout=500",
        ]
        record = localstack.spawn(
            f"etcd-{name}", argv, log=self.directory / f"etcd-{name}.log", url=old.url
        )
        self.records.append(record)
        self.members[index] = record
        localstack.wait_healthy(
            record, functools.partial(localstack.etcd_answers, record), START_DEADLINE
        )
        self.etcd = self.members[0]

    def etcd_leader(self) -> int:
        """The index of the member that is raft leader now (asked of each live member)."""
        for i, record in enumerate(self.members):
            if not self.running(record):
                continue
            try:
                status = _post_json(f"http://{self._etcd_addresses[i]}/v3/maintenance/status")
            except OSError:
                continue
            header = status.get("header")
            if isinstance(header, dict) and header.get("member_id") == status.get("leader"):
                return i
        raise RuntimeError("no etcd member says it is the leader")

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
        with self._numbers_lock:
            self._numbers += 1
            return f"{kind}-{self._numbers}"

    def start_master(self) -> ProcessRecord:
        role = self._role("master")
        record = localstack.start_master(
            self.directory,
            self._process_cluster_url(role),
            self.store_url,
            env=ENV,
            role=role,
            extra_args=("--lease-ttl", str(self.lease_ttl), "--gc-grace", str(self.gc_grace)),
            tls=self._files("master"),
            deadline=START_DEADLINE,
        )
        self.records.append(record)
        self.masters.append(record)
        return record

    def start_worker(self) -> ProcessRecord:
        role = self._role("worker")  # localstack.start_worker's name for worker <number>
        number = int(role.rpartition("-")[2])
        store = self.store_url
        if self.partitionable:
            store = store.replace(self._s3_address, self._link(role, "s3"), 1)
        record = localstack.start_worker(
            self.directory,
            self._process_cluster_url(role),
            number,
            env=ENV,
            extra_args=(
                *("--lease-ttl", str(self.lease_ttl), "--split-bytes", str(NO_SPLIT_BYTES)),
                *("--store", store),
                *(
                    ("--clock-step-file", str(self.clock_file(role)))
                    if self.steppable_clocks
                    else ()
                ),
            ),
            tls=self._files("worker"),
            deadline=START_DEADLINE,
        )
        self.records.append(record)
        self.workers.append(record)
        return record

    # ------------------------------------------------------------------ faults

    def clock_file(self, role: str) -> Path:
        """The file worker ``role`` reads its wall clock's step from (``--clock-step-file``)."""
        return self.directory / f"clock-{role}"

    def step_clock(self, record: ProcessRecord, offset: float) -> None:
        """(With ``steppable_clocks``.) Set worker ``record``'s wall clock ``offset`` seconds off the system's (0: none);
        the worker takes it up within 50 ms. Written whole (a rename), never half-read."""
        path = self.clock_file(record.role)
        part = path.with_suffix(".part")
        part.write_text(f"{offset!r}\n")
        part.replace(path)

    def live_workers(self) -> list[ProcessRecord]:
        return [r for r in self.workers if self.running(r)]

    def live_masters(self) -> list[ProcessRecord]:
        return [r for r in self.masters if self.running(r)]

    def restart_etcd(self, *, down: float = 1.0) -> float:
        """Stop etcd (SIGKILL: a crash), wait ``down`` seconds, start it again with the same
        ports and data directory; return the seconds it was unreachable. A several-member
        etcd is restarted as a whole (every member crashes at once)."""
        started = time.monotonic()
        if self.etcd_members > 1:
            every = range(len(self.members))
            self.kill_members(every)
            time.sleep(down)
            self.restart_members(every)
            return time.monotonic() - started
        old = self.etcd
        assert old is not None
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


def _post_json(url: str, body: dict[str, object] | None = None) -> dict[str, object]:
    request = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


def _reconfigure(
    api: str,
    change: str,
    match: Callable[[dict[str, Any]], bool],
    *,
    present: bool = True,
    peer: str = "",
    deadline: float = 60.0,
) -> list[dict[str, Any]]:
    """Remove the member ``match`` picks (``present`` false) or add one at ``peer``, through
    the member API at ``api``, until the member list shows it done; return that list.

    Checked against the list each time rather than trusting one answer: etcd answers 503
    while it has no leader (the crashed member may have been the leader) and refuses an
    addition until the leader has been connected to a quorum of started members for five
    seconds, and a request that timed out on a loaded machine may have been applied (a
    second removal would be refused as naming no member)."""
    end = time.monotonic() + deadline
    while True:
        listed = _retry_post(f"{api}/list", deadline=deadline)["members"]
        assert isinstance(listed, list)
        chosen = [m for m in listed if match(m)]
        if bool(chosen) == present:
            return listed
        body: dict[str, object] = {"peerURLs": [peer]} if present else {"ID": chosen[0]["ID"]}
        try:
            _post_json(f"{api}/{change}", body)
        except OSError:  # HTTPError among them
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def _retry_post(
    url: str, body: dict[str, object] | None = None, deadline: float = 60.0
) -> dict[str, object]:
    """:func:`_post_json`, retried on 503 and timeouts until ``deadline`` seconds pass."""
    end = time.monotonic() + deadline
    while True:
        try:
            return _post_json(url, body)
        except (urllib.error.HTTPError, OSError) as exc:
            retriable = not isinstance(exc, urllib.error.HTTPError) or exc.code == 503
            if not retriable or time.monotonic() > end:
                raise
            time.sleep(0.5)
