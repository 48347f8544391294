"""From API mutations to stored cells, with every limit checked (§2, §3).

This is the one place that validates a row mutation against a schema and turns it into engine
cells (``keys.Cell``). The client calls :func:`validate_row_mutation` to fail fast; the tablet
server calls :func:`to_cells` again, because a server never trusts its clients.

Limits (stated in ``model``): row keys 1 byte to 64 KiB; qualifiers up to ``MAX_QUALIFIER``;
values up to ``MAX_VALUE``, also after an append; a whole row mutation up to
``MAX_MUTATION_BYTES`` as :func:`mutation_bytes` counts it (so it fits one RPC request frame);
families must exist in the schema and the caller must be allowed to write them (ACLs, §2);
timestamps are microseconds in ``[0, TS_MAX)``; time ranges must not be inverted.
"""

from __future__ import annotations

from collections.abc import Sequence

from tabletstore.data import aggregates
from tabletstore.data.model import (
    MAX_MUTATION_BYTES,
    MAX_QUALIFIER,
    MAX_ROW_KEY,
    MAX_VALUE,
    AddToCell,
    AppendValue,
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    IncrementValue,
    MergeToCell,
    Mutation,
    ReadModifyWriteRule,
    SetCell,
)
from tabletstore.data.schema import TableSchema
from tabletstore.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    Unavailable,
)
from tabletstore.keys import TS_MAX

__all__ = [
    "MAX_MUTATIONS_PER_ROW",
    "REPLICATOR",
    "check_mutation_size",
    "check_not_promoting",
    "check_replica_write",
    "check_row_key",
    "families_of",
    "mutation_bytes",
    "validate_rmw_rules",
    "validate_row_mutation",
]

#: Mutations in one row mutation (Cloud Bigtable allows 100,000).
MAX_MUTATIONS_PER_ROW = 100_000
#: Bytes counted per mutation on top of its names and value: at least what the RPC codec
#: spends on one (msgpack's array, type marker and length headers, a timestamp: at most 26).
MUTATION_OVERHEAD = 32


#: The identity a replicator writes its replica tables as (``client/replicator.py``): the only
#: writer of a table that follows another, and a writer of nothing else.
REPLICATOR = "tabletstore-replicator"


def check_not_promoting(schema: TableSchema) -> None:
    """Unavailable (retry) while the table is being promoted from replica to primary: it
    takes no write at all then. A tablet checks it again at the moment a write joins its
    commit log, so that once a worker has the promoting schema and its log has sealed what
    it holds, no replicated write can be stamped later (``client/replicator.py`` promote)."""
    replica = schema.replica_of
    if replica is not None and replica.promoting:
        raise Unavailable(
            f"table {schema.name!r} is being promoted from replica to primary; retry in a "
            "few seconds"
        )


def check_replica_write(schema: TableSchema, identity: str | None) -> None:
    """The write policy of replication (single primary): a replica table takes writes from
    its replicator only, and the replicator writes nothing but replicas. PreconditionFailed
    names which; Unavailable (retry) while the table is being promoted."""
    replica = schema.replica_of
    if replica is None:
        if identity == REPLICATOR:
            raise PreconditionFailed(
                f"table {schema.name!r} is not a replica (it was promoted, or never followed "
                "another): the replicator does not write it"
            )
        return
    check_not_promoting(schema)
    if identity != REPLICATOR:
        raise PreconditionFailed(
            f"table {schema.name!r} is a replica of {replica.table!r} at {replica.source} and "
            "refuses client writes while it follows it; write to the primary, or promote "
            f"this one (tabletstore replication promote {schema.name})"
        )


def mutation_bytes(row: bytes, mutations: Sequence[Mutation]) -> int:
    """The size a row mutation counts against ``MAX_MUTATION_BYTES``: an upper bound on its
    encoded size, less the request's fixed envelope."""
    total = len(row)
    for m in mutations:
        total += MUTATION_OVERHEAD
        if isinstance(m, SetCell):
            total += len(m.family) + len(m.qualifier) + len(m.value)
        elif isinstance(m, DeleteCells):
            total += len(m.family) + len(m.qualifier)
        elif isinstance(m, DeleteFamily):
            total += len(m.family)
        elif isinstance(m, AddToCell | MergeToCell):
            value = m.value if isinstance(m.value, bytes) else b""
            total += len(m.family) + len(m.qualifier) + len(value) + 8
    return total


def _check_qualifier(family: str, qualifier: object) -> None:
    if not isinstance(qualifier, bytes):
        raise InvalidArgument("qualifier must be bytes")
    if len(qualifier) > MAX_QUALIFIER:
        raise InvalidArgument(
            f"qualifier {family}:{qualifier[:64]!r}... is {len(qualifier)} bytes; the limit is "
            f"{MAX_QUALIFIER} (64 KiB)"
        )


def check_row_key(row: bytes) -> None:
    """Row keys are non-empty byte strings of at most 64 KiB (§2)."""
    if not isinstance(row, bytes | bytearray):
        raise InvalidArgument(f"row key must be bytes, not {type(row).__name__}")
    if not row:
        raise InvalidArgument("row key must not be empty")
    if len(row) > MAX_ROW_KEY:
        raise InvalidArgument(f"row key is {len(row)} bytes; the limit is {MAX_ROW_KEY} (64 KiB)")


def _check_int(value: object, what: str) -> None:
    """``value`` is an int proper: a bool or a float would pass the range checks and be stored,
    then fail the SSTable's int64 column at every minor compaction of the tablet."""
    if type(value) is not int:
        raise InvalidArgument(f"{what} must be an int, not {type(value).__name__} ({value!r})")


def _check_timestamp(timestamp: int | None) -> None:
    if timestamp is None:
        return
    _check_int(timestamp, "timestamp (microseconds)")
    if not 0 <= timestamp < TS_MAX:
        raise InvalidArgument(f"timestamp {timestamp} is outside [0, 2^63-1)")


def _check_plain(schema: TableSchema, family: str, what: str) -> None:
    value_type = schema.families[family].value_type
    if value_type is not None:
        raise InvalidArgument(
            f"{what} cannot write column family {schema.name}:{family}: it is an aggregate "
            f"family ({value_type}); use AddToCell or MergeToCell"
        )


def _check_aggregate(schema: TableSchema, m: AddToCell | MergeToCell) -> None:
    kind = type(m).__name__
    value_type = schema.families[m.family].value_type
    if value_type is None:
        raise InvalidArgument(
            f"{kind} needs an aggregate column family; {schema.name}:{m.family} has no value "
            "type (write it with SetCell)"
        )
    _check_qualifier(m.family, m.qualifier)
    _check_timestamp(m.timestamp)
    try:
        if isinstance(m, AddToCell):
            aggregates.input_state(value_type, m.value)
        else:
            aggregates.validate_state(value_type, m.value)
    except ValueError as exc:
        raise InvalidArgument(
            f"{kind} to {schema.name}:{m.family}:{m.qualifier[:64]!r}: {exc}"
        ) from None
    if isinstance(m.value, bytes) and len(m.value) > MAX_VALUE:
        raise InvalidArgument(
            f"value of {m.family}:{m.qualifier[:64]!r} is {len(m.value)} bytes; "
            f"the limit is {MAX_VALUE}"
        )


def _check_family(schema: TableSchema, family: str, identity: str | None, write: bool) -> None:
    if type(family) is not str:
        raise InvalidArgument(f"column family must be a str, not {type(family).__name__}")
    fam = schema.families.get(family)
    if fam is None:
        raise NotFound(f"table {schema.name!r} has no column family {family!r}")
    allowed = fam.acl.may_write(identity) if write else fam.acl.may_read(identity)
    if not allowed:
        verb = "write" if write else "read"
        who = identity if identity is not None else "anonymous"
        raise PermissionDenied(f"{who} may not {verb} column family {schema.name}:{family}")


def families_of(mutations: Sequence[Mutation], schema: TableSchema) -> set[str]:
    """The families a mutation list writes (DeleteRow writes every family)."""
    out: set[str] = set()
    for m in mutations:
        if isinstance(m, DeleteRow):
            out.update(schema.families)
        else:
            out.add(m.family)
    return out


def _plain_set_cells_size(
    schema: TableSchema, row: bytes, mutations: Sequence[Mutation], identity: str | None
) -> int | None:
    """The fast path of :func:`validate_row_mutation` for the common row mutation: only
    SetCells of writable plain families, every part within its limit. Returns its
    :func:`mutation_bytes`, or None when any check needs the full path (which names the
    problem)."""
    if type(row) is not bytes or not row or len(row) > MAX_ROW_KEY:
        return None
    if not mutations or len(mutations) > MAX_MUTATIONS_PER_ROW:
        return None
    families = schema.families
    size = len(row)
    for m in mutations:
        if type(m) is not SetCell:
            return None
        fam = families.get(m.family)
        if fam is None or fam.value_type is not None or not fam.acl.may_write(identity):
            return None
        qualifier, value, ts = m.qualifier, m.value, m.timestamp
        if type(qualifier) is not bytes or len(qualifier) > MAX_QUALIFIER:
            return None
        if type(value) is not bytes or len(value) > MAX_VALUE:
            return None
        if ts is not None and (type(ts) is not int or not 0 <= ts < TS_MAX):
            return None
        size += MUTATION_OVERHEAD + len(m.family) + len(qualifier) + len(value)
    return size


def validate_row_mutation(
    schema: TableSchema, row: bytes, mutations: Sequence[Mutation], identity: str | None = None
) -> None:
    """Raise a precise error if the row mutation is not acceptable; return None otherwise."""
    check_replica_write(schema, identity)
    size = _plain_set_cells_size(schema, row, mutations, identity)
    if size is not None and size <= MAX_MUTATION_BYTES:
        return
    check_row_key(row)
    if not mutations:
        raise InvalidArgument(f"row mutation of {row[:64]!r} has no mutations")
    if len(mutations) > MAX_MUTATIONS_PER_ROW:
        raise InvalidArgument(
            f"row mutation has {len(mutations)} mutations; the limit is {MAX_MUTATIONS_PER_ROW}"
        )
    for m in mutations:
        if isinstance(m, SetCell):
            _check_family(schema, m.family, identity, write=True)
            _check_plain(schema, m.family, "SetCell")
            _check_qualifier(m.family, m.qualifier)
            if not isinstance(m.value, bytes):
                raise InvalidArgument("value must be bytes")
            if len(m.value) > MAX_VALUE:
                raise InvalidArgument(
                    f"value of {m.family}:{m.qualifier[:64]!r} is {len(m.value)} bytes; "
                    f"the limit is {MAX_VALUE}"
                )
            _check_timestamp(m.timestamp)
        elif isinstance(m, AddToCell | MergeToCell):
            _check_family(schema, m.family, identity, write=True)
            _check_aggregate(schema, m)
        elif isinstance(m, DeleteCells):
            _check_family(schema, m.family, identity, write=True)
            _check_qualifier(m.family, m.qualifier)
            for bound in (m.start, m.end):
                if bound is not None:
                    _check_int(bound, "a delete's time bound (microseconds)")
            start = 0 if m.start is None else m.start
            end = TS_MAX if m.end is None else m.end
            if start < 0 or end < start or end > TS_MAX:
                raise InvalidArgument(
                    f"invalid time range [{m.start}, {m.end}) in delete: bounds must be in "
                    f"[0, 2^63-1] with start <= end"
                )
        elif isinstance(m, DeleteFamily):
            _check_family(schema, m.family, identity, write=True)
        elif isinstance(m, DeleteRow):
            for family in schema.families:
                _check_family(schema, family, identity, write=True)
        else:
            raise InvalidArgument(f"unknown mutation type {type(m).__name__}")
    check_mutation_size(row, mutations)


def check_mutation_size(row: bytes, mutations: Sequence[Mutation]) -> None:
    """InvalidArgument if the row mutation is larger than ``MAX_MUTATION_BYTES``."""
    size = mutation_bytes(row, mutations)
    if size > MAX_MUTATION_BYTES:
        raise InvalidArgument(
            f"row mutation of {row[:64]!r} is {size} bytes (keys, columns and values); the "
            f"limit is {MAX_MUTATION_BYTES} ({MAX_MUTATION_BYTES >> 20} MiB): split it into "
            f"several row mutations"
        )


def validate_rmw_rules(
    schema: TableSchema, row: bytes, rules: Sequence[ReadModifyWriteRule], identity: str | None
) -> None:
    """Read-modify-write rules need read and write access to their families."""
    check_replica_write(schema, identity)
    check_row_key(row)
    if not rules:
        raise InvalidArgument("read-modify-write has no rules")
    for r in rules:
        if not isinstance(r, AppendValue | IncrementValue):
            raise InvalidArgument(f"unknown read-modify-write rule {type(r).__name__}")
        _check_family(schema, r.family, identity, write=True)
        _check_family(schema, r.family, identity, write=False)
        _check_plain(schema, r.family, type(r).__name__)
        _check_qualifier(r.family, r.qualifier)
        if isinstance(r, AppendValue) and not isinstance(r.value, bytes):
            raise InvalidArgument(f"an append's value must be bytes, not {type(r.value).__name__}")
        if isinstance(r, IncrementValue):
            _check_int(r.amount, "an increment's amount")
        if isinstance(r, IncrementValue) and not -(2**63) <= r.amount < 2**63:
            raise InvalidArgument(f"increment {r.amount} does not fit in 64 bits")
