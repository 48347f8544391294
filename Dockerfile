# tabletstore's one container image: master, worker, bigtable-api, the Lambda functions, an etcd
# member and the etcd client proxy, chosen by the entrypoint's first argument
# (docker/entrypoint.sh). Build: docker build -t tabletstore .
FROM python:3.11-slim-bookworm

# etcd: the etcd members run from this image too (Debian's 3.4), with etcdctl for their snapshots.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server etcd-client \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tabletstore
COPY pyproject.toml README.md ./
COPY tabletstore ./tabletstore
COPY functions ./functions
# bigtable-api's gRPC extra, and the Lambda runtime interface client for the `function` role.
RUN pip install --no-cache-dir ".[bigtable-api]" "awslambdaric>=2.0"
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
