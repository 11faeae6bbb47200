"""The local scrubber: every stored record's checksum verified in the background at a bounded
rate, so damage to a sealed segment (truncated, zeroed, a flipped bit, a deleted file) is
found before a reader needs the entry, as BookKeeper's local scrubber does.

A pass walks every ledger's entries in index order, reading each record (``pread``) and
checking it like a read does (CRC, ids). It reads at most ``rate`` bytes a second, in slices
of at most ``slice_bytes`` (the loop is held for one slice, then the next waits for the rate),
over the store's file system seam and the running loop's clock. A damaged entry is recorded
in ``store.damaged`` (``(ledger, entry) -> what``: the bookie's info reports it) and handed to
``on_damage(ledger_id, entry_id, error)`` (a bookie process marks the ledger under-replicated,
so auto-recovery copies the entry back from the other replicas). An entry read fine again (a
repair wrote a new copy) leaves ``damaged``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from pybk.errors import CorruptRecordError
from pybk.storage.records import decode_entry_at
from pybk.storage.store import LedgerStore

__all__ = ["Scrubber"]

DamageCallback = Callable[[int, int, str], None]


class Scrubber:
    """Verifies ``store``'s records: :meth:`run_once` (on demand) or :meth:`start` (passes
    every ``interval`` seconds, at most ``rate`` bytes a second)."""

    def __init__(self, store: LedgerStore, *, rate: float = 8 << 20,
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

    def _locations(self) -> Iterator[tuple[int, int, int, int, int]]:
        """(ledger, entry, segment, offset, size) of every entry held now."""
        for lid in self.store.ledger_ids():
            st = self.store.index.get(lid)
            if st is None:
                continue
            for eid, (seg, off, size) in st.entries.items():
                yield lid, int(eid), seg, off, size

    async def run_once(self) -> dict[tuple[int, int], str]:
        """One pass over every entry held; the damage found in it."""
        found: dict[tuple[int, int], str] = {}
        budget = count = 0
        for lid, eid, seg, off, size in self._locations():
            count += 1
            if budget >= self.slice_bytes:  # a slice done: wait out the rate, then go on
                await asyncio.sleep(budget / self.rate)
                budget = 0
            elif count % 512 == 0:  # (many small records: let the loop breathe)
                await asyncio.sleep(0)
            st = self.store.index.get(lid)
            if st is None or st.entries.get(eid) != (seg, off, size):
                continue  # deleted or moved (compaction, repair) since the pass began
            path = self.store.journal_path(seg)
            try:
                decode_entry_at(self.store.fs.pread(path, off, size), path, off, lid, eid)
                self.store.damaged.pop((lid, eid), None)
            except (OSError, CorruptRecordError) as exc:
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
