"""The chaos report's garbage-collection line: read from the masters' logs."""

from __future__ import annotations

import logging
from pathlib import Path

from tabletstore.master.gc import GcReport
from tabletstore.testing.chaos.collection_log import CollectionSeen, parse, read

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the master's (cli/server_cmds.py)


def _line(name: str, message: str, *args: object) -> str:
    record = logging.LogRecord(name, logging.INFO, __file__, 1, message, args, None)
    return logging.Formatter(_FORMAT).format(record)


def _summary(deleted: int) -> str:
    report = GcReport(
        listed=10,
        listed_bytes=100,
        deleted=deleted,
        deleted_bytes=7,
        dry_run=False,
        counts={},
        unknown=(),
    )
    return _line("tabletstore.master.gc", "garbage collection: %s", report.summary())


def test_collections_deletions_and_adoptions_are_added_over_every_lead(tmp_path: Path) -> None:
    adopted = _line(
        "tabletstore.master.gc_state",
        "adopted collector state %s: %d held objects",
        "gc/since/00000000000000000003.json.gz",
        12,
    )
    leading = _line("tabletstore.master.master_process", "master %s is leading", "127.0.0.1:1")
    # master-1 leads twice (it lost its lease once): the second lead adopts.
    (tmp_path / "master-1.log").write_text(
        "\n".join([leading, _summary(5), _summary(7), "noise", leading, adopted])
    )
    (tmp_path / "master-2.log").write_text("\n".join([leading, adopted, _summary(1)]))
    (tmp_path / "worker-3.log").write_text(_summary(100))  # not a master's
    seen = read(tmp_path)
    assert seen == CollectionSeen(collections=3, deleted=13, adopted=2, leads=3)
    assert seen.line() == (
        "garbage collection: 13 objects deleted in 3 collections; "
        "2 of 3 leads adopted the last leader's memory"
    )


def test_a_run_whose_masters_deleted_nothing_says_so() -> None:
    assert parse(["a master that never led"]) == CollectionSeen()
