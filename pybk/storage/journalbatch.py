"""One batch on its way through the journal, and how the futures of failed appends fail.

:class:`pybk.storage.journal.Journal` writes its buffered records as a :class:`JournalBatch`,
syncs it, then completes it (the store's callbacks, the appends' futures) exactly once, or
fails it; kept apart so the journal's module holds the group commit itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pybk.errors import fresh_copy
from pybk.storage.index import Position

__all__ = ["JournalBatch", "fail_futures", "not_open"]


class JournalBatch:
    """One batch on its way: written, then synced, then completed (answered) exactly once."""

    __slots__ = ("bytes", "completed", "entries", "futs", "offsets", "position", "tags")

    def __init__(self, tags: list[Any], offsets: list[int],
                 futs: list[asyncio.Future[None] | None], size: int, entries: int) -> None:
        self.tags = tags
        self.entries = entries  # the entries its records hold (their weights)
        self.offsets = offsets  # where each item starts in the segment, then the batch's end
        self.futs = futs
        self.bytes = size
        #: where the segment ends after this batch (set once written)
        self.position: Position | None = None
        #: answered (successfully or not): never again
        self.completed = False

    @property
    def records(self) -> int:
        return len(self.tags)


def fail_futures(futs: list[asyncio.Future[None] | None], exc: BaseException) -> None:
    """Fail every pending future of ``futs`` (None: an append without one), each with its own
    copy of ``exc``, marked as retrieved (the caller may never look)."""
    for fut in filter(None, futs):
        if not fut.done():
            fut.set_exception(fresh_copy(exc))
            fut.exception()


def not_open() -> asyncio.Future[None]:
    """A journal's future maker before it opened (no loop yet): refuses."""
    raise RuntimeError("journal is not open")
