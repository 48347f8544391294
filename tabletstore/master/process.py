"""A master process (§5.2): campaign for mastership, then run assignment rounds, balancing and
garbage collection while leading; serve the master RPCs. Reads no flags: the CLI passes settings in."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.errors import (
    Fenced,
    TabletStoreError,
)
from tabletstore.master.gc import DEFAULT_INTERVAL, GarbageCollector
from tabletstore.master.gc_plan import DEFAULT_GRACE
from tabletstore.master.master import Master
from tabletstore.metadata.catalog import ClusterSettings
from tabletstore.ops.metrics import MasterMetrics
from tabletstore.ops.status_http import StatusServer, serve_master
from tabletstore.options import MasterOptions
from tabletstore.rpc.services import MASTER
from tabletstore.rpc.tcp import RpcServer, TcpTransport
from tabletstore.rpc.wire import register_all

__all__ = ["run_master"]

log = logging.getLogger(__name__)


async def run_master(
    coordinator: Coordinator,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    store_url: str | None = None,
    lease_ttl: float = 5.0,
    interval: float = 1.0,
    gc_interval: float = DEFAULT_INTERVAL,  # seconds between garbage collections (garbage.py)
    gc_grace: float = DEFAULT_GRACE,  # never delete a younger object (gc.py: rule 1)
    stop: asyncio.Event | None = None,
    ready: Callable[[str], None] | None = None,
    metrics_port: int | None = None,
    metrics_ready: Callable[[str], None] | None = None,
    options: MasterOptions | None = None,
) -> None:
    """The master process (§5.2): serve admin RPCs, campaign for the master lock, and while
    leading keep every tablet assigned, balance load and merge small neighbours (``options``:
    see :mod:`tabletstore.master.balancer`). Returns when ``stop`` is set; raises ``Fenced`` when
    the lease is lost (the process should exit: a standby takes over). With ``metrics_port``
    (0: a free one) it also serves ``/metrics`` and ``/status`` over HTTP
    (tabletstore.ops.status_http) and passes their base URL to ``metrics_ready``."""
    register_all()
    stop = stop or asyncio.Event()
    if store_url is not None:
        await ClusterSettings(store_url).save(coordinator)
    # Loads give their own bound, MasterOptions.load_timeout (a replay may take minutes).
    transport = TcpTransport(timeout=60.0)
    metrics = MasterMetrics()  # observability: counted always, served with metrics_port
    master = Master(
        coordinator=coordinator, transport=metrics.count_loads(transport), options=options
    )
    master.leading = False  # until elected: admin requests are answered NotServing
    metrics.watch_leading(lambda: master.leading)
    server = RpcServer(metrics.instrument(MASTER.handlers(master)), host=host, port=port)
    await server.start()
    metrics.process_id = server.address
    lease = await coordinator.grant_lease(lease_ttl)
    metrics.watch_lease(lambda: lease)
    election = coordinator.election(paths.MASTER_ELECTION)
    # Collects while leading; opens the store at its first run (errors are logged, not fatal).
    collector = GarbageCollector(
        None,
        master.catalog,
        coordinator,
        clock=master.clock,
        interval=gc_interval,
        grace=gc_grace,
        store_url=store_url,
        on_report=lambda r: metrics.gc_round(
            deleted_objects=r.deleted, deleted_bytes=r.deleted_bytes
        ),
    )
    http: StatusServer | None = None
    try:
        if metrics_port is not None:
            http = await serve_master(
                master, metrics, address=server.address, host=host, port=metrics_port
            )
            if metrics_ready is not None:
                metrics_ready(http.url)
        async with lease.keep_alive():
            if ready is not None:
                ready(server.address)
            campaign = asyncio.ensure_future(election.campaign(server.address.encode(), lease))
            stopped = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({campaign, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
            if not campaign.done():
                campaign.cancel()
                with contextlib.suppress(asyncio.CancelledError, TabletStoreError):
                    await campaign
                return
            campaign.result()
            master.leading = True
            log.info("master %s is leading", server.address)
            while not stop.is_set():
                if lease.expired:
                    raise Fenced("the master's lease expired; another master may lead now")
                try:
                    metrics.assignment_round(await master.assign())
                except TabletStoreError as exc:
                    metrics.assignment_failed(exc)
                    log.warning("assignment round failed: %s", exc)
                await collector.maybe_run()
                await master.balancer.run_round()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
    finally:
        master.leading = False
        with contextlib.suppress(TabletStoreError):
            await election.resign()
        if http is not None:
            await http.close()
        await server.close(grace=2.0)
        await master.close()
        await transport.close()
        await collector.close()
        with contextlib.suppress(TabletStoreError):
            await lease.revoke()
