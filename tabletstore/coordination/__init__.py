"""Coordination: what Bigtable asks of Chubby (§4), served by etcd or in process.

Open one by URL (the scheme chooses the implementation, like ``storage_s3``'s stores):

* ``etcd://host:port[,host:port]/<namespace>`` — a real etcd 3.4 cluster (``etcd.py``);
* ``memory://<name>`` — in process; the same name in one process shares state
  (``memory://`` alone is private), for the embedded mode and tests (``memory.py``).

Modules: ``base`` (the protocol and value types), ``lease`` (the holder's view of a lease and
the fencing deadline), ``election`` (leader election over any coordinator), ``paths`` (every
key), ``memory`` and ``etcd`` (the implementations).
"""

from __future__ import annotations

from tabletstore.clock import Clock
from tabletstore.coordination.base import (
    Compare,
    CompareOp,
    CompareTarget,
    Coordinator,
    Delete,
    DeleteResult,
    EventType,
    Get,
    GetResult,
    KeyValue,
    Lease,
    Op,
    OpResult,
    Put,
    PutResult,
    TxnResult,
    Watch,
    WatchEvent,
    absent,
    create_revision_is,
    mod_revision_is,
    value_is,
    version_is,
)
from tabletstore.coordination.election import Election, Observation
from tabletstore.errors import InvalidArgument

__all__ = [
    "Compare",
    "CompareOp",
    "CompareTarget",
    "Coordinator",
    "Delete",
    "DeleteResult",
    "Election",
    "EventType",
    "Get",
    "GetResult",
    "KeyValue",
    "Lease",
    "Observation",
    "Op",
    "OpResult",
    "Put",
    "PutResult",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "absent",
    "check",
    "create_revision_is",
    "mod_revision_is",
    "open_coordinator",
    "value_is",
    "version_is",
]

SCHEMES = ("etcd://", "memory://")


def open_coordinator(url: str, *, clock: Clock | None = None) -> Coordinator:
    """The coordinator for ``url``. Connects lazily; call ``check()`` to fail fast."""
    if not isinstance(url, str):
        raise InvalidArgument(f"a coordinator URL is a str, got {type(url).__name__}")
    if url.startswith("memory://"):
        from tabletstore.coordination.memory import MemoryCoordinator

        name = url[len("memory://") :]
        if "/" in name:
            raise InvalidArgument(f"bad memory coordinator URL {url!r}: expected memory://<name>")
        return MemoryCoordinator.open(name, clock=clock)
    if url.startswith("etcd://"):
        from tabletstore.coordination.etcd import EtcdCoordinator

        return EtcdCoordinator(url, clock=clock)
    raise InvalidArgument(
        f"unsupported coordinator URL {url!r}: expected one of "
        "etcd://host:port[,host:port]/<namespace> or memory://<name>"
    )


async def check(url: str) -> None:
    """Open ``url``, make one round trip and close: Unavailable (naming the endpoint) if down."""
    coordinator = open_coordinator(url)
    try:
        await coordinator.check()
    finally:
        await coordinator.close()
