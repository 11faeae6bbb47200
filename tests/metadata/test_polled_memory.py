"""The memory store with watches delivered as real backends deliver them (the simulator's
switch): it passes the whole conformance suite and its adversarial watch section, and with
the old baseline-at-first-poll bug put back the adversarial section catches it; its
``sync_watches`` returns once every earlier change has been delivered."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from pybk.metadata.base import IN_RECOVERY
from pybk.metadata.memory_watches import PolledDelivery
from pybk.testing.metadata_backends import MemoryBackend, MetadataBackend
from pybk.testing.metadata_conformance import (
    CHECKS,
    check_sync_watches_establishes_every_watch,
    run_check,
    sample_metadata,
)
from pybk.testing.watch_conformance import (
    WATCH_CHECKS,
    check_change_at_once_after_the_watch,
)

Check = Callable[[MetadataBackend], Awaitable[None]]


def polled(*, bug: bool = False) -> MemoryBackend:
    return MemoryBackend(PolledDelivery(poll_interval=0.01, establish_delay=0.03,
                                        rng=random.Random(7), baseline_at_first_poll=bug))


@pytest.mark.parametrize("check", [*CHECKS, *WATCH_CHECKS],
                         ids=lambda c: c.__name__.removeprefix("check_"))
async def test_polled_memory_store_conforms(check: Check) -> None:
    await run_check(polled, check)


async def test_the_adversarial_section_catches_a_baseline_taken_at_the_first_poll() -> None:
    with pytest.raises(AssertionError, match="missed change"):
        await run_check(lambda: polled(bug=True), check_change_at_once_after_the_watch)


def test_bad_delivery_settings_are_value_errors() -> None:
    with pytest.raises(ValueError):
        PolledDelivery(poll_interval=0)
    with pytest.raises(ValueError):
        PolledDelivery(establish_delay=-1)


async def test_sync_watches_conformance_catches_a_baseline_taken_at_the_first_poll() -> None:
    with pytest.raises(AssertionError, match="ledger watch after sync_watches"):
        await run_check(lambda: polled(bug=True), check_sync_watches_establishes_every_watch)


@pytest.mark.parametrize("poll", [False, True], ids=["at_once", "polled"])
async def test_sync_watches_returns_with_every_earlier_change_delivered(poll: bool) -> None:
    """No waiting after the call: what changed before it has been delivered when it returns,
    to a watch set just now (True: it was not established yet, when polled) and to one
    established long ago (False)."""
    store = polled().open if poll else MemoryBackend().open
    watcher = await store()
    writer = watcher.session()  # type: ignore[attr-defined]
    lid = await writer.allocate_ledger_id()
    md = await writer.create_ledger(sample_metadata(lid))
    md = await writer.write_ledger(md.with_changes(state=IN_RECOVERY), md.version)
    fired: list[int] = []
    await watcher.read_ledger(lid)
    old = watcher.watch_ledger(lid, fired.append)
    assert await watcher.sync_watches() is poll
    assert fired == []
    md = await writer.write_ledger(md.with_changes(state=IN_RECOVERY), md.version)
    assert await watcher.sync_watches() is False
    assert fired == [lid]
    new = watcher.watch_ledger(lid, fired.append)  # the session last returned an older one
    assert await watcher.sync_watches() is poll
    assert fired == [lid, lid]
    old.cancel()
    new.cancel()
    await writer.write_ledger(md.with_changes(state=IN_RECOVERY), md.version)
    assert await watcher.sync_watches() is False
    assert fired == [lid, lid]


async def test_sync_watches_waits_only_for_its_own_sessions_open_watches() -> None:
    backend = MemoryBackend(PolledDelivery(poll_interval=5.0, establish_delay=0.0,
                                           rng=random.Random(1)))
    mine, other = await backend.open(), await backend.open()
    other.watch_value("k", lambda _k: None)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await mine.sync_watches() is False  # (the other session's watch is not mine)
    mine.watch_value("k", lambda _k: None)
    await mine.close()  # (its watches go with it)
    assert await mine.sync_watches() is False
    assert loop.time() - started < 1.0  # no 5-second poll waited for
