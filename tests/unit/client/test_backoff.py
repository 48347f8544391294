"""The client's wait between refused attempts: doubling from FIRST, capped, jittered."""

from __future__ import annotations

from tabletstore.client.backoff import CAP, FIRST, retry_pause


def test_the_wait_doubles_from_the_first_up_to_the_cap() -> None:
    for attempt in range(40):
        full = min(CAP, FIRST * 2**attempt)
        waits = [retry_pause(attempt) for _ in range(200)]
        assert all(full / 2 <= w <= full for w in waits), attempt
        assert max(waits) - min(waits) > full / 10, "jittered"


def test_a_caller_learns_a_pause_ended_at_most_a_cap_after_it_did() -> None:
    # The attempts of a caller refused from t = 0 by a pause of ``pause`` seconds: the first
    # one after the pause comes at most CAP later (plus a lookup per attempt). With the old
    # cap of 0.5 s, a split refusing writes for 320 ms answered its callers at 630 ms.
    for pause in (0.05, 0.12, 0.32, 1.0, 3.0):
        for _ in range(100):
            t, attempt = 0.0, 0
            while t < pause:
                t += retry_pause(attempt)
                attempt += 1
            assert t <= pause + 0.1, pause
