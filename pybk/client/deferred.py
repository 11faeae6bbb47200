"""Deferred sync (BookKeeper's ``WriteFlag.DEFERRED_SYNC`` and ``force()``).

A ledger created with ``write_flags={"deferred_sync"}`` sends its adds with the deferred-sync
flag: each bookie answers once its journal has taken the entry, before the fsync
(:mod:`pybk.bookie.deferred`). An append then resolves once Qa bookies have it *written*;
:meth:`DeferredSyncLedgerHandle.force` makes everything added so far durable (a FORCE to each
bookie of the ensemble) and returns the LAC that is now durable. That LAC, not the written
one, is what readers are told (piggybacked on entries; sent as an explicit LAC after a force
no append follows at once), so a reader never sees an entry that a crash could still take back.

Restrictions, as in BookKeeper: the ensemble never changes (a bookie that fails an add or a
force fails the writer; recover the ledger and write a new one), and the bookies must speak
protocol version 3 (an older bookie refuses the flag, which fails the writer).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Sequence
from typing import Any, Final

from pybk.client.writer import AddPipeline, AddReply, LedgerHandle
from pybk.errors import (
    BKError,
    BookieUnavailableError,
    IOBookieError,
    LedgerClosedError,
    error_for_status,
    fresh_copy,
)
from pybk.wire import (
    AddBatchRequest,
    ForceRequest,
    ForceResponse,
    Response,
    Status,
    WriteLacRequest,
)

__all__ = ["DEFERRED_LAC_PAST_FORCE", "FORCE_BEFORE_SYNC", "DeferredSyncLedgerHandle",
           "DeferredSyncPipeline", "WriteFlag", "check_write_flags"]

#: mutation switch (a name in ``config.mutations``; registry: ``pybk.testing.mutations``): the
#: bookies are told the written LAC, not the durable one (readers see entries a crash may
#: still take back)
DEFERRED_LAC_PAST_FORCE: Final = "deferred_lac_past_force"
#: mutation switch: ``force()`` returns at once, without the bookies' FORCE answers (what it
#: calls durable may still be in their journals' buffers)
FORCE_BEFORE_SYNC: Final = "force_before_sync"


class WriteFlag(enum.StrEnum):
    """How a ledger's adds are written (``create_ledger(write_flags=...)``)."""

    #: answered once written to the bookies' journals, durable on ``force()``
    DEFERRED_SYNC = "deferred_sync"


def check_write_flags(flags: Iterable[str] | None) -> frozenset[WriteFlag]:
    """The write flags named by ``flags`` (ValueError for an unknown one, TypeError for a
    bare string, which would be read letter by letter)."""
    if flags is None:
        return frozenset()
    if isinstance(flags, str | bytes):
        raise TypeError(f"write_flags is a collection of flags, not {flags!r}: "
                        f"write_flags={{{flags!r}}}")
    out = set()
    for flag in flags:
        try:
            out.add(WriteFlag(flag))
        except ValueError:
            known = ", ".join(repr(f.value) for f in WriteFlag)
            raise ValueError(f"unknown write flag {flag!r} (known: {known})") from None
    return frozenset(out)


class DeferredSyncPipeline(AddPipeline):
    """The add driver of a deferred-sync ledger (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the last entry known durable on every bookie that holds it (what readers are told)
        self.durable_lac = self.core.lac
        self._told = self.core.lac
        self._last: asyncio.Future[int] | None = None
        mutations = self.ctx.config.mutations
        self._lac_past_force = DEFERRED_LAC_PAST_FORCE in mutations
        self._force_before_sync = FORCE_BEFORE_SYNC in mutations

    def push(self, payload: bytes) -> asyncio.Future[int]:
        core = self.core
        if core.error is not None:
            raise fresh_copy(core.error)
        length = core.length + len(payload)
        fut: asyncio.Future[int] = self._loop.create_future()
        told = core.lac if self._lac_past_force else self.durable_lac
        core.push(self._frame(core.lap + 1, told, length, payload), length, fut)
        self._last = fut
        self._schedule()
        return fut

    def push_many(self, payloads: Sequence[bytes]) -> asyncio.Future[list[int]]:
        return asyncio.gather(*[self.push(p) for p in payloads])

    def _send(self, send: Any) -> None:
        request = AddBatchRequest(self.ledger_id, self.master_key, send.entry_ids, send.bodies,
                                  self.recovery, deferred_sync=True)
        try:
            self.ctx.transport.add(send.bookie, request, AddReply(self, send), self._timeout)
        except BKError as exc:
            self._on_reply(send, exc)

    def _send_lac(self, action: Any) -> None:
        """Never tell the bookies more than the durable LAC."""
        self._tell(self.core.lac if self._lac_past_force else self.durable_lac)

    def _tell(self, lac: int) -> None:
        if lac <= self._told:
            return
        self._told = lac
        request = WriteLacRequest(self.ledger_id, lac, self.master_key, self.digest.frame_lac(lac))
        for bookie in self.core.ensemble:
            self.ctx.transport.send(bookie, request, self._timeout).add_done_callback(_ignore)

    async def _change_loop(self) -> None:
        core = self.core
        try:
            failed = core.take_failed()
            if failed:
                causes = "; ".join(f"{b}: {core.failure_causes.get(b, '?')}"
                                   for b in sorted(failed.values()))
                core.fail(BookieUnavailableError(
                    f"ledger {self.ledger_id} uses deferred sync, which never replaces a bookie: "
                    f"{causes}; the writer stops (recover the ledger to seal it)"))
        finally:
            core.change_done()
            self._run()

    async def force(self) -> int:
        """Make every entry added so far durable; returns the durable LAC. A bookie that
        fails the FORCE, or answers holding less than it acknowledged (it restarted and lost
        its unsynced entries), fails the writer."""
        core = self.core
        if core.error is not None:
            raise fresh_copy(core.error)
        target = core.lap
        if target <= self.durable_lac:
            return self.durable_lac
        if self._force_before_sync:  # (the broken build: nothing asked, nothing waited for)
            self.durable_lac = target
            return target
        last = self._last
        if last is not None:
            await asyncio.wait([last])
            if last.exception() is not None:
                raise fresh_copy(last.exception())  # type: ignore[arg-type]
        ensemble, quorums = list(core.ensemble), core.quorums
        expected: dict[str, int] = {}
        for slot, bookie in enumerate(ensemble):
            held = [e for e in range(target, max(-1, target - len(ensemble)), -1)
                    if quorums.has_entry(e, slot)]
            if held:  # (a bookie that was sent nothing is not asked: it may be an old one)
                expected[bookie] = held[0]
        request = ForceRequest(self.ledger_id, self.master_key)
        answers = await asyncio.gather(
            *(self.ctx.transport.send(b, request, self._timeout) for b in expected),
            return_exceptions=True)
        for bookie, answer in zip(expected, answers, strict=True):
            problem = _force_problem(self.ledger_id, bookie, answer, expected[bookie])
            if problem is not None:
                self.fail(problem)
                raise fresh_copy(problem)
        self.durable_lac = max(self.durable_lac, target)
        # readers learn it from the next entry; if none follows at once, from a WriteLac
        self._loop.call_soon(self._tell_if_quiet, self.durable_lac)
        return self.durable_lac

    def _tell_if_quiet(self, lac: int) -> None:
        if self.core.lap <= lac and self.core.error is None:
            self._tell(lac)


def _force_problem(ledger_id: int, bookie: str, answer: Response | BaseException,
                   expected: int) -> BaseException | None:
    if isinstance(answer, BaseException):
        return answer
    if answer.status != Status.OK:
        return error_for_status(answer.status, f"{bookie}: force: {answer.message}")
    assert isinstance(answer, ForceResponse)
    if answer.lac < expected:
        return IOBookieError(
            f"ledger {ledger_id}: bookie {bookie} holds entries up to {answer.lac} only, but "
            f"acknowledged entry {expected} (it restarted before syncing): they are lost")
    return None


def _ignore(fut: asyncio.Future[Response]) -> None:
    if not fut.cancelled():
        fut.exception()


class DeferredSyncLedgerHandle(LedgerHandle):
    """A ledger open for writing with deferred sync (``create_ledger(write_flags=
    {"deferred_sync"})``): appends resolve once written, :meth:`force` makes them durable.

    ``last_add_confirmed`` is the durable LAC (what :meth:`force` returned last), and so is
    what ``read`` may reach; ``close`` forces first, then seals at that LAC (a force that
    fails leaves the ledger open for recovery and raises)."""

    _driver = DeferredSyncPipeline
    _pipeline: DeferredSyncPipeline

    @property
    def last_add_confirmed(self) -> int:
        return self._pipeline.durable_lac

    @property
    def last_add_written(self) -> int:
        """The last entry Qa bookies acknowledged (written, maybe not yet durable)."""
        return self._pipeline.lac

    async def force(self) -> int:
        """Make every entry appended so far durable on its bookies; returns the LAC now
        durable (every entry up to it is, and readers may see it)."""
        if self._closing:
            raise LedgerClosedError(f"ledger {self.id}: this handle is closed")
        return await self._pipeline.force()

    async def close(self) -> None:
        if not self._closing and self._pipeline.error is None:
            self._closing = True  # (no append from now on)
            await self._pipeline.drain()
            try:
                await self._pipeline.force()
            except BKError:
                self._closed = True  # (left open: recovery seals it at what is durable)
                raise
        await super().close()
