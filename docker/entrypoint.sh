#!/bin/sh
# The entrypoint of tabletstore's one container image (Dockerfile): the first argument is the
# role the container plays; the rest are that role's flags.
#
#   master|worker [FLAGS]   the cluster processes (§5.2); --host defaults to the container's own
#                           address (what the process advertises in etcd: 0.0.0.0 cannot be
#                           dialled); the cluster URL comes from TABLETSTORE_URL
#   bigtable-api [FLAGS]    the Cloud Bigtable front door, bound to 0.0.0.0 unless --host given
#   function HANDLER        a Lambda function (functions.log_sort.handler, ...), through the
#                           Lambda runtime interface client
#   etcd [FLAGS]            an etcd member (the image ships Debian's etcd-server)
#   etcd-proxy ENDPOINTS    `etcd grpc-proxy` on 127.0.0.1:2379 with the client certificate from
#                           ETCD_CLIENT_CERT / ETCD_CLIENT_KEY / ETCD_CA_CERT (PEM text), for
#                           processes whose etcd client speaks no TLS
#   health [PORT]           exit 0 if the process of this container accepts TCP connections
#                           on PORT (or on the address and port recorded at start in the
#                           health file, where it could be written), else 1
#   anything else           the tabletstore CLI (e.g. `ls`, `status`, `local-stack up`)
#
# Environment: TABLETSTORE_ADVERTISE_HOST (default: this host's address),
# TABLETSTORE_HEALTH_FILE (default /tmp/tabletstore-health), TABLETSTORE_PYTHON (default python).
set -eu

PYTHON=${TABLETSTORE_PYTHON:-python}
HEALTH_FILE=${TABLETSTORE_HEALTH_FILE:-/tmp/tabletstore-health}

own_address() {
  if [ -n "${TABLETSTORE_ADVERTISE_HOST:-}" ]; then
    echo "$TABLETSTORE_ADVERTISE_HOST"
  else
    "$PYTHON" -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'
  fi
}

# The value of flag $1 among the remaining arguments ("--port 7001" or "--port=7001"), or "".
flag_value() {
  name=$1; shift
  while [ $# -gt 0 ]; do
    case $1 in
      "$name") [ $# -gt 1 ] && { echo "$2"; return; } ;;
      "$name"=*) echo "${1#*=}"; return ;;
    esac
    shift
  done
  echo ""
}

serve() {
  role=$1; shift
  host=$(flag_value --host "$@")
  port=$(flag_value --port "$@")
  if [ -z "$host" ]; then
    if [ "$role" = bigtable-api ]; then host=0.0.0.0; else host=$(own_address); fi
    set -- --host "$host" "$@"
  fi
  if [ -n "$port" ] && [ "$port" != 0 ]; then
    [ "$host" = 0.0.0.0 ] && host=127.0.0.1
    # Best effort: a read-only root or a root-owned /tmp (Fargate's volumes) leaves no place
    # for it, and `health PORT` (what the task definitions run) does not need it.
    printf '%s %s\n' "$host" "$port" 2>/dev/null > "$HEALTH_FILE" \
      || echo "entrypoint: cannot write $HEALTH_FILE; health needs its PORT argument" >&2
  fi
  exec "$PYTHON" -m tabletstore.cli.main "$role" "$@"
}

health() {
  if [ $# -gt 0 ]; then
    targets="127.0.0.1:$1 $(own_address):$1"
  elif [ -f "$HEALTH_FILE" ]; then
    targets=$(awk '{print $1 ":" $2}' "$HEALTH_FILE")
  else
    echo "health: no port given and no $HEALTH_FILE (the process records it at start)" >&2
    exit 1
  fi
  exec "$PYTHON" - $targets <<'PY'
import socket, sys
for target in sys.argv[1:]:
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as exc:
        print(f"health: {target}: {exc}", file=sys.stderr)
        continue
    sys.exit(0)
sys.exit(1)
PY
}

etcd_proxy() {
  [ $# -ge 1 ] || { echo "etcd-proxy: give the members' https URLs, comma-separated" >&2; exit 2; }
  tls=$(mktemp -d)
  printf '%s\n' "${ETCD_CLIENT_CERT:?etcd-proxy needs ETCD_CLIENT_CERT}" > "$tls/client.pem"
  printf '%s\n' "${ETCD_CLIENT_KEY:?etcd-proxy needs ETCD_CLIENT_KEY}" > "$tls/client.key"
  printf '%s\n' "${ETCD_CA_CERT:?etcd-proxy needs ETCD_CA_CERT}" > "$tls/ca.pem"
  exec etcd grpc-proxy start --endpoints="$1" --listen-addr=127.0.0.1:2379 \
    --cert="$tls/client.pem" --key="$tls/client.key" --cacert="$tls/ca.pem"
}

[ $# -gt 0 ] || set -- --help
role=$1
case $role in
  master | worker | bigtable-api) shift; serve "$role" "$@" ;;
  function)
    shift
    [ $# -eq 1 ] || { echo "function: give one handler, e.g. functions.gc.handler" >&2; exit 2; }
    exec "$PYTHON" -m awslambdaric "$1" ;;
  etcd) shift; exec etcd "$@" ;;
  etcd-proxy) shift; etcd_proxy "$@" ;;
  health) shift; health "$@" ;;
  *) exec "$PYTHON" -m tabletstore.cli.main "$@" ;;
esac
