"""Watches of the memory store delivered as real backends deliver them (the simulator's switch).

By default the memory store fires a watch synchronously, the moment a change is made: a
watcher can never be late, so bugs that need a late watch never show in the simulator.
With a :class:`PolledDelivery` the shared state instead polls, as the SQLite store does and
much as ZooKeeper's watches arrive: a watch is *established* some time after it is set
(``establish_delay``, drawn per watch from the injected random), then compared every
``poll_interval`` with the subject's version, several changes coalescing into one fire.

Each watch keeps the baseline the watch guarantee asks for: the version its session last
returned for the subject, else the version when the watch was set. The mutation switch
:data:`WATCH_BASELINE_AT_FIRST_POLL` (in ``PolledDelivery.mutations``; or
``baseline_at_first_poll=True``) puts back the old bug of the persistent backends: the
baseline taken at the watch's first poll, so a change between the set and that poll is never
reported. The adversarial watch conformance catches it, and so does the simulator's sweep
(a new auditor that misses the loss of the bookie its predecessor shared a host with).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

from pybk.metadata._common import CallbackWatch

__all__ = ["UNKNOWN", "WATCH_BASELINE_AT_FIRST_POLL", "PolledDelivery", "WatchPoller"]

#: a baseline to be taken at the first poll (the mutation)
UNKNOWN: Any = object()
#: mutation switch (a name in ``PolledDelivery.mutations``): each watch's baseline is what its
#: first poll sees (the old SQLite and ZooKeeper backends' bug), not what its session last
#: returned or what was there when it was set
WATCH_BASELINE_AT_FIRST_POLL: Final = "watch_baseline_at_first_poll"


@dataclass
class PolledDelivery:
    """How a memory store delivers watches when it polls (see the module doc)."""

    poll_interval: float = 0.05
    #: a watch is established after a delay drawn uniformly in [0, establish_delay]
    establish_delay: float = 0.1
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    baseline_at_first_poll: bool = False
    #: mutation switches (:data:`WATCH_BASELINE_AT_FIRST_POLL` sets ``baseline_at_first_poll``)
    mutations: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.poll_interval <= 0 or self.establish_delay < 0:
            raise ValueError(f"need poll_interval > 0 and establish_delay >= 0, got "
                             f"{self.poll_interval} and {self.establish_delay}")
        if WATCH_BASELINE_AT_FIRST_POLL in self.mutations:
            self.baseline_at_first_poll = True


@dataclass
class _Polled:
    watch: CallbackWatch
    current: Callable[[], object]  # the subject's version now
    baseline: object
    established_at: float
    compared: int = 0  # the number of the last poll that compared it (0: none yet)


class WatchPoller:
    """The polling task of one memory state and the watches it compares."""

    def __init__(self, delivery: PolledDelivery) -> None:
        self.delivery = delivery
        self._watches: list[_Polled] = []
        self._task: asyncio.Task[None] | None = None
        self._polls = 0  # polls made so far
        self._polled: asyncio.Future[None] | None = None  # done after the next poll

    def add(self, w: CallbackWatch, current: Callable[[], object], returned: object) -> None:
        """Poll ``w``; ``returned`` is the version its session last returned, or UNKNOWN."""
        d = self.delivery
        loop = asyncio.get_running_loop()
        baseline = returned if returned is not UNKNOWN else current()
        if d.baseline_at_first_poll:
            baseline = UNKNOWN
        delay = d.rng.uniform(0.0, d.establish_delay) if d.establish_delay else 0.0
        self._watches.append(_Polled(w, current, baseline, loop.time() + delay))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._loop(), name="pybk-memory-watch-poll")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._watches:
            await asyncio.sleep(self.delivery.poll_interval)
            now = loop.time()
            kept: list[_Polled] = []
            for p in self._watches:
                if p.watch.cancelled:
                    continue
                kept.append(p)
                if now < p.established_at:
                    continue
                p.compared = self._polls + 1
                version = p.current()
                if p.baseline is UNKNOWN:
                    p.baseline = version
                elif version != p.baseline:
                    p.baseline = version
                    p.watch.fire()
            self._watches = kept
            self._polls += 1
            # (after the fires: a waiter resumes once their callbacks have run)
            polled, self._polled = self._polled, None
            if polled is not None and not polled.done():
                polled.set_result(None)

    async def settle(self, watches: Collection[CallbackWatch], bound: float) -> bool:
        """Wait (at most ``bound`` seconds) for a poll after this call that compares each of
        ``watches`` still set (established: its delay passed), its fires delivered. True when
        one of them had never been compared before (a caller that read before may read
        once more), False when all had been."""
        mine = set(watches)
        waiting = [p for p in self._watches if p.watch in mine and not p.watch.cancelled]
        if not waiting:
            return False
        fresh = any(p.compared == 0 for p in waiting)
        start = self._polls
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound
        while any(p.compared <= start and not p.watch.cancelled for p in waiting):
            left = deadline - loop.time()
            if left <= 0 or self._task is None or self._task.done():
                break
            if self._polled is None:
                self._polled = loop.create_future()
            try:
                async with asyncio.timeout(left):
                    await asyncio.shield(self._polled)
            except TimeoutError:
                break
        return fresh
