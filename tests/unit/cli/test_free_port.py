"""localstack.free_port: ports for servers that bind late, out of the way of connections."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tabletstore.cli import localstack
from tabletstore.cli.localstack import LOWEST_PICKED_PORT, free_port, free_ports


def _ephemeral_low() -> int:
    return int(localstack.EPHEMERAL_RANGE.read_text().split()[0])


@pytest.mark.skipif(
    not localstack.EPHEMERAL_RANGE.exists(), reason="this kernel does not say its ephemeral range"
)
def test_a_free_port_is_below_the_range_outgoing_connections_take_theirs_from() -> None:
    """A server started on it seconds later (SeaweedFS's S3 gateway binds its gRPC port once
    its filer is up) cannot find it taken by some connection's local port."""
    low = _ephemeral_low()
    picks = [free_port() for _ in range(50)]
    assert all(LOWEST_PICKED_PORT <= port < low for port in picks), picks
    assert len(set(picks)) == len(picks), "no port given twice while a stack picks its ports"
    for port in picks[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free, as promised
    first = free_ports(3)
    assert LOWEST_PICKED_PORT <= first < low


def test_a_port_in_use_is_not_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "range").write_text("32768\t60999\n")
    monkeypatch.setattr(localstack, "EPHEMERAL_RANGE", tmp_path / "range")
    busy = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", busy))
        taken.listen()
        localstack._RECENT_PICKS.clear()
        # The first pick is the port in use, the second the one after it.
        answers = iter([busy - LOWEST_PICKED_PORT, busy + 1 - LOWEST_PICKED_PORT])
        monkeypatch.setattr(localstack.secrets, "randbelow", lambda _n: next(answers))
        assert free_port() == busy + 1


def test_without_a_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(localstack, "EPHEMERAL_RANGE", tmp_path / "missing")
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
