#!/usr/bin/env bash
# Make the cluster's RPC CA and one certificate per role, as the four JSON secrets the cluster
# and functions modules read (var.tls_secret_arns), each {"ca": PEM, "cert": PEM, "key": PEM}:
#   master.json    -> tls_secret_arns["master"]    the master tasks (OU=master)
#   worker.json    -> tls_secret_arns["worker"]    the worker tasks (OU=worker)
#   client.json    -> tls_secret_arns["client"]    the cli task (OU=client, CN=operator)
#   function.json  -> tls_secret_arns["function"]  the compaction and GC functions (OU=function)
# The CA's key stays in OUT_DIR/ca.key (keep it offline: it issues every identity).
# Usage: cluster-tls.sh OUT_DIR   (then: aws secretsmanager create-secret --name ... --secret-string file://OUT_DIR/master.json)
# TABLETSTORE: the tabletstore command (default: tabletstore; e.g. "python -m tabletstore.cli.main").
set -euo pipefail
out=${1:?usage: cluster-tls.sh OUT_DIR}
read -r -a tabletstore <<< "${TABLETSTORE:-tabletstore}"
mkdir -p "$out"
umask 077
[ -e "$out/ca.pem" ] || "${tabletstore[@]}" certs init "$out" >/dev/null
for pair in master:master worker:worker operator:client function:function; do
  name=${pair%%:*} role=${pair#*:}
  "${tabletstore[@]}" certs issue "$name" --dir "$out" --role "$role" --force >/dev/null
done
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
ca = (out / "ca.pem").read_text()
for secret, name in (("master", "master"), ("worker", "worker"), ("client", "operator"), ("function", "function")):
    value = {"ca": ca, "cert": (out / f"{name}.pem").read_text(), "key": (out / f"{name}.key").read_text()}
    (out / f"{secret}.json").write_text(json.dumps(value))
PY
echo "wrote $out/master.json, worker.json, client.json and function.json"
