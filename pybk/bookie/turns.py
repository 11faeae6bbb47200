"""Large batched adds admitted over several loop turns, so no request holds the loop long.

Admitting an entry the bookie already holds, or refusing one, is work per entry (an index
lookup, a comparison, an error), done on the event loop. A batch of up to 65,536 entries
needing that work held the loop for a quarter of a second or more; every other connection
waited. A batch of more than :data:`ADMIT_CHUNK` entries is therefore admitted
:data:`ADMIT_STEP` entries per loop turn, each chunk checked as a batch of its own (the
bookie's state, the ledger, every entry), and answered once, when every chunk has its
outcome. The writer's default batches (1,024 entries) are never split.

The chunks of every batch being admitted take turns in one
:class:`~pybk.runtime.turnqueue.TurnQueue` of the bookie: one chunk per loop turn in all,
however many batches are in flight (each scheduling its own next chunk, sixty-four batches
ran sixty-four chunks in one turn). A chunk's outcome is kept as a range until the last one:
no list of an outcome per entry is held while the batch is in flight.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from pybk.errors import BKError
from pybk.runtime.turnqueue import TurnQueue
from pybk.wire import AddCallback, AddOutcome

__all__ = ["ADMIT_CHUNK", "ADMIT_STEP", "admit_in_turns"]

#: batches of more entries than this are admitted over several loop turns
ADMIT_CHUNK = 1024
#: entries admitted per loop turn then (about a millisecond of the slow path's checks)
ADMIT_STEP = 512

#: ``add_batch(ledger_id, entry_ids, bodies, master_key, on_done, recovery)``: never raises
AddBatch = Callable[[int, Sequence[int], Sequence[bytes], bytes, AddCallback, bool], None]


class _Combined:
    """The chunks' outcomes gathered into the one answer of the batch."""

    __slots__ = ("failed", "left", "n", "on_done")

    def __init__(self, n: int, chunks: int, on_done: AddCallback) -> None:
        self.n = n
        #: (start, stop, outcome) of each chunk not all stored, until the last chunk's
        self.failed: list[tuple[int, int, AddOutcome]] = []
        self.left = chunks
        self.on_done = on_done

    def chunk_done(self, start: int, stop: int, outcome: AddOutcome) -> None:
        if outcome is not None:
            self.failed.append((start, stop, outcome))
        self.left -= 1
        if self.left:
            return
        if not self.failed:
            self.on_done(None)
            return
        outcomes: list[BKError | None] = [None] * self.n
        for lo, hi, out in self.failed:
            if isinstance(out, BKError):
                outcomes[lo:hi] = [out] * (hi - lo)
            else:
                assert out is not None
                outcomes[lo:hi] = out
        self.failed = []
        self.on_done(None if outcomes.count(None) == self.n else outcomes)


def admit_in_turns(add_batch: AddBatch, ledger_id: int, entry_ids: Sequence[int],
                   bodies: Sequence[bytes], master_key: bytes, on_done: AddCallback,
                   recovery: bool, on_admitted: Callable[[], None] | None = None,
                   chunk: int = ADMIT_STEP, turns: TurnQueue | None = None) -> None:
    """Admit the batch ``chunk`` entries per loop turn (the first one now, the others as
    ``turns`` gives them a turn: a queue of their own if None); ``on_done`` gets one outcome
    for the lot, ``on_admitted`` is called once the last chunk was handed over."""
    n = len(bodies)
    combined = _Combined(n, -(-n // chunk), on_done)
    position = [0]

    def admit() -> bool:
        start = position[0]
        stop = position[0] = min(n, start + chunk)
        add_batch(ledger_id, entry_ids[start:stop], bodies[start:stop], master_key,
                  functools.partial(combined.chunk_done, start, stop), recovery)
        if stop < n:
            return False
        if on_admitted is not None:
            on_admitted()
        return True

    if not admit():
        (turns if turns is not None else TurnQueue()).submit(admit)
