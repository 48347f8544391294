"""Benchmarks that print figures (docs/architecture/design.md layout: ``bench/``).

* ``python -m bench.paper``: the six benchmarks of the paper's §7 (Figure 6), side by side
  with SlateDB, plus the cost in S3 requests; see :mod:`bench.paper`.
* ``bench/sstable_bench.py``, ``bench/rpc_bench.py``: component benchmarks.
"""

from pathlib import Path

from tabletstore.extras import MissingExtra, check_extra


def replace_between(path: Path, begin: str, end: str, text: str) -> None:
    """Replace what is between the markers ``begin`` and ``end`` in the page ``path`` with
    ``text`` (a benchmark's ``--docs``: the table in the docs is the one it printed)."""
    page = path.read_text()
    head, sep, rest = page.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise SystemExit(f"{path} has no {begin} ... {end} block")
    path.write_text(f"{head}{begin}\n{text}{end}{tail}")


def require_extra(extra: str, what: str, *modules: str) -> None:
    """End the benchmark ``what`` at its start, with one line naming the extra to install,
    when ``modules`` of ``extra`` (default: all of them) are not installed."""
    try:
        check_extra(extra, *modules, what=what)
    except MissingExtra as exc:
        raise SystemExit(str(exc)) from exc
