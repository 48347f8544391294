"""``python -m bench.changes``: change-stream throughput, end-to-end lag and reader cost.

On a local cluster (:class:`bench.cluster_target.ClusterTarget`, ``--workers`` worker
processes, the store a local directory or moto's S3 server) a table with a change retention,
pre-split over the workers as bench.paper's tables are, takes bench.paper's *random writes*
(:class:`bench.paper.Workloads`: R single-row puts of 1000-byte values, 32 in flight) while a
reader in another process follows every partition of its change stream
(``table.follow_changes``, the Python API). Measured, one row per phase:

* **follow**: the reader follows the stream while the writer writes. Its *lag* per change is
  the instant the reader received it minus the change's commit time (its log segment's stamp,
  taken just before the segment's PUT, before the write was acknowledged): what an application
  watching the table waits, p50 and p99 over every change. Changes/s is what it delivered over
  the writing time (the write rate: it delivers what was written).
* **catch-up**: a fresh reader, after the writes, reads the whole retained stream from the
  first write to the last (``start_time``/``end_time``): how fast a reader that fell behind,
  or a new replica, reads a backlog; no lag.

* **replicate**: the same writes once more, while a second local cluster (one worker, the
  same store kind, its own etcd namespace and store) follows the table through a replicator
  in another process (``client/replicator.py``, what ``tabletstore replicate`` runs). Its lag
  per change is the instant the replica acknowledged the change minus the change's commit
  time at the source: the *replication lag* an application reading the replica sees.

Each phase also reports what the reader fetched from the store: segments per change
delivered, bytes fetched per change, and the commit-log segments the cluster wrote while the
writes ran. One reading process fetches each new segment of every log once, whatever table it
holds (``client/change_stream.py``): also the segments of METADATA's own writes, and those
written between the last write and the moment the reader's watermark passes it (a reader
catching up reads to its cut, past its end time).

Phases are :data:`PHASES` entries, run in order.

``--quick`` is CI-size (bench.paper's quick scale); ``--json`` and ``--markdown`` write the
results; ``--docs PAGE`` puts the Markdown table in PAGE between the markers
:data:`BEGIN` and :data:`END` (docs/performance/index.md's "Change streams").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.synchronize
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

from bench import replace_between
from bench.cluster_target import ClusterTarget
from bench.latency import percentile
from bench.paper import QUICK_SCALE, BenchConfig, Workloads, machine, measure
from tabletstore.client.change_plan import Change, Heartbeat, PartitionEnd
from tabletstore.client.cluster import ClusterClient
from tabletstore.client.replicator import TableReplicator
from tabletstore.data.validation import REPLICATOR
from tabletstore.embedded import connect_async
from tabletstore.storage_s3 import layout

__all__ = ["BEGIN", "END", "PHASES", "ChangeResult", "main", "markdown", "run", "write_docs"]

TABLE = "changes"
#: The table's change retention (seconds): longer than any run.
RETENTION = 3600.0
#: The default size: 1/50 of the paper's R (20,000 writes).
DEFAULT_SCALE = 1 / 50
#: Seconds a reader process gets to start and to finish reading after the writes.
READER_DEADLINE = 300.0
#: The markers around the table in the docs page (``--docs``).
BEGIN, END = "<!-- bench.changes: begin -->", "<!-- bench.changes: end -->"


@dataclass
class ChangeResult:
    """One phase."""

    phase: str
    changes: int
    seconds: float
    #: Lag of each change (reception minus commit time), ms; None for a phase without lag.
    lag_p50_ms: float | None = None
    lag_p99_ms: float | None = None
    lag_max_ms: float | None = None
    segments_fetched: int = 0
    bytes_fetched: int = 0
    listings: int = 0
    #: Commit-log segments the cluster wrote during the phase's writes.
    segments_written: int = 0
    partitions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.changes / self.seconds if self.seconds > 0 else 0.0

    @property
    def segments_per_change(self) -> float | None:
        return self.segments_fetched / self.changes if self.changes else None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["changes_per_second"] = round(self.rate, 1)
        out["segments_per_change"] = self.segments_per_change
        out["bytes_fetched_per_change"] = (
            self.bytes_fetched / self.changes if self.changes else None
        )
        return out


# ------------------------------------------------------------------------------ the reader


@dataclass
class _Shared:
    """What the benchmark and a reader process share."""

    started: multiprocessing.synchronize.Event
    stop: multiprocessing.synchronize.Event
    #: Wall-clock instant after the last acknowledged write (0 until known).
    end: Synchronized  # type: ignore[type-arg]


def _reader_main(
    url: str, mode: str, since: float, until: float | None, poll: float, shared: _Shared, out: str
) -> None:
    """A reader process (``spawn``: a fresh interpreter, as an application's would be)."""
    result = asyncio.run(_read(url, mode, since, until, poll, shared))
    with open(out, "w") as f:
        json.dump(result, f)


async def _read(
    url: str, mode: str, since: float, until: float | None, poll: float, shared: _Shared
) -> dict[str, Any]:
    client = await connect_async(url)
    try:
        table = client.table(TABLE)
        initial = set(await table.change_partitions())
        watermarks: dict[object, float] = {}
        lags: list[float] = []
        count = ended = 0
        t0 = time.time()
        first = last = 0.0
        async for part, item in table.follow_changes(start_time=since, end_time=until, poll=poll):
            now = time.time()
            if isinstance(item, Change):
                lags.append(now - item.commit_time)
                count += 1
                first = first or now
                last = now
            elif isinstance(item, Heartbeat):
                watermarks[part] = item.watermark
                if not shared.started.is_set() and initial <= set(watermarks):
                    shared.started.set()
            elif isinstance(item, PartitionEnd):
                watermarks.pop(part, None)
                ended += 1
            if (
                mode == "follow"
                and shared.stop.is_set()
                and watermarks
                and all(w >= shared.end.value for w in watermarks.values())
            ):
                break
        cache = client.change_segments
        return {
            "changes": count,
            "lags": lags,
            "seconds": time.time() - t0,
            "first": first,
            "last": last,
            "fetched": cache.fetched,
            "fetched_bytes": cache.fetched_bytes,
            "listings": cache.listings,
            "partitions": len(initial) + ended,
        }
    finally:
        await client.close()


def _replicator_main(
    source_url: str, replica_url: str, since: float, poll: float, shared: _Shared, out: str
) -> None:
    """A replicator process (``spawn``), as ``tabletstore replicate`` runs one."""
    result = asyncio.run(_replicate(source_url, replica_url, since, poll, shared))
    with open(out, "w") as f:
        json.dump(result, f)


async def _replicate(
    source_url: str, replica_url: str, since: float, poll: float, shared: _Shared
) -> dict[str, Any]:
    """Follow the table into the replica cluster from ``since``; the lag of each change is
    the instant the replica acknowledged it minus its commit time at the source. Done once
    the writes ended and the replica's applied watermark passed their end."""
    src = await connect_async(source_url)
    lags: list[float] = []
    try:
        replica = await ClusterClient.open(replica_url, identity=REPLICATOR)
        try:
            follower = TableReplicator(
                src, source_url, replica, TABLE, start_time=since, poll=poll,
                applied=lambda c: lags.append(time.time() - c.commit_time),
            )  # fmt: skip
            await follower.prepare()
            task = asyncio.create_task(follower.run())
            t0 = time.time()
            try:
                while True:
                    if task.done():
                        task.result()  # the replicator's error, if it stopped
                        raise RuntimeError("the replicator stopped following")
                    progress = follower.progress
                    assert progress is not None
                    if set(progress.partitions) <= set(progress.watermarks):
                        shared.started.set()  # every partition has had a heartbeat
                    if shared.stop.is_set() and progress.applied_watermark() >= shared.end.value:
                        break
                    await asyncio.sleep(0.05)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            cache = src.change_segments
            return {
                "changes": len(lags),
                "lags": lags,
                "seconds": time.time() - t0,
                "fetched": cache.fetched,
                "fetched_bytes": cache.fetched_bytes,
                "listings": cache.listings,
                "partitions": len(progress.partitions),
            }
        finally:
            await replica.close()
    finally:
        await src.close()


async def _reader(
    url: str,
    mode: str,
    since: float,
    until: float | None,
    poll: float,
    directory: str,
    during: Callable[[_Shared], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Run a reader process; ``during`` (the writes) runs once it follows every partition."""
    args = (url, mode, since, until, poll)
    return await _process(f"{mode} reader", _reader_main, args, directory, during)


async def _process(
    name: str,
    main: Callable[..., None],
    args: tuple[Any, ...],
    directory: str,
    during: Callable[[_Shared], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Run ``main(*args, shared, out)`` in a process; ``during`` (the writes) runs once it
    set ``shared.started``; its result is the JSON it wrote to ``out``."""
    ctx = multiprocessing.get_context("spawn")
    shared = _Shared(ctx.Event(), ctx.Event(), ctx.Value("d", 0.0))
    out = os.path.join(directory, f"{name.replace(' ', '-')}.json")
    proc = ctx.Process(target=main, args=(*args, shared, out), daemon=True)
    proc.start()
    try:
        if during is not None:
            deadline = time.monotonic() + READER_DEADLINE
            while not shared.started.is_set():
                if not proc.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the {name} did not start following")
                await asyncio.sleep(0.1)
            await during(shared)
        await asyncio.to_thread(proc.join, READER_DEADLINE)
        if proc.exitcode != 0:
            raise RuntimeError(f"the {name} failed (exit status {proc.exitcode})")
        result: dict[str, Any] = json.loads(await asyncio.to_thread(Path(out).read_text))
        return result
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


# ------------------------------------------------------------------------------ phases


@dataclass
class _Run:
    """What the phases share: the cluster, the sizes, the writes' span."""

    target: ClusterTarget
    cfg: BenchConfig
    poll: float
    directory: str
    #: The object store kind (``file``, ``moto``): the replica cluster's too.
    store: str = "file"
    began: float = 0.0
    ended: float = 0.0
    write_rate: float = 0.0
    write_seconds: float = 0.0


async def _segments_written(run: _Run, since: float, until: float) -> int:
    """Commit-log segments (not fences) in the bucket stamped within ``[since, until]``."""
    n = 0
    async with run.target._db._database_store() as store:
        async for info in store.list(layout.LOGS):
            if info.size and since - 1 <= info.last_modified <= until + 1:
                n += 1
    return n


@dataclass
class _Writes:
    """One pass of bench.paper's random writes: its span and rate."""

    began: float = 0.0
    ended: float = 0.0
    rate: float = 0.0
    seconds: float = 0.0


def _writer(run: _Run, span: _Writes) -> Callable[[_Shared], Awaitable[None]]:
    """The writes, as a process's ``during``: they tell it when they ended."""

    async def write(shared: _Shared) -> None:
        w = Workloads(run.target, run.cfg)
        result = await measure("random writes", run.target, w.random_writes(TABLE), run.cfg)
        span.ended = time.time()
        span.rate, span.seconds = result.rate, result.seconds
        shared.end.value = span.ended
        shared.stop.set()

    return write


async def _lagged(
    run: _Run, phase: str, got: dict[str, Any], span: _Writes, **extra: Any
) -> ChangeResult:
    """A phase that followed ``span``'s writes as they were made: its lag per change."""
    lags = sorted(got["lags"])
    return ChangeResult(
        phase=phase,
        changes=got["changes"],
        seconds=max(1e-9, span.seconds),
        lag_p50_ms=1000 * percentile(lags, 0.50),
        lag_p99_ms=1000 * percentile(lags, 0.99),
        lag_max_ms=1000 * (lags[-1] if lags else 0.0),
        segments_fetched=got["fetched"],
        bytes_fetched=got["fetched_bytes"],
        listings=got["listings"],
        segments_written=await _segments_written(run, span.began, span.ended),
        partitions=got["partitions"],
        extra={"write_rate": span.rate, **extra},
    )


async def _follow(run: _Run) -> ChangeResult:
    """The writes, with a reader following the stream from their start."""
    span = _Writes(began=time.time())
    run.began = span.began
    got = await _reader(
        run.target.url, "follow", span.began, None, run.poll, run.directory,
        during=_writer(run, span),
    )  # fmt: skip
    run.ended, run.write_rate, run.write_seconds = span.ended, span.rate, span.seconds
    return await _lagged(run, "follow", got, span)


async def _replication(run: _Run) -> ChangeResult:
    """The same writes once more, with a replica cluster (one worker, the same store kind)
    following the table through a replicator process: its lag per change is the instant the
    replica acknowledged the change minus the change's commit time at the source."""
    replica = ClusterTarget(f"cluster:1:{run.store}", rows=run.cfg.rows, mem_rows=run.cfg.mem_rows)
    await replica.open()
    try:
        span = _Writes(began=time.time())
        args = (run.target.url, replica.url, span.began, run.poll)
        got = await _process(
            "replicator", _replicator_main, args, run.directory, during=_writer(run, span)
        )
    finally:
        await replica.close()
    result = await _lagged(run, "replicate", got, span)
    if result.changes < run.cfg.rows:
        raise RuntimeError(f"the replica applied {result.changes} changes of {run.cfg.rows} writes")
    return result


async def _catch_up(run: _Run) -> ChangeResult:
    """A fresh reader reads the retained stream of the writes, start to end."""
    got = await _reader(run.target.url, "catch-up", run.began, run.ended, run.poll, run.directory)
    return ChangeResult(
        phase="catch-up",
        changes=got["changes"],
        seconds=max(1e-9, got["last"] - got["first"]) if got["changes"] else got["seconds"],
        segments_fetched=got["fetched"],
        bytes_fetched=got["fetched_bytes"],
        listings=got["listings"],
        segments_written=await _segments_written(run, run.began, run.ended),
        partitions=got["partitions"],
        extra={"seconds_with_start": got["seconds"]},
    )


#: The phases, in order (the module docstring says how a replication phase joins them).
PHASES: tuple[tuple[str, Callable[[_Run], Awaitable[ChangeResult]]], ...] = (
    ("follow", _follow),
    ("catch-up", _catch_up),
    ("replicate", _replication),
)


async def run(
    cfg: BenchConfig,
    *,
    workers: int,
    store: str,
    poll: float,
    directory: str,
    log: Callable[[str], None] = print,
) -> list[ChangeResult]:
    """Start the cluster, create the table, run every phase, stop the cluster."""
    target = ClusterTarget(
        f"cluster:{workers}:{store}",
        rows=cfg.rows,
        mem_rows=cfg.mem_rows,
        block_cache_bytes=cfg.block_cache_bytes,
    )
    await target.open()
    try:
        await target.create(TABLE)
        await target._db.set_changes(TABLE, RETENTION)
        state = _Run(target, cfg, poll, directory, store)
        results = []
        for _, phase in PHASES:
            r = await phase(state)
            results.append(r)
            log(line(r))
        if results and results[0].changes != cfg.rows:
            raise RuntimeError(
                f"the follower read {results[0].changes} changes of {cfg.rows} writes"
            )
        return results
    finally:
        await target.close()


# ------------------------------------------------------------------------------ reports


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def line(r: ChangeResult) -> str:
    spc = r.segments_per_change
    return (
        f"  {r.phase:<9} {r.changes:>8,} changes {r.rate:>9,.0f}/s  lag p50 "
        f"{_ms(r.lag_p50_ms)} ms p99 {_ms(r.lag_p99_ms)} ms  segments fetched "
        f"{r.segments_fetched:,} ({'-' if spc is None else f'{spc:.3f}'}/change, "
        f"{r.bytes_fetched / max(1, r.changes):,.0f} B/change), written {r.segments_written:,}, "
        f"listings {r.listings:,}"
    )


def markdown(
    results: Sequence[ChangeResult], cfg: BenchConfig, host: dict[str, Any], workers: int
) -> str:
    out = [
        "| phase | changes | changes/s | lag p50 ms | lag p99 ms | lag max ms "
        "| segments fetched / change | bytes fetched / change | segments written "
        "| segments fetched |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        spc = r.segments_per_change
        out.append(
            f"| {r.phase} | {r.changes:,} | {r.rate:,.0f} | {_ms(r.lag_p50_ms)} "
            f"| {_ms(r.lag_p99_ms)} | {_ms(r.lag_max_ms)} "
            f"| {'-' if spc is None else f'{spc:.3f}'} "
            f"| {r.bytes_fetched / max(1, r.changes):,.0f} | {r.segments_written:,} "
            f"| {r.segments_fetched:,} |"
        )
    write_rate = next((r.extra.get("write_rate") for r in results if r.phase == "follow"), None)
    out.append("")
    out.append(
        f"bench.paper's random writes: {cfg.rows:,} puts of {cfg.value_size} bytes, "
        f"{cfg.concurrency} in flight"
        + (f", {write_rate:,.0f} writes/s" if write_rate else "")
        + f", on a local cluster of {workers} worker process{'es' if workers > 1 else ''} "
        f"(the table in {2 * workers} tablets); the reader is another process, and so is "
        f"the replicator, whose replica is a second local cluster of one worker. Machine: "
        f"{host['cpu']}, {host['cores']} cores, Python {host['python']}, load average at "
        f"the end {', '.join(f'{x:.1f}' for x in host['load_average'] or ())}."
    )
    return "\n".join(out) + "\n"


def write_docs(path: Path, text: str) -> None:
    """Replace what is between :data:`BEGIN` and :data:`END` in ``path`` with ``text``."""
    replace_between(path, BEGIN, END, text)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.changes", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"scale {QUICK_SCALE:g} (CI size)")
    p.add_argument(
        "--scale", type=float, help=f"writes vs the paper's R (default {DEFAULT_SCALE:g})"
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--store", choices=("file", "moto"), default="file", help="the object store")
    p.add_argument("--concurrency", type=int, help="writes in flight (default 32)")
    p.add_argument("--poll", type=float, default=0.5, help="the readers' poll interval, seconds")
    p.add_argument("--dir", help="work directory for the readers' results (default: temporary)")
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--markdown", help="write the results as a Markdown table here")
    p.add_argument(
        "--docs", type=Path, help="put the Markdown table in this page, between its markers"
    )
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.poll <= 0:
        p.error("--poll must be positive")
    scale = args.scale or (QUICK_SCALE if args.quick else DEFAULT_SCALE)
    try:
        cfg = BenchConfig.scaled(scale, concurrency=args.concurrency)
    except ValueError as exc:
        p.error(str(exc))
    import tempfile

    directory = args.dir or tempfile.mkdtemp(prefix="tabletstore-bench-changes-")
    os.makedirs(directory, exist_ok=True)
    print(f"bench.changes: {cfg.rows:,} random writes, cluster:{args.workers}:{args.store}")
    results = asyncio.run(
        run(cfg, workers=args.workers, store=args.store, poll=args.poll, directory=directory)
    )
    host = machine()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "config": asdict(cfg),
                    "workers": args.workers,
                    "store": args.store,
                    "poll": args.poll,
                    "machine": host,
                    "results": [r.as_dict() for r in results],
                },
                f,
                indent=1,
            )
    table = markdown(results, cfg, host, args.workers)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    if args.docs is not None:
        write_docs(args.docs, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
