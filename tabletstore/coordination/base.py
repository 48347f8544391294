"""The Coordinator interface: what tabletstore needs from Chubby (§4), served by etcd.

Bigtable uses Chubby for five things (§4): one active master (an exclusive lock held under a
session), the servers directory (one file per tablet server, locked under its session), the
root tablet's location, schemas and ACLs. tabletstore asks the same of a :class:`Coordinator`:

* **leases** replace Chubby sessions: a key put with ``lease=`` vanishes when the lease ends
  (revoked, or not kept alive for ``ttl`` seconds);
* **transactions** compare a key's value, ``create_revision``, ``mod_revision`` or ``version``
  and then apply puts, deletes and gets atomically (an absent key has ``create_revision == 0``);
* **watches** stream every change under a prefix in revision order, optionally from an older
  revision, so a reader can list a prefix and then follow it without missing a change;
* **elections** (``election.py``) are built from those three, once, for every implementation.

Revisions are etcd's: one global counter that every write (put, delete, write transaction)
increases by one. A key's ``create_revision`` is the revision that created it and is the
*epoch* docs/architecture/design.md §6 uses for fencing: a claim re-created by a new owner has a
larger one.

Contracts every implementation keeps (checked by
``tabletstore.testing.coordinator_conformance``):

* keys are non-empty ``str`` (UTF-8, relative to the coordinator's namespace); values ``bytes``;
* ``get`` returns ``None`` for a missing key; ``get_prefix`` returns keys in ascending order;
* a put whose lease has ended raises :class:`~tabletstore.errors.Fenced`;
* a transaction whose compares fail is a normal result (``succeeded=False``), not an error;
* a watch delivers events in revision order, each exactly once, with ``prev_kv`` where the
  backend still has it; an unreachable backend raises
  :class:`~tabletstore.errors.Unavailable` naming the endpoint.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from tabletstore.errors import InvalidArgument

if TYPE_CHECKING:
    from tabletstore.coordination.election import Election

__all__ = [
    "Compare",
    "CompareOp",
    "CompareTarget",
    "Coordinator",
    "Delete",
    "DeleteResult",
    "EventType",
    "Get",
    "GetResult",
    "KeyValue",
    "Lease",
    "LeaseKeepAlive",
    "Op",
    "OpResult",
    "Put",
    "PutResult",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "absent",
    "check_key",
    "create_revision_is",
    "mod_revision_is",
    "value_is",
    "version_is",
]


def check_key(key: str, *, what: str = "key") -> str:
    """Return ``key`` if it is a valid coordinator key, else raise InvalidArgument."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"coordinator {what} must be a non-empty str, got {key!r}")
    if "\x00" in key:
        raise InvalidArgument(f"coordinator {what} must not contain NUL: {key!r}")
    return key


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as the coordinator stores it (etcd's mvccpb.KeyValue)."""

    key: str
    value: bytes
    #: Revision of the write that created this key (0 only in DELETE events).
    create_revision: int
    #: Revision of the last write to this key (for DELETE events: the deleting revision).
    mod_revision: int
    #: Number of writes since creation: 1 after the creating put.
    version: int
    #: The lease the key is attached to, 0 for none.
    lease_id: int = 0


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch. ``kv.mod_revision`` is the revision of the change."""

    type: EventType
    kv: KeyValue
    #: The key before the change, when the backend still has it.
    prev_kv: KeyValue | None = None

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


# ----------------------------------------------------------------------------- transactions


class CompareTarget(enum.Enum):
    VALUE = "value"
    CREATE = "create_revision"
    MOD = "mod_revision"
    VERSION = "version"


class CompareOp(enum.Enum):
    EQUAL = "=="
    NOT_EQUAL = "!="
    LESS = "<"
    GREATER = ">"


@dataclass(frozen=True, slots=True)
class Compare:
    """``<target of key> <op> <operand>``; all compares of a transaction must hold.

    As in etcd, an absent key has create_revision, mod_revision and version 0, and any VALUE
    compare on an absent key fails (whatever the operator).
    """

    key: str
    target: CompareTarget
    op: CompareOp
    operand: bytes | int

    def __post_init__(self) -> None:
        check_key(self.key)
        if self.target is CompareTarget.VALUE:
            if not isinstance(self.operand, bytes):
                raise InvalidArgument(f"a VALUE compare needs bytes, got {self.operand!r}")
        elif not isinstance(self.operand, int) or isinstance(self.operand, bool):
            raise InvalidArgument(
                f"a {self.target.value} compare needs an int, got {self.operand!r}"
            )

    def holds(self, kv: KeyValue | None) -> bool:
        """Evaluate this compare against the key's current state (None: absent)."""
        if kv is None and self.target is CompareTarget.VALUE:
            return False
        actual: bytes | int
        if self.target is CompareTarget.VALUE:
            assert kv is not None
            actual = kv.value
        elif kv is None:
            actual = 0
        elif self.target is CompareTarget.CREATE:
            actual = kv.create_revision
        elif self.target is CompareTarget.MOD:
            actual = kv.mod_revision
        else:
            actual = kv.version
        return _apply_op(self.op, actual, self.operand)


def _apply_op(op: CompareOp, actual: bytes | int, operand: bytes | int) -> bool:
    if op is CompareOp.EQUAL:
        return actual == operand
    if op is CompareOp.NOT_EQUAL:
        return actual != operand
    if op is CompareOp.LESS:
        return actual < operand  # type: ignore[operator]
    return actual > operand  # type: ignore[operator]


def value_is(key: str, value: bytes) -> Compare:
    return Compare(key, CompareTarget.VALUE, CompareOp.EQUAL, value)


def absent(key: str) -> Compare:
    """The key does not exist (etcd idiom: create_revision == 0)."""
    return Compare(key, CompareTarget.CREATE, CompareOp.EQUAL, 0)


def create_revision_is(key: str, revision: int) -> Compare:
    return Compare(key, CompareTarget.CREATE, CompareOp.EQUAL, revision)


def mod_revision_is(key: str, revision: int) -> Compare:
    return Compare(key, CompareTarget.MOD, CompareOp.EQUAL, revision)


def version_is(key: str, version: int) -> Compare:
    return Compare(key, CompareTarget.VERSION, CompareOp.EQUAL, version)


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    #: Attach the key to this lease (0: none). A lease that has ended fails the whole txn.
    lease_id: int = 0

    def __post_init__(self) -> None:
        check_key(self.key)
        if not isinstance(self.value, bytes):
            raise InvalidArgument(f"coordinator values are bytes, got {type(self.value).__name__}")


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``key``, or every key starting with it when ``prefix`` is set."""

    key: str
    prefix: bool = False

    def __post_init__(self) -> None:
        check_key(self.key)


@dataclass(frozen=True, slots=True)
class Get:
    """Read ``key``, or every key starting with it (in key order) when ``prefix`` is set."""

    key: str
    prefix: bool = False

    def __post_init__(self) -> None:
        check_key(self.key)


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class PutResult:
    #: The revision of the transaction; the key's new mod_revision.
    revision: int


@dataclass(frozen=True, slots=True)
class DeleteResult:
    deleted: int


@dataclass(frozen=True, slots=True)
class GetResult:
    kvs: tuple[KeyValue, ...]


OpResult = PutResult | DeleteResult | GetResult


class TxnResult(NamedTuple):
    """``(succeeded, results)``: results holds one entry per op of the branch that ran."""

    succeeded: bool
    results: tuple[OpResult, ...]


def check_txn_ops(ops: Sequence[Op]) -> None:
    """etcd's rule: a transaction branch may not write the same key twice."""
    put_keys = [op.key for op in ops if isinstance(op, Put)]
    if len(set(put_keys)) != len(put_keys):
        raise InvalidArgument(f"a transaction puts the same key twice: {put_keys}")
    for op in ops:
        if isinstance(op, Delete):
            for key in put_keys:
                if key == op.key or (op.prefix and key.startswith(op.key)):
                    raise InvalidArgument(f"a transaction puts and deletes {key!r}")


# ----------------------------------------------------------------------------- leases


@runtime_checkable
class LeaseKeepAlive(Protocol):
    """An async context manager that keeps a lease alive while it is entered."""

    async def __aenter__(self) -> Lease: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class Lease(Protocol):
    """A Chubby session: keys attached to it vanish when it ends (§4).

    ``last_renewed`` is the holder's clock reading (``Clock.monotonic``) taken *before* the
    last successful grant or keep-alive was sent, so the lease cannot end at the server
    before ``last_renewed + ttl``. :meth:`safe_until` subtracts a safety margin from that;
    a worker acknowledges writes only while ``clock.monotonic() < lease.safe_until()``
    (docs/architecture/design.md §6, fencing rule 1).
    """

    @property
    def id(self) -> int: ...

    @property
    def ttl(self) -> float:
        """Seconds the lease lives without a keep-alive (as granted by the server)."""
        ...

    @property
    def last_renewed(self) -> float: ...

    @property
    def expired(self) -> bool:
        """True once the holder must consider the lease gone: revoked, reported gone by the
        server, or ``last_renewed + ttl`` has passed without a successful keep-alive."""
        ...

    def safe_until(self) -> float:
        """``last_renewed + ttl - safety_margin`` on the holder's monotonic clock."""
        ...

    async def refresh(self) -> None:
        """Send one keep-alive. Raises Fenced if the lease is already gone."""
        ...

    def keep_alive(self, *, interval: float | None = None) -> LeaseKeepAlive:
        """Refresh every ``interval`` seconds (default ``ttl / 3``) while entered.

        Failed refreshes are retried until the lease expires; the loop then stops and
        ``expired`` becomes true. Leaving the context stops refreshing (it does not revoke).
        """
        ...

    async def wait_expired(self) -> None:
        """Return once ``expired`` is true."""
        ...

    async def revoke(self) -> None:
        """End the lease now, deleting its keys. Idempotent."""
        ...


# ----------------------------------------------------------------------------- watches


@runtime_checkable
class Watch(Protocol):
    """A stream of :class:`WatchEvent`; an async context manager and an async iterator.

    The watch is established when ``__aenter__`` returns (or on the first ``__anext__``):
    without ``start_revision`` it reports every change made after that point; with it, every
    change at or after that revision. Leaving the context cancels it.
    """

    async def __aenter__(self) -> Watch: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def __aiter__(self) -> AsyncIterator[WatchEvent]: ...

    async def __anext__(self) -> WatchEvent: ...

    async def close(self) -> None: ...


# ----------------------------------------------------------------------------- coordinator


@runtime_checkable
class Coordinator(Protocol):
    """Leases, keys, transactions, watches and elections (the Chubby of §4)."""

    #: The URL this coordinator was opened from, for messages (``etcd://h:p/ns``).
    url: str

    async def check(self) -> None:
        """Raise Unavailable (naming the endpoint) unless the backend answers."""
        ...

    async def grant_lease(self, ttl: float, *, safety_margin: float | None = None) -> Lease:
        """A new lease of at least ``ttl`` seconds. ``safety_margin`` defaults to ttl / 10."""
        ...

    async def revoke_lease(self, lease_id: int) -> None:
        """End someone else's lease by id (``KeyValue.lease_id``), deleting its keys at once:
        the master's fast failure detection (``master/failure_detector.py``). Idempotent: a
        lease already gone is no error."""
        ...

    async def get(self, key: str) -> KeyValue | None: ...

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Every key starting with ``prefix`` (``""``: all keys), in ascending key order."""
        ...

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        """Write the key; return the new revision. Fenced if ``lease`` has ended."""
        ...

    async def delete(self, key: str) -> bool:
        """Delete the key; True if it existed."""
        ...

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix``; return how many were deleted."""
        ...

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[Op],
        on_failure: Sequence[Op] = (),
    ) -> TxnResult:
        """If every compare holds run ``on_success`` else ``on_failure``, atomically."""
        ...

    def watch_prefix(self, prefix: str, *, start_revision: int | None = None) -> Watch:
        """Follow every change under ``prefix`` (see :class:`Watch`)."""
        ...

    def election(self, name: str) -> Election:
        """The leader election called ``name`` (see ``election.py``)."""
        ...

    async def close(self) -> None:
        """Release connections; leases are not revoked (they expire on their own)."""
        ...
