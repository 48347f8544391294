"""A worker process (§5.2): the TabletServer behind an RPC server and a status endpoint, run until
told to stop or until its lease is lost; then, with ``rejoin``, again as a new worker in the same
process. Reads no flags: the CLI passes settings in."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

from tabletstore.clock import Clock
from tabletstore.coordination import paths
from tabletstore.coordination.base import (
    Coordinator,
)
from tabletstore.coordination.lease import end_lost_lease
from tabletstore.coordination.tokens import TokenStore
from tabletstore.errors import (
    Fenced,
    TabletStoreError,
    Unavailable,
)
from tabletstore.metadata.catalog import ClusterSettings
from tabletstore.ops.gc_pauses import GcPauses
from tabletstore.ops.loop_lag import LoopLag
from tabletstore.ops.metrics import WorkerMetrics
from tabletstore.ops.status_http import StatusServer, serve_worker
from tabletstore.ops.views import publish_page
from tabletstore.options import TabletOptions, WorkerOptions
from tabletstore.rpc.auth import ClientAuth, ServerAuth
from tabletstore.rpc.services import TABLET
from tabletstore.rpc.tcp import RpcServer, TcpTransport
from tabletstore.rpc.versions import SPOKEN, Versions
from tabletstore.rpc.wire import register_all
from tabletstore.security import TlsConfig, check_bind
from tabletstore.storage_s3 import check_store, open_store
from tabletstore.worker.sorter import Sorter
from tabletstore.worker.tablet_server import TabletServer
from tabletstore.worker.tablet_service_guard import TableSchemas, guard

__all__ = ["run_worker"]

log = logging.getLogger(__name__)


async def run_worker(
    coordinator: Coordinator,
    *,
    worker_id: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    store_url: str | None = None,
    options: WorkerOptions | None = None,
    tablet_options: TabletOptions | None = None,
    stop: asyncio.Event | None = None,
    ready: Callable[[TabletServer], None] | None = None,
    warm_up: Callable[[], None] | None = None,
    metrics_port: int | None = None,
    metrics_ready: Callable[[str], None] | None = None,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    status_token: str | None = None,
    versions: Versions = SPOKEN,
    clock: Clock | None = None,
    rejoin: bool = False,
) -> None:
    """A worker process (§5.2): serve the worker RPCs on ``host:port`` until ``stop`` is set
    (then minor-compact and release every tablet) or the lease is lost (then stop at once:
    another worker may already own the tablets). The stop takes at most
    ``WorkerOptions.drain_deadline`` seconds: past it (the object store or etcd unreachable),
    the worker logs the tablets it did not flush, whose commit logs hold every acknowledged
    write for recovery to replay, and raises Unavailable. A lost lease raises ``Fenced``, so that the
    process exits and a fresh one may start with a new lease and incarnation; with ``rejoin``
    the process does that itself, without paying for a new process's start-up: once the
    stopped worker serves nothing (its RPC listener closed, every tablet dropped unflushed,
    its commit log closed), it ends the lost lease at the coordinator (waiting for the
    coordinator to answer: after a lost quorum nothing can be done before), so its tablets'
    claims go at once rather than when the coordinator's clock ends the lease, and joins again
    as a new worker: a new id (``worker_id`` + ``-j<n>``, else a fresh one), lease, commit-log
    incarnation and caches, on the same port. Nothing of the old worker is kept but the
    process: its tablets come back through the master like any dead worker's, recovered from
    its log (§5.2). A worker whose lease is lost before it first served raises as before.
    ``ready`` is called once per worker that serves, under its lease (the first, then each
    rejoined one).

    With ``metrics_port`` (0: a free one) it also serves ``/metrics`` and ``/status`` over
    HTTP (tabletstore.ops.status_http) and passes their base URL to ``metrics_ready``.

    With ``tls`` (the cluster CA and this worker's certificate, role worker) every port speaks
    TLS and requests are authorized (``worker/tablet_service_guard.py``): clients prove who they
    are by certificate or token. Without it, a non-loopback ``host`` is refused unless
    ``insecure``. ``status_token``: a read-only bearer token for scrapers of the status
    endpoint. ``versions``: the RPC protocol versions it speaks, as a server and as a client
    (default this build's; capped only to rehearse an upgrade, ``rpc/versions.py``).
    ``clock``: the tablet server's (default the system's; the chaos harness steps one).

    ``warm_up``: the process's start-up work (the CLI's ``warm_up_process``: imports, a full
    garbage collection), run on this loop once the server listens and before the lease is
    taken, by the first worker and again by each rejoined one (whose collection then takes the
    old worker's garbage before the new lease rather than during it). It holds the loop for as
    long as it runs, a second of CPU that a loaded machine stretches past the lease's TTL: run
    once the lease is held, it would starve the lease's keep-alive, and the worker would lose
    its lease before it served anything."""
    stop = stop or asyncio.Event()
    wid = worker_id or _fresh_id()
    rejoined = 0
    served: list[TabletServer] = []

    def started(server: TabletServer) -> None:
        served.append(server)
        if ready is not None:
            ready(server)

    while True:
        served.clear()
        try:
            await _one_worker(
                coordinator,
                worker_id=wid,
                host=host,
                port=port,
                store_url=store_url,
                options=options,
                tablet_options=tablet_options,
                stop=stop,
                ready=started,
                warm_up=warm_up,
                metrics_port=metrics_port,
                metrics_ready=metrics_ready,
                tls=tls,
                insecure=insecure,
                status_token=status_token,
                versions=versions,
                clock=clock,
            )
            return
        except Fenced as exc:
            if not rejoin or not served or stop.is_set():
                raise
            log.warning("%s; rejoining as a new worker", exc)
        old = served.pop()
        assert old.lease is not None
        lost = old.lease.id
        # The same port again (the first one bound, when any free one was asked for): clients
        # and operators know the worker by its address.
        port = int(old.address.rpartition(":")[2])
        del old  # nothing of it is kept: the next warm-up collects it before the new lease
        if not await end_lost_lease(coordinator, lost, stop):
            return  # told to stop while the coordinator was unreachable
        rejoined += 1
        wid = f"{worker_id}-j{rejoined}" if worker_id is not None else _fresh_id()


def _fresh_id() -> str:
    return f"w-{uuid.uuid4().hex[:10]}"


async def _one_worker(
    coordinator: Coordinator,
    *,
    worker_id: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    store_url: str | None = None,
    options: WorkerOptions | None = None,
    tablet_options: TabletOptions | None = None,
    stop: asyncio.Event | None = None,
    ready: Callable[[TabletServer], None] | None = None,
    warm_up: Callable[[], None] | None = None,
    metrics_port: int | None = None,
    metrics_ready: Callable[[str], None] | None = None,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    status_token: str | None = None,
    versions: Versions = SPOKEN,
    clock: Clock | None = None,
) -> None:
    """One worker of the process (:func:`run_worker`); raises ``Fenced`` once it has stopped
    after losing its lease."""
    check_bind(host, authenticated=tls is not None, insecure=insecure, what="worker")
    register_all()
    stop = stop or asyncio.Event()
    url = store_url or (await ClusterSettings.load(coordinator)).store_url
    wid = worker_id or _fresh_id()
    metrics = WorkerMetrics(wid)  # observability: counted always, served with metrics_port
    store = open_store(url, registry=metrics.registry)
    try:
        # Fail fast with one error naming the URL (missing bucket, bad credentials, a server
        # that ignores create-only PUTs) instead of serving tablets on a store that cannot work.
        await check_store(store)
    except BaseException:
        await store.close()
        raise
    # To METADATA tablets on other workers, as this worker (its certificate).
    transport = TcpTransport(
        timeout=60.0, auth=ClientAuth(tls) if tls is not None else None, versions=versions
    )
    tablet_server = TabletServer(
        wid,
        "",
        store=store,
        coordinator=coordinator,
        transport=transport,
        options=options,
        tablet_options=tablet_options,
        clock=clock,
    )
    metrics.observe_server(tablet_server)
    handlers = metrics.instrument(
        guard(
            TABLET.handlers(tablet_server.services),
            where=f"worker {wid}",
            denied=metrics.denied,
            tables=TableSchemas.of(tablet_server.catalog),
        )
    )
    auth = ServerAuth(tls, TokenStore(coordinator)) if tls is not None else None
    server = RpcServer(
        handlers,
        host=host,
        port=port,
        options=(options or WorkerOptions()).rpc,
        auth=auth,
        versions=versions,
    )
    metrics.observe_rpc(server)
    await server.start()
    tablet_server.address = server.address
    # How late the loop runs what is due, and with report_stalls where it is held.
    stalls = (options or WorkerOptions()).report_stalls
    with GcPauses(metrics.observe_gc) as pauses:
        async with LoopLag(metrics.loop_lag.observe, stall_seconds=stalls, gc_pauses=pauses):
            fenced = False
            http: StatusServer | None = None
            try:
                if metrics_port is not None:
                    http = await serve_worker(
                        tablet_server,
                        metrics,
                        host=host,
                        port=metrics_port,
                        coordinator=coordinator,
                        tls=tls,
                        token=status_token,
                    )
                    if metrics_ready is not None:
                        metrics_ready(http.url)
                if warm_up is not None:
                    warm_up()  # before the lease (docstring)
                await tablet_server.start()
                if ready is not None:
                    ready(tablet_server)
                assert tablet_server.lease is not None
                lease = tablet_server.lease
                if http is not None:  # the master's page links here while this worker's lease lasts
                    await publish_page(coordinator, "worker", wid, http.url, lease)
                # This worker also takes sort tasks of dead workers' logs (§6; worker.sorter).
                sorter = Sorter(wid, store, coordinator, lease, shared=tablet_server.sorts)
                async with asyncio.TaskGroup() as waits:
                    # Sort tasks until told to stop or the lease is lost, whichever comes first; a task
                    # cut short is harmless: its claim goes with the lease or is re-run.
                    sorting = waits.create_task(sorter.run(stop))
                    either = [
                        waits.create_task(stop.wait()),
                        waits.create_task(lease.wait_expired()),
                    ]
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                    for task in [*either, sorting]:
                        task.cancel()
                fenced = lease.expired and not stop.is_set()
                if fenced:
                    # Said now, as it stops serving: the stop below may wait long for the commit log's
                    # PUTs in flight to settle on a slow store (an outcome is never abandoned).
                    log.warning(
                        "worker %s lost its lease; it serves nothing more and is stopping", wid
                    )
            finally:
                deadline = (options or WorkerOptions()).drain_deadline
                try:
                    async with asyncio.timeout(deadline):
                        if http is not None:
                            await http.close()
                        held = tablet_server.lease
                        if not fenced and held is not None and not held.expired:
                            # Stopping on purpose: the master's failure detector must not take our
                            # closed listener for a crash while we flush and hand over the tablets.
                            with contextlib.suppress(TabletStoreError):
                                await coordinator.put(paths.draining(wid), b"", lease=held)
                        await server.close(grace=2.0)
                        # A worker whose lease is gone must not touch its tablets' records any more.
                        await tablet_server.stop(flush=not fenced)
                        await transport.close()
                        await store.close()
                except TimeoutError:
                    abandoned = tablet_server.unflushed
                    log.error(
                        "worker %s did not drain within %g s (its object store or etcd unreachable?); "
                        "abandoning %d tablet(s) not flushed, whose commit logs hold every "
                        "acknowledged write for recovery to replay: %s",
                        wid,
                        deadline,
                        len(abandoned),
                        ", ".join("/".join(key) for key in abandoned) or "none",
                    )
                    for close in (transport.close, store.close):
                        with contextlib.suppress(Exception):  # its own timeout too
                            async with asyncio.timeout(1.0):
                                await close()
                    raise Unavailable(
                        f"worker {wid} did not drain within {deadline:g} s: {len(abandoned)} tablet(s) "
                        "left to recovery from the commit log"
                    ) from None
            if fenced:
                raise Fenced(f"worker {wid} lost its lease; its tablets are being reassigned")
