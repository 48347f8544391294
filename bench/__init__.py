"""Benchmarks that print figures (docs/architecture/design.md layout: ``bench/``).

* ``python -m bench.paper``: the six benchmarks of the paper's §7 (Figure 6), side by side
  with SlateDB, plus the cost in S3 requests; see :mod:`bench.paper`.
* ``bench/sstable_bench.py``, ``bench/rpc_bench.py``: component benchmarks.
"""

from tabletstore.extras import MissingExtra, check_extra


def require_extra(extra: str, what: str, *modules: str) -> None:
    """End the benchmark ``what`` at its start, with one line naming the extra to install,
    when ``modules`` of ``extra`` (default: all of them) are not installed."""
    try:
        check_extra(extra, *modules, what=what)
    except MissingExtra as exc:
        raise SystemExit(str(exc)) from exc
