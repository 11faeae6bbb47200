"""The bookie's adds: single, batched and recovery adds, in the callback form every transport
drives (``add_request``), the hot path (``add_entry``) and the awaitable form (``add``).

A mixin of :class:`pybk.bookie.bookie.Bookie`, as :class:`pybk.bookie.reads.BookieReads` is:
the add side of the bookie kept apart from its life cycle and state. An add of a ledger this
bookie does not hold (and did not delete) is first checked against the metadata
(:mod:`pybk.bookie.unknown`): the adds of one ledger that arrive meanwhile share that one
check and are then admitted in their order of arrival. Once the ledger is held, the check
costs one lookup in the storage engine's index per request.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any

from pybk.bookie.deferred import DeferredAdd, DeferredSyncs
from pybk.bookie.replies import CountedAdd, Respond
from pybk.bookie.state import STOPPED, BookieState
from pybk.bookie.turns import admit_in_turns
from pybk.bookie.unknown import UnknownLedgerCheck
from pybk.errors import (
    BKError,
    BookieStoppedError,
    IOBookieError,
    ReadOnlyBookieError,
)
from pybk.runtime import sometimes
from pybk.runtime.turnqueue import TurnQueue
from pybk.stats import BookieStats
from pybk.storage.engine import LedgerStorage
from pybk.storage.store import AddCallback as EntryCallback
from pybk.storage.store import ResolveFuture
from pybk.wire import AddBatchRequest, AddCallback, AddRequest, Response

__all__ = ["BookieAdds"]

_RECOVERY_ON_FULL_DISK = sometimes.point(
    "bookie.recovery_add_on_full_disk",
    "a bookie read-only for its disk still took a recovery add (how a ledger gets sealed)")


class BookieAdds:
    """:class:`pybk.bookie.bookie.Bookie`'s adds (a mixin: the bookie's state is one)."""

    bookie_id: str
    store: LedgerStorage | None
    stats: BookieStats | None
    deferred: DeferredSyncs
    admit_chunk: int
    admit_step: int
    admit_turns: TurnQueue
    #: checks adds of ledgers not held here against the metadata (or None)
    unknown_ledgers: UnknownLedgerCheck | None
    _state: BookieState
    _reason: str
    _journal_failed: bool
    _disk_full: bool
    _remote_error: Callable[..., None]

    def _unknown(self, ledger_id: int) -> UnknownLedgerCheck | None:
        """The check an add of ``ledger_id`` must pass first: None when the ledger is held
        (or deleted: the engine refuses it), when stopped, or when nothing is checked."""
        check = self.unknown_ledgers
        store = self.store
        if (check is None or store is None or store.find(ledger_id) is not None
                or store.is_deleted(ledger_id)):
            return None
        return check

    def _vouched(self, admit: Callable[[], None], on_done: Any, ledger_id: int,
                 error: Exception | None) -> None:
        """The metadata's verdict on an add of a ledger not held here: ``admit()`` it, or
        answer ``on_done`` with the refusal."""
        if error is None:
            admit()
        else:
            on_done(self._add_error(error, ledger_id, -1))

    def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes, body: bytes,
                  on_done: EntryCallback, recovery: bool = False) -> None:
        """Store one framed entry and tell the outcome through ``on_done(error)``: ``None``
        once the entry is durable and readable here, else the error (a :class:`BKError`:
        ReadOnlyBookieError, LedgerFencedError, UnauthorizedError, EntryExistsError, ...;
        for a ledger not held here, the refusals of :mod:`pybk.bookie.unknown`).

        ``on_done`` is called exactly once, possibly before this returns, synchronously
        inside the journal's batch completion: it must be quick and must not raise. This is
        the bookie's hot path (BookKeeper's ``addEntry`` with its write callback): no task,
        no future and no request or response object per entry. :meth:`add` is the awaitable
        form, :meth:`add_request` the one the transports drive."""
        check = self.unknown_ledgers  # (inline: the hot path pays one lookup in the index)
        if check is not None and (store := self.store) is not None and store.find(
                ledger_id) is None and not store.is_deleted(ledger_id):
            admit = functools.partial(self._put_entry, ledger_id, entry_id, master_key, body,
                                      on_done, recovery)
            check.vouch(ledger_id, master_key, "an add",
                        functools.partial(self._vouched, admit, on_done, ledger_id))
            return
        self._put_entry(ledger_id, entry_id, master_key, body, on_done, recovery)

    def _put_entry(self, ledger_id: int, entry_id: int, master_key: bytes, body: bytes,
                   on_done: EntryCallback, recovery: bool) -> None:
        """:meth:`add_entry` once the ledger may be created here."""
        store = self.store
        if store is None or self._state == STOPPED or self._journal_failed or (
                self._disk_full and not recovery):
            on_done(self._add_refusal(recovery))
            return
        if self._disk_full:
            _RECOVERY_ON_FULL_DISK()
        try:
            store.add_entry(ledger_id, entry_id, body, master_key, recovery, on_done)
        except Exception as exc:
            on_done(self._add_error(exc, ledger_id, entry_id))

    def _add_refusal(self, recovery: bool) -> BKError:
        """Why this bookie takes no add now (stopped, or read-only for this kind of add)."""
        if self._state == STOPPED or self.store is None:
            return BookieStoppedError(f"bookie {self.bookie_id} is stopped")
        return ReadOnlyBookieError(f"bookie {self.bookie_id} is read-only: {self._reason}")

    def add_request(self, request: AddRequest | AddBatchRequest, on_done: AddCallback) -> None:
        """The add path every transport drives (the in-process transport, the TCP server, the
        simulated network): ``on_done(outcome)`` exactly once, a :data:`AddOutcome` (None:
        stored; a BKError; for a batch, possibly one outcome per entry), possibly before this
        returns, from the journal's batch completion. No response object is made: a server
        builds one only to put it on the wire. A request for a ledger not held here is
        checked against the metadata first (one check per ledger, however many adds wait)."""
        stats = self.stats
        if stats is not None:  # one timing per request: a batch's entries share it
            on_done = CountedAdd(stats, request, on_done, asyncio.get_running_loop().time)
        if request.deferred_sync:  # answered once the journal took it (pybk.bookie.deferred)
            on_done = self.deferred.start(request.ledger_id, on_done)
        check = self.unknown_ledgers  # (inline, as in add_entry)
        lid = request.ledger_id
        if check is not None and (store := self.store) is not None and store.find(
                lid) is None and not store.is_deleted(lid):
            admit = functools.partial(self._admit_request, request, on_done)
            check.vouch(request.ledger_id, request.master_key, "an add",
                        functools.partial(self._vouched, admit, on_done, request.ledger_id))
            return
        self._admit_request(request, on_done)

    def _admit_request(self, request: AddRequest | AddBatchRequest,
                       on_done: AddCallback) -> None:
        """:meth:`add_request` once the ledger may be created here."""
        if type(request) is AddBatchRequest:
            if len(request.bodies) > self.admit_chunk and len(request.entry_ids) == len(
                    request.bodies):  # (a large batch: over several loop turns)
                admit_in_turns(self._put_batch, request.ledger_id, request.entry_ids,
                               request.bodies, request.master_key, on_done, request.recovery,
                               on_done.admitted if isinstance(on_done, DeferredAdd) else None,
                               min(self.admit_step, self.admit_chunk), self.admit_turns)
                return
            self._put_batch(request.ledger_id, request.entry_ids, request.bodies,
                            request.master_key, on_done, request.recovery)
        else:
            assert isinstance(request, AddRequest)
            self._put_entry(request.ledger_id, request.entry_id, request.master_key,
                            request.body, on_done, request.recovery)
        if isinstance(on_done, DeferredAdd):
            on_done.admitted()

    def add_batch(self, ledger_id: int, entry_ids: Sequence[int], bodies: Sequence[bytes],
                  master_key: bytes, on_done: AddCallback, recovery: bool = False) -> None:
        """Store several framed entries of one ledger (``bodies[i]`` is entry
        ``entry_ids[i]``) with one journal append, one index update and one answer:
        ``on_done(outcome)`` once, like :meth:`add_request`. The bookie's state and the
        ledger's checks apply to the whole batch; each entry's own checks to it alone."""
        check = self._unknown(ledger_id)
        if check is not None:
            admit = functools.partial(self._put_batch, ledger_id, entry_ids, bodies,
                                      master_key, on_done, recovery)
            check.vouch(ledger_id, master_key, "an add",
                        functools.partial(self._vouched, admit, on_done, ledger_id))
            return
        self._put_batch(ledger_id, entry_ids, bodies, master_key, on_done, recovery)

    def _put_batch(self, ledger_id: int, entry_ids: Sequence[int], bodies: Sequence[bytes],
                   master_key: bytes, on_done: AddCallback, recovery: bool = False) -> None:
        """:meth:`add_batch` once the ledger may be created here."""
        store = self.store
        if store is None or self._state == STOPPED or self._journal_failed or (
                self._disk_full and not recovery):
            on_done(self._add_refusal(recovery))
            return
        try:
            store.add_batch(ledger_id, entry_ids, bodies, master_key, recovery, on_done)
        except Exception as exc:
            on_done(self._add_error(exc, ledger_id, entry_ids[0] if entry_ids else -1))

    def _add_error(self, exc: Exception, ledger_id: int, entry_id: int) -> BKError:
        """What an add reports for ``exc`` raised while admitting it: a BKError as is;
        anything else is a bug, logged with its traceback and reported as this bookie's I/O
        error (the writer replaces the bookie)."""
        if isinstance(exc, BKError):
            return exc
        self._remote_error("unexpected errors adding entries",
                           f"({ledger_id}, {entry_id}): {type(exc).__name__}: {exc}", exc)
        return IOBookieError(f"unexpected {type(exc).__name__}: {exc}")

    def add(self, ledger_id: int, entry_id: int, master_key: bytes, body: bytes,
            recovery: bool = False) -> asyncio.Future[None]:
        """Awaitable form of :meth:`add_entry`: resolves once the entry is durable, raises
        its error otherwise."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.add_entry(ledger_id, entry_id, master_key, body, ResolveFuture(fut), recovery)
        return fut

    def add_nowait(self, request: AddRequest, reply: Callable[[Response], None]) -> None:
        """Answer an add through ``reply(response)``, called exactly once (possibly before
        this returns): the same answers as ``await handle(request)``. :meth:`add_request`
        with the outcome put in a response (for callers that want one)."""
        self.add_request(request, Respond(request, reply))
