"""LedgerStorage: the seam between a bookie and its storage engine.

Everything a bookie asks of its disk, as a :class:`typing.Protocol` (structural: an engine
implements it by having these members, no base class). :class:`pybk.storage.store.LedgerStore`
(the journal is the entry store) is today's engine; ``pybk.testing.ledger_storage_conformance``
checks any engine against the behaviours the bookie relies on.

The journal stays the durability log of every engine (an add is acknowledged after the
journal fsync that covers it), so the seam exposes it for its failure state, backlog and
position; where an engine keeps entries after that (the journal's segments, or entry logs
behind a write cache) and how it indexes them is its own business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from pybk.errors import BKError
from pybk.storage.compaction import CompactionResult
from pybk.storage.journal import Journal
from pybk.storage.startup import ReplayReport
from pybk.storage.writes import AddCallback, BatchCallback
from pybk.wire import Status

__all__ = ["LedgerStorage", "LedgerView"]


class LedgerView(Protocol):
    """What the bookie reads of one ledger's state (``LedgerStorage.find``/``state``)."""

    master_key: bytes | None
    fenced: bool
    explicit_lac_body: bytes | None

    @property
    def lac(self) -> int:
        """The highest LAC known here (explicit, piggybacked or arrived with an add)."""
        ...

    @property
    def last_entry(self) -> int:
        """The highest entry id held (durable), -1 when none."""
        ...


@runtime_checkable
class LedgerStorage(Protocol):
    """A bookie's storage engine. Errors are pybk's :class:`~pybk.errors.BKError` kinds:
    NoSuchLedgerError / NoSuchEntryError for what is not held (UnknownLedgerStateError while
    the engine may have lost data), LedgerFencedError, UnauthorizedError, EntryExistsError,
    BadRequestError, IOBookieError / CorruptRecordError for damage."""

    journal: Journal
    #: ``path@offset`` of each suspect journal segment the engine started over
    suspect: list[str]
    #: entries found damaged: (ledger, entry) -> what
    damaged: dict[tuple[int, int], str]
    #: set when the engine opened read-only (disk full at start-up)
    read_only_reason: str
    #: what start-up found (checkpoint loaded, journal replayed, leftovers)
    report: ReplayReport

    # ---------------------------------------------------------------- start-up / shut-down
    async def open(self) -> None:
        """Recover (last checkpoint + journal replay after it) and start taking writes."""
        ...

    async def close(self) -> None:
        """Drain pending writes, checkpoint, close files."""
        ...

    def abandon(self, exc: BaseException) -> None:
        """Crash: no sync; every pending write fails with ``exc``."""
        ...

    # ---------------------------------------------------------------- writes
    def add(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
            recovery: bool = False) -> asyncio.Future[None]:
        """One framed entry; the future resolves once it is durable and readable."""
        ...

    def add_entry(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
                  recovery: bool, on_done: AddCallback) -> None:
        """One framed entry, the hot path: raises at once for a refused add, else calls
        ``on_done(error)`` exactly once (None: durable and readable)."""
        ...

    def add_batch(self, ledger_id: int, entry_ids: Sequence[int], bodies: Sequence[bytes],
                  master_key: bytes, recovery: bool, on_done: BatchCallback) -> None:
        """Entries of one ledger; ``on_done(outcome)`` once for the lot."""
        ...

    def fence(self, ledger_id: int, master_key: bytes) -> Awaitable[None]:
        """Fence durably (creating the ledger, fenced, if unknown); effective at once."""
        ...

    def write_lac(self, ledger_id: int, lac: int, body: bytes,
                  master_key: bytes) -> Awaitable[None]:
        """Record an explicit LAC and its body durably (the journal may hold its record for
        the next batch, ``journal_lazy_wait`` at most); readers see it at once."""
        ...

    def delete_ledger(self, ledger_id: int) -> Awaitable[None]:
        """Forget a ledger for good (later adds, fences and LAC writes are refused)."""
        ...

    # ---------------------------------------------------------------- reads
    def read(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored framed entry (``entry_id == -1``: the last one held), verified."""
        ...

    def read_many(self, ledger_id: int, entry_ids: Sequence[int], max_bytes: int,
                  max_absent: int = ...,
                  ) -> tuple[list[tuple[int, Status, bytes | None]], dict[int, BKError]]:
        """The batched read: a prefix of ``entry_ids`` answered, each failure alone."""
        ...

    def read_range(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        """(entry id, body) for the entries held in [first, last], ascending."""
        ...

    def lac(self, ledger_id: int) -> int:
        """The ledger's LAC here; -1 when unknown."""
        ...

    def state(self, ledger_id: int) -> LedgerView:
        """The ledger's state; NoSuchLedgerError when unknown or deleted."""
        ...

    def find(self, ledger_id: int) -> LedgerView | None:
        """The ledger's state, or None when unknown or deleted (no error)."""
        ...

    def is_deleted(self, ledger_id: int) -> bool:
        """Whether the ledger was deleted on this bookie."""
        ...

    def entry_size(self, ledger_id: int, entry_id: int) -> int | None:
        """Bytes stored for a held entry (its record), None when not held; no disk read."""
        ...

    def ranges(self, ledger_id: int) -> tuple[tuple[int, int], ...]:
        """The entry ids held, as inclusive (first, last) runs."""
        ...

    def ledger_ids(self) -> list[int]:
        """Ledgers held (not deleted), ascending."""
        ...

    # ---------------------------------------------------------------- maintenance
    def checkpoint(self) -> Awaitable[object]:
        """Make everything durable so far independent of the journal before the mark it
        returns (replay starts there)."""
        ...

    @property
    def checkpoint_stats(self) -> dict[str, int]:
        """Counters of the checkpoints written (inspection)."""
        ...

    def segment_usage(self) -> dict[int, tuple[int, int]]:
        """file id -> (live bytes, file bytes) of the sealed files garbage collection and
        compaction look at."""
        ...

    async def compact(self, threshold: float | None = None, *,
                      pace: Callable[[int], Awaitable[None]] | None = None,
                      ) -> CompactionResult:
        """Reclaim sealed files whose live fraction is below ``threshold``."""
        ...

    def scrub_items(self) -> Iterator[tuple[int, int, int, object]]:
        """(ledger, entry, bytes, where) of every entry on disk: the scrubber's walk."""
        ...

    def scrub_check(self, ledger_id: int, entry_id: int, where: Any) -> int | None:
        """Verify one entry where :meth:`scrub_items` found it: bytes read, None if gone
        since; damage raises CorruptRecordError or OSError."""
        ...

    def _check(self) -> None:
        """Assert the engine's invariants (stateful tests)."""
        ...
