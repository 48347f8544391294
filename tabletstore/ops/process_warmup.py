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
  (700, 10, 10) a streamed scan spends a large share of a worker's CPU per value in the
  collector, and a MutateRows batch of 100 rows in the front door sets off several young
  collections and, every few batches, a full one. Garbage cycles are still collected, only
  less often; the requests' own objects are freed by reference counting as ever. Not much
  higher, though: a collection walks every tracked object of the generations it collects, so
  its pause grows with the threshold. A young collection of 100,000 objects held a worker's
  event loop for 100-150 ms on a quiet machine and 150-450 ms in a soak on a loaded one (the
  largest stalls of its workers); one of 10,000 takes 5-30 ms.

Only process entry points call it (``tabletstore worker``, ``tabletstore bigtable-api``, the
benchmark drivers' ``python -m bench.paper``): it changes process-wide state, which a library
or a test process must not. An application serving requests from the embedded database is
such a process too, and calls it itself (``from tabletstore import warm_up_process``) once at
start, after its imports: the embedded database does not, being a library. Measured with
``bench.paper``'s scans on the embedded database (32 callers, one event loop): full
collections walking the ~100,000 objects the imports left held the loop for 35-45 ms twice a
second, scans' p99 70-90 ms; warmed up, 25-36 ms, and 40 % more values per second.
"""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLDS", "warm_up_process"]

#: The cyclic collector's thresholds in a warmed-up server process (module docstring).
GC_THRESHOLDS = (10_000, 10, 1000)


def warm_up_process(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    """Load pyarrow's lazy imports, freeze what is loaded, raise the collector's thresholds."""
    import pyarrow as pa

    pa.array([], pa.int64())
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
