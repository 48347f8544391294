"""A master process (§5.2): campaign for mastership, then run assignment rounds, balancing and
garbage collection while leading; serve the master RPCs. Reads no flags: the CLI passes settings in."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator, Lease
from tabletstore.coordination.election import Election
from tabletstore.coordination.lease import end_lost_lease
from tabletstore.coordination.tokens import TokenStore
from tabletstore.errors import (
    Fenced,
    InvalidArgument,
    TabletStoreError,
)
from tabletstore.master.compaction_cycle import CompactionExecutor
from tabletstore.master.failure_detector import FailureDetector
from tabletstore.master.gc import GarbageCollector
from tabletstore.master.log_recovery import (
    InProcessSortExecutor,
    LogRecovery,
    SortExecutor,
    WorkerSortExecutor,
)
from tabletstore.master.master import Master
from tabletstore.master.master_service_guard import guard
from tabletstore.metadata.catalog import ClusterSettings
from tabletstore.metadata.record import LogRef
from tabletstore.ops.metrics import MasterMetrics
from tabletstore.ops.status_http import StatusServer, serve_master
from tabletstore.ops.views import publish_page
from tabletstore.options import MasterOptions
from tabletstore.rpc.auth import ClientAuth, ServerAuth
from tabletstore.rpc.services import MASTER, TABLET
from tabletstore.rpc.tcp import RpcServer, TcpTransport
from tabletstore.rpc.transport import Transport
from tabletstore.rpc.versions import SPOKEN, Versions
from tabletstore.rpc.wire import register_all
from tabletstore.security import TlsConfig, check_bind
from tabletstore.storage_s3 import check_store, open_store
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["make_recovery", "make_sort_executor", "run_master"]

log = logging.getLogger(__name__)


async def _campaign(election: Election, value: bytes, lease: Lease, stop: asyncio.Event) -> bool:
    """Campaign for the master lock until elected (True) or until ``stop`` is set (False: the
    campaign is given up). A campaign's error is raised as itself."""
    failed: list[TabletStoreError] = []
    elected = False

    async def campaign() -> None:
        nonlocal elected
        try:
            await election.campaign(value, lease)
        except TabletStoreError as exc:
            failed.append(exc)  # raised below, outside the TaskGroup (not as a group)
        else:
            elected = True

    async with asyncio.TaskGroup() as tasks:
        either = [tasks.create_task(campaign()), tasks.create_task(stop.wait())]
        done, _ = await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        for task in either:
            task.cancel()
    if either[0] not in done:
        return False  # stopped first: whatever the cancelled campaign raised is moot
    if failed:
        raise failed[0]
    return elected


async def run_master(
    coordinator: Coordinator,
    options: MasterOptions | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    store_url: str | None = None,
    stop: asyncio.Event | None = None,
    ready: Callable[[str], None] | None = None,
    metrics_port: int | None = None,
    metrics_ready: Callable[[str], None] | None = None,
    sort_executor: str = "workers",
    compaction_executor: str = "workers",
    cluster_url: str | None = None,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    status_token: str | None = None,
    versions: Versions = SPOKEN,
    rejoin: bool = False,
    metadata_splits: Sequence[bytes] = (),
) -> None:
    """The master process (§5.2): serve admin RPCs, campaign for the master lock, and while
    leading keep every tablet assigned, balance load and merge small neighbours, collect
    garbage (``options``: its lease, rounds and thresholds; default :class:`MasterOptions`).
    Returns when ``stop`` is set; raises ``Fenced`` when
    the lease is lost (the process should exit: a standby takes over), or with ``rejoin``
    stops and starts again in the same process as a new standby, on the same port, without
    paying for a new process's start-up: once this master has stopped acting as one (its
    loops cancelled, its RPC server closed), it ends the lost lease at the coordinator
    (waiting for the coordinator to answer), so its election key goes at once, and campaigns
    under a new lease with nothing kept of the old master. A master whose lease is lost before
    it served raises as before; ``ready`` is called each time it serves. With ``metrics_port``
    (0: a free one) it also serves ``/metrics`` and ``/status`` over HTTP
    (tabletstore.ops.status_http) and passes their base URL to ``metrics_ready``.

    ``sort_executor`` says where dead workers' logs are sorted (§6, :mod:`master.log_recovery`):
    ``workers`` (the live workers), ``local`` (this process), ``lambda:<function>`` (AWS
    Lambda, ``functions/log_sort.py``) or ``none`` (each new owner reads the whole log).
    ``compaction_executor`` says where §5.4's major-compaction cycle rewrites tablets
    (:mod:`master.compaction_cycle`): ``workers`` (each tablet's serving worker), ``local``
    (this process) or ``lambda:<function>`` (AWS Lambda, ``functions/compaction.py``, which
    needs ``cluster_url``: the etcd URL the function connects to).

    With ``tls`` (the cluster CA and this master's certificate, role master) every port
    speaks TLS and table administration is for each table's admins
    (``master/master_service_guard.py``). Without it, a non-loopback ``host`` is refused unless
    ``insecure``. ``status_token``: a read-only bearer token for scrapers of the status
    endpoint. ``versions``: the RPC protocol versions it speaks, as a server and as a client
    (default this build's; capped only to rehearse an upgrade, ``rpc/versions.py``).
    ``metadata_splits``: METADATA row keys to pre-split METADATA at when this master creates
    it (a new cluster; :class:`~tabletstore.master.master.Master`)."""
    stop = stop or asyncio.Event()
    leases: list[Lease] = []
    addresses: list[str] = []

    def started(address: str) -> None:
        addresses.append(address)
        if ready is not None:
            ready(address)

    while True:
        leases.clear()
        addresses.clear()
        try:
            await _one_master(
                coordinator,
                options,
                host=host,
                port=port,
                store_url=store_url,
                stop=stop,
                ready=started,
                metrics_port=metrics_port,
                metrics_ready=metrics_ready,
                sort_executor=sort_executor,
                compaction_executor=compaction_executor,
                cluster_url=cluster_url,
                tls=tls,
                insecure=insecure,
                status_token=status_token,
                versions=versions,
                leases=leases,
                metadata_splits=metadata_splits,
            )
            return
        except Fenced as exc:
            if not rejoin or not leases or not addresses or stop.is_set():
                raise
            log.warning("%s; rejoining as a standby", exc)
        if not await end_lost_lease(coordinator, leases[-1].id, stop):
            return  # told to stop while the coordinator was unreachable
        port = int(addresses[-1].rpartition(":")[2])


async def _one_master(
    coordinator: Coordinator,
    options: MasterOptions | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    store_url: str | None = None,
    stop: asyncio.Event | None = None,
    ready: Callable[[str], None] | None = None,
    metrics_port: int | None = None,
    metrics_ready: Callable[[str], None] | None = None,
    sort_executor: str = "workers",
    compaction_executor: str = "workers",
    cluster_url: str | None = None,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    status_token: str | None = None,
    versions: Versions = SPOKEN,
    leases: list[Lease],
    metadata_splits: Sequence[bytes] = (),
) -> None:
    """One master of the process (:func:`run_master`); its lease goes into ``leases`` once
    granted. Raises ``Fenced`` once it has stopped after losing its lease."""
    check_bind(host, authenticated=tls is not None, insecure=insecure, what="master")
    register_all()
    options = options or MasterOptions()
    stop = stop or asyncio.Event()
    if store_url is not None:
        await _check_store(store_url)
        await ClusterSettings(store_url).save(coordinator)
    # Loads give their own bound, MasterOptions.load_timeout (a replay may take minutes).
    transport = TcpTransport(
        timeout=60.0, auth=ClientAuth(tls) if tls is not None else None, versions=versions
    )
    metrics = MasterMetrics()  # observability: counted always, served with metrics_port
    store: ObjectStore | None = None
    recovery: LogRecovery | None = None
    try:
        url = store_url or (await ClusterSettings.load(coordinator)).store_url
    except TabletStoreError as exc:
        # No store recorded yet: new owners read dead logs whole (correct, slower).
        log.warning("no object store known, dead logs will not be sorted: %s", exc)
    else:
        store = open_store(url)
        recovery = make_recovery(sort_executor, store, url, coordinator, options)
    master = Master(
        coordinator=coordinator,
        transport=metrics.count_loads(transport),
        options=options,
        recovery=recovery,
        metadata_splits=metadata_splits,
    )
    try:
        master.compaction_cycle.executor = make_compaction_executor(
            compaction_executor, master, store, transport, cluster_url
        )
    except InvalidArgument:
        if store is not None:
            await store.close()
        raise
    master.leading = False  # until elected: admin requests are answered NotServing
    metrics.watch_leading(lambda: master.leading)
    handlers = metrics.instrument(guard(master, MASTER.handlers(master), denied=metrics.denied))
    auth = ServerAuth(tls, TokenStore(coordinator)) if tls is not None else None
    server = RpcServer(
        handlers, host=host, port=port, options=options.rpc, auth=auth, versions=versions
    )
    metrics.observe_rpc(server)
    await server.start()
    metrics.process_id = server.address
    lease = await coordinator.grant_lease(options.lease.ttl, safety_margin=options.lease.margin)
    leases.append(lease)
    metrics.watch_lease(lambda: lease)
    election = coordinator.election(paths.MASTER_ELECTION)
    # Collects while leading; opens the store at its first run (errors are logged, not fatal).
    collector = GarbageCollector(
        None,
        master.catalog,
        coordinator,
        clock=master.clock,
        interval=options.gc_interval,
        grace=options.gc_grace,
        store_url=store_url,
        on_report=lambda r: metrics.gc_round(
            deleted_objects=r.deleted, deleted_bytes=r.deleted_bytes, listed_objects=r.listed
        ),
    )
    http: StatusServer | None = None
    try:
        if metrics_port is not None:
            http = await serve_master(
                master,
                metrics,
                address=server.address,
                host=host,
                port=metrics_port,
                coordinator=coordinator,
                tls=tls,
                token=status_token,
            )
            # Linked from the other masters' and the workers' pages while the lease lasts.
            await publish_page(coordinator, "master", server.address, http.url, lease)
            if metrics_ready is not None:
                metrics_ready(http.url)
        async with lease.keep_alive():
            if ready is not None:
                ready(server.address)
            if not await _campaign(election, server.address.encode(), lease, stop):
                return
            master.leading = True
            log.info("master %s is leading", server.address)
            detector = None
            if options.probe_interval is not None:
                detector = FailureDetector(
                    coordinator, interval=options.probe_interval, refusals=options.probe_refusals
                )
            await _lead(master, collector, metrics, lease, stop, options.interval, detector)
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
        if store is not None:
            await store.close()
        with contextlib.suppress(TabletStoreError):
            await lease.revoke()


async def _lead(
    master: Master,
    collector: GarbageCollector,
    metrics: MasterMetrics,
    lease: Lease,
    stop: asyncio.Event,
    interval: float,
    detector: FailureDetector | None = None,
) -> None:
    """The leading master's four loops (assignment, garbage collection, balancing,
    checkpoints of the tables with history; and the ``detector``'s probes of the workers), each
    at its own pace, so that neither a garbage collection nor a balancing move (each may wait
    out a METADATA deadline while a worker is dead) ever delays the assignment rounds that
    recover that worker's tablets (§5.2). Returns
    when ``stop`` is set; raises Fenced when the lease is lost."""

    async def assignment() -> None:
        try:
            metrics.assignment_round(await master.assign(if_changed=True))
        except TabletStoreError as exc:
            metrics.assignment_failed(exc)
            log.warning("assignment round failed: %s", exc)
        master.compaction_cycle.run_round()  # §5.4's cycle: starts background work only

    async def balancing() -> None:
        await master.balancer.run_round()

    async def every(step: Callable[[], Awaitable[None]], wake: asyncio.Event | None = None) -> None:
        while True:
            await step()
            if wake is None:
                await asyncio.sleep(interval)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await wake.wait()
            wake.clear()

    async def collecting() -> None:
        await collector.maybe_run()

    async def checkpointing() -> None:
        try:
            await master.checkpointer.run_round()
        except TabletStoreError as exc:  # the catalog unreachable: next round
            log.warning("checkpoint round failed: %s", exc)

    # A worker found dead by the failure detector (§5.2) is recovered by the next round at
    # once, not an interval later.
    woken = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        loops = [
            tasks.create_task(every(assignment, woken)),
            tasks.create_task(every(collecting)),
            tasks.create_task(every(balancing)),
            tasks.create_task(every(checkpointing)),
        ]
        if detector is not None:

            def revoked(worker: str) -> None:
                master.worker_gone(worker)
                woken.set()

            detector.on_revoked = revoked
            loops.append(tasks.create_task(detector.run()))
        ends = [tasks.create_task(stop.wait()), tasks.create_task(lease.wait_expired())]
        await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        for task in [*loops, *ends]:
            task.cancel()
    if lease.expired and not stop.is_set():
        raise Fenced("the master's lease expired; another master may lead now")


async def _check_store(url: str) -> None:
    """Refuse a store the cluster cannot use before recording it for every worker: a missing
    bucket, bad credentials or a server that ignores create-only PUTs, one error naming it."""
    store = open_store(url)
    try:
        await check_store(store)
    finally:
        await store.close()


def make_sort_executor(
    kind: str, store: ObjectStore, store_url: str, coordinator: Coordinator
) -> SortExecutor:
    """The sort executor ``kind`` names: ``workers`` (the live workers' sorters), ``local``
    (a pool of this process's children) or ``lambda:<function>``; a recovery's and a
    point-in-time restore's (``master/pitr_restore.py``)."""
    if kind == "workers":
        return WorkerSortExecutor(store, coordinator)
    if kind == "local":
        # Processes, not the event loop: a sort is CPU work, and the loop keeps leases alive.
        return InProcessSortExecutor(store, processes=2, store_url=store_url)
    if kind.startswith("lambda:") and len(kind) > len("lambda:"):
        from tabletstore.master.sort_lambda import LambdaSortExecutor

        return LambdaSortExecutor(kind[len("lambda:") :], store, store_url)
    raise InvalidArgument(
        f"sort executor {kind!r} is not one of workers, local, lambda:<function>, none"
    )


def make_recovery(
    kind: str,
    store: ObjectStore,
    store_url: str,
    coordinator: Coordinator,
    options: MasterOptions,
) -> LogRecovery | None:
    """The master's log sorting with the executor ``kind`` names (see :func:`run_master`)."""
    if kind == "none":
        return None
    executor = make_sort_executor(kind, store, store_url, coordinator)
    recovery = LogRecovery(
        store,
        executor,
        coordinator,
        task_bytes=options.sort_task_bytes,
        attempts=options.sort_attempts,
        owner_bytes=options.sort_owner_bytes,
    )
    if isinstance(executor, WorkerSortExecutor):
        # A log sorted in one task, or of at most sort_owner_bytes, is sorted by the worker its
        # tablets go to (owner affinity).
        executor.owner_of = lambda worker_id, incarnation: recovery.owner(
            LogRef(worker_id, incarnation)
        )
    return recovery


def make_compaction_executor(
    kind: str,
    master: Master,
    store: ObjectStore | None,
    transport: Transport,
    cluster_url: str | None,
) -> CompactionExecutor:
    """Where the master's major-compaction cycle runs (see :func:`run_master`)."""
    if kind == "workers":
        return master.compaction_cycle.executor
    if kind == "local":
        if store is None:
            raise InvalidArgument("the local compaction executor needs the cluster's store")
        from tabletstore.master.remote_compaction import RemoteCompactionExecutor

        return RemoteCompactionExecutor(
            master.catalog,
            store,
            lambda address: TABLET.client(transport, address),
            clock=master.clock,
        )
    if kind.startswith("lambda:") and len(kind) > len("lambda:"):
        if cluster_url is None:
            raise InvalidArgument("the Lambda compaction executor needs the cluster's URL")
        from tabletstore.master.compaction_lambda import LambdaCompactionExecutor

        return LambdaCompactionExecutor(kind[len("lambda:") :], cluster_url)
    raise InvalidArgument(
        f"compaction executor {kind!r} is not one of workers, local, lambda:<function>"
    )
