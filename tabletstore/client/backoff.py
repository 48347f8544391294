"""How long the client waits before it sends a refused request again (§5.1, §5.2).

A tablet is not served for a moment when it splits (its writes are refused while the last of
its memtable is written out and METADATA commits the children: tens of milliseconds, a few
hundred on a busy worker), moves (the same, §5.4) or is recovered after its worker died
(§5.3: the lease's TTL and the replay, seconds). Each refused attempt costs a METADATA read
(the location is looked up again) and a request to a worker, so the client waits between
attempts, and the wait doubles: from 10 ms, so a split's short pause costs little more than
itself, up to :data:`CAP`. The cap bounds how late a caller learns that the tablet is served
again: with a cap of half a second, a split that refused writes for 320 ms made its callers
wait 630 ms. Each wait is drawn between half and all of its value, so the callers a pause
refused together do not all come back at the same moment.
"""

from __future__ import annotations

from tabletstore.clock import Random

__all__ = ["CAP", "FIRST", "retry_pause"]

#: Where the waits' jitter comes from (not a seeded source: no test depends on it).
_JITTER = Random()

#: The first wait (seconds).
FIRST = 0.01
#: The longest wait (seconds): a caller of a tablet unavailable for seconds (a recovery)
#: asks again ten times a second.
CAP = 0.1


def retry_pause(attempt: int) -> float:
    """Seconds to wait after refused attempt number ``attempt`` (0 for the first)."""
    return min(CAP, FIRST * (1 << min(attempt, 16))) * _JITTER.uniform(0.5, 1.0)
