"""Benchmarks that print figures (DESIGN.md layout: ``bench/``).

* ``python -m bench.paper``: the six benchmarks of the paper's §7 (Figure 6), side by side
  with SlateDB, plus the cost in S3 requests; see :mod:`bench.paper`.
* ``bench/sstable_bench.py``, ``bench/rpc_bench.py``: component benchmarks.
"""
