#!/usr/bin/env bash
# Make the etcd cluster's CA and the client certificate the tabletstore tasks' etcd proxies
# present, as the two JSON secrets the etcd and cluster modules read:
#   ca.json      {"cert": PEM, "key": PEM}            -> var.etcd_ca_secret_arn
#   client.json  {"cert": PEM, "key": PEM, "ca": PEM} -> var.etcd_client_secret_arn
# Usage: etcd-ca.sh OUT_DIR     (then: aws secretsmanager create-secret --name ... --secret-string file://OUT_DIR/ca.json)
set -euo pipefail
out=${1:?usage: etcd-ca.sh OUT_DIR}
mkdir -p "$out" && cd "$out"
umask 077
openssl req -x509 -newkey rsa:4096 -nodes -days 3650 -subj "/CN=tabletstore-etcd-ca" \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -new -newkey rsa:2048 -nodes -subj "/CN=tabletstore" -keyout client.key -out client.csr 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
  -extfile client.ext -out client.pem 2>/dev/null
python3 - <<'PY'
import json
read = lambda name: open(name).read()
json.dump({"cert": read("ca.pem"), "key": read("ca.key")}, open("ca.json", "w"))
json.dump({"cert": read("client.pem"), "key": read("client.key"), "ca": read("ca.pem")}, open("client.json", "w"))
PY
rm -f client.csr client.ext ca.srl
echo "wrote $out/ca.json and $out/client.json"
