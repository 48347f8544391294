"""The etcd members' boot script, run as EC2 runs it: the script the plan renders into each
launch template's user data (infra/terraform/modules/etcd/member.sh.tftpl), executed by bash as
root in an instance container, its etcd serving the rehearsal's cluster.

What the instance gets, and what stands in for the cloud (as small as the script's calls):

* **The instance** is a container of the instance image (scripts/cloud-rehearsal.sh builds it
  from the base image: curl, openssl, util-linux, e2fsprogs, the AWS CLI, the docker CLI),
  run as root with the capability the script's mount needs (CAP_SYS_ADMIN; not
  ``--privileged``, whose every capability a machine that is itself a container may not
  have), on the host network. ``dnf``, ``systemctl`` and
  ``docker`` are stand-ins (tests/cloud/instance/): the package is already there, systemd
  calls are logged and ``enable`` needs the unit file, and the docker CLI reaches the
  rehearsal's one Docker Engine (no registry: ``login`` checks its password, ``pull`` that
  the image is in the engine; container names are prefixed with the member's name).
* **EC2 and the other AWS APIs** (attach, describe, Secrets Manager, ECR's login password) are
  moto's server: each member's interface, volume and instance exist there, tagged as the
  plan tags them, and the script's ids are theirs (:func:`localize`).
* **Instance metadata** (IMDSv2 at 169.254.169.254) is :class:`Imds`, reached by curl as its
  HTTP proxy (``http_proxy``): a token first, then the instance id.
* **The data volume** is a loop device over a file, at ``/dev/xvdf`` and under its own name
  (where udev's ``/dev/disk/by-uuid`` would let ``mount UUID=`` find it): the script makes
  the file system, records it in fstab and mounts it. The instance's ``/var/lib`` is a directory
  of the host bind-mounted with shared propagation, so the mount reaches the Docker Engine,
  which starts the etcd container with it (the docker stand-in names the host path).
* **Addresses**: each member's fixed address becomes a loopback address of its own
  (127.0.1.N), and the instance's own loopback 127.0.0.1 another (127.0.2.N): three members
  share one host network here, each listening where the script says on its own addresses.
"""

from __future__ import annotations

import base64
import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["IMDS_HOST", "Imds", "Member", "localize", "planned_members"]

IMDS_HOST = "169.254.169.254"


@dataclass(frozen=True)
class Member:
    """One etcd member of the plan: its boot script and what the script names."""

    name: str
    script: str
    volume_id: str
    eni_id: str
    address: str
    tags: Mapping[str, str]


def planned_members(plan_resources: list[dict[str, Any]]) -> list[Member]:
    """The members of the plan (its resources, child modules included): each launch template's
    decoded user data, with its member's volume, interface and address."""
    by_key: dict[str, dict[str, dict[str, Any]]] = {}
    for resource in plan_resources:
        if resource["type"] in ("aws_launch_template", "aws_ebs_volume", "aws_network_interface"):
            by_key.setdefault(str(resource.get("index")), {})[resource["type"]] = resource["values"]
    members = []
    for key, found in sorted(by_key.items()):
        template = found.get("aws_launch_template")
        if template is None:
            continue
        if not isinstance(template.get("user_data"), str):
            raise ValueError(f"member {key}: its boot script is not known at plan")
        volume, eni = found.get("aws_ebs_volume"), found.get("aws_network_interface")
        if volume is None or eni is None or not volume.get("id") or not eni.get("id"):
            raise ValueError(f"member {key}: its volume and interface ids are not in the plan")
        members.append(
            Member(
                name=key,
                script=base64.b64decode(template["user_data"]).decode(),
                volume_id=volume["id"],
                eni_id=eni["id"],
                address=(eni.get("private_ips") or [""])[0],
                tags=dict(template["tag_specifications"][0]["tags"]),
            )
        )
    return members


def localize(script: str, *, ids: Mapping[str, str], addresses: Mapping[str, str], own: str) -> str:
    """``script`` with the plan's ids replaced by the stand-in's (also in their dash-less form,
    as the NVMe device name carries a volume id), each member's address by its loopback
    address, and the instance's own 127.0.0.1 by ``own``."""
    for planned, here in ids.items():
        script = script.replace(planned, here).replace(
            planned.replace("-", ""), here.replace("-", "")
        )
    for planned, here in addresses.items():
        script = re.sub(rf"(?<![\d.]){re.escape(planned)}(?![\d])", here, script)
    return re.sub(r"(?<![\d.])127\.0\.0\.1(?![\d])", own, script)


class Imds:
    """IMDSv2 for one instance, as an HTTP proxy for 169.254.169.254: ``PUT
    /latest/api/token`` (with a TTL header) answers a token; ``GET /latest/meta-data/<path>``
    needs it and answers ``metadata[path]``. Anything else is 404 (or 401 without the
    token), as IMDS answers."""

    def __init__(self, metadata: Mapping[str, str]) -> None:
        self.metadata = dict(metadata)
        self.tokens: set[str] = set()
        self.requests: list[str] = []
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _path(self) -> str | None:
                parts = urlsplit(self.path)
                host = parts.hostname or (self.headers.get("Host") or "").split(":")[0]
                return parts.path if host == IMDS_HOST else None

            def do_PUT(self) -> None:
                path = self._path()
                imds.requests.append(f"PUT {path}")
                if path != "/latest/api/token":
                    return self._answer(404)
                if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._answer(400)
                token = secrets.token_hex(16)
                imds.tokens.add(token)
                self._answer(200, token)

            def do_GET(self) -> None:
                path = self._path()
                imds.requests.append(f"GET {path}")
                if self.headers.get("X-aws-ec2-metadata-token") not in imds.tokens:
                    return self._answer(401)
                key = (path or "").removeprefix("/latest/meta-data/")
                if path is None or key not in imds.metadata:
                    return self._answer(404)
                self._answer(200, imds.metadata[key])

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.proxy = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
