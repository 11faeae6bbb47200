"""The adversarial section of the metadata conformance suite: watches never miss a change.

The guarantee every :class:`~pybk.metadata.base.MetadataStore` makes (see its docs): a watch
fires at least once for every change committed after the state this store last returned to
a caller for that subject, or after the watch was set when the store never returned it.
Extra fires are allowed, a missed change never is.

These checks wait for nothing before they change something: no settling pause, no waiting
for a polling backend's first poll. The watching store already has its watch machinery
running (a watch on another key, as every auto-recovery process has for its election).
Each check runs :data:`TRIALS` trials per subject (bookies, a lock, a value, a ledger) and
fails on the first missed change (listed in docs/internals.md, "pybk/testing/watch_conformance.py").
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pybk.metadata.base import BookieRegistration, MetadataStore, Watch
from pybk.testing.metadata_backends import MetadataBackend
from pybk.testing.metadata_conformance import run_check
from pybk.testing.metadata_helpers import sample_metadata

__all__ = [
    "TRIALS",
    "WATCH_CHECKS",
    "check_change_at_once_after_the_watch",
    "check_change_between_read_and_watch",
    "check_flip_and_back",
    "check_three_stores_concurrently",
    "watch_conformance_test",
]

#: trials per subject and check
TRIALS = 50
KINDS = ("bookies", "lock", "value", "ledger")
_names = itertools.count()


@dataclass
class _Subject:
    """One thing a store can watch, and how to read it, watch it and change it."""

    read: Callable[[MetadataStore], Awaitable[object]]
    watch: Callable[[MetadataStore, Callable[[], None]], Watch]
    change: Callable[[MetadataStore], Awaitable[None]]
    flip: Callable[[MetadataStore], Awaitable[None]]  # a change and its undoing


async def _subject(kind: str, setup: MetadataStore) -> _Subject:
    """A fresh subject of ``kind`` (made through ``setup``)."""
    n = next(_names)
    if kind == "bookies":
        bid = f"bk-adv-{n}"
        reg = BookieRegistration(bid, "127.0.0.1:1")

        async def toggle(s: MetadataStore) -> None:
            if any(b.bookie_id == bid for b in await s.list_bookies()):
                await s.unregister_bookie(bid)
            else:
                await s.register_bookie(reg)

        async def flip_bookie(s: MetadataStore) -> None:
            await s.register_bookie(reg)
            await s.unregister_bookie(bid)

        return _Subject(lambda s: s.list_bookies(), lambda s, cb: s.watch_bookies(cb),
                        toggle, flip_bookie)
    if kind == "lock":
        name = f"adversarial/lock-{n}"

        async def toggle_lock(s: MetadataStore) -> None:
            if s.holds_lock(name):
                await s.unlock(name)
            else:
                assert await s.try_lock(name, "changer"), "the changer could not take the lock"

        async def flip_lock(s: MetadataStore) -> None:
            assert await s.try_lock(name, "changer")
            await s.unlock(name)

        return _Subject(lambda s: s.lock_owner(name),
                        lambda s, cb: s.watch_lock(name, lambda _n: cb()), toggle_lock, flip_lock)
    if kind == "value":
        key = f"adversarial/value-{n}"
        await setup.create_value(key, b"0")

        async def bump(s: MetadataStore) -> None:
            await s.update_value(key, lambda cur: b"%d" % (int(cur.value) + 1))

        async def flip_value(s: MetadataStore) -> None:
            cur = await s.read_value(key)
            new = await s.write_value(key, cur.value + b"x", cur.version)
            await s.write_value(key, cur.value, new.version)

        return _Subject(lambda s: s.read_value(key),
                        lambda s, cb: s.watch_value(key, lambda _k: cb()), bump, flip_value)
    if kind == "ledger":
        lid = await setup.allocate_ledger_id()
        await setup.create_ledger(sample_metadata(lid))

        async def grow(s: MetadataStore) -> None:
            await s.update_ledger(lid, lambda md: md.with_changes(length=md.length + 1))

        async def flip_ledger(s: MetadataStore) -> None:
            md = await s.read_ledger(lid)
            new = await s.write_ledger(md.with_changes(length=md.length + 7), md.version)
            await s.write_ledger(md, new.version)

        return _Subject(lambda s: s.read_ledger(lid),
                        lambda s, cb: s.watch_ledger(lid, lambda _l: cb()), grow, flip_ledger)
    raise ValueError(f"unknown subject kind {kind!r}")


async def _open_running(backend: MetadataBackend) -> tuple[MetadataStore, Watch]:
    """A store whose watch machinery already runs (a watch on a key nobody touches)."""
    store = await backend.open()
    await store.list_keys()  # connected
    return store, store.watch_value(f"adversarial/idle-{next(_names)}", lambda _k: None)


async def _fired(event: asyncio.Event, bound: float, what: str) -> None:
    try:
        await asyncio.wait_for(event.wait(), bound)
    except TimeoutError:
        raise AssertionError(f"missed change: {what} (no fire within {bound}s)") from None


async def _trials(backend: MetadataBackend, order: str, trials: int) -> None:
    watcher, idle = await _open_running(backend)
    changer = await backend.open()
    for kind in KINDS:
        subject = await _subject(kind, changer)
        for trial in range(trials):
            fired = asyncio.Event()
            what = f"{kind}, trial {trial}, {order}"
            if order == "read, watch, change":
                await subject.read(watcher)
                w = subject.watch(watcher, fired.set)
                await subject.change(changer)
            elif order == "watch, change (never read)":  # this store never returns it
                w = subject.watch(watcher, fired.set)
                await subject.change(changer)
            elif order == "read, change, watch":
                await subject.read(watcher)
                await subject.change(changer)
                w = subject.watch(watcher, fired.set)
            elif order == "read, flip and back, watch":
                await subject.read(watcher)
                await subject.flip(changer)
                w = subject.watch(watcher, fired.set)
            elif order == "read, watch, flip and back":
                await subject.read(watcher)
                w = subject.watch(watcher, fired.set)
                await subject.flip(changer)
            else:
                raise ValueError(order)
            try:
                await _fired(fired, backend.bound, what)
            finally:
                w.cancel()
    idle.cancel()


async def check_change_at_once_after_the_watch(
    backend: MetadataBackend, *, trials: int = TRIALS
) -> None:
    await _trials(backend, "read, watch, change", trials)
    await _trials(backend, "watch, change (never read)", trials)


async def check_change_between_read_and_watch(
    backend: MetadataBackend, *, trials: int = TRIALS
) -> None:
    await _trials(backend, "read, change, watch", trials)


async def check_flip_and_back(backend: MetadataBackend, *, trials: int = TRIALS) -> None:
    await _trials(backend, "read, flip and back, watch", trials)
    await _trials(backend, "read, watch, flip and back", trials)


async def check_three_stores_concurrently(
    backend: MetadataBackend, *, trials: int = TRIALS
) -> None:
    """Three stores, each with its machinery running, read and watch the same subjects (all
    at once), then all change them at once; every store must hear of every other store's
    change (each change is committed after every store's read)."""
    stores = [(await _open_running(backend))[0] for _ in range(3)]
    for kind in KINDS:
        subjects = [await _subject(kind, stores[0]) for _ in range(3)]  # one per changer
        for trial in range(trials):
            events = [[asyncio.Event() for _ in range(3)] for _ in range(3)]  # [watcher][subj]
            watches: list[Watch] = []

            async def look(i: int, subjects: list[_Subject] = subjects,
                           events: list[list[asyncio.Event]] = events,
                           watches: list[Watch] = watches) -> None:
                for j, subject in enumerate(subjects):
                    await subject.read(stores[i])
                    watches.append(subject.watch(stores[i], events[i][j].set))

            try:
                await asyncio.gather(*(look(i) for i in range(3)))
                await asyncio.gather(*(subjects[i].change(stores[i]) for i in range(3)))
                for i in range(3):
                    for j in range(3):
                        if i != j:
                            await _fired(events[i][j], backend.bound,
                                         f"{kind}, trial {trial}: store {i} on store {j}'s change")
            finally:
                for w in watches:
                    w.cancel()


WATCH_CHECKS: list[Callable[[MetadataBackend], Awaitable[None]]] = [
    check_change_at_once_after_the_watch,
    check_change_between_read_and_watch,
    check_flip_and_back,
    check_three_stores_concurrently,
]


def watch_conformance_test(
    make_backend: Callable[[], MetadataBackend],
) -> Callable[..., Awaitable[None]]:
    """A pytest test (parametrized over :data:`WATCH_CHECKS`) for a backend."""
    import pytest

    @pytest.mark.parametrize("check", WATCH_CHECKS,
                             ids=lambda c: c.__name__.removeprefix("check_"))
    async def test_watch_conformance(
        check: Callable[[MetadataBackend], Awaitable[None]],
    ) -> None:
        await run_check(make_backend, check)

    return test_watch_conformance
