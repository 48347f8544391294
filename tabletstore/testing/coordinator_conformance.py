"""The conformance suite every Coordinator passes (docs/architecture/conventions.md convention 13).

A backend's test module subclasses :class:`CoordinatorConformance` and provides one fixture,
``harness``, returning a :class:`CoordinatorHarness`: how to open a coordinator on a
namespace private to the test, and how to let time pass or a lease expire on that backend
(advance a ManualClock in process; wait for real against etcd, whose leases last whole
seconds — so the lease tests are kept few).

It pins the contracts of ``tabletstore.coordination.base`` and ``election``: revisions and
versions, prefix ranges in key order, transactions (absent keys, every compare target, losing
compares as a normal result), compare-and-swap races, watch order and start revisions, lease
expiry removing keys and notifying, keep-alive, revoke, and election hand-over.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

import pytest

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
    Put,
    PutResult,
    Watch,
    WatchEvent,
    absent,
    mod_revision_is,
    value_is,
    version_is,
)
from tabletstore.errors import Fenced, InvalidArgument

__all__ = ["CoordinatorConformance", "CoordinatorHarness"]

#: Upper bound for any single wait in this suite (seconds of real time).
DEADLINE = 20.0


class CoordinatorHarness(Protocol):
    """What a backend's test module supplies to the suite."""

    #: The clock the coordinators use (leases, safe_until).
    clock: Clock
    #: A short lease TTL this backend supports.
    ttl: float

    def open(self) -> Coordinator:
        """A new coordinator on this test's private namespace (same state every call)."""
        ...

    async def let_time_pass(self, seconds: float) -> None:
        """Let ``seconds`` pass, giving keep-alive tasks the chance to run."""
        ...

    async def let_lease_expire(self, lease: Lease) -> None:
        """Let the lease run out (no keep-alive) until the server has ended it."""
        ...


async def next_event(watch: Watch) -> WatchEvent:
    async with asyncio.timeout(DEADLINE):
        return await anext(aiter(watch))


async def still_pending(task: asyncio.Task[object]) -> bool:
    """Give ``task`` a fair chance to finish; True if it did not (it is blocked)."""
    for _ in range(20):
        await asyncio.sleep(0)
    done, _ = await asyncio.wait({task}, timeout=0.2)
    return not done


class CoordinatorConformance:
    """Subclass with a ``harness`` fixture; every test then runs against that backend."""

    @pytest.fixture
    async def coordinator(self, harness: CoordinatorHarness) -> AsyncIterator[Coordinator]:
        coordinator = harness.open()
        yield coordinator
        await coordinator.close()

    # ------------------------------------------------------------------ keys and revisions

    async def test_put_get_revisions_and_versions(self, coordinator: Coordinator) -> None:
        r1 = await coordinator.put("k", b"one")
        r2 = await coordinator.put("k", b"two")
        assert r2 > r1
        kv = await coordinator.get("k")
        assert kv is not None
        assert (kv.key, kv.value) == ("k", b"two")
        assert (kv.create_revision, kv.mod_revision, kv.version) == (r1, r2, 2)
        assert kv.lease_id == 0

    async def test_missing_key_and_delete(self, coordinator: Coordinator) -> None:
        assert await coordinator.get("nope") is None
        assert await coordinator.delete("nope") is False
        await coordinator.put("k", b"v")
        assert await coordinator.delete("k") is True
        assert await coordinator.get("k") is None
        r = await coordinator.put("k", b"again")
        kv = await coordinator.get("k")
        assert kv is not None and kv.create_revision == r and kv.version == 1

    async def test_get_prefix_sorted_and_delete_prefix(self, coordinator: Coordinator) -> None:
        for key in ["a/c/d", "b", "a/b", "a0", "a/a", "a/\u00e9", "a/B"]:
            await coordinator.put(key, key.encode())
        got = await coordinator.get_prefix("a/")
        expected = sorted(["a/c/d", "a/b", "a/a", "a/\u00e9", "a/B"], key=str.encode)
        assert [kv.key for kv in got] == expected
        assert [kv.value for kv in got] == [k.encode() for k in expected]
        assert [kv.key for kv in await coordinator.get_prefix("")] == sorted(
            ["a/c/d", "b", "a/b", "a0", "a/a", "a/\u00e9", "a/B"], key=str.encode
        )
        assert await coordinator.delete_prefix("a/") == 5
        assert [kv.key for kv in await coordinator.get_prefix("")] == ["a0", "b"]
        assert await coordinator.get_prefix("zz") == []

    async def test_bad_keys_are_invalid_argument(self, coordinator: Coordinator) -> None:
        with pytest.raises(InvalidArgument):
            await coordinator.put("", b"v")
        with pytest.raises(InvalidArgument):
            await coordinator.put("k", "not bytes")  # type: ignore[arg-type]

    # ------------------------------------------------------------------ transactions

    async def test_txn_on_absent_key(self, coordinator: Coordinator) -> None:
        first = await coordinator.txn([absent("x")], [Put("x", b"1")], [Get("x")])
        assert first.succeeded
        (put,) = first.results
        assert isinstance(put, PutResult)
        second = await coordinator.txn([absent("x")], [Put("x", b"2")], [Get("x")])
        assert not second.succeeded
        (get,) = second.results
        assert isinstance(get, GetResult)
        assert [(kv.key, kv.value, kv.mod_revision) for kv in get.kvs] == [
            ("x", b"1", put.revision)
        ]

    async def test_txn_value_compare_on_absent_key_always_fails(
        self, coordinator: Coordinator
    ) -> None:
        for op in CompareOp:
            compare = Compare("ghost", CompareTarget.VALUE, op, b"")
            result = await coordinator.txn([compare], [Put("ghost", b"x")])
            assert not result.succeeded, op
        assert await coordinator.get("ghost") is None

    async def test_txn_compare_targets(self, coordinator: Coordinator) -> None:
        r1 = await coordinator.put("k", b"v1")
        r2 = await coordinator.put("k", b"v2")
        cases: list[tuple[Compare, bool]] = [
            (value_is("k", b"v2"), True),
            (value_is("k", b"v1"), False),
            (Compare("k", CompareTarget.VALUE, CompareOp.GREATER, b"v1"), True),
            (Compare("k", CompareTarget.CREATE, CompareOp.EQUAL, r1), True),
            (Compare("k", CompareTarget.CREATE, CompareOp.LESS, r1), False),
            (mod_revision_is("k", r2), True),
            (mod_revision_is("k", r1), False),
            (Compare("k", CompareTarget.MOD, CompareOp.GREATER, r1), True),
            (version_is("k", 2), True),
            (Compare("k", CompareTarget.VERSION, CompareOp.NOT_EQUAL, 2), False),
            (Compare("absent", CompareTarget.VERSION, CompareOp.EQUAL, 0), True),
            (absent("k"), False),
        ]
        for compare, expected in cases:
            result = await coordinator.txn([compare], [Get("k")], [])
            assert result.succeeded is expected, compare
        both = await coordinator.txn([value_is("k", b"v2"), version_is("k", 1)], [Put("k", b"no")])
        assert not both.succeeded and both.results == ()

    async def test_txn_ops_apply_atomically_at_one_revision(self, coordinator: Coordinator) -> None:
        await coordinator.put("p/1", b"a")
        await coordinator.put("p/2", b"b")
        result = await coordinator.txn(
            [], [Put("q", b"new"), Delete("p/", prefix=True), Get("p/", prefix=True), Get("q")]
        )
        assert result.succeeded
        put, deleted, gone, q = result.results
        assert isinstance(put, PutResult) and isinstance(deleted, DeleteResult)
        assert deleted.deleted == 2
        assert isinstance(gone, GetResult) and gone.kvs == ()
        assert isinstance(q, GetResult) and [kv.value for kv in q.kvs] == [b"new"]
        q_kv = await coordinator.get("q")
        assert q_kv is not None and q_kv.mod_revision == put.revision

    async def test_txn_writing_a_key_twice_is_invalid(self, coordinator: Coordinator) -> None:
        with pytest.raises(InvalidArgument):
            await coordinator.txn([], [Put("d", b"1"), Put("d", b"2")])
        assert await coordinator.get("d") is None

    async def test_cas_race_one_winner_per_round(self, harness: CoordinatorHarness) -> None:
        contenders = [harness.open() for _ in range(4)]
        try:
            await contenders[0].put("counter", b"0")
            for round_ in range(5):
                kv = await contenders[0].get("counter")
                assert kv is not None and kv.value == str(round_).encode()

                async def bump(c: Coordinator, seen: KeyValue = kv) -> bool:
                    next_value = str(int(seen.value) + 1).encode()
                    compare = mod_revision_is("counter", seen.mod_revision)
                    result = await c.txn([compare], [Put("counter", next_value)])
                    return result.succeeded

                wins = await asyncio.gather(*(bump(c) for c in contenders for _ in range(2)))
                assert sum(wins) == 1, wins
            final = await contenders[0].get("counter")
            assert final is not None and final.value == b"5" and final.version == 6
        finally:
            for c in contenders:
                await c.close()

    async def test_cas_increments_from_many_writers_are_all_counted(
        self, harness: CoordinatorHarness
    ) -> None:
        writers = [harness.open() for _ in range(4)]

        async def increment(c: Coordinator, times: int) -> int:
            attempts = 0
            for _ in range(times):
                while True:
                    attempts += 1
                    kv = await c.get("n")
                    if kv is None:
                        result = await c.txn([absent("n")], [Put("n", b"1")])
                    else:
                        value = str(int(kv.value) + 1).encode()
                        result = await c.txn(
                            [mod_revision_is("n", kv.mod_revision)], [Put("n", value)]
                        )
                    if result.succeeded:
                        break
            return attempts

        try:
            await asyncio.gather(*(increment(c, 5) for c in writers))
            kv = await writers[0].get("n")
            assert kv is not None and kv.value == b"20" and kv.version == 20
        finally:
            for c in writers:
                await c.close()

    # ------------------------------------------------------------------ watches

    async def test_watch_delivers_changes_in_order(self, harness: CoordinatorHarness) -> None:
        watcher, writer = harness.open(), harness.open()
        try:
            async with watcher.watch_prefix("w/") as watch:
                await writer.put("outside", b"x")
                r1 = await writer.put("w/a", b"1")
                r2 = await writer.put("w/b", b"2")
                r3 = await writer.put("w/a", b"3")
                await writer.delete("w/a")
                await writer.txn([], [Put("w/c", b"4"), Delete("w/b")])
                events = [await next_event(watch) for _ in range(6)]
            summary = [(e.type, e.kv.key, e.kv.value) for e in events]
            assert summary == [
                (EventType.PUT, "w/a", b"1"),
                (EventType.PUT, "w/b", b"2"),
                (EventType.PUT, "w/a", b"3"),
                (EventType.DELETE, "w/a", b""),
                (EventType.PUT, "w/c", b"4"),
                (EventType.DELETE, "w/b", b""),
            ]
            assert [e.revision for e in events[:3]] == [r1, r2, r3]
            revisions = [e.revision for e in events]
            assert revisions == sorted(revisions) and revisions[4] == revisions[5]
            assert events[2].prev_kv is not None and events[2].prev_kv.value == b"1"
            assert events[3].prev_kv is not None and events[3].prev_kv.value == b"3"
            assert events[0].kv.create_revision == r1 and events[2].kv.version == 2
        finally:
            await watcher.close()
            await writer.close()

    async def test_watch_from_start_revision_replays_history(
        self, coordinator: Coordinator
    ) -> None:
        await coordinator.put("h/0", b"before")
        start = await coordinator.put("h/1", b"a")
        await coordinator.delete("h/0")
        await coordinator.put("h/2", b"b")
        async with coordinator.watch_prefix("h/", start_revision=start) as watch:
            replayed = [await next_event(watch) for _ in range(3)]
            live = await coordinator.put("h/3", b"c")
            newest = await next_event(watch)
        assert [(e.type, e.kv.key) for e in replayed] == [
            (EventType.PUT, "h/1"),
            (EventType.DELETE, "h/0"),
            (EventType.PUT, "h/2"),
        ]
        assert replayed[0].revision == start
        assert (newest.kv.key, newest.revision) == ("h/3", live)

    async def test_list_then_watch_misses_nothing(self, coordinator: Coordinator) -> None:
        """The servers-directory pattern: list, then watch from the next revision."""
        await coordinator.put("s/1", b"x")
        listed = await coordinator.get_prefix("s/")
        after = max(kv.mod_revision for kv in listed) + 1
        await coordinator.put("s/2", b"y")
        async with coordinator.watch_prefix("s/", start_revision=after) as watch:
            event = await next_event(watch)
        assert (event.type, event.kv.key) == (EventType.PUT, "s/2")

    # ------------------------------------------------------------------ leases

    async def test_lease_expiry_removes_keys_and_notifies(
        self, harness: CoordinatorHarness, coordinator: Coordinator
    ) -> None:
        lease = await coordinator.grant_lease(harness.ttl)
        assert lease.ttl >= harness.ttl and not lease.expired
        await coordinator.put("servers/w1", b"addr", lease=lease)
        kv = await coordinator.get("servers/w1")
        assert kv is not None and kv.lease_id == lease.id
        await coordinator.put("plain", b"stays")
        async with coordinator.watch_prefix("servers/") as watch:
            await harness.let_lease_expire(lease)
            async with asyncio.timeout(DEADLINE):
                await lease.wait_expired()
            assert lease.expired
            event = await next_event(watch)
        assert (event.type, event.kv.key) == (EventType.DELETE, "servers/w1")
        assert event.prev_kv is not None and event.prev_kv.lease_id == lease.id
        assert await coordinator.get("servers/w1") is None
        assert await coordinator.get("plain") is not None
        with pytest.raises(Fenced):
            await coordinator.put("servers/w1", b"late", lease=lease)
        with pytest.raises(Fenced):
            await lease.refresh()

    async def test_keep_alive_keeps_keys(
        self, harness: CoordinatorHarness, coordinator: Coordinator
    ) -> None:
        # Twice the short TTL: a keep-alive delayed by a loaded machine must not lose it.
        lease = await coordinator.grant_lease(harness.ttl * 2)
        await coordinator.put("claims/t/1", b"w1", lease=lease)
        granted = lease.last_renewed
        async with lease.keep_alive(interval=lease.ttl / 5):
            await harness.let_time_pass(lease.ttl * 1.5)
            assert not lease.expired
            assert lease.last_renewed > granted
            assert lease.safe_until() < lease.last_renewed + lease.ttl
            assert harness.clock.monotonic() < lease.safe_until()
        assert await coordinator.get("claims/t/1") is not None
        await lease.revoke()

    async def test_revoke_deletes_keys_at_once(self, coordinator: Coordinator) -> None:
        lease = await coordinator.grant_lease(30)
        await coordinator.put("a", b"1", lease=lease)
        await coordinator.put("b", b"2", lease=lease)
        async with coordinator.watch_prefix("") as watch:
            await lease.revoke()
            events = [await next_event(watch), await next_event(watch)]
        assert lease.expired
        assert {e.kv.key for e in events} == {"a", "b"}
        assert events[0].revision == events[1].revision
        assert await coordinator.get_prefix("") == []
        await lease.revoke()  # idempotent

    async def test_revoke_by_id_ends_anothers_lease(self, coordinator: Coordinator) -> None:
        """The master's fast failure detection revokes a dead worker's lease by the id its
        servers entry carries: its keys go at once, its holder's refresh is Fenced."""
        lease = await coordinator.grant_lease(30)
        await coordinator.put("servers/w9", b"addr", lease=lease)
        kv = await coordinator.get("servers/w9")
        assert kv is not None
        await coordinator.revoke_lease(kv.lease_id)
        assert await coordinator.get("servers/w9") is None
        with pytest.raises(Fenced):
            await coordinator.put("servers/w9", b"late", lease=lease)
        with pytest.raises(Fenced):
            await lease.refresh()
        await coordinator.revoke_lease(kv.lease_id)  # idempotent

    # ------------------------------------------------------------------ elections

    async def test_election_hands_over_when_leader_lease_ends(
        self, harness: CoordinatorHarness, coordinator: Coordinator
    ) -> None:
        lease_a = await coordinator.grant_lease(harness.ttl)
        lease_b = await coordinator.grant_lease(60)
        a, b = coordinator.election("master"), coordinator.election("master")
        assert await a.leader() is None
        term_a = await a.campaign(b"A", lease_a)
        leader = await b.leader()
        assert leader is not None and leader.value == b"A"
        campaign_b = asyncio.create_task(b.campaign(b"B", lease_b))
        try:
            assert await still_pending(campaign_b)
            await harness.let_lease_expire(lease_a)
            async with asyncio.timeout(DEADLINE):
                term_b = await campaign_b
            assert term_b.create_revision > term_a.create_revision
            leader = await a.leader()
            assert leader is not None and leader.value == b"B"
        finally:
            campaign_b.cancel()
            await asyncio.gather(campaign_b, return_exceptions=True)
            await lease_b.revoke()

    async def test_election_resign_and_queue_order(self, coordinator: Coordinator) -> None:
        leases = [await coordinator.grant_lease(60) for _ in range(3)]
        elections = [coordinator.election("master") for _ in range(3)]
        await elections[0].campaign(b"0", leases[0])
        second = asyncio.create_task(elections[1].campaign(b"1", leases[1]))
        assert await still_pending(second)
        third = asyncio.create_task(elections[2].campaign(b"2", leases[2]))
        try:
            assert await still_pending(third)
            await elections[0].resign()
            async with asyncio.timeout(DEADLINE):
                await second
            assert await still_pending(third)
            leader = await elections[0].leader()
            assert leader is not None and leader.value == b"1"
            await elections[1].proclaim(b"1-updated")
            leader = await elections[0].leader()
            assert leader is not None and leader.value == b"1-updated"
            await elections[1].resign()
            async with asyncio.timeout(DEADLINE):
                await third
        finally:
            for task in (second, third):
                task.cancel()
            await asyncio.gather(second, third, return_exceptions=True)
            for lease in leases:
                await lease.revoke()

    async def test_campaign_fails_fenced_when_its_lease_ends(
        self, coordinator: Coordinator
    ) -> None:
        lease_a, lease_b = await coordinator.grant_lease(60), await coordinator.grant_lease(60)
        await coordinator.election("m").campaign(b"A", lease_a)
        waiting = asyncio.create_task(coordinator.election("m").campaign(b"B", lease_b))
        try:
            assert await still_pending(waiting)
            await lease_b.revoke()
            with pytest.raises(Fenced):
                async with asyncio.timeout(DEADLINE):
                    await waiting
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await lease_a.revoke()

    async def test_cancelled_campaign_leaves_the_queue(self, coordinator: Coordinator) -> None:
        lease_a, lease_b = await coordinator.grant_lease(60), await coordinator.grant_lease(60)
        await coordinator.election("m").campaign(b"A", lease_a)
        waiting = asyncio.create_task(coordinator.election("m").campaign(b"B", lease_b))
        assert await still_pending(waiting)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert [kv.value for kv in await coordinator.get_prefix("elections/m/")] == [b"A"]
        await lease_a.revoke()
        await lease_b.revoke()

    async def test_observe_sees_leader_changes(self, coordinator: Coordinator) -> None:
        lease_a, lease_b = await coordinator.grant_lease(60), await coordinator.grant_lease(60)
        a, b = coordinator.election("obs"), coordinator.election("obs")
        try:
            async with a.observe() as leaders:
                seen = aiter(leaders)
                async with asyncio.timeout(DEADLINE):
                    assert await anext(seen) is None
                    await a.campaign(b"A", lease_a)
                    first = await anext(seen)
                    assert first is not None and first.value == b"A"
                    campaign_b = asyncio.create_task(b.campaign(b"B", lease_b))
                    assert await still_pending(campaign_b)
                    await lease_a.revoke()
                    await campaign_b
                    second = await anext(seen)
                    assert second is not None and second.value == b"B"
                    await b.resign()
                    assert await anext(seen) is None
        finally:
            await lease_b.revoke()
