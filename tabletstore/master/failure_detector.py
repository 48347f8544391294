"""Fast failure detection: the master ends a dead worker's lease instead of waiting it out (§5.2).

Paper §5.2: "the master is responsible for detecting when a tablet server is no longer serving
its tablets ... the master periodically asks each tablet server for the status of its lock. If
a tablet server reports that it has lost its lock, or if the master was unable to reach a
server during its last several attempts, the master attempts to acquire an exclusive lock on
the server's file ... the master ensures that the tablet server can never serve again by
deleting its server file." Here a worker's "file" is its ``servers/<worker>`` key and its
lock is its lease: without this module a dead worker's tablets are recovered only once its
lease runs out (up to the TTL after its last keep-alive), and that wait is most of a recovery
on a quiet cluster.

:class:`FailureDetector` probes every worker in the servers directory every ``interval``
seconds by opening (and at once closing) a TCP connection to its advertised RPC address. When
``refusals`` probes in a row are *refused* (ECONNREFUSED: nothing listens there), it revokes
the worker's lease by the id its servers entry carries (``Coordinator.revoke_lease``): its
servers entry and every claim go at once, and the next assignment round (woken by
``on_revoked``) recovers its tablets.

Why only a refused connection, never a timeout (safety)
-------------------------------------------------------
Revoking a lease takes the tablets away from a worker that may not know it: its reads are
refused only past its *own* safe lease time, computed from its last successful keep-alive
(``Lease.safe_until``), and a revoked-but-running worker still believes its lease valid until
its next keep-alive is answered "lease not found" (up to a third of the TTL later). Writes are
safe regardless (a new owner fences the old log before replaying it, docs/architecture/design.md §6
rule 4, so a zombie's later appends fail and are never acknowledged), but a stale *read* from such a
worker after the new owner acknowledged a write would be wrong. So the master revokes only when the
worker provably serves nothing any more:

* a connection to the worker's own listening address is refused only when no socket listens
  there. A worker opens its RPC listener before it registers and closes it only when it stops:
  the process died (the kernel closed every socket it had: no connection can carry a request),
  or ``run_worker`` is shutting down, and then the server stops reading requests on its
  connections (``RpcServer.close`` drains them) and never serves a new one;
* a *paused* (SIGSTOP), overloaded or partitioned worker is never revoked early: its kernel
  still completes the TCP handshake (the listen backlog), so the probe connects, or it times
  out; a timeout is not proof of anything, and the lease's TTL decides as before;
* a worker stopping on purpose closes its listener first and then flushes and hands over
  its tablets, which may take seconds: it puts ``draining/<worker-id>`` (on its lease) before
  closing the listener, and is never probed while that key exists, so its tablets move
  cleanly (flushed) rather than by recovery;
* a new process that takes the port answers, so it is not mistaken for a dead one (and a
  different worker has a different id and lease anyway); the revocation is by the lease id
  read with the address, so it can never end a later lease.

The one assumption: a refusal comes from the worker's host, not from a firewall rejecting the
master's packets only (a REJECT rule between master and workers that spares clients). Such a
deployment must turn the probes off (``MasterOptions.probe_interval = None``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.errors import InvalidArgument, TabletStoreError

__all__ = ["FailureDetector", "Refusals", "probe"]

log = logging.getLogger(__name__)


@dataclass
class Refusals:
    """The pure part: consecutive refused probes per (worker, lease id), and when to revoke."""

    needed: int
    _count: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.needed < 1:
            raise InvalidArgument(f"refusals must be at least 1, got {self.needed}")

    def observe(self, worker: str, lease_id: int, refused: bool) -> bool:
        """Record one probe's outcome; True when this worker's lease is to be revoked now
        (``needed`` refusals in a row; a connected or timed-out probe starts over)."""
        key = (worker, lease_id)
        if not refused:
            self._count.pop(key, None)
            return False
        self._count[key] = n = self._count.get(key, 0) + 1
        return n >= self.needed

    def retain(self, live: set[tuple[str, int]]) -> None:
        """Forget the workers no longer in the servers directory."""
        self._count = {k: n for k, n in self._count.items() if k in live}


async def probe(address: str, *, within: float) -> bool:
    """True if a TCP connection to ``address`` (``host:port``) is refused (nothing listens);
    False if it connects, times out or fails in any other way (nothing is proven then)."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(within):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    try:
        async with asyncio.timeout(within):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        pass
    return False


class FailureDetector:
    """Probes the servers directory's workers and revokes the leases of dead ones (module
    docstring). ``on_revoked`` is called after each revocation (it wakes the assignment)."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        interval: float,
        refusals: int = 2,
        timeout: float = 1.0,
        on_revoked: Callable[[str], None] | None = None,
    ) -> None:
        if interval <= 0 or timeout <= 0:
            raise InvalidArgument(
                f"probe interval and timeout must be > 0, got {interval}, {timeout}"
            )
        self._coord = coordinator
        self._interval = interval
        self._timeout = timeout
        self._refusals = Refusals(refusals)
        #: Called after each revocation (the master wakes its assignment loop).
        self.on_revoked = on_revoked
        #: Worker ids whose lease this detector revoked (status pages, tests).
        self.revoked: list[str] = []

    async def run(self) -> None:
        """Probe rounds until cancelled; a coordinator error skips a round."""
        while True:
            try:
                await self.round()
            except TabletStoreError as exc:
                log.warning("failure detection round failed: %s", exc)
            await asyncio.sleep(self._interval)

    async def round(self) -> list[str]:
        """One probe of every registered worker; returns the workers whose lease it revoked."""
        draining = {
            paths.parse_draining(kv.key) for kv in await self._coord.get_prefix(paths.DRAINING)
        }
        kvs = await self._coord.get_prefix(paths.SERVERS)
        workers = [
            (paths.parse_server(kv.key), kv.lease_id, kv.value.decode())
            for kv in kvs
            if kv.lease_id and paths.parse_server(kv.key) not in draining
        ]
        self._refusals.retain({(w, lease) for w, lease, _ in workers})
        refused = await asyncio.gather(
            *(probe(address, within=self._timeout) for _, _, address in workers)
        )
        revoked = []
        for (worker, lease_id, address), was_refused in zip(workers, refused, strict=True):
            if not self._refusals.observe(worker, lease_id, was_refused):
                continue
            log.warning(
                "worker %s refuses connections at %s: it is gone; revoking its lease %x "
                "so its tablets are recovered now (§5.2)",
                worker,
                address,
                lease_id,
            )
            await self._coord.revoke_lease(lease_id)
            self._refusals.observe(worker, lease_id, False)
            self.revoked.append(worker)
            revoked.append(worker)
            if self.on_revoked is not None:
                self.on_revoked(worker)
        return revoked
