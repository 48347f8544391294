"""The embedded database is durable across SIGKILL — "data written, process killed
with SIGKILL, reopened: every acknowledged write is there".

A child process (durability_child.py) writes to ``file://DIR`` through the synchronous API with
tiny memtables (so minor and merging compactions run constantly), printing an acknowledgement
after each call returns: single rows, ``mutate_rows`` batches, row deletes, counter increments,
check-and-mutate steps and explicit flush + compaction. The parent SIGKILLs it at a random
point — after a random number of acknowledgements, or while an explicit compaction runs, each
followed by a random few milliseconds so the kill lands inside the next call — then reopens the
directory (a recovery) and checks:

* every acknowledged row is there with both its cells (cf:a and n:b, written in one row
  mutation), and every row that is there is whole and has the right value (unacknowledged
  ones may or may not have applied, but never partly or wrongly);
* every acknowledged delete holds;
* the counter equals the acknowledged increments, or one more (the increment in flight);
* the check-and-mutate value equals the last acknowledged step, or one more.

Rounds share the directory, so later rounds also recover from earlier crashes' recoveries.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import tabletstore
from tabletstore import SetCell
from tests.integration.durability_child import value_for

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 4
#: Memtables this small freeze every few dozen writes: kills land in minor compactions too.
FLUSH_BYTES = 8 * 1024
START_DEADLINE = 60.0
ACK_DEADLINE = 60.0

pytestmark = pytest.mark.timeout(300)


@dataclass
class History:
    """What the children acknowledged, over every round."""

    rows: set[bytes] = field(default_factory=set)
    deleted: set[bytes] = field(default_factory=set)
    #: Rows whose delete was sent but not acknowledged when the child died: it may have
    #: happened (the delete can be durable in the log before the child hears back).
    maybe_deleted: set[bytes] = field(default_factory=set)
    counter_low: int = 0  # acknowledged increments (at least this many applied)
    counter_in_flight: int = 0  # 1 if the killed child may have been incrementing
    cas_low: int = 0

    def record(self, line: str) -> None:
        word, _, arg = line.partition(" ")
        if word == "row":
            self.rows.add(arg.encode())
        elif word == "deleting":
            self.maybe_deleted.add(arg.encode())
        elif word == "del":
            self.rows.discard(arg.encode())
            self.maybe_deleted.discard(arg.encode())
            self.deleted.add(arg.encode())
        elif word == "inc":
            self.counter_low += 1
        elif word == "cas":
            self.cas_low = int(arg)


class Child:
    """The writer process; its stdout lines arrive on a queue (a thread reads the pipe)."""

    def __init__(self, directory: Path, round_no: int, seed: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.durability_child",
                *(str(directory), str(round_no), str(seed), str(FLUSH_BYTES)),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.endswith("\n"):  # a line cut by the kill was never acknowledged
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, deadline: float) -> str:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"child wrote nothing in time; stderr: {self.stderr()}") from None
        if line is None:
            raise AssertionError(f"child exited ({self.proc.poll()}): {self.stderr()}")
        return line

    def kill(self) -> list[str]:
        """SIGKILL; the lines it had printed before dying (acknowledged too)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        rest = []
        while (line := self.lines.get_nowait()) is not None:
            rest.append(line)
        return rest

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-3000:]


def _run_round(directory: Path, round_no: int, rng: random.Random, history: History) -> str:
    """One child: run it to a random kill point, kill it, record its acknowledgements."""
    child = Child(directory, round_no, rng.randrange(2**32))
    try:
        assert child.next_line(time.monotonic() + START_DEADLINE) == "ready"
        during_compaction = rng.random() < 0.3
        acks = rng.randint(20, 160)
        end = time.monotonic() + ACK_DEADLINE
        while True:
            line = child.next_line(end)
            history.record(line)
            if line == "compacting" and during_compaction:
                break
            acks -= line.split(" ", 1)[0] not in ("compacting", "compacted", "deleting")
            if acks <= 0 and not during_compaction:
                break
            if acks <= -400:  # no compaction came: kill anyway
                break
        history.counter_in_flight = 1
        time.sleep(rng.uniform(0, 0.03))  # into the next call (bounded, not a wait)
    finally:
        rest = child.kill()
    for line in rest:
        history.record(line)
    return f"round {round_no}: killed {'in compaction' if during_compaction else 'mid-stream'}"


async def _check(directory: Path, history: History, where: str) -> None:
    db = await tabletstore.connect_async(f"file://{directory}")
    try:
        seen = {r.key: r async for r in db.table("t").read_rows()}
    finally:
        await db.close()
    problems: list[str] = []
    for key in sorted(history.rows):
        row = seen.get(key)
        if row is None and key not in history.maybe_deleted:
            problems.append(f"acknowledged row {key!r} is missing")
    for key in sorted(history.deleted):
        if key in seen:
            problems.append(f"acknowledged delete of {key!r} is not there")
    for key, row in seen.items():
        if key in (b"counter", b"cas"):
            continue
        value = value_for(key)
        a, b = row.latest("cf", b"a"), row.latest("n", b"b")
        if (a, b) != (value, value[:8]):
            problems.append(f"row {key!r} is partial or wrong: cf:a={a!r:.40} n:b={b!r}")
    counter = seen[b"counter"].latest("n", b"count") if b"counter" in seen else None
    count = struct.unpack(">q", counter)[0] if counter is not None else 0
    low, high = history.counter_low, history.counter_low + history.counter_in_flight
    if not low <= count <= high:
        problems.append(f"counter is {count}; acknowledged increments allow [{low}, {high}]")
    cas_row = seen.get(b"cas")
    cas = int(cas_row.latest("n", b"v") or b"0") if cas_row is not None else 0
    if not history.cas_low <= cas <= history.cas_low + 1:
        problems.append(f"check-and-mutate value is {cas}; acknowledged {history.cas_low}")
    assert not problems, f"{where}:\n" + "\n".join(problems[:20])
    # What is there now is the base of the next round (an in-flight write that applied counts).
    history.counter_low, history.counter_in_flight = count, 0
    history.cas_low = cas
    # An in-flight delete either happened or not; the next child starts from what is there.
    for key in history.maybe_deleted:
        if key not in seen:
            history.rows.discard(key)
            history.deleted.add(key)
    history.maybe_deleted.clear()


async def test_every_acknowledged_write_survives_sigkill(tmp_path: Path) -> None:
    seed = int(os.environ.get("DURABILITY_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    directory = tmp_path / "db"
    db = await tabletstore.connect_async(f"file://{directory}")
    t = await db.create_table("t", ["cf", "n"], split_keys=[b"1", b"3", b"cas"])
    await t.mutate_row(b"cas", [SetCell("n", b"v", b"0")])
    await db.close()
    history = History()
    for round_no in range(ROUNDS):
        where = _run_round(directory, round_no, rng, history) + f" (seed {seed})"
        await _check(directory, history, where)
    assert len(history.rows) > ROUNDS * 10
    assert history.counter_low > 0 and history.cas_low > 0
