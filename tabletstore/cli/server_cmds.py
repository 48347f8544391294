"""The long-lived processes of a cluster: ``tabletstore master`` (§5.2) and ``tabletstore
worker`` (§5.2, §5.3)::

    tabletstore --url etcd://H:P/NS master [--store URL] [--port P] [--lease-ttl S] [--split-bytes N]
    tabletstore --url etcd://H:P/NS worker [--port P] [--lease-ttl S] [--split-bytes N]
        [--processes N|auto]
        (both: --metrics-port P serves the status page, /metrics and /status)

``worker --processes N`` runs N worker processes under a supervisor (``cli/supervisor.py``):
each is a worker of its own (identity, lease, log, port); process ``i`` serves on ``--port``
+ ``i`` and ``--metrics-port`` + ``i`` when those are not 0, and is named ``--worker-id``-``i``
when one is given (a restarted process adds ``-r<n>``: a new worker, never the dead one's
identity, whose tablets the master recovers from its log as after any crash).

Each checks etcd and the object store before it starts (a missing bucket ends it at once with
one line), logs INFO and up on stderr, and runs until SIGINT or SIGTERM. With the global
``--tls-*`` options it serves TLS; without them a non-loopback ``--host`` is refused unless
``--insecure``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import click

from tabletstore.cli.context import Failure, cli_context, run_loop
from tabletstore.cli.rpc_flags import protocol_versions, rpc_caps
from tabletstore.cli.supervisor import (
    GroupPlace,
    Supervisor,
    group_options,
    group_place,
    processes_option,
)
from tabletstore.clock import SteppedClock, SystemClock
from tabletstore.coordination import open_coordinator
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.metadata.catalog import ClusterSettings
from tabletstore.options import (
    SPLIT_BYTES,
    LeaseOptions,
    MasterOptions,
    RpcServerOptions,
    TabletOptions,
    WorkerOptions,
)
from tabletstore.rpc.versions import Versions
from tabletstore.security import TlsConfig, check_bind
from tabletstore.storage_s3 import open_store

log = logging.getLogger(__name__)

__all__ = ["master_cmd", "worker_cmd"]


def _cluster_url() -> str:
    obj = cli_context()
    if not obj.url.startswith("etcd://"):
        raise Failure(
            f"--url must be the cluster's etcd://host:port/namespace URL, not {obj.url!r}"
        )
    return obj.url


async def _follow_clock_steps(clock: SteppedClock, path: Path) -> None:
    """Keep ``clock``'s offset at the seconds ``path`` holds (none, or no file: 0), read every
    100 ms; each change is logged, so a process's log shows when its clock was stepped."""
    while True:
        try:
            text = (await asyncio.to_thread(path.read_text)).strip()
            offset = float(text) if text else 0.0
        except (OSError, ValueError):
            offset = 0.0  # absent, or caught half-written: no step
        if offset != clock.offset:
            log.warning(
                "wall clock stepped by %+.3f s (now %+.3f s off)", offset - clock.offset, offset
            )
            clock.offset = offset
        await asyncio.sleep(0.1)


def _serve(run: Callable[[Any, asyncio.Event], Awaitable[None]], *, store: str | None) -> None:
    """Run a long-lived process body until SIGINT/SIGTERM; one-line failure otherwise.

    The coordinator and the object store (``store``, else the cluster's) are checked first:
    a missing bucket, unusable credentials or an unreachable endpoint end the process at once
    with one line saying so, rather than in a loop of failed commit-log and SSTable writes.
    Its log (INFO and up, timestamped: what an operator reads after a failover) goes to
    standard error."""
    url = _cluster_url()
    # tabletstore's own INFO (loads, recoveries, splits); other libraries' warnings only.
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("tabletstore").setLevel(logging.INFO)

    async def main_async() -> None:
        coordinator = open_coordinator(url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await coordinator.check()
            await _check_store(coordinator, store)
            await run(coordinator, stop)
        finally:
            await coordinator.close()

    try:
        run_loop(main_async())
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc


async def _check_store(coordinator: Any, store: str | None) -> None:
    """``store`` (else the cluster's, NotFound when no master recorded one) answers: its
    endpoint is reachable, the credentials work and the bucket exists."""
    url = store if store is not None else (await ClusterSettings.load(coordinator)).store_url
    opened = open_store(url)
    try:
        # Every store open_store builds has check() (storage_s3.open_store); the ObjectStore
        # protocol does not declare it.
        check: Callable[[], Awaitable[None]] | None = getattr(opened, "check", None)
        if check is not None:
            await check()
    finally:
        await opened.close()


_lease_ttl_option = click.option(
    "--lease-ttl",
    type=click.FloatRange(min=1.0),
    default=LeaseOptions().ttl,
    show_default=True,
    help="Seconds of this process's etcd lease: how soon others take over after it dies.",
)
_rejoin_option = click.option(
    "--rejoin/--no-rejoin",
    default=True,
    show_default=True,
    help="After losing its lease (the coordinator unreachable for longer than the lease), stop "
    "and join again as a new process of its kind in this process; --no-rejoin: exit (status 1) "
    "for a supervisor to start a fresh one.",
)
_split_bytes_option = click.option(
    "--split-bytes",
    type=click.IntRange(min=1),
    default=SPLIT_BYTES,
    show_default=True,
    help="Split a tablet past this many bytes of SSTables; the master merges small neighbours "
    "by the same size (give the master and every worker the same value).",
)
_metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve the status page (GET /), /metrics (Prometheus) and /status (JSON) on this port "
    "(0: any free one; default: not served).",
)


_insecure_option = click.option(
    "--insecure",
    is_flag=True,
    help="Allow serving on a non-loopback --host without TLS (anyone reaching it may claim "
    "any identity).",
)
_status_token_option = click.option(
    "--status-token-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="A file holding a read-only bearer token for scrapers of the status endpoint (with TLS).",
)


def _process_tls(host: str, insecure: bool, what: str) -> TlsConfig | None:
    """The TLS files a master or worker serves with; refuses a non-loopback ``host`` without
    them (unless ``insecure``) before anything starts."""
    obj = cli_context()
    if obj.tls is not None and not obj.tls.has_identity:
        raise Failure(f"a {what} with TLS needs its own --tls-cert and --tls-key")
    try:
        # With TLS a master or worker always authenticates (certificates, or tokens).
        check_bind(host, authenticated=obj.tls is not None, insecure=insecure, what=what)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    return obj.tls


def _status_token(path: Path | None) -> str | None:
    if path is None:
        return None
    token = path.read_text().strip()
    if not token:
        raise Failure(f"--status-token-file {path} is empty")
    return token


def _metrics_ready(url: str) -> None:
    click.echo(f"metrics on {url}/metrics, status on {url}/status, page on {url}/", err=True)


@click.command("master")
@click.option("--store", default=None, help="The cluster's object store URL (recorded in etcd).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--port", type=int, default=0, show_default=True, help="Port (0: any free one).")
@_lease_ttl_option
@_rejoin_option
@_split_bytes_option
@_metrics_port_option
@click.option(
    "--sort-executor",
    default="workers",
    show_default=True,
    help="Where dead workers' logs are sorted for recovery (§6): workers, local, "
    "lambda:<function-name> or none (each new owner reads the whole log).",
)
@click.option(
    "--compaction-executor",
    default="workers",
    show_default=True,
    help="Where the periodic major compactions run (§5.4): workers (each tablet's own), "
    "local (this process) or lambda:<function-name> (functions/compaction.py).",
)
@click.option(
    "--sort-owner-bytes",
    type=click.IntRange(min=0),
    default=MasterOptions().sort_owner_bytes,
    show_default=True,
    help="Largest dead log (bytes to sort) whose tablets all go to one worker, which sorts it "
    "and keeps the runs (memory, then local disk) so the log is read once (§6); larger logs "
    "are sorted by every worker. 0: only logs of one sort task.",
)
@click.option(
    "--max-split-keys",
    type=click.IntRange(min=0),
    default=MasterOptions().max_split_keys,
    show_default=True,
    help="Split keys one create_table may give (0: no bound).",
)
@click.option(
    "--max-tables-per-principal",
    type=click.IntRange(min=0),
    default=MasterOptions().max_tables_per_principal,
    show_default=True,
    help="Tables one principal may administer, with auth on (0: no bound).",
)
@click.option(
    "--merge-after",
    type=click.FloatRange(min=0.0),
    default=MasterOptions().merge_after,
    show_default=True,
    help="Seconds two small adjacent tablets must stay small before the master merges them.",
)
@click.option(
    "--metadata-split-at",
    "metadata_split_at",
    multiple=True,
    metavar="TABLE_PREFIX",
    help="Pre-split METADATA where table names reach this prefix, when this master creates "
    "it (a new cluster; ignored, with a warning, once METADATA exists). Repeat for each "
    "split; give every master the same ones.",
)
@click.option(
    "--gc-grace",
    type=click.FloatRange(min=1.0),
    default=MasterOptions().gc_grace,
    show_default=True,
    help="Seconds an unreferenced object must have existed, and have been found unreferenced, "
    "before garbage collection deletes it (§5.4). Must stay well above any compaction's "
    "upload-to-commit time; shorter frees storage and trims live logs sooner.",
)
@rpc_caps
@protocol_versions
@_insecure_option
@_status_token_option
def master_cmd(
    store: str | None,
    host: str,
    port: int,
    lease_ttl: float,
    rejoin: bool,
    split_bytes: int,
    metrics_port: int | None,
    sort_executor: str,
    compaction_executor: str,
    sort_owner_bytes: int,
    max_split_keys: int,
    max_tables_per_principal: int,
    merge_after: float,
    metadata_split_at: tuple[str, ...],
    gc_grace: float,
    rpc: RpcServerOptions,
    versions: Versions,
    insecure: bool,
    status_token_file: Path | None,
) -> None:
    """Run a master (§5.2): campaign for the master lock, then keep every tablet assigned."""
    from tabletstore.master.master_process import run_master
    from tabletstore.metadata.rows import metadata_split_keys

    try:
        metadata_splits = metadata_split_keys(metadata_split_at)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), param_hint="--metadata-split-at") from exc

    options = MasterOptions(
        lease=LeaseOptions(ttl=lease_ttl),
        split_bytes=split_bytes,
        rpc=rpc,
        sort_owner_bytes=sort_owner_bytes,
        max_split_keys=max_split_keys,
        max_tables_per_principal=max_tables_per_principal,
        merge_after=merge_after,
        gc_grace=gc_grace,
    )
    tls = _process_tls(host, insecure, "master")
    status_token = _status_token(status_token_file)
    # The URL a compaction function connects to (only the lambda executor needs one).
    cluster_url = _cluster_url() if compaction_executor.startswith("lambda:") else None

    def ready(address: str) -> None:
        click.echo(f"master listening on {address} (RPC protocol {versions})", err=True)

    _serve(
        lambda coord, stop: run_master(
            coord,
            options,
            host=host,
            port=port,
            store_url=store,
            stop=stop,
            ready=ready,
            metrics_port=metrics_port,
            metrics_ready=_metrics_ready,
            sort_executor=sort_executor,
            compaction_executor=compaction_executor,
            cluster_url=cluster_url,
            tls=tls,
            insecure=insecure,
            status_token=status_token,
            versions=versions,
            rejoin=rejoin,
            metadata_splits=metadata_splits,
        ),
        store=store,
    )


@click.command("worker")
@click.option("--store", default=None, help="Object store URL (default: the cluster's).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--port", type=int, default=0, show_default=True, help="Port (0: any free one).")
@click.option("--worker-id", default=None, help="A stable id (default: a random one).")
@_lease_ttl_option
@_rejoin_option
@_split_bytes_option
@click.option(
    "--compaction-processes",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Processes for merging and major compactions (0: in the serving process).",
)
@click.option(
    "--compaction-nice",
    type=click.IntRange(min=0, max=19),
    default=WorkerOptions().compaction_nice,
    show_default=True,
    help="Steps of CPU priority (nice) the compaction processes run below the worker.",
)
@click.option(
    "--block-cache-bytes",
    type=click.IntRange(min=0),
    default=WorkerOptions().block_cache_bytes,
    show_default=True,
    help="Block cache capacity in bytes.",
)
@click.option(
    "--compaction-memory-bytes",
    type=click.IntRange(min=1),
    default=WorkerOptions().compaction_memory_bytes,
    show_default=True,
    help="SSTable bytes the merging and major compactions running at once may read "
    "(bounds their memory; a larger one runs alone).",
)
@click.option(
    "--sort-processes",
    type=click.IntRange(min=0),
    default=WorkerOptions().sort_processes,
    show_default=True,
    help="Processes sorting the dead logs this worker owns (§6; 0: in the serving process).",
)
@click.option(
    "--sort-memory-bytes",
    type=click.IntRange(min=0),
    default=WorkerOptions().sort_memory_bytes,
    show_default=True,
    help="Bytes of the runs it sorted kept in memory for its own replay.",
)
@click.option(
    "--sort-spill-bytes",
    type=click.IntRange(min=0),
    default=WorkerOptions().sort_spill_bytes,
    show_default=True,
    help="Bytes of such runs kept on local disk past that (0: none; the rest is read back "
    "from the store).",
)
@click.option(
    "--sort-spill-dir",
    type=click.Path(exists=True, file_okay=False, writable=True),
    default=None,
    help="Where the directory of those runs is made (default: the system's temporary one).",
)
@click.option(
    "--drain-deadline",
    type=click.FloatRange(min=0.0, min_open=True),
    default=WorkerOptions().drain_deadline,
    show_default=True,
    help="Seconds a stopping worker may spend flushing its tablets; past it, it logs the "
    "tablets it did not flush (their commit logs hold every acknowledged write: recovery "
    "replays them) and exits non-zero.",
)
@click.option(
    "--report-stalls",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Log where the event loop is held (its stack) once it is this many seconds late "
    "(default: no reports; the lag is on /metrics either way).",
)
@click.option(
    "--clock-step-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    hidden=True,
    help="Testing only: step this process's wall clock by the seconds this file holds, "
    "read again every 100 ms (the chaos harness's clock_jump fault).",
)
@_metrics_port_option
@processes_option("a worker of its own (identity, lease, port)")
@group_options
@rpc_caps
@protocol_versions
@_insecure_option
@_status_token_option
def worker_cmd(
    store: str | None,
    host: str,
    port: int,
    worker_id: str | None,
    lease_ttl: float,
    rejoin: bool,
    split_bytes: int,
    compaction_processes: int,
    compaction_nice: int,
    block_cache_bytes: int,
    compaction_memory_bytes: int,
    sort_processes: int,
    sort_memory_bytes: int,
    sort_spill_bytes: int,
    sort_spill_dir: str | None,
    drain_deadline: float,
    report_stalls: float | None,
    clock_step_file: Path | None,
    metrics_port: int | None,
    processes: int,
    group_slot: int | None,
    group_start: int,
    group_ready_fd: int | None,
    rpc: RpcServerOptions,
    versions: Versions,
    insecure: bool,
    status_token_file: Path | None,
) -> None:
    """Run a stateless tablet-server worker (§5.2, §5.3), or ``--processes`` of them."""
    from tabletstore.ops.process_warmup import warm_up_process
    from tabletstore.worker.tablet_server import TabletServer
    from tabletstore.worker.worker_process import run_worker

    options = WorkerOptions(
        lease=LeaseOptions(ttl=lease_ttl),
        compaction_processes=compaction_processes,
        compaction_nice=compaction_nice,
        block_cache_bytes=block_cache_bytes,
        compaction_memory_bytes=compaction_memory_bytes,
        sort_processes=sort_processes,
        sort_memory_bytes=sort_memory_bytes,
        sort_spill_bytes=sort_spill_bytes,
        sort_spill_dir=sort_spill_dir,
        drain_deadline=drain_deadline,
        report_stalls=report_stalls,
        rpc=rpc,
    )
    tablet_options = TabletOptions(split_bytes=split_bytes)
    tls = _process_tls(host, insecure, "worker")
    status_token = _status_token(status_token_file)

    if processes > 1:
        if port != 0 and port + processes - 1 > 65535:
            raise Failure(f"--port {port} leaves no room for {processes} processes' ports")
        group = Supervisor(
            processes,
            sys.argv[1:],
            name="worker",
            serving=lambda: click.echo(f"{processes} worker processes serving", err=True),
        )
        raise SystemExit(group.serve())
    place = group_place(group_slot, group_start, group_ready_fd)
    if place is not None:
        worker_id, port, metrics_port = _group_member(place, worker_id, port, metrics_port)

    served = False  # run_worker's rejoin: one process may run several workers

    def ready(server: TabletServer) -> None:
        nonlocal served
        click.echo(
            f"worker {server.worker_id} listening on {server.address} (RPC protocol {versions})",
            err=True,
        )
        if not served and place is not None:
            place.serving()  # once: it closes the pipe
        served = True

    clock = SteppedClock(SystemClock()) if clock_step_file is not None else None

    async def body(coord: Any, stop: asyncio.Event) -> None:
        follower = None
        if clock is not None and clock_step_file is not None:
            follower = asyncio.create_task(_follow_clock_steps(clock, clock_step_file))
        try:
            await run_worker(
                coord,
                worker_id=worker_id,
                host=host,
                port=port,
                store_url=store,
                options=options,
                tablet_options=tablet_options,
                stop=stop,
                ready=ready,
                # Freeze what start-up loaded and raise the collector's thresholds before the
                # first request (ops/process_warmup.py), and before the lease is taken (each
                # rejoined worker's too).
                warm_up=warm_up_process,
                metrics_port=metrics_port,
                metrics_ready=_metrics_ready,
                tls=tls,
                insecure=insecure,
                status_token=status_token,
                versions=versions,
                clock=clock,
                rejoin=rejoin,
            )
        finally:
            if follower is not None:
                follower.cancel()

    _serve(body, store=store)


def _group_member(
    place: GroupPlace, worker_id: str | None, port: int, metrics_port: int | None
) -> tuple[str | None, int, int | None]:
    """The identity and ports of worker process ``place.slot`` of a group: the ports shifted
    by the slot (0 stays 0: any free one), and a given id suffixed by it. A restarted slot is
    a new worker (``-r<n>``): the dead one's id belongs to its lease and log, which the
    master recovers from as after any crash."""
    if worker_id is not None:
        worker_id = f"{worker_id}-{place.slot}" + (f"-r{place.start}" if place.start else "")
    shifted_port = port + place.slot if port else 0
    shifted_metrics = metrics_port + place.slot if metrics_port else metrics_port
    return worker_id, shifted_port, shifted_metrics
