"""``python -m bench.recovery_timeline DIR``: where the seconds of each worker-kill recovery of a
chaos run went.

Reads a ``bench.chaos --dir DIR`` run: ``history.json`` (the kills, every client operation,
and ``t0_wall``, the wall-clock time of the history's zero) and the processes' logs (wall-clock
lines of the masters and workers). For each kill it prints, in seconds after the SIGKILL:

* ``revoked``: the failure detector revoked the dead worker's lease (§5.2);
* ``planned``: the master logged the sort plan of the dead log (§6), if it sorted it;
* ``sorted``: the last sort task of that log finished on a worker;
* per tablet the dead worker held: ``load sent`` and ``served`` (the master's "loaded ... in
  S s" line: the load was sent S seconds before it), the worker's replay seconds, and
  ``client``: the first acknowledged operation on that tablet that started after the kill (the
  checker's recovery figure is the slowest tablet's ``client``).

Tablet index ``i`` of the chaos table is tablet id ``t{i:05d}`` (the table is pre-split and
never splits during a run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_REVOKE = re.compile(r"worker (\S+) refuses connections")
_PLAN = re.compile(r"sorting commit log (\S+?)/(\d+):")
_SORTED = re.compile(r"sorted (\S+?)/(\d+)@\d+:")
_LOADED = re.compile(r"loaded (t\d{5}) on (\S+) in ([\d.]+) s")
_SERVING = re.compile(
    r"serving [^/]+/(t\d{5}): opened with (\d+) commit log\(s\) to replay in ([\d.]+) s"
)


@dataclass
class Line:
    at: float  # wall-clock seconds
    source: str
    text: str


@dataclass
class KillTimeline:
    at: float
    worker: str
    tablets: list[int]
    revoked: float | None = None
    planned: float | None = None
    sorted: float | None = None
    load_sent: dict[int, float] = field(default_factory=dict)
    served: dict[int, float] = field(default_factory=dict)
    replay: dict[int, float] = field(default_factory=dict)
    client: dict[int, float | None] = field(default_factory=dict)


def _lines(directory: Path) -> list[Line]:
    out = []
    for path in sorted(directory.glob("*.log")):
        if not path.name.startswith(("master", "worker")):
            continue
        for text in path.read_text(errors="replace").splitlines():
            m = _STAMP.match(text)
            if m is None:
                continue
            stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            at = stamp.replace(tzinfo=dt.UTC).timestamp()
            out.append(Line(at, path.stem, text[m.end() :]))
    out.sort(key=lambda line: line.at)
    return out


def _first(lines: list[Line], after: float, pattern: re.Pattern[str], worker: str) -> float | None:
    for line in lines:
        if line.at < after:
            continue
        m = pattern.search(line.text)
        if m is not None and m.group(1) == worker:
            return line.at
    return None


def timelines(directory: Path) -> list[KillTimeline]:
    history = json.loads((directory / "history.json").read_text())
    lines = _lines(directory)
    ops = [o for o in history["ops"] if o["outcome"] == "ok" and o["row"] is not None]
    kills = [
        f for f in history["faults"] if f["kind"] in ("kill_worker", "kill_sorter", "sort_twice")
    ]
    worker_ids = _worker_ids(directory)
    t0 = history.get("t0_wall")
    if t0 is None and kills:
        # A history saved before t0_wall existed: place the first kill 0.75 s (the middle
        # of the detector's 0.5 to 1 s) before the first revocation of its worker.
        first = worker_ids.get(kills[0]["target"], kills[0]["target"])
        revoked = _first(lines, 0.0, _REVOKE, first)
        if revoked is None:
            raise SystemExit("history.json has no t0_wall and no revocation to estimate it")
        t0 = revoked - 0.75 - kills[0]["start"]
    out = []
    for i, fault in enumerate(kills):
        at = t0 + fault["start"]
        until = t0 + kills[i + 1]["start"] if i + 1 < len(kills) else float("inf")
        worker = worker_ids.get(fault["target"], fault["target"])
        tl = KillTimeline(at, worker, list(fault["detail"].get("tablets", [])))
        tl.revoked = _first(lines, at, _REVOKE, worker)
        tl.planned = _first(lines, at, _PLAN, worker)
        sorted_at = [
            line.at
            for line in lines
            if at <= line.at < until and (m := _SORTED.search(line.text)) and m.group(1) == worker
        ]
        tl.sorted = max(sorted_at, default=None)
        for tablet in tl.tablets:
            tid = f"t{tablet:05d}"
            for line in lines:
                if line.at < at or line.at >= until:
                    continue
                m = _LOADED.search(line.text)
                if m and m.group(1) == tid and tablet not in tl.served:
                    tl.served[tablet] = line.at
                    tl.load_sent[tablet] = line.at - float(m.group(3))
                s = _SERVING.search(line.text)
                if s and s.group(1) == tid and int(s.group(2)) > 0 and tablet not in tl.replay:
                    tl.replay[tablet] = float(s.group(3))
            firsts = [
                o["end"]
                for o in ops
                if o["start"] >= fault["start"] and _tablet(o["row"]) == tablet
            ]
            tl.client[tablet] = t0 + min(firsts) if firsts else None
        out.append(tl)
    return out


def _worker_ids(directory: Path) -> dict[str, str]:
    """Process role (``worker-4``) -> worker id, from each worker log's first line."""
    out = {}
    for path in directory.glob("worker-*.log"):
        for text in path.read_text(errors="replace").splitlines()[:5]:
            m = re.match(r"worker (\S+) listening on", text)
            if m:
                out[path.stem] = m.group(1)
                break
    return out


def _tablet(row: str) -> int:
    from tabletstore.testing.chaos.workload import tablet_of

    return tablet_of(row.encode())


def _rel(t: float | None, at: float) -> str:
    return "-" if t is None else f"{t - at:5.1f}"


def render(tls: list[KillTimeline]) -> str:
    rows = [
        "| kill | worker | revoked | planned | sorted | tablet | load sent | served | replay s "
        "| client |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    slowest: list[float] = []
    phases: dict[str, list[float]] = {"revoked": [], "load sent": [], "served": [], "client": []}
    for n, tl in enumerate(tls, 1):
        worst = 0.0
        for tablet in sorted(tl.tablets):
            client = tl.client.get(tablet)
            rows.append(
                f"| {n} | {tl.worker} | {_rel(tl.revoked, tl.at)} | {_rel(tl.planned, tl.at)} "
                f"| {_rel(tl.sorted, tl.at)} | t{tablet} | {_rel(tl.load_sent.get(tablet), tl.at)} "
                f"| {_rel(tl.served.get(tablet), tl.at)} | {tl.replay.get(tablet, 0.0):.2f} "
                f"| {_rel(client, tl.at)} |"
            )
            if client is not None:
                worst = max(worst, client - tl.at)
        slowest.append(worst)
        if tl.revoked is not None:
            phases["revoked"].append(tl.revoked - tl.at)
        if tl.load_sent:
            phases["load sent"].append(max(tl.load_sent.values()) - tl.at)
        if tl.served:
            phases["served"].append(max(tl.served.values()) - tl.at)
        phases["client"].append(worst)
    rows.append("")
    rows.append(
        "medians over kills (slowest tablet of each): "
        + ", ".join(f"{k} {statistics.median(v):.1f} s" for k, v in phases.items() if v)
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery_timeline", description=__doc__)
    parser.add_argument("directory", type=Path, help="a bench.chaos --dir directory")
    args = parser.parse_args(argv)
    print(render(timelines(args.directory)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
