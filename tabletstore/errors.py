"""The one exception hierarchy of tabletstore.

Every public error says what the caller should do next (SlateDB RFC 0007's coarse errors;
docs/architecture/conventions.md convention 7). Third-party exceptions (botocore, aetcd, pyarrow,
grpc) are translated into these in exactly one place per dependency, with ``raise ... from exc``.

::

    TabletStoreError                  base; .retryable, .may_have_applied
    ├── InvalidArgument               bad input: fix the request, do not retry
    │   └── Unimplemented             the request is valid but not supported
    ├── NotFound                      a table, family, bucket or object does not exist
    ├── AlreadyExists                 create of something that already exists
    ├── PermissionDenied              the caller's identity may not do this (ACLs, §2/§5.3)
    ├── PreconditionFailed            a compare-and-swap lost, or a create-only PUT collided
    │   └── Fenced                    this process lost ownership (lease, log fence): stop
    ├── Corruption                    a checksum or format check failed: data is never returned
    ├── Unavailable                   transient: back off and retry (retryable)
    │   ├── NotServing                the tablet moved: refresh its location, retry (retryable)
    │   └── Unreachable               the request was never sent (connect failed): retry
    ├── Indeterminate                 the operation may or may not have been applied
    └── Closed                        the object was used after close()

``may_have_applied`` is True for Indeterminate only; every other error raised by a mutation
means the mutation was not applied. A missing row is an empty result, never an exception.

Across the wire (RPC ERROR frames, the per-entry errors of a MutateRows response) an error
travels as its :class:`ErrorCode` and message: :func:`error_code` and :func:`error_from_code`
read the one table, :data:`ERROR_CODES`, in both directions. A subclass defined elsewhere
travels as the code of its nearest ancestor here; a code this version does not know (a newer
peer's) arrives as a plain TabletStoreError naming it. Codes are never reused.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "ERROR_CODES",
    "AlreadyExists",
    "Closed",
    "Corruption",
    "ErrorCode",
    "Fenced",
    "Indeterminate",
    "InvalidArgument",
    "NotFound",
    "NotServing",
    "PermissionDenied",
    "PreconditionFailed",
    "TabletStoreError",
    "Unavailable",
    "Unimplemented",
    "Unreachable",
    "error_code",
    "error_from_code",
]


class TabletStoreError(Exception):
    """Base of every error tabletstore raises on purpose."""

    #: Retrying the same request later may succeed.
    retryable: bool = False
    #: A failed mutation may nevertheless have been applied.
    may_have_applied: bool = False


class InvalidArgument(TabletStoreError):
    """The request is malformed (oversized key, unknown family, bad regex, bad URL...)."""


class Unimplemented(InvalidArgument):
    """The request is well formed but this feature is not supported."""


class NotFound(TabletStoreError):
    """A table, column family, bucket or object does not exist."""


class AlreadyExists(TabletStoreError):
    """Something with that name already exists."""


class PermissionDenied(TabletStoreError):
    """The caller's identity is not allowed to read or write this column family."""


class PreconditionFailed(TabletStoreError):
    """A conditional operation's condition did not hold (create-only PUT, compare-and-swap)."""


class Fenced(PreconditionFailed):
    """This process no longer owns what it was writing (lease lost, log fenced): stop."""


class Corruption(TabletStoreError):
    """A checksum or format check failed. The bad data is never returned."""


class Unavailable(TabletStoreError):
    """A dependency (S3, etcd, a worker) is unreachable or overloaded: back off and retry."""

    retryable = True


class NotServing(Unavailable):
    """The addressed worker does not serve that tablet (any more): refresh location, retry."""


class Unreachable(Unavailable):
    """The peer could not be reached, so the request was never sent: safe to retry even when
    the request is not idempotent."""


class Indeterminate(TabletStoreError):
    """The outcome is unknown: the operation may have been applied."""

    retryable = True
    may_have_applied = True


class Closed(TabletStoreError):
    """The object was used after it was closed."""


class ErrorCode(IntEnum):
    """The stable wire code of each error class (never reused; a new class takes a new one)."""

    UNKNOWN = 1
    INVALID_ARGUMENT = 2
    UNIMPLEMENTED = 3
    NOT_FOUND = 4
    ALREADY_EXISTS = 5
    PERMISSION_DENIED = 6
    PRECONDITION_FAILED = 7
    FENCED = 8
    CORRUPTION = 9
    UNAVAILABLE = 10
    NOT_SERVING = 11
    UNREACHABLE = 12
    INDETERMINATE = 13
    CLOSED = 14


#: Every class of the hierarchy and its wire code: the one table, read both ways.
ERROR_CODES: dict[type[TabletStoreError], ErrorCode] = {
    TabletStoreError: ErrorCode.UNKNOWN,
    InvalidArgument: ErrorCode.INVALID_ARGUMENT,
    Unimplemented: ErrorCode.UNIMPLEMENTED,
    NotFound: ErrorCode.NOT_FOUND,
    AlreadyExists: ErrorCode.ALREADY_EXISTS,
    PermissionDenied: ErrorCode.PERMISSION_DENIED,
    PreconditionFailed: ErrorCode.PRECONDITION_FAILED,
    Fenced: ErrorCode.FENCED,
    Corruption: ErrorCode.CORRUPTION,
    Unavailable: ErrorCode.UNAVAILABLE,
    NotServing: ErrorCode.NOT_SERVING,
    Unreachable: ErrorCode.UNREACHABLE,
    Indeterminate: ErrorCode.INDETERMINATE,
    Closed: ErrorCode.CLOSED,
}
_BY_CODE: dict[int, type[TabletStoreError]] = {int(c): cls for cls, c in ERROR_CODES.items()}


def error_code(exc: TabletStoreError) -> ErrorCode:
    """``exc``'s wire code: its class's, or its nearest ancestor's in :data:`ERROR_CODES`."""
    for cls in type(exc).__mro__:
        code = ERROR_CODES.get(cls)  # type: ignore[call-overload]
        if code is not None:
            return code
    return ErrorCode.UNKNOWN


def error_from_code(code: int, message: str) -> TabletStoreError:
    """The error a peer sent as ``code`` and ``message``; an unknown code (from a newer peer)
    becomes a plain TabletStoreError naming it, neither retryable nor possibly applied."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return TabletStoreError(f"error code {code} (unknown to this version): {message}")
    return cls(message)
