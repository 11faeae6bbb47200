"""Deferred-sync adds on the bookie (BookKeeper's ``ackBeforeSync`` and FORCE_LEDGER).

An add with ``deferred_sync`` set is answered as soon as the journal has taken it (the store
admitted it and it waits in the journal's buffer for the next group commit), not after the
fsync. The journal still writes and syncs it with the next batch; :class:`DeferredSyncs`
remembers, per ledger, the adds answered early until their sync, and a FORCE waits for every
one answered before it. A failed sync (the journal died) is kept and reported by the next
FORCE: that is how the writer learns that entries it was told of are gone.

A refusal the store gives at once (a fenced ledger, a wrong key, a read-only bookie) is the
answer, as for any add; an entry of a batch refused only later (it conflicts with one being
written) shows at the next FORCE.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pybk.errors import BKError, IOBookieError, fresh_copy
from pybk.wire import AddCallback, AddOutcome, ForceRequest, ForceResponse, Status

__all__ = ["DeferredAdd", "DeferredSyncs", "force_reply"]


class _Ledger:
    __slots__ = ("error", "next_seq", "outstanding", "waiters")

    def __init__(self) -> None:
        self.next_seq = 0
        #: sequence numbers of the adds answered early and not yet synced
        self.outstanding: set[int] = set()
        #: (sequence number every add below which must be synced, future) per FORCE
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []
        #: the first sync that failed (reported by every later FORCE)
        self.error: BaseException | None = None


class DeferredAdd:
    """One deferred-sync add on its way: hand it to the store as the add's
    ``on_done`` (it is callable), then call :meth:`admitted` once the store call returned."""

    __slots__ = ("answered", "ledger", "on_done", "owner", "seq")

    def __init__(self, owner: DeferredSyncs, ledger_id: int, on_done: AddCallback) -> None:
        self.owner = owner
        self.ledger = ledger_id
        self.on_done = on_done
        self.answered = False
        self.seq = -1

    def __call__(self, outcome: AddOutcome) -> None:
        """The store's outcome: at once (a refusal) it is the answer; later, the sync's."""
        if not self.answered:
            self.answered = True
            self.on_done(outcome)
            return
        self.owner._synced(self.ledger, self.seq, _error_of(outcome))

    def admitted(self) -> None:
        """The store took the add without answering: answer it now (before its fsync)."""
        if self.answered:
            return
        self.answered = True
        self.seq = self.owner._track(self.ledger)
        self.on_done(None)


class DeferredSyncs:
    """The deferred-sync adds a bookie answered before their sync, per ledger."""

    def __init__(self) -> None:
        self._ledgers: dict[int, _Ledger] = {}

    def start(self, ledger_id: int, on_done: AddCallback) -> DeferredAdd:
        """A deferred-sync add of ``ledger_id`` answered through ``on_done``."""
        return DeferredAdd(self, ledger_id, on_done)

    def pending(self, ledger_id: int) -> int:
        """Adds of the ledger answered and not yet synced."""
        led = self._ledgers.get(ledger_id)
        return 0 if led is None else len(led.outstanding)

    async def force(self, ledger_id: int) -> None:
        """Return once every add of ``ledger_id`` answered so far is durable; raise the
        error of a sync that failed (those entries are lost)."""
        led = self._ledgers.get(ledger_id)
        if led is None:
            return
        target = led.next_seq
        if led.outstanding and min(led.outstanding) < target:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            led.waiters.append((target, fut))
            await fut
        if led.error is not None:
            raise fresh_copy(led.error)

    def _track(self, ledger_id: int) -> int:
        led = self._ledgers.get(ledger_id)
        if led is None:
            led = self._ledgers[ledger_id] = _Ledger()
        seq = led.next_seq
        led.next_seq += 1
        led.outstanding.add(seq)
        return seq

    def _synced(self, ledger_id: int, seq: int, error: BaseException | None) -> None:
        led = self._ledgers.get(ledger_id)
        if led is None:
            return
        led.outstanding.discard(seq)
        if error is not None and led.error is None:
            led.error = error if isinstance(error, BKError) else IOBookieError(str(error))
        low = min(led.outstanding, default=led.next_seq)
        still = []
        for target, fut in led.waiters:
            if target <= low:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((target, fut))
        led.waiters = still
        if not led.outstanding and not led.waiters and led.error is None:
            del self._ledgers[ledger_id]  # (nothing to remember: a later FORCE returns at once)


def _error_of(outcome: AddOutcome) -> BaseException | None:
    if outcome is None or isinstance(outcome, BaseException):
        return outcome
    errors: Sequence[Any] = outcome
    return next((e for e in errors if e is not None), None)


async def force_reply(syncs: DeferredSyncs, store: Any, request: ForceRequest) -> ForceResponse:
    """Answer a FORCE: once the ledger's early-answered adds are durable, with the last entry
    of the ledger this bookie holds (-1: none)."""
    await syncs.force(request.ledger_id)
    st = store.find(request.ledger_id)  # (any engine: the journal's or the db's)
    last = st.last_entry if st is not None else -1
    return ForceResponse(Status.OK, request.ledger_id, last)
