"""The RPC certificate of a function that reaches the workers (compaction, gc).

The cluster's masters and workers serve mutual TLS; a function that calls them presents the
function role's certificate of the cluster CA. A Lambda function has only its image and
``/tmp``: :func:`rpc_tls` writes the certificate's three files from the Secrets Manager secret
``TABLETSTORE_TLS_SECRET`` names (JSON ``{"ca", "cert", "key"}``,
infra/terraform/scripts/cluster-tls.sh) where ``TABLETSTORE_TLS_CA``, ``_CERT`` and ``_KEY``
name them (the names the CLI reads), once per execution environment, and answers the
:class:`~tabletstore.security.TlsConfig` they make. Without the secret the files are read as
they are, and without the three variables the function connects without TLS.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from functions.etcd_tls import write_secret_files
from tabletstore.errors import InvalidArgument
from tabletstore.security import TlsConfig
from tabletstore.security.tls import ENV_CA, ENV_CERT, ENV_KEY

__all__ = ["ENV_TLS_SECRET", "rpc_tls"]

#: The environment variable naming the secret (the Terraform functions module sets it).
ENV_TLS_SECRET = "TABLETSTORE_TLS_SECRET"
#: The secret's field -> the variable naming its file.
_FILES = {"ca": ENV_CA, "cert": ENV_CERT, "key": ENV_KEY}


def rpc_tls(env: Mapping[str, str] | None = None, client: Any | None = None) -> TlsConfig | None:
    """The function's RPC TLS files (module docstring), written first if a secret names them
    and they do not all exist."""
    env = os.environ if env is None else env
    secret = env.get(ENV_TLS_SECRET)
    if secret:
        missing = sorted(v for v in _FILES.values() if not env.get(v))
        if missing:
            raise InvalidArgument(f"{ENV_TLS_SECRET} is set but {', '.join(missing)} is not")
        files = {field: Path(env[var]) for field, var in _FILES.items()}
        if not all(p.is_file() for p in files.values()):
            write_secret_files(secret, files, "RPC certificate", client)
    return TlsConfig.from_env(env)
