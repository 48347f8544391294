#!/usr/bin/env bash
# The one test command (README "Run the tests"; .ci/run calls exactly this).
# Installs what the tests need — Debian's etcd-server (etcd 3.4), a Java 17 runtime (Spark)
# and the Python test extras —
# then runs the linters, the type checker, the layering check and the whole test suite against
# real servers on loopback (etcd, moto's S3 server, tabletstore's own processes).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v etcd >/dev/null 2>&1; then
  echo "== installing Debian's etcd-server (etcd binary for the tests)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null
  # The package may start a system etcd on the default ports; the tests never use it.
fi

if ! command -v java >/dev/null 2>&1; then
  echo "== installing a Java 17 runtime (Spark local mode for the batch tests)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi

echo "== installing tabletstore with its test extras"
python -m pip install -q --disable-pip-version-check -e ".[test]"

echo "== ruff"
python -m ruff check tabletstore functions tests bench examples
echo "== mypy (strict on tabletstore/)"
python -m mypy
echo "== import-linter (layering)"
lint-imports --no-cache
echo "== pytest"
python -m pytest -q -p no:cacheprovider "$@"
