"""Table schemas: column families, garbage-collection rules, locality groups, ACLs (§2, §6).

Schemas are pydantic models: they arrive from users and are stored as JSON in the
coordination layer (the paper keeps them in Chubby, §4), so they are validated at the
boundary with precise errors and never in hot paths.

Garbage collection (§2 "Timestamps"): a family keeps either the last N versions of each
column, versions newer than an age, or the union / intersection of such rules. A *union*
collects a cell when any member rule would collect it; an *intersection* only when every
member would (Cloud Bigtable's semantics). :func:`is_garbage` is the one evaluation of a rule
and is used by reads and compactions alike.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

__all__ = [
    "MAX_FAMILY_NAME",
    "Acl",
    "ColumnFamily",
    "GcRule",
    "IntersectionRule",
    "LocalityGroup",
    "MaxAgeRule",
    "MaxVersionsRule",
    "ReplicaOf",
    "TableSchema",
    "UnionRule",
    "counts_versions",
    "is_garbage",
    "validate_family_name",
    "validate_table_name",
]

MAX_FAMILY_NAME = 64
_FAMILY_RE = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no space
_TABLE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def validate_family_name(name: str) -> str:
    """Family names are printable (§2), non-empty, at most 64 characters, without ``:``."""
    if not name or len(name) > MAX_FAMILY_NAME or not _FAMILY_RE.match(name) or ":" in name:
        raise ValueError(
            f"column family name {name!r} must be 1-{MAX_FAMILY_NAME} printable ASCII "
            "characters without spaces or ':'"
        )
    return name


def validate_table_name(name: str) -> str:
    """Table names: 1-64 of letters, digits, ``_``, ``-`` and ``.`` (64: a Cloud Bigtable
    table id of 50 under the front door's 12-character instance prefix)."""
    if not _TABLE_RE.match(name):
        raise ValueError(f"table name {name!r} must be 1-64 characters of [A-Za-z0-9_.-]")
    return name


#: The longest history window a table keeps (seconds): 35 days.
MAX_HISTORY = 35 * 86400.0
#: ``TableSchema.history`` of a table that keeps no history whatever the database's default
#: window (an explicit opt-out; None is "not set": the default applies).
HISTORY_OFF = 0.0
#: The longest change retention a table keeps (seconds): 7 days, as Cloud Bigtable's.
MAX_CHANGES = 7 * 86400.0


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MaxVersionsRule(_Frozen):
    """Keep only the newest ``max_versions`` versions of each column."""

    type: Literal["max_versions"] = "max_versions"
    max_versions: int = Field(ge=1)


class MaxAgeRule(_Frozen):
    """Keep only versions whose timestamp is newer than ``max_age_seconds`` ago."""

    type: Literal["max_age"] = "max_age"
    max_age_seconds: float = Field(gt=0)


class UnionRule(_Frozen):
    """Collect a cell when any member rule would."""

    type: Literal["union"] = "union"
    rules: list[GcRule] = Field(min_length=1)


class IntersectionRule(_Frozen):
    """Collect a cell only when every member rule would."""

    type: Literal["intersection"] = "intersection"
    rules: list[GcRule] = Field(min_length=1)


GcRule = Annotated[
    MaxVersionsRule | MaxAgeRule | UnionRule | IntersectionRule, Field(discriminator="type")
]
UnionRule.model_rebuild()
IntersectionRule.model_rebuild()


def is_garbage(rule: GcRule | None, version_index: int, ts: int, now_micros: int) -> bool:
    """Whether a rule collects the ``version_index``-th newest visible version (0 = newest)
    of a column, whose timestamp is ``ts`` microseconds, at time ``now_micros``."""
    if rule is None:
        return False
    if isinstance(rule, MaxVersionsRule):
        return version_index >= rule.max_versions
    if isinstance(rule, MaxAgeRule):
        return ts < now_micros - int(rule.max_age_seconds * 1_000_000)
    if isinstance(rule, UnionRule):
        return any(is_garbage(r, version_index, ts, now_micros) for r in rule.rules)
    return all(is_garbage(r, version_index, ts, now_micros) for r in rule.rules)


def counts_versions(rule: GcRule | None) -> bool:
    """Whether ``rule`` (or any rule it combines) collects by version count: whether a
    version's fate depends on how many newer versions are visible, so a deletion of newer
    versions can save it."""
    if rule is None:
        return False
    if isinstance(rule, MaxVersionsRule):
        return True
    if isinstance(rule, MaxAgeRule):
        return False
    return any(counts_versions(r) for r in rule.rules)


class Acl(_Frozen):
    """Who may read and write a family (§2 access control, §5.3 authorization).

    ``None`` means everybody; a list names the identities allowed (``"*"`` also means all).
    """

    readers: list[str] | None = None
    writers: list[str] | None = None

    def may_read(self, identity: str | None) -> bool:
        return self.readers is None or "*" in self.readers or identity in self.readers

    def may_write(self, identity: str | None) -> bool:
        return self.writers is None or "*" in self.writers or identity in self.writers


class ColumnFamily(_Frozen):
    """A column family: the unit of access control and of garbage collection (§2).

    ``value_type`` makes it an aggregate family (``data.aggregates``): ``sum``, ``min``,
    ``max`` (64-bit integers) or ``hll`` (distinct count); None = plain byte values. It is
    fixed when the family is created (the master refuses to change it)."""

    name: str
    gc_rule: GcRule | None = None
    locality_group: str = "default"
    acl: Acl = Acl()
    value_type: Literal["sum", "min", "max", "hll"] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return validate_family_name(v)

    @model_serializer(mode="wrap")
    def _omit_plain(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # A plain family serializes as before value types existed (stored schemas, wire).
        out: dict[str, object] = handler(self)
        if self.value_type is None:
            out.pop("value_type", None)
        return out


Compression = Literal["zstd", "lz4", "snappy", "none"]


class LocalityGroup(_Frozen):
    """Families stored together in one SSTable per tablet (§6 "Locality groups")."""

    name: str
    compression: Compression = "zstd"
    in_memory: bool = False
    block_size: int = Field(default=64 * 1024, ge=1024, le=64 * 1024 * 1024)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return validate_family_name(v)


class ReplicaOf(_Frozen):
    """What a replica table follows (``client/replicator.py``): table ``table`` of the cluster
    at ``source`` (its coordinator URL). While a table has one, only the replicator writes it
    (``data/validation.py``); ``promoting`` refuses every write for the seconds a promotion
    takes to fence the replicator's last writes off from the first client writes."""

    source: str
    table: str
    promoting: bool = False


class TableSchema(_Frozen):
    """A table's families and locality groups, and who administers it.

    ``admins``: the principals that may delete the table, change its families and ACLs, and
    snapshot or bulk-load it, checked by a master with auth on
    (``master/master_service_guard.py``; the creator is added at creation). None: anyone may
    (tables made without auth)."""

    name: str
    # Left out of the JSON while unset, so schemas written without auth read as before.
    admins: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)
    families: dict[str, ColumnFamily] = Field(default_factory=dict)
    locality_groups: dict[str, LocalityGroup] = Field(
        default_factory=lambda: {"default": LocalityGroup(name="default")}
    )
    #: Seconds of history the table keeps: any instant this far back can be restored
    #: (``master/pitr_restore.py``; the master checkpoints the table and garbage collection
    #: keeps the commit log that long). None: not set, the database's default window applies
    #: (``master/checkpoints.py`` ``window_of``); :data:`HISTORY_OFF` (0): no history, whatever
    #: the default. Left out of the JSON while unset.
    history: float | None = Field(default=None, exclude_if=lambda v: v is None)
    #: Seconds of change retention: the table's change stream (``client/change_stream.py``)
    #: can be read this far back (garbage collection keeps the commit log that long). None:
    #: no change stream. Left out of the JSON while unset.
    changes: float | None = Field(default=None, exclude_if=lambda v: v is None)
    #: The table it replicates, while it is a replica (docs/operations/replication.md): only
    #: the replicator writes it. None: a primary. Left out of the JSON while unset.
    replica_of: ReplicaOf | None = Field(default=None, exclude_if=lambda v: v is None)

    @field_validator("history")
    @classmethod
    def _history(cls, v: float | None) -> float | None:
        if v is not None and v != HISTORY_OFF and not 0 < v <= MAX_HISTORY:
            raise ValueError(
                f"history window must be more than 0 and at most {MAX_HISTORY / 86400:.0f} "
                f"days (or {HISTORY_OFF:g}: off, whatever the database's default), got {v} "
                "seconds"
            )
        return v

    @field_validator("changes")
    @classmethod
    def _changes(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v <= MAX_CHANGES:
            raise ValueError(
                f"change retention must be more than 0 and at most {MAX_CHANGES / 86400:.0f} "
                f"days, got {v} seconds"
            )
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return validate_table_name(v)

    @model_validator(mode="after")
    def _consistent(self) -> TableSchema:
        for key, fam in self.families.items():
            if key != fam.name:
                raise ValueError(f"family key {key!r} differs from its name {fam.name!r}")
            if fam.locality_group not in self.locality_groups:
                raise ValueError(
                    f"family {fam.name!r} names unknown locality group {fam.locality_group!r}"
                )
        for key, group in self.locality_groups.items():
            if key != group.name:
                raise ValueError(f"locality group key {key!r} differs from its name {group.name!r}")
        return self

    def group_of(self, family: str) -> str:
        """The locality group of a family (KeyError if the family is unknown)."""
        return self.families[family].locality_group
