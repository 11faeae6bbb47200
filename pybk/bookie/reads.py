"""The bookie's reads: entries, batches of them, LAC reads and long polls.

A mixin of :class:`pybk.bookie.bookie.Bookie` (one object: the bookie's state, its store and
its parked long polls): the read side of ``Bookie.handle`` kept apart from the bookie's life
cycle, state and add paths. A damaged or unreadable entry is reported as such (never as
absent: rule R2), logged at a bounded rate since a remote peer can repeat the read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from pybk.bookie.longpoll import LongPollWaiters
from pybk.bookie.sizing import READ_BATCH_MAX_BYTES, answer_size
from pybk.bookie.state import STOPPED, BookieState
from pybk.bookie.unknown import UnknownLedgerCheck, fence_checked
from pybk.errors import (
    BadRequestError,
    BookieStoppedError,
    CorruptRecordError,
    IOBookieError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from pybk.runtime import sometimes
from pybk.storage.engine import LedgerStorage
from pybk.wire import (
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Status,
)

# (a module constant: each ``Status.X`` is a few hundred ns on CPython 3.11, whose enum
# metaclass's ``__getattr__`` takes every class attribute off the fast path)
_OK = Status.OK

__all__ = ["MAX_ENTRY_ID", "NO_SUCH_ENTRY_ON_IO_ERROR", "BookieReads"]

_LONG_POLL_FENCED = sometimes.point(
    "bookie.long_poll_ended_by_fence", "a parked long poll was answered because of a fence")

#: the highest entry id (entry ids are signed 64-bit on the wire)
MAX_ENTRY_ID: Final = (1 << 63) - 1

#: mutation switch (a name in ``config.mutations``; registry: ``pybk.testing.mutations``):
#: the bookie answers NoSuchEntry when reading an entry fails with an I/O or checksum error
#: (BookKeeper #2908), which lets recovery call a stored entry absent
NO_SUCH_ENTRY_ON_IO_ERROR: Final = "no_such_entry_on_io_error"


class BookieReads:
    """:class:`pybk.bookie.bookie.Bookie`'s reads (a mixin: the bookie's state is one)."""

    bookie_id: str
    store: LedgerStorage | None
    unknown_ledgers: UnknownLedgerCheck | None
    _state: BookieState
    _journal_failed: bool
    _polls: LongPollWaiters
    #: the :data:`NO_SUCH_ENTRY_ON_IO_ERROR` mutation is on (a broken build)
    _no_such_entry_on_io_error: bool
    _store: Callable[[], LedgerStorage]
    _remote_error: Callable[[str, str], None]

    def _read_entry(self, store: LedgerStorage, ledger_id: int, entry_id: int) -> bytes:
        try:
            return store.read(ledger_id, entry_id)
        except (CorruptRecordError, IOBookieError) as exc:
            if self._no_such_entry_on_io_error:  # a broken build (mutation switch)
                raise NoSuchEntryError(str(exc)) from None
            self._remote_error("damaged or unreadable entries read", str(exc))
            raise

    def _read_batch(self, req: ReadBatchRequest) -> ReadBatchResponse:
        """Several entries at once (``LedgerStore.read_many``: one pread for neighbouring
        records, an answer kept within :data:`READ_BATCH_MAX_BYTES`); each entry answered on
        its own, like :meth:`_read` would."""
        store = self._store()
        lid = req.ledger_id
        out, errors = store.read_many(lid, req.entry_ids, READ_BATCH_MAX_BYTES)
        for index, err in errors.items():
            if isinstance(err, CorruptRecordError | IOBookieError):
                if self._no_such_entry_on_io_error:  # a broken build (mutation switch)
                    out[index] = (out[index][0], Status.NO_SUCH_ENTRY, None)
                else:
                    self._remote_error("damaged or unreadable entries read", str(err))
        return ReadBatchResponse(_OK, lid, store.lac(lid), tuple(out))

    async def _read(self, req: ReadRequest) -> ReadResponse:
        store = self._store()
        lid = req.ledger_id
        if req.previous_lac is not None and req.previous_lac >= MAX_ENTRY_ID:
            raise BadRequestError(f"ledger {lid}: previous_lac {req.previous_lac} leaves no "
                                  "entry id to wait for (entry ids are below 2^63-1)")
        if req.fence:
            await fence_checked(self.unknown_ledgers, store, lid, req.master_key)
        if req.previous_lac is not None and req.timeout > 0:
            return await self._long_poll(store, req, req.previous_lac)
        if req.previous_lac is not None:
            # a non-waiting LAC probe: answer like a long poll that timed out at once
            return self._poll_answer(store, req, req.previous_lac)
        body = self._read_entry(store, lid, req.entry_id)
        entry_id = req.entry_id
        if entry_id == -1:
            entry_id = store.state(lid).last_entry
        return ReadResponse(_OK, lid, entry_id, body, lac=store.lac(lid))

    async def _long_poll(self, store: LedgerStorage, req: ReadRequest,
                         previous_lac: int) -> ReadResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.timeout
        lid = req.ledger_id
        while True:
            if store.is_deleted(lid):
                raise NoSuchLedgerError(f"ledger {lid} was deleted on this bookie")
            st = store.find(lid)
            if st is not None and (st.lac > previous_lac or st.fenced):
                if st.lac <= previous_lac:
                    _LONG_POLL_FENCED()
                break
            if self._journal_failed or self._state == STOPPED:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await self._polls.wait(lid, remaining)
            if self.store is not store:
                raise BookieStoppedError(f"bookie {self.bookie_id} stopped during a long poll")
        return self._poll_answer(store, req, previous_lac)

    def _poll_answer(self, store: LedgerStorage, req: ReadRequest,
                     previous_lac: int) -> ReadResponse:
        lid = req.ledger_id
        if store.is_deleted(lid):
            raise NoSuchLedgerError(f"ledger {lid} was deleted on this bookie")
        st = store.find(lid)
        lac = -1 if st is None else st.lac
        wanted = previous_lac + 1
        body = None
        if st is not None and store.entry_size(lid, wanted) is not None:
            body = self._read_entry(store, lid, wanted)
        return ReadResponse(_OK, lid, wanted, body, lac=lac)

    def response_size_hint(self, request: Request) -> int | None:
        """Bytes of entry data the answer to ``request`` will carry, from the index alone
        (:func:`pybk.bookie.sizing.answer_size`); None when stopped."""
        return None if self.store is None else answer_size(self.store, request)

    def _read_lac(self, req: ReadLacRequest) -> ReadLacResponse:
        store = self._store()
        st = store.state(req.ledger_id)
        last = None
        if st.last_entry >= 0:
            last = self._read_entry(store, req.ledger_id, -1)
        return ReadLacResponse(_OK, req.ledger_id, st.explicit_lac_body, last)
