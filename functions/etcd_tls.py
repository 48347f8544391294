"""The etcd client certificate of a function that opens the cluster's etcd (compaction, gc).

A cluster whose etcd requires client certificates is named by a URL whose ``?ca=&cert=&key=``
are files (``tabletstore.coordination.etcd``). The ECS tasks write them at start; a Lambda
function has only its image and ``/tmp``, so :func:`ensure_etcd_tls` writes them there from the
Secrets Manager secret ``TABLETSTORE_ETCD_CLIENT_SECRET`` names (JSON ``{"cert", "key",
"ca"}``, infra/terraform/scripts/etcd-ca.sh), once per execution environment: files that exist
are kept. Without the variable nothing is written, and opening the URL reports the missing
files.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ENV_SECRET", "ensure_etcd_tls", "write_secret_files"]

#: The environment variable naming the secret (the Terraform functions module sets it).
ENV_SECRET = "TABLETSTORE_ETCD_CLIENT_SECRET"
#: The etcd URL's parameter -> the secret's field.
_FIELDS = {"ca": "ca", "cert": "cert", "key": "key"}


def _paths(cluster_url: str) -> dict[str, Path]:
    _, sep, query = cluster_url.partition("?")
    if not sep:
        return {}
    params = urllib.parse.parse_qs(query)
    return {name: Path(params[name][-1]) for name in _FIELDS if name in params}


def ensure_etcd_tls(
    cluster_url: str, *, env: Mapping[str, str] | None = None, client: Any | None = None
) -> bool:
    """Write the certificate files ``cluster_url`` names from the secret, unless they all
    exist or no secret is configured; True if it wrote them."""
    paths = _paths(cluster_url)
    env = os.environ if env is None else env
    secret = env.get(ENV_SECRET)
    if not paths or not secret or all(p.is_file() for p in paths.values()):
        return False
    write_secret_files(secret, {_FIELDS[n]: p for n, p in paths.items()}, "etcd client", client)
    return True


def write_secret_files(
    secret: str, files: Mapping[str, Path], what: str, client: Any | None = None
) -> None:
    """Write each field of the JSON secret ``secret`` to its file in ``files`` (field ->
    path), readable by this process's user alone; a field missing is an error naming it."""
    if client is None:
        import boto3

        client = boto3.client("secretsmanager")
    value = json.loads(client.get_secret_value(SecretId=secret)["SecretString"])
    missing = sorted(f for f in files if not value.get(f))
    if missing:
        raise ValueError(f"the {what} secret {secret} has no {', '.join(missing)}")
    for field, path in files.items():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(value[field].rstrip("\n") + "\n")
        os.replace(partial, path)
