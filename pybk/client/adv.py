"""Caller-chosen entry ids (BookKeeper's ``LedgerHandleAdv``, ``createLedgerAdv``).

The writer names each entry's id; adds may arrive out of order and from many tasks. An entry
whose predecessors are all added goes into the ordinary write pipeline at once; one that
arrives ahead of a missing id is held by the handle until the gap is filled (:class:`AdvOrder`,
sans-IO). So the LAC is the contiguous prefix of acknowledged ids, an append's future
resolves once its id and every id before it are durable, and recovery seals at the end of
that prefix: entries held ahead of a gap were never sent, so they never outlive the writer.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any, Final

from pybk.client.writer import LedgerHandle
from pybk.errors import BadRequestError, DuplicateEntryIdError, LedgerClosedError, fresh_copy
from pybk.wire import WriteLacRequest

__all__ = ["ADV_ACKS_HELD_ENTRIES", "ADV_LAC_OVER_GAP", "AdvOrder", "LedgerHandleAdv"]

#: mutation switch (a name in ``config.mutations``; registry: ``pybk.testing.mutations``): an
#: entry held ahead of a missing id is answered at once, as if it and every id before it were
#: durable (it was never sent: a writer that never fills the gap loses an acknowledged entry)
ADV_ACKS_HELD_ENTRIES: Final = "adv_acks_held_entries"
#: mutation switch: an entry held ahead of a missing id moves the LAC told to the bookies to
#: it, over the gap (readers see ids no bookie holds)
ADV_LAC_OVER_GAP: Final = "adv_lac_over_gap"


class AdvOrder:
    """Puts caller-chosen ids in order (sans-IO): :meth:`offer` an entry, get back the run of
    entries that may now enter the pipeline (ids ``next_id``, ``next_id + 1``, ...)."""

    def __init__(self, next_id: int = 0) -> None:
        #: the id the pipeline takes next (every smaller id was released)
        self.next_id = next_id
        #: entries ahead of a missing id: id -> (payload, waiter)
        self.ahead: dict[int, tuple[bytes, Any]] = {}

    @property
    def held(self) -> int:
        """Entries waiting for a missing id before them."""
        return len(self.ahead)

    def offer(self, entry_id: int, payload: bytes, waiter: Any = None,
              ) -> list[tuple[int, bytes, Any]]:
        """Take entry ``entry_id``; returns ``(id, payload, waiter)`` of each entry released
        now, in id order. Raises DuplicateEntryIdError (taking nothing) for an id offered
        before."""
        if entry_id < self.next_id or entry_id in self.ahead:
            raise DuplicateEntryIdError(
                f"entry id {entry_id} was added already (next new id in order: "
                f"{self.next_id}); nothing was added")
        self.ahead[entry_id] = (payload, waiter)
        out = []
        ahead = self.ahead
        while (item := ahead.pop(self.next_id, None)) is not None:
            out.append((self.next_id, item[0], item[1]))
            self.next_id += 1
        return out

    def take_held(self) -> list[tuple[int, Any]]:
        """Remove every held entry; returns ``(id, waiter)`` of each, in id order."""
        held = sorted((eid, w) for eid, (_p, w) in self.ahead.items())
        self.ahead.clear()
        return held


class LedgerHandleAdv(LedgerHandle):
    """A ledger open for writing whose entry ids the caller chooses (see the module docstring).

    ``append(entry_id, data)`` returns a future of ``entry_id`` that resolves once Qa bookies
    hold it and every smaller id durably. An id added before (or at most the last add
    confirmed) raises :class:`pybk.DuplicateEntryIdError`. ``append_many`` (ids chosen by the
    handle) is refused. Closing seals the ledger at the contiguous prefix; entries still held
    ahead of a gap fail with LedgerClosedError."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._order = AdvOrder(self.last_add_pushed + 1)
        self._acks_held = ADV_ACKS_HELD_ENTRIES in self._ctx.config.mutations
        self._lac_over_gap = ADV_LAC_OVER_GAP in self._ctx.config.mutations

    @property
    def held(self) -> int:
        """Entries waiting for a missing id before them (never sent yet)."""
        return self._order.held

    def append(self, entry_id: int, data: bytes | bytearray | memoryview,  # type: ignore[override]
               ) -> asyncio.Future[int]:
        """Add ``data`` as entry ``entry_id``; returns a future of the id. Refused before
        anything is taken: a bad id (TypeError, ValueError), a duplicate
        (DuplicateEntryIdError), a non-bytes payload, one over ``max_entry_size``, a closed or
        failed handle."""
        if isinstance(entry_id, bool) or not isinstance(entry_id, int):
            raise TypeError(f"entry_id must be an int, not {entry_id!r}")
        if entry_id < 0:
            raise ValueError(f"entry_id must be >= 0, got {entry_id}")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"append() takes bytes, not {type(data).__name__}")
        data = bytes(data)
        if len(data) > self._max_entry:
            raise self._too_large(len(data))
        if self._closing:
            raise LedgerClosedError(f"ledger {self.id}: this handle is closed")
        error = self._pipeline.error
        if error is not None:
            raise fresh_copy(error)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        for _eid, payload, waiter in self._order.offer(entry_id, data, fut):
            inner = self._pipeline.push(payload)
            inner.add_done_callback(functools.partial(self._settle, waiter))
        if self._acks_held and entry_id in self._order.ahead:
            fut.set_result(entry_id)  # (the broken build: answered before it was even sent)
        if self._lac_over_gap and entry_id in self._order.ahead:
            self._tell_lac(max(self._order.ahead))
        return fut

    def _tell_lac(self, lac: int) -> None:
        """(Mutation ADV_LAC_OVER_GAP only: a broken build's explicit LAC.)"""
        p = self._pipeline
        request = WriteLacRequest(self.id, lac, p.master_key, p.digest.frame_lac(lac))
        for bookie in p.core.ensemble:
            p.ctx.transport.send(bookie, request, 2.0).add_done_callback(_ignore)

    def append_many_nowait(self, items: Sequence[bytes | bytearray | memoryview],
                           ) -> asyncio.Future[list[int]]:
        raise BadRequestError(
            f"ledger {self.id} takes caller-chosen entry ids: use append(entry_id, data)")

    def _settle(self, waiter: asyncio.Future[int], inner: asyncio.Future[int]) -> None:
        if inner.cancelled():
            waiter.cancel()
            return
        exc = inner.exception()
        if exc is None:
            if not waiter.done():
                waiter.set_result(inner.result())
            return
        if not waiter.done():
            waiter.set_exception(fresh_copy(exc))
            waiter.exception()
        # the pipeline failed: the entries held ahead of a gap can never be added either
        self._fail_held(exc)

    def _fail_held(self, exc: BaseException) -> None:
        for _eid, waiter in self._order.take_held():
            if not waiter.done():
                waiter.set_exception(fresh_copy(exc))
                waiter.exception()  # the caller may never look; do not warn

    async def close(self) -> None:
        """Seal the ledger at the contiguous prefix of acknowledged ids (see the class)."""
        await super().close()
        if self._order.held:
            first = self._order.next_id
            self._fail_held(LedgerClosedError(
                f"ledger {self.id} was closed at entry {self.last_add_confirmed}: entry id "
                f"{first} was never added, so the entries after it were not either"))

    def __repr__(self) -> str:
        return (f"<LedgerHandleAdv {self.id} lac={self.last_add_confirmed} "
                f"lap={self.last_add_pushed} held={self.held} closed={self.is_closed}>")


def _ignore(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
