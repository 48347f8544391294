"""ops.process_warmup: a server process's start-up warm-up (frozen start-up objects, raised GC
thresholds). Run in a child process: it changes process-wide state."""

from __future__ import annotations

import subprocess
import sys

from tabletstore.ops.process_warmup import GC_THRESHOLDS

_CHILD = """
import gc
from tabletstore.ops.process_warmup import warm_up_process
before = gc.get_freeze_count()
warm_up_process()
print(before, gc.get_freeze_count(), *gc.get_threshold())
"""


def test_warm_up_process_freezes_startup_objects_and_raises_thresholds() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    before, frozen, *thresholds = map(int, out)
    assert before == 0
    assert frozen > 1000  # the modules loaded so far (pyarrow's among them)
    assert tuple(thresholds) == GC_THRESHOLDS
