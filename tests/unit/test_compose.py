"""compose.yaml and the Dockerfile agree with the CLI, etcd and the entrypoint they run.

No Docker daemon is needed: the compose file is parsed, each tabletstore command is checked
against the click command it names (flags, values it would accept), each etcd flag against the
installed etcd's own ``--help``, ports against health checks; the Dockerfile is checked for a
non-root user, a health check and the entrypoint every role goes through (which
tests/integration/test_entrypoint.py runs for real).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from tabletstore.cli.main import main
from tabletstore.storage_s3.s3 import parse_s3_url

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = "/usr/local/bin/tabletstore-entrypoint"
TABLETSTORE_ROLES = ("master", "worker", "bigtable-api")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return compose["services"]  # type: ignore[no-any-return]


def _parse_with_click(command: list[str]) -> click.Context:
    """Parse ``role args...`` exactly as the CLI would (unknown flags, bad values fail)."""
    role, *args = command
    sub = main.commands[role]  # type: ignore[attr-defined]
    return sub.make_context(role, list(args), resilient_parsing=False)  # type: ignore[no-any-return]


def test_services_present(services: dict[str, dict[str, Any]]) -> None:
    assert {"minio", "bucket", "etcd", "master", "worker"} <= set(services)
    assert services["worker"]["deploy"]["replicas"] >= 1


def test_tabletstore_services_share_one_image_built_here(
    services: dict[str, dict[str, Any]],
) -> None:
    ours = [s for s in services.values() if s.get("build") == "."]
    assert {s["image"] for s in ours} == {"tabletstore:local"}
    assert len(ours) >= 4  # etcd, master, worker, cli
    for service in ours:
        # The cluster URL reaches every process the way the CLI reads it (--url's envvar).
        envvar = next(p.envvar for p in main.params if p.name == "url")
        assert service["environment"][envvar].startswith("etcd://etcd:2379/")


@pytest.mark.parametrize("name", ["master", "worker"])
def test_cluster_commands_are_valid_cli_invocations(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    service = services[name]
    ctx = _parse_with_click(service["command"])
    assert ctx.info_name == name
    assert ctx.params["port"] > 0, "a fixed port: the health check and peers need it"
    # The entrypoint supplies --host (the container's address); a fixed one would be wrong.
    assert ctx.params["host"] == "127.0.0.1" and "--host" not in service["command"]
    if name == "master":
        loc = parse_s3_url(ctx.params["store"])
        assert loc.bucket == "tabletstore" and loc.endpoint_url == "http://minio:9000"
        assert "mc mb --ignore-existing local/tabletstore" in services["bucket"]["command"][0]
        assert services[name]["depends_on"]["bucket"]["condition"] == (
            "service_completed_successfully"
        )
    published = {str(p).split(":")[-1] for p in service.get("ports", [])}
    if published:
        assert str(ctx.params["port"]) in published


@pytest.mark.parametrize("name", ["etcd", "master", "worker"])
def test_health_checks_go_through_the_entrypoint(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    test = services[name]["healthcheck"]["test"]
    assert test[:3] == ["CMD", ENTRYPOINT, "health"]
    if name == "etcd":
        client_url = next(a for a in services["etcd"]["command"] if a.startswith("--listen-client"))
        assert client_url.endswith(f":{test[3]}")


def test_etcd_flags_are_etcds_own(services: dict[str, dict[str, Any]]) -> None:
    etcd = shutil.which("etcd")
    assert etcd, "etcd is not installed (Debian's etcd-server; scripts/test.sh installs it)"
    known = set(
        re.findall(
            r"--[a-z0-9-]+", subprocess.run([etcd, "--help"], capture_output=True, text=True).stdout
        )
    )
    role, *flags = services["etcd"]["command"]
    assert role == "etcd"
    for flag in flags:
        assert flag.split("=", 1)[0] in known, flag


def test_minio_is_pinned_and_healthy(services: dict[str, dict[str, Any]]) -> None:
    for name in ("minio", "bucket"):
        image = services[name]["image"]
        assert re.search(r":RELEASE\.\d{4}-", image), f"{name} image not pinned: {image}"
    assert services["minio"]["healthcheck"]["test"][:2] == ["CMD", "mc"]
    master_env = services["master"]["environment"]
    minio_env = services["minio"]["environment"]
    assert master_env["AWS_ACCESS_KEY_ID"] == minio_env["MINIO_ROOT_USER"]
    assert master_env["AWS_SECRET_ACCESS_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]


def test_dockerfile_runs_unprivileged_with_a_health_check() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert f"COPY docker/entrypoint.sh {ENTRYPOINT}" in lines
    assert f'ENTRYPOINT ["{ENTRYPOINT}"]' in lines
    health = next(line for line in lines if line.startswith("HEALTHCHECK"))
    assert f'CMD ["{ENTRYPOINT}", "health"]' in health
    install = next(line for line in lines if line.startswith("RUN pip install"))
    assert "bigtable-api" in install and "awslambdaric" in install  # every role's needs
    assert any("etcd-server" in line for line in lines)
    # The handlers the functions Terraform module names are in the image's sources.
    assert "COPY functions ./functions" in lines


def test_entrypoint_roles_match_the_cli() -> None:
    text = (ROOT / "docker" / "entrypoint.sh").read_text()
    case = re.search(r"master \| worker \| bigtable-api\)", text)
    assert case, "the entrypoint no longer serves the three process roles"
    for role in TABLETSTORE_ROLES:
        command = main.commands[role]  # type: ignore[attr-defined]
        names = {opt for p in command.params for opt in getattr(p, "opts", [])}
        assert {"--host", "--port"} <= names, role  # what the entrypoint reads and fills in


def test_published_ports_are_on_loopback_and_images_are_pinned(
    services: dict[str, dict[str, Any]],
) -> None:
    """etcd takes no credentials and MinIO's are the file's own: nothing is published beyond
    this host. Third-party images name their registry and an exact release."""
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        image = service["image"]
        if service.get("build") != ".":
            assert image.startswith("quay.io/"), (name, image)
            assert re.search(r":RELEASE\.[0-9TZ-]+$|@sha256:[0-9a-f]{64}$", image), (name, image)
