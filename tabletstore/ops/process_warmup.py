"""A long-running server process's warm-up: pay start-up costs at start, and keep
the cyclic garbage collector off the request path (the worker and the Bigtable API front door).

Bigtable's tablet servers are long-lived processes serving many small requests (§5.3); in
CPython every request's allocations count toward the cyclic collector's thresholds, and each of
its full collections walks every tracked object the process holds. :func:`warm_up_process`:

* builds one pyarrow array, so pyarrow's import of pandas (0.2-0.5 s of CPU holding the GIL)
  happens now rather than in the first minor compaction or the first request that decodes an
  SSTable block, while calls wait;
* ``gc.collect()`` then ``gc.freeze()``: every object loaded so far (the engine, grpc and
  protobuf descriptors, the etcd client; a few hundred thousand) leaves the collector's reach,
  so its full collections walk only what the process made since;
* raises the collector's thresholds to :data:`GC_THRESHOLDS`. At Python's default
  (700, 10, 10) a scan of 50,000 one-value rows through one worker (``python -m
  bench.rpc_ratio --benchmark scans --scale 0.05``) spent 3.4 to 5.8 µs of the worker's
  ~20 µs of CPU per value in the collector (about 170 young and one full collection per
  50,000 values, measured with ``gc.callbacks``); in the front door a MutateRows batch of 100
  rows set off several young collections per batch and a full one every few batches (server
  CPU per batched row fell about 10% with them raised, bench/bigtable_api.py). Garbage cycles
  are still collected, only less often; the requests' own objects are freed by reference
  counting as before.

Only process entry points call it (``tabletstore worker``, ``tabletstore bigtable-api``): it
changes process-wide state, which a library or a test process must not.
"""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLDS", "warm_up_process"]

#: The cyclic collector's thresholds in a warmed-up server process (module docstring).
GC_THRESHOLDS = (100_000, 50, 1000)


def warm_up_process(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    """Load pyarrow's lazy imports, freeze what is loaded, raise the collector's thresholds."""
    import pyarrow as pa

    pa.array([], pa.int64())
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
