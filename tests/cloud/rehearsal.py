"""The cloud rehearsal's run (scripts/cloud-rehearsal.sh starts Docker, builds the image and
then runs ``python -m tests.cloud.rehearsal``); it prints what it does and ends with one
summary line, exit status 0 only if every step passed.

1. The plan (``tests.cloud.plan``): ``environments/dev`` against moto.
2. SeaweedFS as the bucket (the plan's bucket name), etcd on loopback -- with TLS and a client
   certificate when the plan's cluster URL names one (its secret's values are this run's
   certificates: the one substitution of a secret).
3. The Lambda functions of the plan, each a container started as Lambda starts an image
   (``tests.cloud.containers.function_run_args``) and polling its own Runtime API stand-in;
   the Invoke API stand-in in front of them is the tasks' ``AWS_ENDPOINT_URL_LAMBDA``.
4. The ECS tasks: one master task and two worker tasks, every container of each task definition
   in ``dependsOn`` order (``tests.cloud.containers.task_run_args``), each task with its own
   loopback address; the app containers are healthy when their own health check command says
   so (run in the container, as ECS runs it).
5. The flow: a table, rows written through the client, the worker serving them killed
   (SIGKILL), the master's recovery, the log-sort function invoked on the dead worker's log
   through the Runtime API (by the master when its sort executor is Lambda, otherwise by this
   run with the plan's own event), and every row read back.
6. The compaction function on a tablet (the event the master's Lambda executor sends), its
   output committed by the worker; the GC function with its schedule's event, then with no
   grace period: the replaced SSTables deleted, every row read back.
7. IAM: every S3 call each role's processes made, against the role's policies of the plan.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tabletstore.security import TlsConfig
from tests.cloud import etcd_members
from tests.cloud import plan as tfplan
from tests.cloud.containers import (
    Function,
    Loopback,
    PlanError,
    Platform,
    function_run_args,
    health_command,
    start_order,
    substitute,
    task_run_args,
)
from tests.cloud.lambda_runtime import InvokeApi, RuntimeApi
from tests.cloud.s3_calls import S3Recorder, iam_requests

ROWS = 200
WORKERS = 2
HEALTH_DEADLINE = 120.0
RECOVERY_DEADLINE = 180.0
#: Credentials every container gets (SeaweedFS and moto accept any).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal"}


class RehearsalError(Exception):
    """A step failed; the message says which and why."""


def say(message: str) -> None:
    print(message, flush=True)


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RehearsalError(f"docker {' '.join(args[:3])}...: {result.stderr.strip()[-2000:]}")
    return result.stdout


def wait_for(check: Callable[[], bool], deadline: float, what: str) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise RehearsalError(f"{what}: not within {deadline:g}s")
        time.sleep(0.5)


def logs(container: str, lines: int = 25) -> str:
    result = subprocess.run(
        ["docker", "logs", "--tail", str(lines), container], capture_output=True, text=True
    )
    return (result.stdout + result.stderr).strip()


def running(container: str) -> bool:
    return docker("inspect", "-f", "{{.State.Running}}", container, check=False).strip() == "true"


@dataclass
class Task:
    """One ECS task started here: its containers, by container name -> docker name."""

    family: str
    address: str
    containers: dict[str, str] = field(default_factory=dict)
    app: str = ""


@dataclass
class Run:
    image: str
    work: Path
    cache: Path | None
    started: float
    done: list[str] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    functions: dict[str, RuntimeApi] = field(default_factory=dict)
    function_containers: dict[str, str] = field(default_factory=dict)
    #: Function name -> its IAM role's address in the plan.
    function_roles: dict[str, str] = field(default_factory=dict)
    invoke: InvokeApi | None = None
    records: list[Any] = field(default_factory=list)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    loopback: Loopback | None = None
    #: Per IAM role (its resource address in the plan): the recording S3 endpoint its
    #: processes use (tests.cloud.s3_calls).
    recorders: dict[str, S3Recorder] = field(default_factory=dict)
    bucket: str = ""
    cluster_url: str = ""
    #: The store URL of the plan, and as this run's client reaches it.
    planned_store_url: str = ""
    store_url: str = ""
    #: The cluster URL of the plan (the master's TABLETSTORE_URL).
    planned_cluster_url: str = ""
    #: moto's server (the AWS APIs besides S3 and Lambda) and its endpoint.
    moto: Any = None
    aws_endpoint: str = ""
    tls: Any = None
    instance_image: str = ""
    #: This run's client certificate of the cluster's RPC CA (the operator's).
    rpc_tls: Any = None
    seaweed: str = ""
    #: The etcd members' instance containers, host mounts and loop devices (to undo).
    instances: list[str] = field(default_factory=list)
    mounts: list[Path] = field(default_factory=list)
    loops: list[str] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)
    #: Each member's instance environment, and the images of booted instances.
    instance_env: dict[str, dict[str, str]] = field(default_factory=dict)
    booted: list[str] = field(default_factory=list)

    def step(self, label: str, detail: str) -> None:
        """A step passed: ``label`` goes into the summary line, ``detail`` is printed now."""
        self.done.append(label)
        say(f"   ok: {detail}")


# ----------------------------------------------------------------------------- servers


def start_servers(run: Run, plan: Mapping[str, Any]) -> None:
    from tabletstore.cli import localstack

    tasks = tfplan.task_definitions(plan)
    master = _task(tasks, "master")
    app = _app_container(master, "master")
    env = {e["name"]: e["value"] for e in app.get("environment") or []}
    if "TABLETSTORE_URL" not in env:
        raise RehearsalError("the master's task definition sets no TABLETSTORE_URL")
    planned_url = env["TABLETSTORE_URL"]
    store = _flag(app["command"], "--store") or env.get("TABLETSTORE_STORE_URL")
    if store is None:
        raise RehearsalError("the master's task gives no store URL (--store)")

    seaweed = localstack.start_seaweedfs(run.work / "seaweedfs", log=run.work / "seaweedfs.log")
    run.records.append(seaweed)
    bucket = store.split("://", 1)[1].split("/", 1)[0]
    _create_bucket(seaweed.url, bucket)
    run.bucket = bucket

    run.seaweed = seaweed.url
    members = etcd_members.planned_members(list(tfplan.resources(plan)))
    if not members:
        raise RehearsalError("the plan has no etcd members (launch templates)")
    if "ca=" not in planned_url:
        raise RehearsalError(f"the cluster URL names no etcd client certificate: {planned_url}")
    # The operator's step: the etcd CA and the client certificate, as the two secrets.
    ca_dir = run.work / "etcd-ca"
    result = subprocess.run(
        ["bash", str(tfplan.TF / "scripts" / "etcd-ca.sh"), str(ca_dir)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RehearsalError(f"etcd-ca.sh: {result.stderr.strip()}")
    run.secrets[tfplan.VARIABLES["etcd_ca_secret_arn"]] = json.loads(
        (ca_dir / "ca.json").read_text()
    )
    run.secrets[tfplan.VARIABLES["etcd_client_secret_arn"]] = json.loads(
        (ca_dir / "client.json").read_text()
    )
    tls = TlsConfig(str(ca_dir / "ca.pem"), str(ca_dir / "client.pem"), str(ca_dir / "client.key"))
    # And the cluster's RPC certificates, one secret per role; this run is the operator.
    tls_dir = run.work / "cluster-tls"
    result = subprocess.run(
        ["bash", str(tfplan.TF / "scripts" / "cluster-tls.sh"), str(tls_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "TABLETSTORE": f"{sys.executable} -m tabletstore.cli.main"},
    )
    if result.returncode != 0:
        raise RehearsalError(f"cluster-tls.sh: {result.stderr.strip()}")
    arns = json.loads(tfplan.VARIABLES["tls_secret_arns"])
    for role in tfplan.TLS_ROLES:
        run.secrets[arns[role]] = json.loads((tls_dir / f"{role}.json").read_text())
    run.rpc_tls = TlsConfig(
        str(tls_dir / "ca.pem"), str(tls_dir / "operator.pem"), str(tls_dir / "operator.key")
    )
    run.tls = tls
    run.planned_store_url = store
    run.planned_cluster_url = planned_url
    start_aws(run)
    endpoints = start_members(run, members, tls)
    run.loopback = Loopback(etcd=",".join(endpoints), s3=seaweed.url, etcd_scheme="https")
    # This process's own store URL: the loopback S3 server named in it (no recorder).
    run.store_url = f"{substitute(store, run.loopback)}&endpoint_url={seaweed.url}"
    # The client's URL: the plan's namespace, this machine's certificate files.
    namespace = planned_url.split("://", 1)[1].split("/", 1)[1].split("?", 1)[0]
    run.cluster_url = localstack.with_tls(f"etcd://{','.join(endpoints)}/{namespace}", tls)
    run.step(
        "SeaweedFS + moto",
        f"SeaweedFS {seaweed.url} (bucket {bucket}); moto {run.aws_endpoint} (EC2, Secrets "
        "Manager with the secrets etcd-ca.sh and cluster-tls.sh made, ECR)",
    )


def start_members(run: Run, members: list[etcd_members.Member], tls: TlsConfig) -> list[str]:
    """Each member's boot script in its instance container (tests.cloud.etcd_members), then
    the cluster's health over TLS with the client certificate; the members' client endpoints."""
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=run.aws_endpoint, region_name="us-east-1", **_keys())
    vpc = ec2.create_vpc(CidrBlock="10.99.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.99.0.0/24", AvailabilityZone="us-east-1a")
    subnet_id = subnet["Subnet"]["SubnetId"]
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    image_uri = tfplan.VARIABLES["image_uri"]
    docker("tag", run.image, image_uri)
    socket = os.environ["DOCKER_HOST"].removeprefix("unix://")
    addresses = {m.address: f"127.0.1.{i + 1}" for i, m in enumerate(members)}
    base = run.work / "members"
    base.mkdir(parents=True, exist_ok=True)
    for i, member in enumerate(members):
        tags = [{"Key": k, "Value": v} for k, v in member.tags.items()]

        def tagged(kind: str, tags: list[dict[str, str]] = tags) -> list[dict[str, Any]]:
            return [{"ResourceType": kind, "Tags": tags}]

        eni = ec2.create_network_interface(
            SubnetId=subnet_id, TagSpecifications=tagged("network-interface")
        )["NetworkInterface"]["NetworkInterfaceId"]
        volume = ec2.create_volume(
            AvailabilityZone="us-east-1a", Size=1, TagSpecifications=tagged("volume")
        )["VolumeId"]
        (instance,) = ec2.run_instances(
            ImageId=ami,
            MinCount=1,
            MaxCount=1,
            SubnetId=subnet_id,
            TagSpecifications=tagged("instance"),
        )["Instances"]
        # The primary address: where the instance's connections come from (on this host
        # network, to another loopback address, 127.0.0.1).
        imds = etcd_members.Imds({"instance-id": instance["InstanceId"], "local-ipv4": "127.0.0.1"})
        run.closers.append(imds.close)
        script = etcd_members.localize(
            member.script,
            ids={member.volume_id: volume, member.eni_id: eni},
            addresses=addresses,
            own=f"127.0.2.{i + 1}",
        )
        home = base / member.name
        var_lib = home / "var-lib"
        var_lib.mkdir(parents=True)
        (home / "user-data").write_text(script)
        # The instance's /var/lib, shared with the host (and so with the Docker Engine).
        _host("mount", "--bind", str(var_lib), str(var_lib))
        _host("mount", "--make-shared", str(var_lib))
        run.mounts.append(var_lib)
        disk = base / f"{member.name}.img"
        with disk.open("wb") as out:
            out.truncate(256 << 20)
        loop = _host("losetup", "--find", "--show", str(disk)).strip()
        run.loops.append(loop)
        name = f"instance-{member.name}"
        env = {
            **CREDENTIALS,
            "http_proxy": imds.proxy,
            "no_proxy": "127.0.0.1,localhost",
            "AWS_ENDPOINT_URL": run.aws_endpoint,
            "AWS_ENDPOINT_URL_S3": run.seaweed,
            "INSTANCE_NAME": member.name,
            "INSTANCE_VAR_LIB": str(var_lib),
            "INSTANCE_REGISTRY": image_uri.split("/", 1)[0],
        }
        run.instance_env[member.name] = {**env, "DOCKER_SOCKET": socket}
        docker(
            "run", "--detach", "--name", name, "--cap-add", "SYS_ADMIN", "--network", "host",
            "--mount", f"type=bind,src={socket},dst=/var/run/docker.sock",
            "--mount", f"type=bind,src={var_lib},dst=/var/lib,bind-propagation=rshared",
            "--mount", f"type=bind,src={home / 'user-data'},dst=/run/user-data,readonly",
            "--device", f"{loop}:/dev/xvdf", "--device", f"{loop}:{loop}",
            *[a for k, v in env.items() for a in ("--env", f"{k}={v}")],
            run.instance_image, "bash", "/run/user-data",
        )  # fmt: skip
        run.instances.append(name)
    for name in run.instances:
        code = int(docker("wait", name, timeout=HEALTH_DEADLINE).strip() or "1")
        if code != 0:
            raise RehearsalError(f"{name}'s boot script exited {code}:\n{logs(name, 40)}")
    endpoints = [f"{addresses[m.address]}:2379" for m in members]
    health = [
        "etcdctl", f"--endpoints={','.join(f'https://{e}' for e in endpoints)}",
        f"--cacert={tls.ca}", f"--cert={tls.cert}", f"--key={tls.key}", "endpoint", "health",
    ]  # fmt: skip

    def healthy() -> bool:
        result = subprocess.run(
            health, capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"}
        )
        return result.returncode == 0

    try:
        wait_for(healthy, HEALTH_DEADLINE, "the etcd members' health over TLS")
    except RehearsalError as exc:
        raise RehearsalError(
            f"{exc}:\n" + "\n".join(logs(f"{m.name}-etcd", 10) for m in members)
        ) from exc
    checked = [_check_member(run, m) for m in members]
    run.step(
        f"{len(members)} etcd members booted",
        f"{len(members)} etcd members from the plan's boot scripts ({', '.join(checked)}), "
        f"healthy over TLS with the client certificate at {', '.join(endpoints)}",
    )
    snapshot_member(run, members[0])
    return endpoints


def _check_member(run: Run, member: etcd_members.Member) -> str:
    """What the boot script left on its instance: the volume in fstab and mounted, etcd as the
    image's user on its own files, docker and the timers enabled."""
    instance = f"instance-{member.name}"
    fstab = _read(instance, "/etc/fstab")
    calls = _read(instance, "/var/log/systemctl.log")
    if not re.search(r"^UUID=\S+ /var/lib/etcd ext4 ", fstab, re.M):
        raise RehearsalError(f"{instance}: the data volume is not in fstab:\n{fstab}")
    if not os.path.ismount(run.work / "members" / member.name / "var-lib" / "etcd"):
        raise RehearsalError(f"{instance}: the data volume is not mounted at /var/lib/etcd")
    for unit in ("docker", "etcd-snapshot.timer", "etcd-metrics.timer"):
        if unit not in calls:
            raise RehearsalError(f"{instance}: {unit} not enabled")
    container = f"{member.name}-etcd"
    wait_for(
        lambda: docker("inspect", "-f", "{{.State.Health.Status}}", container).strip() == "healthy",
        HEALTH_DEADLINE,
        f"{container}'s own health check",
    )
    user = docker("exec", container, "id", "-u").strip()
    key = run.work / "members" / member.name / "var-lib" / "etcd" / "tls" / "member.key"
    mode = f"{key.stat().st_mode & 0o777:o} {key.stat().st_uid}"
    if mode != f"600 {user}":
        raise RehearsalError(f"{member.name}: its key is {mode} (mode, owner), etcd runs as {user}")
    return f"{member.name}: uid {user}, key 0600"


def _read(container: str, path: str) -> str:
    """A file of a container (running or not), as text."""
    import io
    import tarfile

    result = subprocess.run(["docker", "cp", f"{container}:{path}", "-"], capture_output=True)
    if result.returncode != 0:
        raise RehearsalError(f"{container}:{path}: {result.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as tar:
        member = tar.next()
        extracted = tar.extractfile(member) if member is not None else None
        if extracted is None:
            raise RehearsalError(f"{container}:{path} is not a file")
        return extracted.read().decode()


def snapshot_member(run: Run, member: etcd_members.Member) -> None:
    """The member's snapshot service once, as systemd would start it: the boot script's unit
    (its ExecStart) with its EnvironmentFile, on the booted instance (its file system as the
    boot script left it); the snapshot must be in the bucket under the member's prefix."""
    import boto3

    instance = f"instance-{member.name}"
    unit = _read(instance, "/etc/systemd/system/etcd-snapshot.service")
    match = re.search(r"^ExecStart=.* (s3://([^/]+)/(\S+))$", unit, re.M)
    if match is None or "EnvironmentFile=/etc/etcd-snapshot.env" not in unit:
        raise RehearsalError(f"{instance}: the snapshot unit is not as expected:\n{unit}")
    destination, bucket, prefix = match.groups()
    booted = f"tabletstore-rehearsal-booted:{member.name}"
    docker("commit", instance, booted)
    run.booted.append(booted)
    # systemd's EnvironmentFile: one KEY=VALUE a line, the value the rest of the line.
    start = (
        'while IFS= read -r line; do [ -n "$line" ] && export "$line"; done'
        " < /etc/etcd-snapshot.env; "
        "exec $(sed -n 's/^ExecStart=//p' /etc/systemd/system/etcd-snapshot.service)"
    )
    env = run.instance_env[member.name]
    out = docker(
        "run", "--rm", "--network", "host",
        "--mount", f"type=bind,src={env['DOCKER_SOCKET']},dst=/var/run/docker.sock",
        "--mount", f"type=bind,src={env['INSTANCE_VAR_LIB']},dst=/var/lib",
        *[a for k, v in env.items() if k != "DOCKER_SOCKET" for a in ("--env", f"{k}={v}")],
        booted, "bash", "-c", start, timeout=HEALTH_DEADLINE,
    )  # fmt: skip
    s3 = boto3.client("s3", endpoint_url=run.seaweed, region_name="us-east-1", **_keys())
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    if bucket != run.bucket or not listed:
        raise RehearsalError(f"no snapshot under {destination} after the service ran: {out}")
    run.step(
        f"{member.name} snapshot uploaded",
        f"{member.name}'s snapshot service (its unit and environment file as the boot script "
        f"wrote them) uploaded {listed[0]['Key']} ({listed[0]['Size']} bytes)",
    )


def _host(*command: str) -> str:
    result = subprocess.run(list(command), capture_output=True, text=True)
    if result.returncode != 0:
        raise RehearsalError(f"{' '.join(command)}: {result.stderr.strip()}")
    return result.stdout


def start_aws(run: Run) -> None:
    """moto's server as the AWS APIs the containers call besides S3 and Lambda: Secrets
    Manager holds the plan's secrets (their ARNs, this run's values), as the functions read
    them at their start (functions/etcd_tls.py)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    run.moto = server
    host, port = server.get_host_and_port()
    run.aws_endpoint = f"http://{host}:{port}"
    secrets = boto3.client(
        "secretsmanager", endpoint_url=run.aws_endpoint, region_name="us-east-1", **_keys()
    )
    for arn, values in run.secrets.items():
        # moto names a secret's ARN NAME-XXXXXX and finds it by the ARN without the suffix,
        # as Secrets Manager does (the plan's ARNs name no suffix).
        secrets.create_secret(Name=arn.rsplit(":secret:", 1)[1], SecretString=json.dumps(values))


def _keys() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }


def _create_bucket(endpoint: str, bucket: str) -> None:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise RehearsalError(f"creating bucket {bucket}: {exc}") from exc


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def _task(tasks: Mapping[str, Any], role: str) -> dict[str, Any]:
    found = [t for family, t in tasks.items() if family.endswith(f"-{role}")]
    if len(found) != 1:
        raise RehearsalError(f"the plan has {len(found)} task definitions for {role}: {tasks}")
    return dict(found[0])


def _app_container(task: Mapping[str, Any], role: str) -> dict[str, Any]:
    for container in task["containers"]:
        if container["name"] == role:
            return dict(container)
    raise RehearsalError(f"the {role} task has no container named {role}")


# ----------------------------------------------------------------------------- functions


def start_functions(run: Run, plan: Mapping[str, Any]) -> None:
    assert run.loopback is not None
    planned = tfplan.functions(plan)
    if not planned:
        raise RehearsalError("the plan has no Lambda functions")
    for name, values in sorted(planned.items()):
        function = Function.from_plan(values)
        loopback = _loopback_for(run, values["role_address"])
        run.function_roles[name] = values["role_address"]
        api = RuntimeApi(name)
        run.functions[name] = api
        container = f"fn-{name}"
        args = function_run_args(
            function,
            image=run.image,
            name=container,
            loopback=loopback,
            platform=Platform(credentials=CREDENTIALS, endpoints=_endpoints(run)),
            runtime_api=api.address,
        )
        docker("run", *args)
        run.function_containers[name] = container
    run.invoke = InvokeApi(run.functions, timeout=300)

    def polling() -> bool:
        for name, api in run.functions.items():
            if api.init_error is not None:
                raise RehearsalError(
                    f"function {name} could not start: {api.init_error}\n"
                    + logs(run.function_containers[name])
                )
            if not running(run.function_containers[name]):
                raise RehearsalError(
                    f"function {name}'s container exited:\n{logs(run.function_containers[name])}"
                )
        return all(api.polls > 0 for api in run.functions.values())

    wait_for(polling, HEALTH_DEADLINE, "every function's runtime polling its Runtime API")
    commands = {" ".join(Function.from_plan(v).command) for v in planned.values()}
    run.step(
        f"{len(planned)} functions on the Runtime API",
        f"{len(planned)} Lambda functions polling their Runtime APIs ({', '.join(sorted(planned))}"
        f"; image_config commands {sorted(commands)}; read-only root, uid 993, /tmp tmpfs)",
    )


def _loopback_for(run: Run, role: str) -> Loopback:
    """The loopback endpoints of a process of IAM role ``role``: S3 through its recorder."""
    assert run.loopback is not None
    if role not in run.recorders:
        run.recorders[role] = S3Recorder(run.loopback.s3)
    return replace(run.loopback, s3=run.recorders[role].endpoint)


def _endpoints(run: Run) -> dict[str, str]:
    endpoints = {}
    if run.invoke is not None:
        endpoints["lambda"] = run.invoke.endpoint
    if run.aws_endpoint:
        endpoints["secrets_manager"] = run.aws_endpoint
    return endpoints


# ----------------------------------------------------------------------------- tasks


def start_task(run: Run, task: Mapping[str, Any], role: str, index: int) -> Task:
    """Every container of ``task`` in dependsOn order (module docstring)."""
    assert run.loopback is not None
    address = f"127.0.0.{10 + len(run.tasks)}"
    loopback = _loopback_for(run, task["task_role"])
    started = Task(family=role, address=address)
    run.tasks.append(started)
    volumes = {}
    for volume in task["volumes"]:
        # Fargate: an empty directory on the task's ephemeral storage, owned by root, 0755.
        path = run.work / "tasks" / f"{role}-{index}" / volume
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, 0, 0)
        path.chmod(0o755)
        volumes[volume] = str(path)
    containers = [c for c in task["containers"] if not _proxy(c)]
    skipped = [c["name"] for c in task["containers"] if _proxy(c)]
    for container in containers:
        container["dependsOn"] = [
            d for d in container.get("dependsOn") or [] if d["containerName"] not in skipped
        ]
    waits = {
        d["containerName"]: d["condition"] for c in containers for d in c.get("dependsOn") or []
    }
    for container in start_order(containers):
        name = f"{role}-{index}-{container['name']}"
        args = task_run_args(
            container,
            image=run.image,
            name=name,
            loopback=loopback,
            platform=Platform(credentials=CREDENTIALS, endpoints=_endpoints(run), address=address),
            volumes=volumes,
            secrets=run.secrets,
        )
        docker("run", *args)
        started.containers[container["name"]] = name
        condition = waits.get(container["name"])
        if condition in ("SUCCESS", "COMPLETE"):
            code = int(docker("wait", name, timeout=HEALTH_DEADLINE).strip())
            if condition == "SUCCESS" and code != 0:
                raise RehearsalError(f"{name} exited {code} (SUCCESS needed):\n{logs(name)}")
        elif condition == "HEALTHY":
            _wait_healthy(name, container)
    started.app = started.containers[role]
    app = next(c for c in containers if c["name"] == role)
    _wait_healthy(started.app, app)
    if skipped:
        say(f"   note: {role} task's {skipped} not run (a sidecar serving 127.0.0.1:2379 inside "
            "its own task cannot run beside others on one host network); the app's etcd "
            "endpoint is the loopback etcd instead")  # fmt: skip
    return started


def _proxy(container: Mapping[str, Any]) -> bool:
    return list(container.get("command") or [])[:1] == ["etcd-proxy"]


def _wait_healthy(name: str, container: Mapping[str, Any]) -> None:
    command = health_command(container)

    def healthy() -> bool:
        if not running(name):
            raise RehearsalError(f"{name} exited:\n{logs(name)}")
        if command is None:
            return True
        result = subprocess.run(
            ["docker", "exec", name, *command], capture_output=True, text=True, timeout=30
        )
        return result.returncode == 0

    wait_for(healthy, HEALTH_DEADLINE, f"{name}'s health check {command}")


def start_tasks(run: Run, plan: Mapping[str, Any]) -> None:
    tasks = tfplan.task_definitions(plan)
    master = start_task(run, _task(tasks, "master"), "master", 0)
    workers = [start_task(run, _task(tasks, "worker"), "worker", i) for i in range(WORKERS)]
    app = _app_container(_task(tasks, "worker"), "worker")
    user = app.get("user") or docker("inspect", "-f", "{{.Config.User}}", run.image).strip()
    env = {e["name"] for e in app.get("environment") or []}
    tls = "--insecure" not in app["command"] and "TABLETSTORE_TLS_CERT" in env
    run.step(
        f"master + {len(workers)} workers (user {user}, read-only root"
        + (", mutual TLS)" if tls else ", --insecure)"),
        f"master task ({master.address}) and {len(workers)} worker tasks "
        f"({', '.join(w.address for w in workers)}) healthy: the plan's commands, "
        f"user {user}, read-only root: {bool(app.get('readonlyRootFilesystem'))}, RPC "
        + ("over mutual TLS with each role's certificate" if tls else "without TLS"),
    )


# ----------------------------------------------------------------------------- the flow


def flow(run: Run) -> None:
    asyncio.run(_flow(run))


async def _flow(run: Run) -> None:
    import tabletstore
    from tabletstore import SetCell
    from tabletstore.commitlog.runs import TabletRange

    rows = {f"row-{i:05d}".encode(): f"value-{i}".encode() for i in range(ROWS)}
    async with await tabletstore.connect_async(run.cluster_url, tls=run.rpc_tls) as db:
        await db.create_table("rehearsal", ["f"])
        table = db.table("rehearsal")
        for key, value in rows.items():
            await table.mutate_row(key, [SetCell("f", b"c", value)])
        run.step(f"{ROWS} rows written", f"table 'rehearsal' created, {ROWS} rows written")

        info = await db.catalog.get_table("rehearsal")
        tablets = await db.catalog.list_tablets(info.table_id)
        locations = {t.location for t in tablets}
        victim = next(
            (w for w in run.tasks if w.family == "worker" and
             any(str(loc).startswith(f"{w.address}:") for loc in locations)),
            None,
        )  # fmt: skip
        if victim is None:
            raise RehearsalError(f"no worker task serves the table: {locations}")
        workers_before = await db.catalog.live_workers()
        dead_id = next(
            (wid for wid, addr in workers_before.items() if addr.startswith(f"{victim.address}:")),
            None,
        )
        logs_of = {ref for t in tablets for ref in t.logs if ref.worker_id == dead_id}
        ranges = [
            TabletRange(t.table_id, t.tablet_id, t.start_row, t.end_row)
            for t in tablets
            if any(ref in t.logs for ref in logs_of)
        ]
        docker("kill", victim.app)
        run.step("worker killed", f"worker {victim.app} ({victim.address}, {dead_id}) killed")

        deadline = time.monotonic() + RECOVERY_DEADLINE
        read: dict[bytes, bytes] = {}
        while True:
            try:
                async for row in table.read_rows():
                    read[row.key] = row.latest("f", b"c")
                if read == rows:
                    break
            except Exception as exc:  # the tablet is unavailable until it is recovered
                if time.monotonic() > deadline:
                    raise RehearsalError(f"rows not readable after the kill: {exc}") from exc
            if time.monotonic() > deadline:
                raise RehearsalError(f"read back {len(read)} of {ROWS} rows")
            await asyncio.sleep(1)
        run.step(f"{ROWS} rows read back", f"all {ROWS} rows read back after the recovery")

    dead = max(((r.worker_id, r.incarnation) for r in logs_of), default=None)
    await _log_sort(run, dead, ranges)


async def _log_sort(run: Run, dead: tuple[str, int] | None, ranges: list[Any]) -> None:
    """The log-sort function on the dead worker's log: what the master invoked, or, when it
    invoked nothing (its sort executor is not Lambda, or its recovery replayed the log
    directly), what it would have invoked: the log's sort plan made as the master makes it
    (``plan_sort``) and one invocation per task, each answered with the task's manifest, a
    retry with the same one."""
    from tabletstore.commitlog.sorting import plan_sort
    from tabletstore.storage_s3 import open_store

    assert run.invoke is not None
    name = next((n for n in run.functions if n.endswith("log-sort")), None)
    if name is None:
        raise RehearsalError(f"no log-sort function in the plan: {sorted(run.functions)}")
    api = run.functions[name]
    by_master = [i for i in api.invocations if i.done.is_set()]
    if by_master:
        failed = [i for i in by_master if i.error is not None]
        if failed:
            raise RehearsalError(f"the master's log-sort invocations failed: {failed[0].error}")
        run.step(
            f"{name} invoked by the master",
            f"the master invoked {name} {len(by_master)} times through the Runtime API",
        )
        return
    if dead is None:
        raise RehearsalError("the killed worker's commit log is not known")
    worker_id, incarnation = dead
    store = open_store(run.store_url)
    try:
        plan = await plan_sort(store, worker_id, incarnation, ranges)
    finally:
        await store.close()
    # The master's store URL, reaching S3 as the function does (through its role's recorder).
    function_store = substitute(run.planned_store_url, _loopback_for(run, run.function_roles[name]))
    records = 0
    for task in plan.tasks:
        event = {
            "store_url": function_store,
            "worker_id": worker_id,
            "incarnation": incarnation,
            "first_segment": task.first,
        }
        answer = await asyncio.to_thread(_invoke, run.invoke.endpoint, name, event)
        again = await asyncio.to_thread(_invoke, run.invoke.endpoint, name, event)
        if not answer.get("ok") or again != answer:
            raise RehearsalError(f"{name} on {worker_id}/{incarnation}: {answer} then {again}")
        records += int(answer["manifest"]["records"])
    if records < ROWS:
        raise RehearsalError(f"{name} sorted {records} records of the dead log, not {ROWS}")
    run.step(
        f"{name} sorted the dead log ({records} records)",
        f"{name} invoked through the Runtime API on the dead log {worker_id}/{incarnation}: "
        f"{len(plan.tasks)} sort task(s), {records} records, a retry answered the same "
        "(the master invoked it on no task: its recovery replayed the small log directly)",
    )


def compact_and_collect(run: Run, plan: Mapping[str, Any]) -> None:
    asyncio.run(_compact_and_collect(run, tfplan.scheduled_events(plan)))


async def _compact_and_collect(run: Run, scheduled: Mapping[str, dict[str, Any]]) -> None:
    """The compaction function on a tablet of the table, invoked with the event the master's
    Lambda executor sends (``compaction_event``), its output committed by the serving worker;
    then the GC function with the event its schedule sends (the plan's rule target), and
    again with no grace period: the SSTables the compaction replaced are deleted, every row
    still reads back."""
    import tabletstore
    from tabletstore import SetCell
    from tabletstore.master.compaction_lambda import compaction_event
    from tabletstore.storage_s3 import open_store

    assert run.invoke is not None
    compaction = _function_named(run, "compaction")
    gc = _function_named(run, "gc")
    if gc not in scheduled:
        raise RehearsalError(f"no schedule of the plan invokes {gc}: {sorted(scheduled)}")
    # The cluster URL as the functions reach the cluster (the plan's, endpoints substituted).
    cluster_url = substitute(run.planned_cluster_url, _loopback_for(run, run.function_roles[gc]))
    async with await tabletstore.connect_async(run.cluster_url, tls=run.rpc_tls) as db:
        table = db.table("rehearsal")
        # Two flushes, a tenth of the rows overwritten between them (with their own values):
        # the tablet has SSTables to merge.
        for _ in range(2):
            for i in range(0, ROWS, 10):
                await table.mutate_row(
                    f"row-{i:05d}".encode(), [SetCell("f", b"c", f"value-{i}".encode())]
                )
            await db.flush("rehearsal")
        info = await db.catalog.get_table("rehearsal")
        record = max(
            await db.catalog.list_tablets(info.table_id),
            key=lambda r: sum(len(refs) for refs in r.sstables.values()),
        )
        inputs = sorted(ref.key for refs in record.sstables.values() for ref in refs)
        if len(inputs) < 2:
            raise RehearsalError(f"tablet {record.tablet_id} has {len(inputs)} SSTables, not 2+")
        event = compaction_event(cluster_url, record)
        answer = await asyncio.to_thread(_invoke, run.invoke.endpoint, compaction, event)
        if not answer.get("ok"):
            raise RehearsalError(f"{compaction}: {answer}")
        after = await db.catalog.get_tablet(record.table_id, record.tablet_id)
        outputs = sorted(ref.key for refs in after.sstables.values() for ref in refs)
        if outputs != sorted(answer["outputs"]) or set(outputs) & set(inputs):
            raise RehearsalError(
                f"{compaction}'s output not committed: it answered {answer['outputs']}, the "
                f"tablet lists {outputs} (inputs {inputs})"
            )
        run.step(
            f"{compaction} compacted {len(inputs)} SSTables",
            f"{compaction} invoked through the Runtime API with the master executor's event: "
            f"{len(inputs)} SSTables of tablet {record.tablet_id} merged into {len(outputs)}, "
            "committed by the serving worker",
        )

        planned = scheduled[gc]
        event = substitute_event(planned, cluster_url)
        answer = await asyncio.to_thread(_invoke, run.invoke.endpoint, gc, event)
        if not answer.get("ok") or answer["listed"] < len(outputs):
            raise RehearsalError(f"{gc} with its scheduled event: {answer}")
        now = await asyncio.to_thread(_invoke, run.invoke.endpoint, gc, {**event, "grace": 0})
        store = open_store(run.store_url)
        try:
            left = [k for k in inputs if await store.head(k) is not None]
            kept = [k for k in outputs if await store.head(k) is None]
        finally:
            await store.close()
        if not now.get("ok") or left or kept or now["deleted"] < len(inputs):
            raise RehearsalError(
                f"{gc} with no grace period: {now}; replaced SSTables left {left}, "
                f"live ones deleted {kept}"
            )
        read = {}
        async for row in table.read_rows():
            read[row.key] = row.latest("f", b"c")
        expected = {f"row-{i:05d}".encode(): f"value-{i}".encode() for i in range(ROWS)}
        if read != expected:
            raise RehearsalError(f"after GC {len(read)} rows read, not the {ROWS} written")
    run.step(
        f"{gc} deleted {now['deleted']} objects",
        f"{gc} invoked with its schedule's event (listed {answer['listed']}, deleted "
        f"{answer['deleted']} within the grace period), then with grace 0: deleted "
        f"{now['deleted']} objects, the {len(inputs)} replaced SSTables among them; "
        f"all {ROWS} rows read back",
    )


def substitute_event(event: Mapping[str, Any], cluster_url: str) -> dict[str, Any]:
    """A planned event with its cluster URL as this run reaches the cluster."""
    if "cluster_url" not in event:
        raise RehearsalError(f"the planned event names no cluster_url: {event}")
    return {**event, "cluster_url": cluster_url}


def _function_named(run: Run, kind: str) -> str:
    name = next((n for n in run.functions if n.endswith(f"-{kind}")), None)
    if name is None:
        raise RehearsalError(f"no {kind} function in the plan: {sorted(run.functions)}")
    return name


def _invoke(endpoint: str, name: str, event: Mapping[str, Any]) -> dict[str, Any]:
    import boto3

    client = boto3.client(
        "lambda",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="rehearsal",
        aws_secret_access_key="rehearsal",
    )
    answer = client.invoke(FunctionName=name, Payload=json.dumps(event).encode())
    body = json.loads(answer["Payload"].read())
    if "FunctionError" in answer:
        raise RehearsalError(f"{name} failed: {body}")
    return dict(body)


# ----------------------------------------------------------------------------- IAM


def check_iam(run: Run, plan: Mapping[str, Any]) -> None:
    """Each role's recorded S3 calls against its policies with moto's IAM enforcement, and a
    read and a write outside its prefixes denied (tests.cloud.iam)."""
    import logging

    from moto.server import ThreadedMotoServer

    from tests.cloud import iam

    policies = tfplan.role_policies(plan)
    roles = {}
    for role in run.recorders:
        documents = policies.get(role, [])
        unknown = [d["unknown"] for d in documents if "unknown" in d]
        if unknown or not documents:
            raise RehearsalError(f"role {role}: policies not known from the plan: {unknown}")
        roles[role] = documents
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    problems: list[str] = []
    counts = []
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        keys = iam.moto_with_users(endpoint, run.bucket, roles)
        for role, recorder in run.recorders.items():
            requests = sorted({r for call in recorder.calls for r in iam_requests(call)}, key=str)
            found = iam.check_role(
                endpoint, run.bucket, keys[role], roles[role], requests, "elsewhere/probe"
            )
            problems += [f"{role}: {p}" for p in found]
            counts.append(f"{role.rsplit('.', 1)[-1]}: {len(requests)}")
    finally:
        server.stop()
    if problems:
        raise RehearsalError("IAM:\n  " + "\n  ".join(problems))
    run.step(
        f"IAM fits {len(roles)} roles",
        f"every S3 request each role's processes made is allowed by its plan policies under "
        f"moto's IAM enforcement, and none outside its prefixes ({'; '.join(counts)})",
    )


# ----------------------------------------------------------------------------- main


def stop(run: Run) -> None:
    from tabletstore.cli import localstack

    for name in [c for t in run.tasks for c in t.containers.values()] + list(
        run.function_containers.values()
    ):
        docker("rm", "-f", name, check=False)
    if run.invoke is not None:
        run.invoke.close()
    for recorder in run.recorders.values():
        recorder.close()
    for api in run.functions.values():
        api.close()
    for record in reversed(run.records):
        localstack.stop(record)
    for name in run.instances:
        member = name.removeprefix("instance-")
        docker("rm", "-f", name, f"{member}-etcd", check=False)
    for image in run.booted:
        docker("rmi", "-f", image, check=False)
    for mount in reversed(run.mounts):
        subprocess.run(["umount", "-l", str(mount / "etcd")], capture_output=True)
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
    for loop in run.loops:
        subprocess.run(["losetup", "-d", loop], capture_output=True)
    for close in run.closers:
        close()
    if run.moto is not None:
        run.moto.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cloud.rehearsal")
    parser.add_argument("--image", required=True)
    parser.add_argument("--instance-image", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--started", type=float, default=time.time())
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    for key, value in CREDENTIALS.items():
        os.environ[key] = value
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    run = Run(image=args.image, work=args.work, cache=args.cache, started=args.started)
    run.instance_image = args.instance_image
    steps: list[tuple[str, Callable[[], None]]] = []
    plan: dict[str, Any] = {}

    def load_plan() -> None:
        plan.update(tfplan.plan_json(args.work, args.cache, log=say))
        count = sum(1 for _ in tfplan.resources(plan))
        run.step(
            f"plan of {tfplan.ENVIRONMENT} ({count} resources)",
            f"plan of environments/{tfplan.ENVIRONMENT} against moto: {count} resources",
        )

    steps = [
        ("plan", load_plan),
        ("servers", lambda: start_servers(run, plan)),
        ("functions", lambda: start_functions(run, plan)),
        ("tasks", lambda: start_tasks(run, plan)),
        ("flow", lambda: flow(run)),
        ("compaction and gc", lambda: compact_and_collect(run, plan)),
        ("iam", lambda: check_iam(run, plan)),
    ]
    failed = None
    try:
        for name, step in steps:
            say(f"== {name}")
            try:
                step()
            except (RehearsalError, PlanError, tfplan.TerraformError, ValueError) as exc:
                failed = f"{name}: {exc}"
                break
    finally:
        stop(run)
    elapsed = time.time() - args.started
    if failed is not None:
        if "\n" in failed:
            print(failed, file=sys.stderr, flush=True)
        say(f"cloud rehearsal: FAILED at {failed.splitlines()[0]} "
            f"({len(run.done)} steps passed, {elapsed:.0f}s)")  # fmt: skip
        return 1
    say(f"cloud rehearsal: passed in {elapsed:.0f}s: {'; '.join(run.done)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
