"""Change streams through the front door: Cloud Bigtable's ``GenerateInitialChangeStreamPartitions``
and ``ReadChangeStream`` messages to and from ``client/change_stream.py``'s items (pure
conversions; the handlers are ``front_door.BigtableData``'s).

* A ``StreamPartition``'s ``row_range`` is ``[start_key_closed, end_key_open)`` (either empty:
  unbounded), the only form a partition takes; other bounds are InvalidArgument.
* A ``Change`` is one ``DataChange`` (type USER, ``done``), its cells as ``MutationChunk``
  mutations: ``SetCell``, ``DeleteFromColumn`` (with its time range), ``DeleteFromFamily``,
  ``DeleteFromRow``, ``AddToCell`` (an int64 input) and ``MergeToCell`` (an hll state);
  ``tiebreaker`` is the change's order within the row modulo 2^31.
* A ``Heartbeat`` carries a ``StreamContinuationToken`` for the whole partition; a
  ``PartitionEnd`` is a ``CloseStream`` with status OUT_OF_RANGE, the new partitions, and one
  continuation token per new partition whose partition is the part of it the ended stream
  covered (a merged partition is read with the tokens of all its parts).
"""

from __future__ import annotations

import struct
from typing import Any

from google.cloud.bigtable_v2.types import bigtable as bt
from google.cloud.bigtable_v2.types import data as bd
from google.protobuf import timestamp_pb2
from google.rpc import code_pb2, status_pb2

from tabletstore.client.change_plan import (
    Change,
    ChangePartition,
    Heartbeat,
    Mod,
    PartitionEnd,
)
from tabletstore.errors import InvalidArgument
from tabletstore.keys import decode_ts_range

__all__ = [
    "change_response",
    "close_response",
    "heartbeat_response",
    "partition_from_pb",
    "partition_response",
    "seconds_of",
]

_Response = bt.ReadChangeStreamResponse.pb()
_Mutation = bd.Mutation.pb()
_Partition = bd.StreamPartition.pb()
_Token = bd.StreamContinuationToken.pb()
_INT64 = struct.Struct(">q")
_TS_MAX = (1 << 63) - 1


def partition_from_pb(has: bool, partition: Any) -> ChangePartition | None:
    """A request's ``StreamPartition`` (None if it has none)."""
    if not has:
        return None
    rr = partition.row_range
    which_start = rr.WhichOneof("start_key")
    which_end = rr.WhichOneof("end_key")
    if which_start == "start_key_open" or which_end == "end_key_closed":
        raise InvalidArgument(
            "a change-stream partition is a row range [start_key_closed, end_key_open), as "
            "GenerateInitialChangeStreamPartitions and CloseStream hand them out"
        )
    start = rr.start_key_closed if which_start else b""
    end = rr.end_key_open if which_end and rr.end_key_open else None
    return ChangePartition(bytes(start), None if end is None else bytes(end))


def _partition_pb(p: ChangePartition) -> Any:
    out = _Partition()
    out.row_range.start_key_closed = p.start
    if p.end is not None:
        out.row_range.end_key_open = p.end
    return out


def partition_response(p: ChangePartition) -> Any:
    """One ``GenerateInitialChangeStreamPartitionsResponse``."""
    return bt.GenerateInitialChangeStreamPartitionsResponse.pb()(partition=_partition_pb(p))


def seconds_of(has: bool, value: Any) -> float | None:
    """A ``Timestamp`` or ``Duration`` field in seconds (None if unset)."""
    if not has:
        return None
    return float(value.seconds) + float(value.nanos) / 1e9


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    micros = round(seconds * 1_000_000)
    return timestamp_pb2.Timestamp(seconds=micros // 1_000_000, nanos=micros % 1_000_000 * 1000)


def _mutation(m: Mod) -> Any:
    out = _Mutation()
    if m.kind == "put":
        out.set_cell.family_name = m.family
        out.set_cell.column_qualifier = m.qualifier
        out.set_cell.timestamp_micros = m.timestamp
        out.set_cell.value = m.value
    elif m.kind == "delete_column":
        start, end = decode_ts_range(m.value)
        out.delete_from_column.family_name = m.family
        out.delete_from_column.column_qualifier = m.qualifier
        out.delete_from_column.time_range.start_timestamp_micros = start
        if end != _TS_MAX:
            out.delete_from_column.time_range.end_timestamp_micros = end
    elif m.kind == "delete_family":
        out.delete_from_family.family_name = m.family
    elif m.kind == "delete_row":
        out.delete_from_row.SetInParent()
    elif m.kind == "aggregate_hll":
        out.merge_to_cell.family_name = m.family
        out.merge_to_cell.column_qualifier.raw_value = m.qualifier
        out.merge_to_cell.timestamp.raw_timestamp_micros = m.timestamp
        out.merge_to_cell.input.raw_value = m.value
    else:  # aggregate_sum, aggregate_min, aggregate_max: one int64 input
        out.add_to_cell.family_name = m.family
        out.add_to_cell.column_qualifier.raw_value = m.qualifier
        out.add_to_cell.timestamp.raw_timestamp_micros = m.timestamp
        (out.add_to_cell.input.int_value,) = _INT64.unpack(m.value)
    return out


def change_response(c: Change, watermark: float) -> Any:
    """A ``DataChange`` response for one change."""
    resp = _Response()
    dc = resp.data_change
    dc.type_ = bt.ReadChangeStreamResponse.DataChange.Type.USER
    dc.row_key = c.row
    dc.commit_timestamp.CopyFrom(_timestamp(c.commit_time))
    dc.tiebreaker = c.seq & 0x7FFFFFFF
    for m in c.mods:
        dc.chunks.add().mutation.CopyFrom(_mutation(m))
    dc.done = True
    dc.token = c.token
    if watermark > 0:
        dc.estimated_low_watermark.CopyFrom(_timestamp(watermark))
    return resp


def heartbeat_response(h: Heartbeat, partition: ChangePartition) -> Any:
    resp = _Response()
    hb = resp.heartbeat
    hb.continuation_token.partition.CopyFrom(_partition_pb(partition))
    hb.continuation_token.token = h.token
    hb.estimated_low_watermark.CopyFrom(_timestamp(h.watermark))
    return resp


def close_response(end: PartitionEnd) -> Any:
    resp = _Response()
    close = resp.close_stream
    close.status.CopyFrom(
        status_pb2.Status(
            code=code_pb2.OUT_OF_RANGE,
            message=f"partition {end.partition} ended (its tablet split or merged)",
        )
    )
    for succ, token in end.successors:
        close.new_partitions.append(_partition_pb(succ))
        ends = [e for e in (succ.end, end.partition.end) if e is not None]
        part = ChangePartition(max(succ.start, end.partition.start), min(ends) if ends else None)
        close.continuation_tokens.append(_Token(partition=_partition_pb(part), token=token))
    return resp
