#!/bin/bash
# Save a snapshot of one etcd member and upload it to the deployment's bucket. Each member's
# systemd timer runs it hourly (member.sh.tftpl installs it as /usr/local/sbin/etcd-snapshot);
# docs/operations/cloud-deployment.md "Backup and restore" restores from what it uploads.
#
#   etcd-snapshot.sh s3://BUCKET/etcd-snapshots/NAME/MEMBER/
#
# Environment:
#   ETCDCTL        the etcdctl command, endpoint and TLS flags included (default: etcdctl);
#                  on a member, `docker exec etcd etcdctl --endpoints=https://127.0.0.1:2379 ...`
#   SNAPSHOT_DIR   where etcdctl writes the snapshot (default: a new directory under /var/tmp)
#   SNAPSHOT_LOCAL the same directory as this script sees it (default: SNAPSHOT_DIR; on a
#                  member etcdctl runs in the etcd container, which sees the data volume as /data)
#   AWS            the aws CLI command (default: aws), with its usual credentials and region
#
# The snapshot is checked (etcdctl snapshot status reads it whole and verifies its hash) before
# it is uploaded as <stamp>-rev<revision>.db, so a listing sorts by time and names the revision.
set -euo pipefail
destination=${1:?usage: etcd-snapshot.sh s3://BUCKET/PREFIX/}
case $destination in
  s3://*/) ;;
  *) echo "etcd-snapshot: the destination must be an s3://BUCKET/PREFIX/ ending in /, not $destination" >&2; exit 2 ;;
esac
read -r -a etcdctl <<< "${ETCDCTL:-etcdctl}"
read -r -a aws <<< "${AWS:-aws}"
if [ -z "${SNAPSHOT_DIR:-}" ]; then
  SNAPSHOT_DIR=$(mktemp -d /var/tmp/etcd-snapshot.XXXXXX)
  SNAPSHOT_LOCAL=$SNAPSHOT_DIR
fi
local_dir=${SNAPSHOT_LOCAL:-$SNAPSHOT_DIR}
stamp=$(date -u +%Y%m%dT%H%M%SZ)
name="snapshot-$stamp.db"
trap 'rm -f "$local_dir/$name"' EXIT

ETCDCTL_API=3 "${etcdctl[@]}" snapshot save "$SNAPSHOT_DIR/$name" >&2
# etcdctl prints the snapshot's hash, revision, keys and size, after checking its integrity.
status=$(ETCDCTL_API=3 "${etcdctl[@]}" --write-out=json snapshot status "$SNAPSHOT_DIR/$name")
revision=$(printf '%s' "$status" | sed -n 's/.*"revision":\([0-9]*\).*/\1/p')
[ -n "$revision" ] || { echo "etcd-snapshot: cannot read the snapshot's status: $status" >&2; exit 1; }
key="$stamp-rev$revision.db"
"${aws[@]}" s3 cp --only-show-errors "$local_dir/$name" "$destination$key"
echo "etcd-snapshot: uploaded $destination$key (revision $revision)"
