"""Locks and leader elections on a metadata backend (part of
:data:`pybk.testing.metadata_conformance.CHECKS`): a lock has one holder, is released by its
holder and freed when the holder's owner dies; an election has one leader and fails over when
the leader resigns or dies.
"""

from __future__ import annotations

import asyncio

from pybk.testing.metadata_backends import MetadataBackend
from pybk.testing.metadata_helpers import raises, wait_event, wait_until

__all__ = [
    "check_election_has_one_leader_and_fails_over",
    "check_lock_vanishes_with_its_owner",
    "check_locks_are_exclusive_and_released",
]


async def check_locks_are_exclusive_and_released(backend: MetadataBackend) -> None:
    a, b = await backend.open(), await backend.open()
    fired = asyncio.Event()
    watch = b.watch_lock("replication/ledger-1", lambda _n: fired.set())
    assert await b.lock_owner("replication/ledger-1") is None
    assert await a.try_lock("replication/ledger-1", "worker-a")
    assert a.holds_lock("replication/ledger-1") and not b.holds_lock("replication/ledger-1")
    assert await a.try_lock("replication/ledger-1", "worker-a")  # again: still ours
    await wait_event(fired, backend.bound, "lock watch after the lock was taken")
    assert not await b.try_lock("replication/ledger-1", "worker-b")
    assert not b.holds_lock("replication/ledger-1")
    assert await b.lock_owner("replication/ledger-1") == "worker-a"
    assert await b.try_lock("replication/ledger-2", "worker-b")
    assert await a.list_locks("replication/") == {
        "replication/ledger-1": "worker-a", "replication/ledger-2": "worker-b"}
    assert await a.list_locks("other/") == {}
    fired.clear()
    await b.unlock("replication/ledger-1")  # not b's: nothing happens
    assert await a.lock_owner("replication/ledger-1") == "worker-a"
    await a.unlock("replication/ledger-1")
    assert not a.holds_lock("replication/ledger-1")
    await wait_event(fired, backend.bound, "lock watch after the lock was released")
    assert await b.lock_owner("replication/ledger-1") is None
    assert await b.try_lock("replication/ledger-1", "worker-b")
    assert await a.list_locks() == {
        "replication/ledger-1": "worker-b", "replication/ledger-2": "worker-b"}
    watch.cancel()
    await raises(ValueError, lambda: a.try_lock("bad//name", "x"), "a bad lock name")
    await raises(ValueError, lambda: a.try_lock("ok", ""), "an empty owner")


async def check_lock_vanishes_with_its_owner(backend: MetadataBackend) -> None:
    doomed, other = await backend.open(), await backend.open()
    closing = await backend.open()
    assert await doomed.try_lock("auditor-lock", "doomed")
    assert await closing.try_lock("closing-lock", "closing")
    await closing.close()  # a clean close releases at once
    assert await other.lock_owner("closing-lock") is None
    await backend.kill_owner(doomed)

    async def taken() -> bool:
        return await other.try_lock("auditor-lock", "other")

    await wait_until(taken, backend.bound, "a dead holder's lock to become free")
    assert other.holds_lock("auditor-lock")
    assert await other.lock_owner("auditor-lock") == "other"


async def check_election_has_one_leader_and_fails_over(backend: MetadataBackend) -> None:
    stores = [await backend.open() for _ in range(3)]
    observer = await backend.open()
    elections = [s.election("auditor", f"candidate-{i}") for i, s in enumerate(stores)]
    changes: list[tuple[str, bool]] = []
    for e in elections:
        e.on_change = lambda leading, e=e: changes.append((e.candidate, leading))
        await e.join()

    async def one_leader() -> bool:
        return sum(e.is_leader for e in elections) == 1

    await wait_until(one_leader, backend.bound, "one leader among three candidates")
    first = next(e for e in elections if e.is_leader)
    await asyncio.wait_for(first.wait_leader(), backend.bound)  # returns at once
    assert await observer.election_leader("auditor") == first.candidate
    assert (first.candidate, True) in changes
    # the leader resigns: another one takes over
    await first.resign()
    assert not first.is_leader
    rest = [e for e in elections if e is not first]

    async def another() -> bool:
        return sum(e.is_leader for e in rest) == 1

    await wait_until(another, backend.bound, "a new leader after the first resigned")
    second = next(e for e in rest if e.is_leader)
    assert await observer.election_leader("auditor") == second.candidate
    assert not first.is_leader
    # the second leader's process dies: the last candidate takes over
    await backend.kill_owner(stores[elections.index(second)])
    last = next(e for e in rest if e is not second)
    await asyncio.wait_for(last.wait_leader(), backend.bound)

    async def reported() -> bool:
        return await observer.election_leader("auditor") == last.candidate

    await wait_until(reported, backend.bound, "the observer to see the last candidate lead")
    await last.resign()

    async def nobody() -> bool:
        return await observer.election_leader("auditor") is None

    await wait_until(nobody, backend.bound, "no leader once every candidate left")
