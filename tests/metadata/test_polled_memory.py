"""The memory store with watches delivered as real backends deliver them (the simulator's
switch): it passes the whole conformance suite and its adversarial watch section, and with
the old baseline-at-first-poll bug put back the adversarial section catches it."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest

from pybk.metadata.memory_watches import PolledDelivery
from pybk.testing.metadata_backends import MemoryBackend, MetadataBackend
from pybk.testing.metadata_conformance import CHECKS, run_check
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
