"""Pure conversions between Cloud Bigtable API messages and tabletstore values (§2, §3).

The front door (:mod:`tabletstore.bigtable_api.front_door`) receives raw protobuf messages of
``google.bigtable.v2`` and ``google.bigtable.admin.v2`` (the classes shipped in
``google-cloud-bigtable``) and speaks tabletstore's own API. Every conversion lives here, as a
function of its arguments only (server time is passed in), so it is tested without a server.

Contracts, decided once for the whole front door:

* **Names.** ``projects/P/instances/I/tables/T``: ``T`` must match ``[A-Za-z0-9_.-]{1,50}``
  (Cloud Bigtable's limit); which tabletstore table it names depends on the instance
  (:mod:`tabletstore.bigtable_api.instances`).
* **Timestamps** are microseconds with millisecond granularity, as in a Cloud Bigtable table
  whose granularity is ``MILLIS`` (the only granularity reported). ``SetCell`` timestamps and
  ``DeleteFromColumn`` time ranges must be multiples of 1000 (else INVALID_ARGUMENT, as the
  service answers); ``timestamp_micros = -1`` is replaced by the front door's clock truncated to
  the millisecond. Filter timestamp bounds may be any microsecond value.
* **Row ranges**: an empty key bound is unbounded (data.proto ``RowRange``); a request naming no
  rows reads the whole table; empty row keys in a row set select nothing. Column and value range
  bounds are taken literally: a bound set to ``b""`` is the empty string, as in the service.
* **Filters** map 1:1 onto :mod:`tabletstore.data.filters`. As the service does, a ``chain`` or
  ``interleave`` needs at least two sub-filters, a ``condition`` needs a predicate, and the flag
  filters (``pass_all_filter``, ``block_all_filter``, ``sink``, ``strip_value_transformer``) must
  be true when set. A filter over one of the cost limits of :mod:`tabletstore.data.filters`
  (filters, regexes, pattern bytes, copies, work per cell, compiled program size) is
  INVALID_ARGUMENT naming the limit and its value; the node count is checked on the message
  before any of it is translated.
* **Aggregate families** (``value_type`` of an aggregate type): Int64 ``sum``, ``min_``,
  ``max_`` (big-endian encoding) and ``hllpp_unique_count`` map onto tabletstore's value types
  (:mod:`tabletstore.data.aggregates`); ``AddToCell`` and ``MergeToCell`` onto the mutations of
  the same names. Int64 cells read back as 8 big-endian bytes, as in the service; an hll cell
  holds tabletstore's own sketch encoding (the service's is Zetasketch's).
* **Errors**: :func:`status_code` maps the one tabletstore exception hierarchy onto gRPC codes.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.cloud.bigtable_admin_v2.types import table as admin_table
from google.cloud.bigtable_admin_v2.types import types as admin_types
from google.cloud.bigtable_v2.types import bigtable as bt
from google.cloud.bigtable_v2.types import data

from tabletstore.data.filters import (
    ApplyLabel,
    BlockAll,
    CellsPerColumnLimit,
    CellsPerRowLimit,
    CellsPerRowOffset,
    Chain,
    ColumnQualifierRegex,
    ColumnRange,
    Condition,
    FamilyNameRegex,
    Interleave,
    PartsBudget,
    PassAll,
    RowFilter,
    RowKeyRegex,
    RowSample,
    Sink,
    StripValue,
    TimestampRange,
    ValueRange,
    ValueRegex,
)
from tabletstore.data.model import (
    AddToCell,
    AppendValue,
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    IncrementValue,
    MergeToCell,
    Mutation,
    ReadModifyWriteRule,
    Row,
    SetCell,
)
from tabletstore.data.query import RowRange, RowSet
from tabletstore.data.schema import (
    ColumnFamily,
    GcRule,
    IntersectionRule,
    MaxAgeRule,
    MaxVersionsRule,
    TableSchema,
    UnionRule,
    validate_table_name,
)
from tabletstore.errors import (
    AlreadyExists,
    Closed,
    Corruption,
    Indeterminate,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
    Unimplemented,
)

__all__ = [
    "GRANULARITY_MICROS",
    "TableName",
    "family_from_pb",
    "filter_from_pb",
    "gc_rule_from_pb",
    "gc_rule_to_pb",
    "mutations_from_pb",
    "parse_instance_name",
    "parse_table_name",
    "rmw_rules_from_pb",
    "row_set_from_pb",
    "row_to_pb",
    "server_timestamp",
    "status_code",
    "table_to_pb",
    "value_type_from_pb",
]

#: Cloud Bigtable's timestamp granularity for tabletstore tables: one millisecond.
GRANULARITY_MICROS = 1000

# The protobuf classes (``.pb()`` of the proto-plus wrappers). Messages are handled raw.
RowFilterPB: Any = data.RowFilter.pb()
RowSetPB: Any = data.RowSet.pb()
MutationPB: Any = data.Mutation.pb()
RowPB: Any = data.Row.pb()
FamilyPB: Any = data.Family.pb()
ColumnPB: Any = data.Column.pb()
CellPB: Any = data.Cell.pb()
GcRulePB: Any = admin_table.GcRule.pb()
TablePB: Any = admin_table.Table.pb()
TypePB: Any = admin_types.Type.pb()
_INT64 = struct.Struct(">q")
_VIEW = admin_table.Table.View
_MILLIS = admin_table.Table.TimestampGranularity.MILLIS
ReadRowsResponsePB: Any = bt.ReadRowsResponse.pb()

_INSTANCE_RE = re.compile(r"^projects/([^/]+)/instances/([^/]+)$")
_TABLE_RE = re.compile(r"^projects/([^/]+)/instances/([^/]+)/tables/([^/]+)$")


# -- names -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TableName:
    """A parsed ``projects/P/instances/I/tables/T``; ``table`` is the tabletstore table."""

    project: str
    instance: str
    table: str

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/instances/{self.instance}"

    def __str__(self) -> str:
        return f"{self.parent}/tables/{self.table}"


def parse_instance_name(name: str) -> tuple[str, str]:
    """``projects/P/instances/I`` -> (P, I); InvalidArgument if malformed."""
    m = _INSTANCE_RE.match(name)
    if m is None:
        raise InvalidArgument(f"instance name {name!r} is not projects/<project>/instances/<id>")
    return m.group(1), m.group(2)


def parse_table_name(name: str) -> TableName:
    """``projects/P/instances/I/tables/T`` -> TableName; InvalidArgument if malformed."""
    m = _TABLE_RE.match(name)
    if m is None:
        raise InvalidArgument(
            f"table name {name!r} is not projects/<project>/instances/<instance>/tables/<table>"
        )
    return TableName(m.group(1), m.group(2), check_table_id(m.group(3)))


#: Longest Cloud Bigtable table id.
MAX_TABLE_ID = 50


def check_table_id(table_id: str) -> str:
    """A table id: at most 50 characters (the service's limit), of a tabletstore table name."""
    if len(table_id) > MAX_TABLE_ID:
        raise InvalidArgument(
            f"table id {table_id!r} must be 1-{MAX_TABLE_ID} characters of [A-Za-z0-9_.-]"
        )
    try:
        return validate_table_name(table_id)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


# -- errors ------------------------------------------------------------------------------------
# Most specific class first: the first isinstance match wins.
_CODES: tuple[tuple[type[TabletStoreError], grpc.StatusCode], ...] = (
    (Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (PreconditionFailed, grpc.StatusCode.FAILED_PRECONDITION),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (Indeterminate, grpc.StatusCode.UNKNOWN),
    (Corruption, grpc.StatusCode.DATA_LOSS),
    (Closed, grpc.StatusCode.UNAVAILABLE),
)


def status_code(exc: TabletStoreError) -> grpc.StatusCode:
    """The gRPC status code that tells a Bigtable client what ``exc`` tells a tabletstore one.

    Indeterminate becomes UNKNOWN: the official clients never blindly retry a non-idempotent
    mutation on UNKNOWN, which is right for "may have been applied".
    """
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


# -- row sets ----------------------------------------------------------------------------------
def _row_range_from_pb(r: Any) -> RowRange:
    start_kind = r.WhichOneof("start_key")
    end_kind = r.WhichOneof("end_key")
    start = getattr(r, start_kind) if start_kind else b""
    end = getattr(r, end_kind) if end_kind else b""
    # An empty bound is unbounded on that side, whichever of open/closed carries it.
    return RowRange(
        start or None,
        end or None,
        start_inclusive=start_kind != "start_key_open",
        end_inclusive=end_kind == "end_key_closed",
    )


def row_set_from_pb(request_has_rows: bool, rows: Any) -> RowSet:
    """The rows a ReadRows request selects: a request naming no keys or ranges reads them all.

    Empty keys name no row (a row key is never empty), so they select nothing.
    """
    if not request_has_rows or (not rows.row_keys and not rows.row_ranges):
        return RowSet.all()
    return RowSet(
        [bytes(k) for k in rows.row_keys if k],
        [_row_range_from_pb(r) for r in rows.row_ranges],
    )


# -- filters -----------------------------------------------------------------------------------
def _bounds(msg: Any, start_field: str, end_field: str, stem: str) -> dict[str, Any]:
    """Literal bounds of a ColumnRange/ValueRange (``stem`` = "qualifier" or "value")."""
    start_kind = msg.WhichOneof(start_field)
    end_kind = msg.WhichOneof(end_field)
    return {
        "start": bytes(getattr(msg, start_kind)) if start_kind else None,
        "end": bytes(getattr(msg, end_kind)) if end_kind else None,
        "start_inclusive": start_kind != f"start_{stem}_open",
        "end_inclusive": end_kind == f"end_{stem}_closed",
    }


def _flag(name: str, make: Callable[[], RowFilter]) -> Callable[[Any], RowFilter]:
    def build(value: Any) -> RowFilter:
        if value is not True:
            raise InvalidArgument(f"{name} must be true if set")
        return make()

    return build


def _composite(name: str, make: Callable[[list[RowFilter]], RowFilter]) -> Callable[[Any], Any]:
    def build(value: Any) -> RowFilter:
        if len(value.filters) < 2:
            raise InvalidArgument(f"{name} must contain at least two RowFilters")
        return make([_filter_from_pb(f) for f in value.filters])

    return build


def _condition(value: Any) -> RowFilter:
    if not value.HasField("predicate_filter"):
        raise InvalidArgument("condition needs a predicate_filter")
    return Condition(
        _filter_from_pb(value.predicate_filter),
        _filter_from_pb(value.true_filter) if value.HasField("true_filter") else None,
        _filter_from_pb(value.false_filter) if value.HasField("false_filter") else None,
    )


def _timestamp_range(value: Any) -> RowFilter:
    start, end = value.start_timestamp_micros, value.end_timestamp_micros
    if start < 0 or end < 0:
        raise InvalidArgument(f"timestamp_range_filter bounds must be >= 0, got [{start}, {end})")
    return TimestampRange(start or None, end or None)


_FILTERS: dict[str, Callable[[Any], RowFilter]] = {
    "chain": _composite("Chain", Chain),
    "interleave": _composite("Interleave", Interleave),
    "condition": _condition,
    "sink": _flag("sink", Sink),
    "pass_all_filter": _flag("pass_all_filter", PassAll),
    "block_all_filter": _flag("block_all_filter", BlockAll),
    "strip_value_transformer": _flag("strip_value_transformer", StripValue),
    "row_key_regex_filter": lambda v: RowKeyRegex(bytes(v)),
    "row_sample_filter": RowSample,
    "family_name_regex_filter": FamilyNameRegex,
    "column_qualifier_regex_filter": lambda v: ColumnQualifierRegex(bytes(v)),
    "value_regex_filter": lambda v: ValueRegex(bytes(v)),
    "column_range_filter": lambda v: ColumnRange(
        v.family_name, **_bounds(v, "start_qualifier", "end_qualifier", "qualifier")
    ),
    "timestamp_range_filter": _timestamp_range,
    "value_range_filter": lambda v: ValueRange(**_bounds(v, "start_value", "end_value", "value")),
    "cells_per_row_offset_filter": CellsPerRowOffset,
    "cells_per_row_limit_filter": CellsPerRowLimit,
    "cells_per_column_limit_filter": CellsPerColumnLimit,
    "apply_label_transformer": ApplyLabel,
}


def _check_parts(f: Any) -> None:
    """InvalidArgument if ``f`` holds more filters, regexes or regex bytes than the cost
    limits allow, found by walking at most that many with a
    :class:`~tabletstore.data.filters.PartsBudget`: a huge message is refused before any of
    it is translated."""
    budget = PartsBudget()
    stack = [f]
    while stack:
        node = stack.pop()
        budget.node()
        kind = node.WhichOneof("filter")
        if kind in ("chain", "interleave"):
            stack.extend(getattr(node, kind).filters)
        elif kind == "condition":
            c = node.condition
            stack.extend(
                getattr(c, name)
                for name in ("predicate_filter", "true_filter", "false_filter")
                if c.HasField(name)
            )
        elif kind is not None and kind.endswith("_regex_filter"):
            budget.regex(len(getattr(node, kind)))


def filter_from_pb(f: Any) -> RowFilter:
    """A ``google.bigtable.v2.RowFilter`` as a :mod:`tabletstore.data.filters` value.

    InvalidArgument names the problem (bad limit, short chain, a cost limit of
    :mod:`tabletstore.data.filters` and its value, ...); the patterns are compiled by the
    tablet server, which refuses a bad one the same way. A RowFilter with nothing set passes
    every cell.
    """
    _check_parts(f)
    return _filter_from_pb(f)


def _filter_from_pb(f: Any) -> RowFilter:
    kind = f.WhichOneof("filter")
    if kind is None:
        return PassAll()  # an empty message is proto3's "unset": no filter, as the emulator
    return _FILTERS[kind](getattr(f, kind))


# -- mutations ---------------------------------------------------------------------------------
def server_timestamp(now_seconds: float) -> int:
    """Server time as a Bigtable timestamp: microseconds truncated to the millisecond."""
    micros = int(now_seconds * 1_000_000)
    return micros - micros % GRANULARITY_MICROS


def _check_granular(what: str, ts: int) -> int:
    if ts < 0 or ts % GRANULARITY_MICROS:
        raise InvalidArgument(
            f"{what} {ts} is not a non-negative multiple of {GRANULARITY_MICROS} "
            "(tables have millisecond granularity)"
        )
    return ts


def _mutation_from_pb(m: Any, now_micros: int) -> Mutation:
    kind = m.WhichOneof("mutation")
    if kind == "set_cell":
        s = m.set_cell
        ts = s.timestamp_micros
        ts = now_micros if ts == -1 else _check_granular("set_cell timestamp_micros", ts)
        return SetCell(s.family_name, bytes(s.column_qualifier), bytes(s.value), ts)
    if kind == "delete_from_column":
        d = m.delete_from_column
        start = _check_granular("delete time range start", d.time_range.start_timestamp_micros)
        end = _check_granular("delete time range end", d.time_range.end_timestamp_micros)
        if end and end < start:
            raise InvalidArgument(f"inverted delete time range [{start}, {end})")
        return DeleteCells(d.family_name, bytes(d.column_qualifier), start or None, end or None)
    if kind == "delete_from_family":
        return DeleteFamily(m.delete_from_family.family_name)
    if kind == "delete_from_row":
        return DeleteRow()
    if kind in ("add_to_cell", "merge_to_cell"):
        return _aggregate_from_pb(kind, getattr(m, kind), now_micros)
    raise InvalidArgument("mutation has no mutation set")


def _aggregate_from_pb(kind: str, a: Any, now_micros: int) -> Mutation:
    """AddToCell / MergeToCell. The qualifier is a ``raw_value``; the timestamp a
    ``raw_timestamp_micros`` of millisecond granularity (unset: server time); the input an
    ``int_value`` (Int64 families) or bytes (``raw_value``/``bytes_value``: an hll input, or
    a state to merge, e.g. Int64's 8 big-endian bytes as the service takes them)."""
    qualifier = a.column_qualifier
    if qualifier.WhichOneof("kind") not in (None, "raw_value", "bytes_value"):
        raise InvalidArgument(f"{kind} column_qualifier must be a raw_value")
    qual = bytes(getattr(qualifier, qualifier.WhichOneof("kind") or "raw_value"))
    ts_kind = a.timestamp.WhichOneof("kind") if a.HasField("timestamp") else None
    if ts_kind is None:
        ts = now_micros
    elif ts_kind == "raw_timestamp_micros":
        ts = _check_granular(f"{kind} timestamp", a.timestamp.raw_timestamp_micros)
    else:
        raise InvalidArgument(f"{kind} timestamp must be a raw_timestamp_micros, not {ts_kind}")
    in_kind = a.input.WhichOneof("kind") if a.HasField("input") else None
    value: int | bytes
    if in_kind == "int_value":
        value = int(a.input.int_value)
    elif in_kind in ("raw_value", "bytes_value", "string_value"):
        raw = getattr(a.input, in_kind)
        value = raw.encode() if isinstance(raw, str) else bytes(raw)
    else:
        raise InvalidArgument(f"{kind} to family {a.family_name!r} has no usable input ({in_kind})")
    if kind == "add_to_cell":
        return AddToCell(a.family_name, qual, value, ts)
    state = value if isinstance(value, bytes) else _INT64.pack(value)
    return MergeToCell(a.family_name, qual, state, ts)


def mutations_from_pb(mutations: Sequence[Any], now_micros: int) -> tuple[Mutation, ...]:
    """A row's Bigtable mutations; ``now_micros`` stamps ``timestamp_micros == -1``."""
    if not mutations:
        raise InvalidArgument("no mutations provided")
    return tuple(_mutation_from_pb(m, now_micros) for m in mutations)


def rmw_rules_from_pb(rules: Sequence[Any]) -> tuple[ReadModifyWriteRule, ...]:
    """ReadModifyWriteRow rules as append / increment rules."""
    if not rules:
        raise InvalidArgument("no rules provided")
    out: list[ReadModifyWriteRule] = []
    for r in rules:
        kind = r.WhichOneof("rule")
        if kind == "append_value":
            out.append(AppendValue(r.family_name, bytes(r.column_qualifier), bytes(r.append_value)))
        elif kind == "increment_amount":
            out.append(IncrementValue(r.family_name, bytes(r.column_qualifier), r.increment_amount))
        else:
            raise InvalidArgument("read-modify-write rule has neither append_value nor increment")
    return tuple(out)


def row_to_pb(row: Row) -> Any:
    """A tabletstore Row as ``google.bigtable.v2.Row`` (families, columns, cells in order)."""
    out = RowPB(key=row.key)
    family: Any = None
    column: Any = None
    for c in row.cells:
        if family is None or family.name != c.family:
            family = out.families.add(name=c.family)
            column = None
        if column is None or column.qualifier != c.qualifier:
            column = family.columns.add(qualifier=c.qualifier)
        column.cells.add(timestamp_micros=c.timestamp, value=c.value, labels=list(c.labels))
    return out


# -- schemas -----------------------------------------------------------------------------------
def gc_rule_from_pb(rule: Any) -> GcRule | None:
    """An admin ``GcRule`` as a schema rule; an empty rule (or union) is no rule."""
    kind = rule.WhichOneof("rule")
    if kind is None:
        return None
    if kind == "max_num_versions":
        if rule.max_num_versions < 1:
            raise InvalidArgument(f"max_num_versions must be >= 1, got {rule.max_num_versions}")
        return MaxVersionsRule(max_versions=rule.max_num_versions)
    if kind == "max_age":
        seconds = rule.max_age.seconds + rule.max_age.nanos / 1e9
        if seconds <= 0:
            raise InvalidArgument(f"max_age must be positive, got {seconds}s")
        return MaxAgeRule(max_age_seconds=seconds)
    members = [r for r in (gc_rule_from_pb(x) for x in getattr(rule, kind).rules) if r is not None]
    if kind == "union":
        return UnionRule(rules=members) if members else None
    if not members:
        raise InvalidArgument("an intersection GC rule needs at least one rule")
    return IntersectionRule(rules=members)


def gc_rule_to_pb(rule: GcRule | None) -> Any:
    """A schema rule as an admin ``GcRule`` (None: the empty rule, keep everything)."""
    if rule is None:
        return GcRulePB()
    if isinstance(rule, MaxVersionsRule):
        return GcRulePB(max_num_versions=rule.max_versions)
    if isinstance(rule, MaxAgeRule):
        out = GcRulePB()
        whole = int(rule.max_age_seconds)
        out.max_age.seconds = whole
        out.max_age.nanos = round((rule.max_age_seconds - whole) * 1e9)
        return out
    members = [gc_rule_to_pb(r) for r in rule.rules]
    if isinstance(rule, UnionRule):
        return GcRulePB(union=GcRulePB.Union(rules=members))
    return GcRulePB(intersection=GcRulePB.Intersection(rules=members))


def family_from_pb(family_id: str, family: Any) -> GcRule | None:
    """The GC rule of an admin ``ColumnFamily`` (its value type: :func:`value_type_from_pb`)."""
    return gc_rule_from_pb(family.gc_rule) if family.HasField("gc_rule") else None


_AGGREGATORS = {"sum": "sum", "min_": "min", "max_": "max", "hllpp_unique_count": "hll"}


def value_type_from_pb(family_id: str, family: Any) -> str | None:
    """The value type of an admin ``ColumnFamily`` (``data.aggregates``): an Int64 ``sum``,
    ``min_`` or ``max_`` aggregate with big-endian encoding, or an ``hllpp_unique_count``;
    None without one. Other value types are UNIMPLEMENTED, naming the family."""
    if not family.HasField("value_type"):
        return None
    vt = family.value_type
    if vt.WhichOneof("kind") != "aggregate_type":
        raise Unimplemented(
            f"column family {family_id!r}: value_type {vt.WhichOneof('kind')} is not "
            "supported (only aggregate types are)"
        )
    agg = vt.aggregate_type
    aggregator = _AGGREGATORS.get(agg.WhichOneof("aggregator") or "")
    if aggregator is None:
        raise InvalidArgument(f"column family {family_id!r}: aggregate type has no aggregator")
    if aggregator != "hll" and agg.HasField("input_type"):
        in_kind = agg.input_type.WhichOneof("kind")
        if in_kind != "int64_type":
            raise InvalidArgument(
                f"column family {family_id!r}: a {aggregator} aggregate takes Int64 input, "
                f"not {in_kind}"
            )
        encoding = agg.input_type.int64_type.encoding.WhichOneof("encoding")
        if encoding not in (None, "big_endian_bytes"):
            raise Unimplemented(
                f"column family {family_id!r}: Int64 encoding {encoding} is not supported "
                "(big_endian_bytes is)"
            )
    return aggregator


def _value_type_to_pb(value_type: str) -> Any:
    """A value type as the admin API describes it (what Google's emulator answers)."""
    out = TypePB()
    agg = out.aggregate_type
    if value_type == "hll":
        agg.input_type.bytes_type.SetInParent()
        agg.hllpp_unique_count.SetInParent()
        return out
    agg.input_type.int64_type.encoding.big_endian_bytes.SetInParent()
    {"sum": agg.sum, "min": agg.min_, "max": agg.max_}[value_type].SetInParent()
    return out


def table_to_pb(name: TableName, schema: TableSchema | None, view: int) -> Any:
    """An admin ``Table``: its name and, unless ``view`` is NAME_ONLY (or ``schema`` is None),
    its column families with their GC rules and the table's (millisecond) granularity."""
    out = TablePB(name=str(name))
    if schema is None or view == _VIEW.NAME_ONLY:
        return out
    out.granularity = _MILLIS
    for fam in schema.families.values():
        out.column_families[fam.name].CopyFrom(_family_to_pb(fam))
    return out


def _family_to_pb(family: ColumnFamily) -> Any:
    out = admin_table.ColumnFamily.pb()()
    if family.gc_rule is not None:
        out.gc_rule.CopyFrom(gc_rule_to_pb(family.gc_rule))
    if family.value_type is not None:
        out.value_type.CopyFrom(_value_type_to_pb(family.value_type))
    return out
