"""Large batched adds admitted over several loop turns, so no request holds the loop long.

Admitting an entry the bookie already holds, or refusing one, is work per entry (an index
lookup, a comparison, an error), done on the event loop. A batch of up to 65,536 entries
needing that work held the loop for a quarter of a second or more; every other connection
waited. A batch of more than :data:`ADMIT_CHUNK` entries is therefore admitted a chunk per
loop turn, each chunk checked as a batch of its own (the bookie's state, the ledger, every
entry), and answered once, when every chunk has its outcome. The writer's default batches
(1,024 entries) are never split.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

from pybk.errors import BKError
from pybk.wire import AddCallback, AddOutcome

__all__ = ["ADMIT_CHUNK", "admit_in_turns"]

#: entries admitted per loop turn (a few milliseconds of the slow path's checks)
ADMIT_CHUNK = 2048

#: ``add_batch(ledger_id, entry_ids, bodies, master_key, on_done, recovery)``: never raises
AddBatch = Callable[[int, Sequence[int], Sequence[bytes], bytes, AddCallback, bool], None]


class _Combined:
    """The chunks' outcomes gathered into the one answer of the batch."""

    __slots__ = ("left", "on_done", "outcomes")

    def __init__(self, n: int, chunks: int, on_done: AddCallback) -> None:
        self.outcomes: list[BKError | None] = [None] * n
        self.left = chunks
        self.on_done = on_done

    def chunk_done(self, start: int, stop: int, outcome: AddOutcome) -> None:
        if isinstance(outcome, BKError):
            self.outcomes[start:stop] = [outcome] * (stop - start)
        elif outcome is not None:
            self.outcomes[start:stop] = outcome
        self.left -= 1
        if self.left == 0:
            outcomes = self.outcomes
            self.on_done(None if all(o is None for o in outcomes) else outcomes)


def admit_in_turns(add_batch: AddBatch, ledger_id: int, entry_ids: Sequence[int],
                   bodies: Sequence[bytes], master_key: bytes, on_done: AddCallback,
                   recovery: bool, on_admitted: Callable[[], None] | None = None,
                   chunk: int = ADMIT_CHUNK) -> None:
    """Admit the batch ``chunk`` entries per loop turn (the first one now); ``on_done`` gets
    one outcome for the lot, ``on_admitted`` is called once the last chunk was handed over."""
    n = len(bodies)
    combined = _Combined(n, -(-n // chunk), on_done)
    loop = asyncio.get_running_loop()

    def admit(start: int) -> None:
        stop = min(n, start + chunk)
        add_batch(ledger_id, entry_ids[start:stop], bodies[start:stop], master_key,
                  functools.partial(combined.chunk_done, start, stop), recovery)
        if stop < n:
            loop.call_soon(admit, stop)
        elif on_admitted is not None:
            on_admitted()

    admit(0)
