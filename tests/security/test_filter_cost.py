"""A read request whose filter would stall a worker's event loop past its lease.

A real master and worker (``python -m tabletstore.cli.main``, lease 5 s) on loopback, the
session's etcd and moto. The attack, sent by an ordinary client through the cluster client:
one ``read_rows`` whose filter interleaves 500 distinct regexes of about 550 bytes, each 19
branches of ``[x-z]{999}`` (RE2 programs of tens of thousands of instructions). The
worker compiled them all on its event loop before reading, with no bound on their number or
total: the loop stalled past the lease and the worker exited. Now the filter is refused with
InvalidArgument naming ``MAX_FILTER_REGEXES`` before any pattern is compiled; a filter within
the count but over the compiled-program budget is refused naming ``MAX_FILTER_PROGRAM``; one
doubling cells twenty times over (``Chain`` of ``Interleave``) naming ``MAX_FILTER_COPIES``.
Meanwhile another client's point reads keep answering and the worker keeps its lease and
stays up.

The hostile filters are built without their constructors' checks (``_unchecked``), as a
client that does not run this library's validation would send them. Bounded: three attack
requests, each under a call deadline; the watcher's reads are bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.cluster import ClusterClient
from tabletstore.data import filters as f
from tabletstore.data.model import SetCell
from tabletstore.errors import InvalidArgument
from tabletstore.pid_liveness import alive
from tests.security.request_support import (
    create_when_ready,
    processes,
    rss_mib,
    start_cluster,
)

__all__ = ["processes"]  # the fixture, used by name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LEASE = 5.0
ATTACK_DEADLINE = 60.0


def _unchecked(cls: type, **values: Any) -> Any:
    """A filter object holding ``values`` without running its checks (what a hostile client
    can put on the wire; the worker's decoder builds it again, with the checks)."""
    obj = object.__new__(cls)
    for field in fields(cls):
        if field.name in values:
            object.__setattr__(obj, field.name, values[field.name])
    return obj


def heavy_pattern(seed: int) -> bytes:
    """About 550 bytes compiling to a program of about 19,000 RE2 instructions (which the
    worker's per-pattern memory budget still accepts)."""
    branches = b"|".join(
        b"seed%04d_branch%02d[%c-z]{999}" % (seed, i, 97 + i % 25) for i in range(19)
    )
    return b"(" + branches + b")"


def regex_flood(n: int) -> f.RowFilter:
    leaves = [_unchecked(f.ValueRegex, pattern=heavy_pattern(i)) for i in range(n)]
    return _unchecked(f.Interleave, filters=tuple(leaves))


def copy_bomb(levels: int) -> f.RowFilter:
    pair = _unchecked(f.Interleave, filters=(f.PassAll(), f.PassAll()))
    return _unchecked(f.Chain, filters=(pair,) * levels)


async def _watch(client: ClusterClient, table: str, stop: asyncio.Event) -> list[float]:
    """Latencies of another client's point reads while the attack runs (at most 2,000)."""
    latencies: list[float] = []
    t = client.table(table)
    while not stop.is_set() and len(latencies) < 2000:
        start = time.monotonic()
        with contextlib.suppress(Exception):  # a dead worker shows as missing answers
            await asyncio.wait_for(t.read_row(b"row"), 10)
        latencies.append(time.monotonic() - start)
        await asyncio.sleep(0.02)
    return latencies


async def test_a_costly_filter_is_refused_and_the_worker_keeps_serving(
    etcd_url: str, s3_url: str, tmp_path: Path, processes: list[ProcessRecord]
) -> None:
    _, worker = await start_cluster(tmp_path, etcd_url, s3_url, processes, lease=LEASE)

    async with (
        await ClusterClient.open(etcd_url) as attacker,
        await ClusterClient.open(etcd_url) as other,
    ):
        table = await create_when_ready(attacker, "t")
        await table.mutate_row(b"row", [SetCell("cf", b"q", b"v" * 100)])
        idle = await _watch(other, "t", _stopped_after(50))
        rss_before = rss_mib(worker.pid)

        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch(other, "t", stop))
        refusals: list[str] = []
        try:
            for hostile in (
                regex_flood(500),
                regex_flood(64),  # within MAX_FILTER_REGEXES
                copy_bomb(20),
            ):
                with pytest.raises(InvalidArgument) as info:
                    async with asyncio.timeout(ATTACK_DEADLINE):
                        _ = [row async for row in table.read_rows(filter=hostile)]
                refusals.append(str(info.value))
        finally:
            stop.set()
            during = await watcher

        print(  # the figures, for a run with -s
            f"other client's read: {max(idle) * 1000:.0f} ms at worst idle, "
            f"{max(during) * 1000:.0f} ms at worst during the attack; worker RSS "
            f"{rss_before:.0f} MiB before, {rss_mib(worker.pid):.0f} MiB after"
        )
        assert "MAX_FILTER_REGEXES=64" in refusals[0], refusals[0]
        assert "MAX_FILTER_PROGRAM=100000" in refusals[1], refusals[1]
        assert "MAX_FILTER_COPIES=64" in refusals[2], refusals[2]
        assert alive(worker.pid), "the worker exited"
        # The worker never lost its lease: the other client's reads kept answering.
        assert max(during) < LEASE, (max(during), max(idle))
        row = await other.table("t").read_row(b"row")
        assert row is not None and row.cells[0].value == b"v" * 100


def _stopped_after(n: int) -> asyncio.Event:
    """An event that is never set: ``_watch`` then stops after ``n`` reads."""
    return _CountingEvent(n)


class _CountingEvent(asyncio.Event):
    def __init__(self, n: int) -> None:
        super().__init__()
        self._left = n

    def is_set(self) -> bool:
        self._left -= 1
        return self._left < 0
