"""The local scrubber: every stored record's checksum verified in the background at a bounded
rate, so damage to a sealed segment (truncated, zeroed, a flipped bit, a deleted file) is
found before a reader needs the entry, as BookKeeper's local scrubber does.

A pass walks every entry the engine keeps on disk (``scrub_items``: the journal engine's
index, the db engine's entry logs) and verifies each like a read does (``scrub_check``: CRC,
ids; the db engine's location rows too). It reads at most ``rate`` bytes a second, in slices
of at most ``slice_bytes`` (the loop is held for one slice, then the next waits for the rate),
over the store's file system seam and the running loop's clock. A damaged entry is recorded
in ``store.damaged`` (``(ledger, entry) -> what``: the bookie's info reports it) and handed to
``on_damage(ledger_id, entry_id, error)`` (a bookie process marks the ledger under-replicated,
so auto-recovery copies the entry back from the other replicas). An entry read fine again (a
repair wrote a new copy) leaves ``damaged``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

from pybk.errors import BKError
from pybk.storage.engine import LedgerStorage

__all__ = ["Scrubber"]

DamageCallback = Callable[[int, int, str], None]

log = logging.getLogger(__name__)


class Scrubber:
    """Verifies ``store``'s records: :meth:`run_once` (on demand) or :meth:`start` (passes
    every ``interval`` seconds, at most ``rate`` bytes a second)."""

    def __init__(self, store: LedgerStorage, *, rate: float = 8 << 20,
                 slice_bytes: int = 1 << 20, interval: float = 3600.0,
                 on_damage: DamageCallback | None = None) -> None:
        if rate <= 0 or slice_bytes <= 0 or interval <= 0:
            raise ValueError("Scrubber needs rate, slice_bytes and interval > 0")
        self.store = store
        self.rate = rate
        self.slice_bytes = slice_bytes
        self.interval = interval
        self.on_damage = on_damage
        #: passes completed, records and bytes verified (tests, operators)
        self.passes = 0
        self.checked = 0
        self.checked_bytes = 0
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> dict[tuple[int, int], str]:
        """One pass over every entry held; the damage found in it."""
        found: dict[tuple[int, int], str] = {}
        budget = count = 0
        for lid, eid, size, where in self._walk():
            count += 1
            if budget >= self.slice_bytes:  # a slice done: wait out the rate, then go on
                await asyncio.sleep(budget / self.rate)
                budget = 0
            elif count % 512 == 0:  # (many small records: let the loop breathe)
                await asyncio.sleep(0)
            try:
                if self.store.scrub_check(lid, eid, where) is None:
                    continue  # deleted or moved (compaction, repair) since the pass began
                self.store.damaged.pop((lid, eid), None)
            except (OSError, BKError) as exc:
                what = f"{type(exc).__name__}: {exc}"
                found[(lid, eid)] = what
                if (lid, eid) not in self.store.damaged:
                    self.store.damaged[(lid, eid)] = what
                    if self.on_damage is not None:
                        self.on_damage(lid, eid, what)
            budget += size
            self.checked += 1
            self.checked_bytes += size
        self.passes += 1
        return found

    def _walk(self) -> Iterator[tuple[int, int, int, object]]:
        """The engine's walk. One that fails (a file gone under it) ends this pass early,
        logged; the next pass walks again."""
        try:
            yield from self.store.scrub_items()
        except (OSError, BKError) as exc:
            log.error("scrubber: the walk over the stored entries stopped: %s", exc)

    def start(self) -> None:
        """Passes in the background until :meth:`stop`, the first at once."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await self.run_once()
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def abandon(self) -> None:
        """Stop at once, not waiting (a crash: the store goes with it)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
