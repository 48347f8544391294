"""The plan's ECS containers and Lambda functions as ``docker run`` arguments (pure).

What runs is exactly what the plan says -- command, entry point, environment, user, read-only
root file system, writable paths, secrets by name -- with one kind of change: **endpoints**.
A task on Fargate reaches etcd, S3, Lambda and Secrets Manager at cloud addresses; here
they are loopback servers, so :func:`substitute` rewrites

* an ``etcd://host:port/...`` URL to the loopback etcd's ``host:port`` (path and query kept:
  namespace, TLS file names), and an ``https://host:port`` list of etcd members the same way;
* an ``s3://bucket/prefix?...`` store URL to address the bucket by path
  (``addressing_style=path``: the loopback S3 server has no per-bucket host names), any
  ``endpoint_url=`` dropped (bucket, prefix and region kept); every container reaches S3 at
  the loopback S3 server its role's processes use through the SDK's own
  ``AWS_ENDPOINT_URL_S3``, so a store URL one process records in etcd and another reads
  (the master's, read by the workers and the functions) sends each one's calls to its own
  role's endpoint;

and the container gets, on top of the plan's environment, what the platform gives a task or
a function (:class:`Platform`): credentials of its role, the region, the endpoints of the AWS
APIs it calls (``AWS_ENDPOINT_URL_<SERVICE>``), and the task's own address (Fargate's awsvpc
gives each task an address of its own; here each task has a loopback address of its own,
127.0.0.N, given as ``TABLETSTORE_ADVERTISE_HOST``, so two tasks on the one host network can
both listen on the ports the plan names). Secrets (``valueFrom``) are resolved from the
values the caller gives for their ARNs, as ECS resolves them from Secrets Manager.

Fargate's rules, applied here as Fargate applies them: a task volume without a host path is
an empty directory owned by root (mode 0755) on the task's ephemeral storage, shared by the
task's containers that mount it; a health check command starts with ``CMD`` or ``CMD-SHELL``.
A field this module does not know is an error, never silently dropped.

Lambda (:func:`function_run_args`): the image's entry point (or ``image_config``'s), its
command from ``image_config``, the function's environment variables plus Lambda's reserved
ones, a read-only root file system with ``/tmp`` writable (512 MB), run as Lambda's
unprivileged user (not the image's ``USER``), the Runtime API at ``AWS_LAMBDA_RUNTIME_API``.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LAMBDA_USER",
    "Function",
    "Loopback",
    "PlanError",
    "Platform",
    "function_run_args",
    "health_command",
    "start_order",
    "substitute",
    "task_run_args",
]

#: The uid:gid Lambda runs a container image's process as (sbx_user1051), whatever its USER.
LAMBDA_USER = "993:990"
#: Lambda's writable /tmp (its default ephemeral storage).
LAMBDA_TMP_MB = 512

#: Container-definition fields the translation knows (everything else is refused).
_KNOWN = {
    "name", "image", "essential", "command", "entryPoint", "environment", "secrets", "user",
    "readonlyRootFilesystem", "mountPoints", "portMappings", "healthCheck", "dependsOn",
    "logConfiguration", "workingDirectory", "stopTimeout", "ulimits", "linuxParameters",
    "cpu", "memory", "memoryReservation", "startTimeout", "volumesFrom",
}  # fmt: skip
_ETCD_URL = re.compile(r"^etcd://(?:(?P<user>[^@/]*)@)?(?P<hosts>[^/?]+)(?P<rest>.*)$")
_HTTPS_MEMBERS = re.compile(r"^https?://[^,/]+(?:,https?://[^,/]+)*$")


class PlanError(Exception):
    """The plan asks for something the cloud would refuse, or this module cannot run."""


@dataclass(frozen=True)
class Loopback:
    """The loopback servers that stand in for the cloud's endpoints."""

    #: The etcd client endpoints, ``host:port[,host:port...]``.
    etcd: str
    #: The S3 endpoint, ``http://host:port``.
    s3: str
    #: The etcd client scheme for member lists (``https`` when etcd serves TLS).
    etcd_scheme: str = "http"


@dataclass(frozen=True)
class Platform:
    """What the platform gives a container beyond the plan: its role's credentials, the region,
    AWS API endpoints (service -> URL, e.g. ``{"lambda": "http://127.0.0.1:5001"}``), and the
    task's own address."""

    credentials: Mapping[str, str]
    region: str = "us-east-1"
    endpoints: Mapping[str, str] = field(default_factory=dict)
    address: str | None = None

    def environment(self) -> dict[str, str]:
        env = {**self.credentials, "AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region}
        for service, url in sorted(self.endpoints.items()):
            env[f"AWS_ENDPOINT_URL_{service.upper()}"] = url
        if self.address is not None:
            env["TABLETSTORE_ADVERTISE_HOST"] = self.address
        return env


def substitute(value: str, loopback: Loopback) -> str:
    """``value`` with a cloud endpoint replaced by its loopback one (module docstring)."""
    if (match := _ETCD_URL.match(value)) is not None:
        user = f"{match['user']}@" if match["user"] is not None else ""
        return f"etcd://{user}{loopback.etcd}{match['rest']}"
    if value.startswith("s3://"):
        parts = urllib.parse.urlsplit(value)
        query = [
            (k, v)
            for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
            if k not in ("endpoint_url", "addressing_style")
        ]
        query.append(("addressing_style", "path"))
        return urllib.parse.urlunsplit(
            parts._replace(query=urllib.parse.urlencode(query, safe=":/"))
        )
    if _HTTPS_MEMBERS.match(value) and value.rsplit(":", 1)[1] == "2379":
        return ",".join(f"{loopback.etcd_scheme}://{host}" for host in loopback.etcd.split(","))
    return value


def _secret(value_from: str, secrets: Mapping[str, Mapping[str, str]]) -> str:
    """An ECS ``valueFrom``: ``<secret ARN>`` or ``<secret ARN>:<json key>:<stage>:<version>``."""
    for arn, values in secrets.items():
        if value_from == arn and "" in values:
            return values[""]
        if value_from.startswith(f"{arn}:"):
            key = value_from[len(arn) + 1 :].split(":", 1)[0]
            if key in values:
                return values[key]
            raise PlanError(f"secret {arn} has no key {key!r} (valueFrom {value_from})")
    raise PlanError(f"no value for the secret {value_from} (known: {sorted(secrets)})")


def health_command(container: Mapping[str, Any]) -> list[str] | None:
    """The container's health check as an argv to run in it, or None without one. ECS takes
    ``["CMD", argv...]`` or ``["CMD-SHELL", "command"]``; anything else is refused."""
    check = container.get("healthCheck")
    if not check:
        return None
    command = list(check.get("command") or [])
    if command[:1] == ["CMD"] and len(command) > 1:
        return command[1:]
    if command[:1] == ["CMD-SHELL"] and len(command) == 2:
        return ["/bin/sh", "-c", command[1]]
    raise PlanError(
        f"container {container.get('name')!r}: healthCheck.command must start with CMD or "
        f"CMD-SHELL (ECS hands it to Docker as its health test), got {command}"
    )


def start_order(containers: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The task's containers in an order that honours ``dependsOn`` (ECS starts a container
    after the ones it depends on); a cycle or an unknown name is an error."""
    by_name = {c["name"]: c for c in containers}
    done: list[Mapping[str, Any]] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if any(c["name"] == name for c in done):
            return
        if name not in by_name:
            raise PlanError(f"dependsOn names no container of the task: {name!r}")
        if name in visiting:
            raise PlanError(f"dependsOn has a cycle through {name!r}")
        visiting.add(name)
        for dep in by_name[name].get("dependsOn") or []:
            visit(dep["containerName"])
        visiting.discard(name)
        done.append(by_name[name])

    for container in containers:
        visit(container["name"])
    return done


def task_run_args(
    container: Mapping[str, Any],
    *,
    image: str,
    name: str,
    loopback: Loopback,
    platform: Platform,
    volumes: Mapping[str, str],
    secrets: Mapping[str, Mapping[str, str]] = {},
) -> list[str]:
    """``docker run`` arguments (after ``run``) for one ECS container definition. ``volumes``
    maps each task volume name to its host directory (made by the caller: root-owned, 0755,
    shared by the task's containers)."""
    unknown = set(container) - _KNOWN
    if unknown:
        raise PlanError(f"container {container.get('name')!r}: fields not rehearsed: {unknown}")
    for unsupported in ("volumesFrom", "linuxParameters"):
        if container.get(unsupported):
            raise PlanError(f"container {container['name']!r}: {unsupported} is not rehearsed")
    args = ["--detach", "--name", name, "--network", "host"]
    if container.get("user"):
        args += ["--user", str(container["user"])]
    if container.get("readonlyRootFilesystem"):
        args.append("--read-only")
    if container.get("workingDirectory"):
        args += ["--workdir", container["workingDirectory"]]
    if container.get("stopTimeout") is not None:
        args += ["--stop-timeout", str(container["stopTimeout"])]
    for limit in container.get("ulimits") or []:
        args += ["--ulimit", f"{limit['name']}={limit['softLimit']}:{limit['hardLimit']}"]
    for mount in container.get("mountPoints") or []:
        source = mount["sourceVolume"]
        if source not in volumes:
            raise PlanError(f"container {container['name']!r} mounts unknown volume {source!r}")
        spec = f"type=bind,src={volumes[source]},dst={mount['containerPath']}"
        args += ["--mount", spec + (",readonly" if mount.get("readOnly") else "")]
    env = {e["name"]: substitute(e["value"], loopback) for e in container.get("environment") or []}
    for secret in container.get("secrets") or []:
        env[secret["name"]] = _secret(secret["valueFrom"], secrets)
    env.update(platform.environment())
    env["AWS_ENDPOINT_URL_S3"] = loopback.s3
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    entry = list(container.get("entryPoint") or [])
    if entry:
        args += ["--entrypoint", entry[0]]
    args.append(image)
    return args + entry[1:] + [substitute(a, loopback) for a in container.get("command") or []]


@dataclass(frozen=True)
class Function:
    """A Lambda function of the plan (``aws_lambda_function``)."""

    name: str
    command: tuple[str, ...]
    entry_point: tuple[str, ...] = ()
    working_directory: str = ""
    environment: Mapping[str, str] = field(default_factory=dict)
    memory_mb: int = 128
    timeout_s: int = 3

    @classmethod
    def from_plan(cls, values: Mapping[str, Any]) -> Function:
        if values.get("package_type") != "Image":
            raise PlanError(f"function {values.get('function_name')}: only image functions")
        config = (values.get("image_config") or [{}])[0]
        env_blocks = values.get("environment") or []
        return cls(
            name=values["function_name"],
            command=tuple(config.get("command") or ()),
            entry_point=tuple(config.get("entry_point") or ()),
            working_directory=config.get("working_directory") or "",
            environment=dict(env_blocks[0].get("variables") or {}) if env_blocks else {},
            memory_mb=int(values.get("memory_size") or 128),
            timeout_s=int(values.get("timeout") or 3),
        )


def function_run_args(
    function: Function,
    *,
    image: str,
    name: str,
    loopback: Loopback,
    platform: Platform,
    runtime_api: str,
) -> list[str]:
    """``docker run`` arguments (after ``run``) that start ``function`` as Lambda starts a
    container image function (module docstring); ``runtime_api`` is ``host:port``."""
    reserved = {
        "AWS_LAMBDA_RUNTIME_API": runtime_api,
        "AWS_LAMBDA_FUNCTION_NAME": function.name,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(function.memory_mb),
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{function.name}",
        "AWS_LAMBDA_LOG_STREAM_NAME": "rehearsal",
        "LAMBDA_TASK_ROOT": "/var/task",
        "LAMBDA_RUNTIME_DIR": "/var/runtime",
        "TZ": ":UTC",
    }
    env = {k: substitute(v, loopback) for k, v in function.environment.items()}
    env.update(platform.environment())
    env["AWS_ENDPOINT_URL_S3"] = loopback.s3
    env.update(reserved)
    args = ["--detach", "--name", name, "--network", "host", "--user", LAMBDA_USER]
    args += ["--read-only", "--tmpfs", f"/tmp:rw,exec,size={LAMBDA_TMP_MB}m,mode=1777"]
    if function.working_directory:
        args += ["--workdir", function.working_directory]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    if function.entry_point:
        args += ["--entrypoint", function.entry_point[0]]
    args.append(image)
    return args + list(function.entry_point[1:]) + list(function.command)
