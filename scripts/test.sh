#!/usr/bin/env bash
# The one test command (README "Two commands"; .ci/run calls exactly this).
# Installs what the tests need — Debian's etcd-server (etcd 3.4), Debian's chromium (the status
# page's browser test drives it with Playwright), a Java 17 runtime (Spark) and the Python
# test extras (the docs extra among them) — then runs the linters, the type checker, the
# layering check, the documentation build and the whole test suite against real servers on
# loopback (etcd, moto's S3 server, tabletstore's own processes); on a full run (no
# arguments) then the cloud rehearsal (scripts/cloud-rehearsal.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=()
command -v etcd >/dev/null 2>&1 || PACKAGES+=(etcd-server)
# etcdctl: the etcd members' snapshot script (infra/terraform) is tested against a local etcd.
command -v etcdctl >/dev/null 2>&1 || PACKAGES+=(etcd-client)
[ -x /usr/bin/chromium ] || PACKAGES+=(chromium)
command -v java >/dev/null 2>&1 || PACKAGES+=(openjdk-17-jre-headless)
if [ "${#PACKAGES[@]}" -gt 0 ]; then
  echo "== installing Debian's ${PACKAGES[*]} (etcd; chromium for the page test; Java for Spark)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${PACKAGES[@]}" >/dev/null
  # The etcd package may start a system etcd on the default ports; the tests never use it.
fi

# Project-local tools from their registries (nothing global, nothing from other hosts):
# s3rver (npm), the second S3 implementation the object-store conformance suite runs against;
# checkov (PyPI) in its own virtualenv, because it pins boto3/botocore versions that would
# clash with aioboto3's in the test environment.
if [ ! -x .tools/npm/node_modules/.bin/s3rver ]; then
  echo "== installing s3rver (npm) into .tools/npm"
  npm install --silent --no-audit --no-fund --prefix .tools/npm s3rver@3.7.1 >/dev/null
fi
if [ ! -x .tools/checkov/bin/checkov ]; then
  echo "== installing checkov (PyPI) into .tools/checkov"
  python -m venv .tools/checkov
  .tools/checkov/bin/pip install -q --disable-pip-version-check "checkov==3.2.533"
fi
# The aws CLI (PyPI) in its own virtualenv (it pins botocore too): the etcd members' snapshot
# script uploads with it, and tests/unit/test_etcd_snapshot.py runs that script against moto.
if [ ! -x .tools/awscli/bin/aws ]; then
  echo "== installing the aws CLI (PyPI) into .tools/awscli"
  python -m venv .tools/awscli
  .tools/awscli/bin/pip install -q --disable-pip-version-check "awscli==1.45.11"
fi
# Terraform itself is part of the machine image (/usr/local/bin/terraform, 1.11) with the
# hashicorp/aws provider in a local plugin directory; tests/unit/test_terraform.py finds both.
command -v terraform >/dev/null || { echo "terraform is not on PATH" >&2; exit 1; }

echo "== installing tabletstore with its test extras"
python -m pip install -q --disable-pip-version-check -e ".[test]"

echo "== ruff"
python -m ruff check tabletstore functions tests bench examples
python -m ruff format --check tabletstore functions tests bench examples
echo "== mypy (strict on tabletstore/)"
python -m mypy
echo "== import-linter (layering)"
lint-imports --no-cache
echo "== mkdocs build --strict"
# The documentation site (mkdocs.yml, docs/) into the git-ignored site/: a broken link, a missing
# page or an API reference that no longer resolves fails the build.
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --site-dir site
# On a full run, the cloud rehearsal's images are built beside the test suite (downloads and
# package unpacking, at the lowest CPU priority), and the rehearsal runs once the suite is done.
PREPARE_PID=""
if [ "$#" -eq 0 ]; then
  # The rehearsal's cache (scripts/cloud-rehearsal.sh's default), named for the suite too: its
  # Terraform plan is made there by tests/cloud/test_rehearsal_plan.py beside the other tests,
  # so the rehearsal after the suite finds it instead of planning once everything else is done.
  export CLOUD_REHEARSAL_CACHE=${CLOUD_REHEARSAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tabletstore-cloud-rehearsal}
  PREPARE_LOG=$(mktemp)
  echo "== cloud rehearsal: images built in the background (log: $PREPARE_LOG)"
  nice -n 19 bash scripts/cloud-rehearsal.sh --prepare >"$PREPARE_LOG" 2>&1 &
  PREPARE_PID=$!
  trap '[ -z "$PREPARE_PID" ] || kill "$PREPARE_PID" 2>/dev/null || true' EXIT
fi
echo "== pytest"
# The suite starts hundreds of tabletstore processes (CLI verbs, masters, workers). With
# PYTHONDONTWRITEBYTECODE set (this machine image sets it) none of them finds a .pyc for the
# package, so each one compiles every module it imports again: about 0.4 s of CPU of its 1.3 s
# start. Let them write bytecode (into the git-ignored __pycache__/ directories).
unset PYTHONDONTWRITEBYTECODE
# Three workers (pytest-xdist) on CI's 2 cores: most tests wait on real processes and servers on
# loopback, not on the CPU; fixtures are per worker (free ports, per-pid buckets, tmp_path).
# --dist loadgroup hands out one test at a time (or one group: the tests sharing a module-scoped
# fixture, tests/conftest.py) to whichever worker is idle, in collection order, and the tests
# marked slow are collected first: the minutes-long tests start at once on different workers
# and the short ones fill in around them. (--dist load would hand each worker a quarter of its
# share as one consecutive chunk at the start: every slow test to the first worker.)
# --durations=40 names the slowest tests in every log.
# TABLETSTORE_TEST_WORKERS overrides the count (0: one process, as before).
python -m pytest -q -p no:cacheprovider -n "${TABLETSTORE_TEST_WORKERS:-3}" --dist loadgroup \
  --durations=40 "$@"

# The cloud deployment rehearsed on this machine (Docker, the image, the Terraform plan's tasks
# and functions, SeaweedFS, etcd): part of the full run only, not of a run of chosen tests.
if [ "$#" -eq 0 ]; then
  if ! wait "$PREPARE_PID"; then
    PREPARE_PID=""
    tail -30 "$PREPARE_LOG" >&2
    echo "cloud rehearsal: preparing the images failed" >&2
    exit 1
  fi
  PREPARE_PID=""
  tail -1 "$PREPARE_LOG"
  echo "== cloud rehearsal (scripts/cloud-rehearsal.sh)"
  bash scripts/cloud-rehearsal.sh
fi
