"""The etcd members' stand-ins (tests/cloud/etcd_members.py): the script's ids and addresses
replaced, and instance metadata as IMDSv2 answers it through curl's proxy setting."""

from __future__ import annotations

import os
import subprocess

from tests.cloud.etcd_members import Imds, localize

SCRIPT = """attached eni-0abc || aws ec2 attach-network-interface --network-interface-id eni-0abc
BY_ID=/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123
aws ec2 attach-volume --volume-id vol-0123 --device /dev/xvdf
--listen-client-urls https://10.40.0.10:2379,https://127.0.0.1:2379
--initial-cluster etcd-0=https://10.40.0.10:2380,etcd-1=https://10.40.16.10:2380
subjectAltName=IP:10.40.0.10,IP:%s,IP:127.0.0.1 10.40.0.100 127.0.0.10
"""


def test_localize_replaces_ids_addresses_and_the_own_loopback() -> None:
    out = localize(
        SCRIPT,
        ids={"vol-0123": "vol-9f", "eni-0abc": "eni-77"},
        addresses={"10.40.0.10": "127.0.1.1", "10.40.16.10": "127.0.1.2"},
        own="127.0.2.1",
    )
    assert "eni-77 ||" in out and "--network-interface-id eni-77" in out
    assert "Store_vol9f" in out and "--volume-id vol-9f" in out
    assert "https://127.0.1.1:2379,https://127.0.2.1:2379" in out
    assert "etcd-1=https://127.0.1.2:2380" in out
    # Only whole addresses: 10.40.0.100 and 127.0.0.10 are other hosts.
    assert "IP:127.0.1.1,IP:%s,IP:127.0.2.1 10.40.0.100 127.0.0.10" in out


def test_imds_answers_a_token_then_metadata_through_curls_proxy() -> None:
    imds = Imds({"instance-id": "i-0123", "local-ipv4": "127.0.0.1"})
    env = {**os.environ, "http_proxy": imds.proxy, "no_proxy": ""}

    def curl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["curl", "-sf", *args], capture_output=True, text=True, env=env)

    try:
        base = "http://169.254.169.254/latest"
        assert curl(f"{base}/meta-data/instance-id").returncode != 0  # no token: 401
        assert curl("-X", "PUT", f"{base}/api/token").returncode != 0  # no TTL header
        token = curl(
            "-X", "PUT", f"{base}/api/token", "-H", "X-aws-ec2-metadata-token-ttl-seconds: 300"
        ).stdout
        header = f"X-aws-ec2-metadata-token: {token}"
        assert curl("-H", header, f"{base}/meta-data/instance-id").stdout == "i-0123"
        assert curl("-H", header, f"{base}/meta-data/local-ipv4").stdout == "127.0.0.1"
        assert curl("-H", header, f"{base}/meta-data/placement").returncode != 0  # 404
    finally:
        imds.close()
