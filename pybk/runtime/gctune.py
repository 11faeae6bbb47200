"""Garbage-collector settings for a process that runs pybk's hot paths (bookies, a writing
client): set by process entry points and by explicit options, never by importing pybk.

Why: the write path allocates a few short-lived containers per entry (a future, a batch's
lists, a callback), freed by reference counting: no per-request cycles (the tests check
this), so the cyclic collector finds nothing to free, yet with the default gen-0 threshold
(700) it runs every few hundred entries and, now and then, a full collection walks every
object the process holds (an application's too), stopping the event loop meanwhile: the
in-process p99 at half the peak rate was made of those pauses (docs/performance.md).

Design notes: docs/internals.md, "pybk/runtime/gctune.py".
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["SERVER_GC_THRESHOLD", "GcTuning", "frozen_by_others", "tune_gc_for_server"]

#: gen-0, gen-1, gen-2 thresholds for a process running pybk's hot paths
SERVER_GC_THRESHOLD: Final = (50_000, 20, 20)


def tune_gc_for_server() -> None:
    """Freeze the heap built so far and raise the collector's thresholds (module doc), for
    good: for a process that is one long-lived bookie or writer (``pybk bookie``).

    About 13% less CPU per entry with 256 writers against one bookie (a bigger gen-0 pass
    every 50,000 net container allocations rather than one every 700), and no full
    collection over what start-up built."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVER_GC_THRESHOLD)


def frozen_by_others() -> bool:
    """Whether objects other than the interpreter's immortal ones are frozen (``gc.freeze()``
    was called and not undone). On 3.12 a full collection moves immortal containers to the
    permanent generation, where ``gc.get_freeze_count()`` counts them; so when the count is
    not zero this unfreezes, collects and compares: a count that drops was someone's freeze.
    Their objects are unfrozen by the check: call it just before freezing again."""
    gc.collect()
    before = gc.get_freeze_count()
    if before == 0:
        return False
    gc.unfreeze()
    gc.collect()
    return gc.get_freeze_count() < before


class GcTuning:
    """:func:`tune_gc_for_server` that can be undone: :meth:`apply` once what should be
    frozen exists (after start-up), :meth:`restore` puts the thresholds back and unfreezes
    (unless something else had frozen objects before: a freeze cannot be partly undone)."""

    def __init__(self) -> None:
        self._previous: tuple[int, int, int] | None = None
        self._froze = False

    @property
    def applied(self) -> bool:
        return self._previous is not None

    def apply(self) -> None:
        if self._previous is not None:
            return
        self._previous = gc.get_threshold()
        self._froze = not frozen_by_others()
        tune_gc_for_server()  # (freezes again whatever the check unfroze)

    def restore(self) -> None:
        previous, self._previous = self._previous, None
        if previous is None:
            return
        if self._froze:
            gc.unfreeze()
        gc.set_threshold(*previous)
