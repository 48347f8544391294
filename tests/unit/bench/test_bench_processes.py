"""The benchmarks' view of a process tree: a worker's compaction processes are children of
its forkserver, so a worker's CPU and memory count its grandchildren too."""

from __future__ import annotations

import subprocess
import sys

from bench.cluster_target import children_of, cpu_seconds, descendants_of

#: Starts the program in argv[1] as its child, prints its pid, waits until its stdin closes.
_PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE)
print(child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""
#: Uses 0.3 s of CPU, then waits until its stdin closes.
_BURN = """
import sys, time
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
print("done", flush=True)
sys.stdin.read()
"""


def test_a_process_trees_descendants_and_their_cpu_are_counted() -> None:
    # top -> middle -> leaf: the leaf is top's grandchild, as a compaction process is a
    # worker's (the forkserver in between).
    middle_program = _PARENT.replace("sys.argv[1]", repr(_BURN))
    top = subprocess.Popen(
        [sys.executable, "-c", _PARENT, middle_program],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert top.stdout is not None
        middle = int(top.stdout.readline())
        leaf = int(top.stdout.readline())  # the middle's print, on the inherited stdout
        assert top.stdout.readline().strip() == "done"  # the leaf's 0.3 s of CPU are used
        assert children_of(top.pid) == [middle] and children_of(middle) == [leaf]
        assert sorted(descendants_of(top.pid)) == sorted([middle, leaf])
        # (in clock ticks, which may round the 0.3 s down a little)
        assert cpu_seconds(top.pid) >= cpu_seconds(leaf) >= 0.25
    finally:
        assert top.stdin is not None
        top.stdin.close()
        top.wait(timeout=60)
