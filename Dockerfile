# tabletstore's one container image: master, worker, bigtable-api, the Lambda functions, an etcd
# member and the etcd client proxy, chosen by the entrypoint's first argument
# (docker/entrypoint.sh). Build: docker build -t tabletstore .
# BASE_IMAGE: any Debian bookworm image with python and pip on PATH; the public one by default
# (scripts/cloud-rehearsal.sh builds one from Debian's packages where no registry is reachable).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# etcd: the etcd members run from this image too (Debian's 3.4), with etcdctl for their snapshots.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server etcd-client \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tabletstore
# The dependencies first, in a layer that changes only with pyproject.toml: bigtable-api's gRPC
# extra, the Lambda runtime interface client for the `function` role, and the build backend
# (the package itself is installed without build isolation below).
COPY pyproject.toml ./
COPY docker/requirements.py /tmp/requirements.py
RUN python /tmp/requirements.py bigtable-api < pyproject.toml > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt "awslambdaric>=2.0" "setuptools>=68" wheel \
 && rm /tmp/requirements.txt /tmp/requirements.py
COPY README.md ./
COPY tabletstore ./tabletstore
COPY functions ./functions
RUN pip install --no-cache-dir --no-deps --no-build-isolation .
COPY docker/entrypoint.sh /usr/local/bin/tabletstore-entrypoint

# Never root: the processes need no privilege (ports above 1024, state in S3 and etcd).
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/tabletstore tabletstore
USER 10001:10001
WORKDIR /var/lib/tabletstore

# master 7000, worker 7001, metrics/status 9100, bigtable-api 8086 (by convention: each
# process takes --port; compose.yaml and the cluster Terraform module use these).
EXPOSE 7000 7001 8086 9100
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/tabletstore-entrypoint", "health"]
ENTRYPOINT ["/usr/local/bin/tabletstore-entrypoint"]
CMD ["--help"]
