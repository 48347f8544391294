"""The commit log: one per worker incarnation, shared by its tablets (§5.3, §6).

Paper §6 "Commit-log implementation" keeps one log per tablet server with the mutations of all
its tablets co-mingled, written with group commit; §5.3 replays it past each tablet's redo
point. Here the log is a numbered sequence of immutable segment objects in the bucket:

* :mod:`~tabletstore.commitlog.format` — the bytes of one segment (the spec);
* :mod:`~tabletstore.commitlog.writer` — :class:`CommitLogWriter`, group commit, fencing;
* :mod:`~tabletstore.commitlog.reader` — :class:`CommitLogReader`, :func:`replay`,
  :func:`fence`.
"""

from __future__ import annotations

from tabletstore.commitlog.format import (
    FORMAT_VERSION,
    LogRecord,
    SegmentContents,
    SegmentHeader,
    decode_segment,
    encode_record,
    encode_segment,
)
from tabletstore.commitlog.reader import (
    CommitLogReader,
    fence,
    list_segments,
    replay,
    replay_cells,
)
from tabletstore.commitlog.writer import CommitLogStats, CommitLogWriter

__all__ = [
    "FORMAT_VERSION",
    "CommitLogReader",
    "CommitLogStats",
    "CommitLogWriter",
    "LogRecord",
    "SegmentContents",
    "SegmentHeader",
    "decode_segment",
    "encode_record",
    "encode_segment",
    "fence",
    "list_segments",
    "replay",
    "replay_cells",
]
