"""Which wire-protocol versions a process speaks, and which one a connection uses.

A cluster is upgraded one process at a time (docs/operations/upgrades.md), so for a while
processes of two releases talk to each other. The promise that makes this safe: every build
speaks its own protocol version N and the one before it, N−1 (:data:`SPOKEN`); two peers use
the highest version both speak; a peer that speaks neither gets an error naming both sides'
versions, and nothing is exchanged.

What travels: the hello's u16 version field (frames.py) carries the *highest* version its
sender speaks. The hello's ten bytes are those every earlier version reads, so a build that
speaks a range is still understood by one that checks for a single version. The lowest version
need not travel: both sides' ranges are contiguous, so the highest version both speak is the
lower of the two highest versions, and each side checks by itself that this is not below its
own lowest (:func:`negotiate`). Both sides compute the same number from the two hellos; a side
that cannot speak it refuses the connection (the server with an ERROR naming both versions, so
the client's calls fail Unimplemented with it).

What a version adds is sent only on a connection of that version or later: a request that
needs it on an older connection fails, before anything is sent, with Unimplemented naming the
versions (:func:`require`). The versions and what each added are listed below and in
docs/architecture/wire.md.

Pure: no I/O. ``tabletstore worker|master --max-protocol-version`` caps a process at an older
version (:func:`spoken`), which is how an upgrade across a protocol change is rehearsed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tabletstore.errors import InvalidArgument, Unimplemented

__all__ = [
    "LOAD_TABLET_AT_VERSION",
    "OLDEST_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "REQUEST_AS_VERSION",
    "RESTORE_COPIED_VERSION",
    "SET_REPLICA_VERSION",
    "SPOKEN",
    "Versions",
    "negotiate",
    "require",
    "spoken",
]

#: 2: errors travel as ErrorCode numbers (ERROR frames, MutateRows entry errors), not names.
#: 3: fields added to ReadRowsRequest (reverse, stats) and the bulk-load messages (load_id), wire
#: types AddToCell/MergeToCell (10, 11), ScanProgress (79), SetAdminsRequest (97), the AUTH frame.
#: 4: RowBatch sent column-wise (wire id 44, was 64), AdoptCompactionRequest (12),
#: BulkLoadTabletRequest.adopt.
#: 5: read_points (per-worker coalesced point reads): TabletKeys, PointReadsRequest,
#: PointReadsResponse (50-52).
#: 6: mutate_tablets (per-worker coalesced single-row writes): TabletMutations,
#: MutateTabletsRequest (53, 54); decoded fields are checked against their type hints.
#: 7: the REQUEST_AS frame (a request on behalf of a delegated principal).
#: 8: load_tablet_at (LoadTabletAtRequest, 80): a load names the tablet's METADATA row;
#: set_replica (SetReplicaRequest, 123): the master makes a table a replica or a primary;
#: restore_copied (RestoreTableRequest's optional ``copied``, CopiedBackup, 13): a restore
#: from another location says what its copy verified.
PROTOCOL_VERSION = 8
#: The oldest version this build speaks: N−1. Raising it (a version bump) drops the oldest;
#: whatever a version added must keep a :func:`require` check until then.
OLDEST_PROTOCOL_VERSION = 7
#: The version that added the REQUEST_AS frame (frames.py).
REQUEST_AS_VERSION = 7
#: The version that added the ``load_tablet_at`` method (LoadTabletAtRequest). A method a
#: version added carries it (``transport.Method.since``): a call of it on an older connection
#: fails with Unimplemented before anything is sent (:func:`require`), so its caller can fall
#: back to the method it replaces.
LOAD_TABLET_AT_VERSION = 8
#: The version that added the master's ``set_replica`` method (SetReplicaRequest): refused on
#: an older connection before it is sent, as :data:`LOAD_TABLET_AT_VERSION` (it has no older
#: method to fall back to; the caller reports the master too old).
SET_REPLICA_VERSION = 8
#: The version that added the master's ``restore_copied`` method (a RestoreTableRequest with
#: its ``copied`` field): refused on an older connection before it is sent, and by a master
#: of this version built before it (no such method: Unimplemented, nothing run); the client
#: then sends ``restore_table`` without the field.
RESTORE_COPIED_VERSION = 8


@dataclass(frozen=True, slots=True)
class Versions:
    """The contiguous range of protocol versions one side speaks."""

    lowest: int
    highest: int

    def __post_init__(self) -> None:
        if not 1 <= self.lowest <= self.highest <= 0xFFFF:
            raise InvalidArgument(
                f"protocol versions must be 1 <= lowest <= highest <= 65535, got "
                f"{self.lowest} to {self.highest}"
            )

    def __str__(self) -> str:
        if self.lowest == self.highest:
            return f"version {self.highest}"
        return f"versions {self.lowest} to {self.highest}"


#: What this build speaks: N and N−1.
SPOKEN = Versions(OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION)


def spoken(highest: int | None = None) -> Versions:
    """This build's versions, capped at ``highest`` (None: all of them). A process capped at
    N−1 talks to its peers as a process of the previous release would, which is how an
    upgrade is rehearsed (``--max-protocol-version``)."""
    if highest is None:
        return SPOKEN
    if not SPOKEN.lowest <= highest <= SPOKEN.highest:
        raise InvalidArgument(
            f"max protocol version must be one this build speaks ({SPOKEN}), got {highest}"
        )
    return Versions(SPOKEN.lowest, highest)


def negotiate(ours: Versions, peer_highest: int, *, peer: str, peer_role: str) -> int:
    """The version of a connection whose other side (``peer_role`` "client" or "server", at
    ``peer``) said in its hello that it speaks up to ``peer_highest``: the highest version both
    speak. Raises Unimplemented naming both sides' versions if this side cannot speak it."""
    version = min(ours.highest, peer_highest)
    if version < ours.lowest:
        raise Unimplemented(
            f"{peer_role} {peer} speaks tabletstore RPC protocol version {peer_highest} at "
            f"most; this side speaks {ours}. Peers must be at most one protocol version apart: "
            f"upgrade the older side first (docs/operations/upgrades.md)"
        )
    return version


def require(version: int, since: int, what: str, *, connection: str) -> None:
    """Refuse ``what``, which protocol version ``since`` added, on a ``connection`` ("to server
    HOST:PORT", "from client HOST:PORT") of an older ``version``: Unimplemented, and nothing of
    it is sent or run."""
    if version < since:
        raise Unimplemented(
            f"{what} needs tabletstore RPC protocol version {since}; the connection "
            f"{connection} speaks version {version}, the highest both sides speak (a peer of "
            "the previous release): it works once that peer is upgraded"
        )
