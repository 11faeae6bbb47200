"""The write path: pipelined adds, in-order acks, ensemble changes, close.

:class:`AddPipeline` is BookKeeper's ``LedgerHandle`` add machinery (``PendingAddOp``,
``sendAddSuccessCallbacks``, ``ensembleChangeLoop``). It serves two users:

* the writer (:class:`LedgerHandle`): ensemble changes are CAS-written to the metadata
  store *before* any add that depends on them is acknowledged (rule R3);
* recovery's write-back (``recovery=True``): adds carry the recovery flag (accepted on a
  fenced ledger), and ensemble changes are kept locally until recovery closes the ledger.

Per entry the cost is one future for the caller, one transport send per replica and a
done-callback: no task per entry, no metadata write per entry.

Invariants (``_check``): pending adds are consecutive from ``lac + 1``; the last fragment
starts at or before ``lac + 1``, so every pending add belongs to the last ensemble; no add
callback fires while an ensemble change is in progress.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from pybk.errors import (
    BKError,
    EntryNotConfirmedError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
    UnauthorizedError,
    UnexpectedConditionError,
    error_for_status,
    fresh_copy,
)
from pybk.metadata.base import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from pybk.protocol import (
    AddRequest,
    AddResponse,
    DigestManager,
    Response,
    Status,
    WriteLacRequest,
)
from pybk.replication.quorum import AckSet, Quorums, plan_ensemble_change
from pybk.replication.reader import LedgerEntry, read_range

if TYPE_CHECKING:
    from pybk.replication.context import ClientContext

__all__ = [
    "ACK_OUT_OF_ORDER",
    "AddPipeline",
    "LedgerHandle",
]

log = logging.getLogger(__name__)

#: mutation switch (a name in ``config.mutations``; registry: ``pybk.testing.mutations``):
#: the writer acknowledges adds as soon as they reach Qa, not in entry-id order
ACK_OUT_OF_ORDER: Final = "ack_out_of_order"

_FATAL_STATUSES = {Status.FENCED: LedgerFencedError, Status.UNAUTHORIZED: UnauthorizedError}


class _PendingAdd:
    __slots__ = ("acks", "batch_first", "body", "entry_id", "future", "length", "request", "sent")

    def __init__(
        self, entry_id: int, body: bytes, length: int, future: asyncio.Future[Any] | None,
        q: Quorums,
    ) -> None:
        self.entry_id = entry_id
        #: the first id of the batch this add ends (its future gets the list of ids), or -1
        self.batch_first = -1
        self.body = body
        self.length = length
        self.future = future
        self.acks = AckSet(q)
        self.sent = False
        self.request: AddRequest | None = None  # one request object for every replica


class AddPipeline:
    """Pipelined adds to one ledger, acknowledged at Qa in entry-id order."""

    def __init__(
        self,
        ctx: ClientContext,
        metadata: LedgerMetadata,
        digest: DigestManager,
        master_key: bytes,
        *,
        recovery: bool = False,
        lac: int = -1,
        length: int = 0,
    ) -> None:
        self.ctx = ctx
        self.ledger_id = metadata.ledger_id
        self.metadata = metadata
        self.quorums = Quorums(metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum)
        self.digest = digest
        self.master_key = master_key
        self.recovery = recovery
        self.ensembles: dict[int, tuple[str, ...]] = dict(metadata.ensembles)
        self.ensemble: list[str] = list(self.ensembles[max(self.ensembles)])
        self.lac = lac
        self.lap = lac
        self.length = length  # length including every entry pushed
        self.lac_length = length  # length including every entry confirmed
        self.pending: deque[_PendingAdd] = deque()
        self.changing = False
        self.failed: dict[int, str] = {}
        self._failure_causes: dict[str, str] = {}  # bookie -> why it was replaced (messages)
        self.error: BaseException | None = None
        self.ensemble_changes = 0
        # Replies are matched to slots by epoch: a reply sent before its slot was last
        # given to another bookie is stale (even if the same bookie comes back later).
        self._epoch = 0
        self._slot_epoch = [0] * metadata.ensemble_size
        #: recovery only: slots written around because no replacement bookie exists
        self.dead_slots: set[int] = set()
        self._change_task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        #: mutation switch ACK_OUT_OF_ORDER: a broken build that ignores entry order
        self._ack_out_of_order = ACK_OUT_OF_ORDER in ctx.config.mutations

    # -- adding ------------------------------------------------------------------------------

    def push(self, payload: bytes) -> asyncio.Future[int]:
        """Frame ``payload`` as the next entry and send it; the future holds its entry id."""
        if self.error is not None:
            raise fresh_copy(self.error)
        entry_id = self.lap + 1
        self.length += len(payload)
        body = self.digest.frame(entry_id, self.lac, self.length, payload)
        return self._push(entry_id, body, self.length)

    def push_framed(self, entry_id: int, body: bytes, length: int) -> asyncio.Future[int]:
        """Send an already framed entry (recovery write-back: the exact bytes read)."""
        if self.error is not None:
            raise fresh_copy(self.error)
        if entry_id != self.lap + 1:
            raise UnexpectedConditionError(
                f"ledger {self.ledger_id}: write-back of entry {entry_id}, expected {self.lap + 1}"
            )
        self.length = length
        return self._push(entry_id, body, length)

    def _push(self, entry_id: int, body: bytes, length: int) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = self._loop.create_future()
        self._enqueue(entry_id, body, length, fut)
        return fut

    def _enqueue(
        self, entry_id: int, body: bytes, length: int, fut: asyncio.Future[Any] | None
    ) -> _PendingAdd:
        self.lap = entry_id
        op = _PendingAdd(entry_id, body, length, fut, self.quorums)
        self.pending.append(op)
        if not self.changing:
            self._send(op)
        return op

    def push_many(self, payloads: list[bytes]) -> asyncio.Future[list[int]]:
        """Add several entries; one future (for the whole batch) holds their ids, so a
        batch costs one loop future, not one per entry."""
        if self.error is not None:
            raise fresh_copy(self.error)
        fut: asyncio.Future[list[int]] = self._loop.create_future()
        if not payloads:
            fut.set_result([])
            return fut
        first = self.lap + 1
        frame = self.digest.frame
        op = None
        for i, payload in enumerate(payloads):
            entry_id = first + i
            self.length += len(payload)
            body = frame(entry_id, self.lac, self.length, payload)
            last = i == len(payloads) - 1
            op = self._enqueue(entry_id, body, self.length, fut if last else None)
        assert op is not None
        op.batch_first = first
        error = self._current_error()  # a method call: the queueing above may have failed
        if error is not None and not fut.done():
            fut.set_exception(fresh_copy(error))
        return fut

    def _current_error(self) -> BaseException | None:
        return self.error

    def _send(self, op: _PendingAdd) -> None:
        if self.error is not None:
            return
        op.sent = True
        for index in self.quorums.write_set(op.entry_id):
            if index in self.dead_slots:
                if op.acks.fail(index):
                    self.fail(NotEnoughBookiesError(
                        f"ledger {self.ledger_id}: entry {op.entry_id} cannot reach "
                        f"{self.quorums.ack_quorum} live bookies of its write set"
                    ))
                    return
                continue
            self._send_to(op, index)

    def _send_to(self, op: _PendingAdd, index: int) -> None:
        request = op.request
        if request is None:
            request = op.request = AddRequest(
                self.ledger_id, op.entry_id, self.master_key, op.body, recovery=self.recovery
            )
        bookie = self.ensemble[index]
        fut = self.ctx.transport.send(bookie, request, self.ctx.config.add_timeout)
        fut.add_done_callback(partial(self._on_reply, op, index, self._epoch, bookie))

    # -- replies -----------------------------------------------------------------------------

    def _on_reply(
        self, op: _PendingAdd, index: int, epoch: int, bookie: str, fut: asyncio.Future[Response]
    ) -> None:
        stale = epoch < self._slot_epoch[index]
        try:
            response = fut.result()
        except (BKError, asyncio.CancelledError) as exc:
            if not stale:
                self._bookie_failed(index, bookie, exc)
            return
        if stale:
            return  # a reply from a bookie whose slot was given to another one: ignored
        if response.status == Status.OK:
            assert isinstance(response, AddResponse)
            if op.acks.ack(index):
                if self._ack_out_of_order:
                    self._resolve(op)  # deliberately broken build: no ordering
                self._complete_in_order()
            return
        self._on_error_status(index, bookie, response)

    def _on_error_status(self, index: int, bookie: str, response: Response) -> None:
        fatal = _FATAL_STATUSES.get(Status(response.status))
        if fatal is not None:
            self.fail(
                fatal(
                    f"ledger {self.ledger_id}: bookie {bookie} refused the add "
                    f"({Status(response.status).name}: {response.message})"
                )
            )
            return
        self._bookie_failed(index, bookie, error_for_status(response.status, response.message))

    def _complete_in_order(self) -> None:
        if self.changing:
            return
        pending = self.pending
        while pending:
            op = pending[0]
            if not op.acks.complete or op.entry_id != self.lac + 1:
                break
            pending.popleft()
            self.lac = op.entry_id
            self.lac_length = op.length
            if op.future is not None:
                self._resolve(op)

    @staticmethod
    def _resolve(op: _PendingAdd) -> None:
        fut = op.future
        if fut is None or fut.done():
            return
        if op.batch_first >= 0:
            fut.set_result(list(range(op.batch_first, op.entry_id + 1)))
        else:
            fut.set_result(op.entry_id)

    def fail(self, exc: BaseException) -> None:
        """Put the pipeline in error: every pending and future add fails with ``exc``."""
        if self.error is None:
            self.error = exc
            log.info("ledger %s: adds fail from now on: %s", self.ledger_id, exc)
        pending, self.pending = self.pending, deque()
        for op in pending:
            if op.future is not None and not op.future.done():
                op.future.set_exception(fresh_copy(exc))

    # -- ensemble change ---------------------------------------------------------------------

    def _bookie_failed(self, index: int, bookie: str, exc: BaseException) -> None:
        if self.error is not None or self.ensemble[index] != bookie or index in self.dead_slots:
            return
        if self.failed.get(index) != bookie:  # once per failure, not once per pending add
            log.info("ledger %s: bookie %s (slot %d) failed: %r", self.ledger_id, bookie,
                     index, exc)
        self.failed[index] = bookie
        self._failure_causes[bookie] = f"{type(exc).__name__}: {exc}"
        if not self.changing:
            self.changing = True
            self._change_task = self._loop.create_task(self._change_loop())

    async def _change_loop(self) -> None:
        try:
            while self.failed and self.error is None:
                failed, self.failed = self.failed, {}
                failed = {i: b for i, b in failed.items() if self.ensemble[i] == b}
                if not failed:
                    continue
                writable = await self.ctx.store.writable_bookies()
                if self.recovery:
                    try:
                        change = plan_ensemble_change(
                            self.ensembles, self.lac, failed, writable, self.ctx.rng
                        )
                    except NotEnoughBookiesError:
                        self._write_around(failed)  # raises if Qa is out of reach
                        change = None
                    if change is not None:
                        self.ensembles = change.ensembles
                else:
                    await self._commit_change(failed, writable)
                self._apply_new_ensemble()
        except NotEnoughBookiesError as exc:
            # name what made the change necessary: "no spare bookie" alone hides the cause
            # (a TLS or auth problem, a crashed bookie...)
            causes = "; ".join(f"{b}: {c}" for b, c in sorted(self._failure_causes.items()))
            self.fail(NotEnoughBookiesError(f"{exc} (replacing failed bookies: {causes})"))
        except BKError as exc:
            self.fail(exc)
        except Exception as exc:  # a bug or a store failure: fail loudly, never hang
            log.exception("ledger %s: ensemble change failed", self.ledger_id)
            self.fail(exc)
        finally:
            self.changing = False
            self._complete_in_order()

    def _write_around(self, failed: dict[int, str]) -> None:
        """Recovery without a spare bookie: keep the failed slots out of the write sets as
        long as every pending write-back can still reach Qa on the others (BookKeeper's
        delayed ensemble change). The entries end up with fewer than Qw replicas but at
        least Qa, on bookies already in the ensemble (nothing rests on an unrecorded one)."""
        for index in failed:
            self.dead_slots.add(index)
        for op in self.pending:
            for index in failed:
                if self.quorums.has_entry(op.entry_id, index) and op.acks.fail(index):
                    raise NotEnoughBookiesError(
                        f"ledger {self.ledger_id}: entry {op.entry_id} cannot reach "
                        f"{self.quorums.ack_quorum} bookies and no replacement is available "
                        f"for {sorted(failed.values())}"
                    )
        log.info("ledger %s: writing around failed bookies %s (no spare)",
                 self.ledger_id, sorted(failed.values()))

    async def _commit_change(self, failed: dict[int, str], writable: Sequence[str]) -> None:
        """CAS the new ensemble into the metadata (the one place a writer changes it)."""
        lac, rng = self.lac, self.ctx.rng

        def transform(md: LedgerMetadata) -> LedgerMetadata | None:
            if md.state != OPEN:
                return None
            change = plan_ensemble_change(md.ensembles, lac, failed, writable, rng)
            if change is None:
                return None
            return md.with_changes(ensembles=change.ensembles)

        md = await self.ctx.store.update_ledger(self.ledger_id, transform)
        if md.state == CLOSED:
            raise LedgerClosedError(
                f"ledger {self.ledger_id} was closed by another client (recovered at "
                f"last entry {md.last_entry_id}) during an ensemble change"
            )
        if md.state == IN_RECOVERY:
            raise LedgerFencedError(
                f"ledger {self.ledger_id} is being recovered by another client"
            )
        self.metadata = md
        self.ensembles = dict(md.ensembles)

    def _apply_new_ensemble(self) -> None:
        """Adopt the last ensemble of ``self.ensembles``: resend the in-flight adds of every
        replaced slot (dropping that slot's earlier ack), and send adds queued meanwhile."""
        new = list(self.ensembles[max(self.ensembles)])
        replaced = [i for i in range(len(new)) if new[i] != self.ensemble[i]]
        if replaced:
            log.info(
                "ledger %s: ensemble %s -> %s from entry %d",
                self.ledger_id, self.ensemble, new, max(self.ensembles),
            )
            self.ensemble = new
            self.ensemble_changes += 1
            self._epoch += 1
            for index in replaced:
                self._slot_epoch[index] = self._epoch
            self.dead_slots.difference_update(replaced)
        has_entry = self.quorums.has_entry
        for op in list(self.pending):
            if not op.sent:
                self._send(op)
                continue
            for index in replaced:
                if has_entry(op.entry_id, index):
                    op.acks.unset(index)
                    self._send_to(op, index)

    # -- draining ----------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait until no add is pending (each acknowledged or failed)."""
        while self.pending:
            futures = [op.future for op in self.pending if op.future is not None]
            await asyncio.gather(*futures, return_exceptions=True)
        if self._change_task is not None and not self._change_task.done():
            await self._change_task

    def _check(self) -> None:
        """Assert the pipeline's invariants (tests call this)."""
        expected = self.lac + 1
        for op in self.pending:
            assert op.entry_id == expected, (op.entry_id, expected)
            expected += 1
        assert expected == self.lap + 1 or not self.pending
        assert max(self.ensembles) <= self.lac + 1
        assert list(self.ensembles[max(self.ensembles)]) == self.ensemble


class LedgerHandle:
    """A ledger open for writing by this client (the only writer).

    ``append`` assigns the entry id at once and returns a future that resolves to it once
    Qa bookies of its write set hold it durably and every earlier entry is acknowledged.
    An add that fails with :class:`LedgerFencedError` or a timeout is *indeterminate*: the
    entry may still turn out to be part of the ledger after recovery.
    """

    def __init__(
        self,
        ctx: ClientContext,
        metadata: LedgerMetadata,
        digest: DigestManager,
        master_key: bytes,
        password: bytes,
    ) -> None:
        self._ctx = ctx
        self._pipeline = AddPipeline(ctx, metadata, digest, master_key)
        self._digest = digest
        self._password = password
        self._closing = False
        self._closed = False
        self._lac_timer: asyncio.TimerHandle | None = None
        self._explicit_lac = -1
        interval = ctx.config.explicit_lac_interval
        if interval > 0:
            self._lac_timer = asyncio.get_running_loop().call_later(interval, self._flush_lac)

    # -- properties --------------------------------------------------------------------------

    @property
    def id(self) -> int:
        return self._pipeline.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._pipeline.metadata

    @property
    def last_add_pushed(self) -> int:
        return self._pipeline.lap

    @property
    def last_add_confirmed(self) -> int:
        return self._pipeline.lac

    @property
    def length(self) -> int:
        """Bytes confirmed so far."""
        return self._pipeline.lac_length

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def ensemble_changes(self) -> int:
        return self._pipeline.ensemble_changes

    # -- adds --------------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview) -> asyncio.Future[int]:
        """Add one entry; returns a future of its entry id (assigned now)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"append() takes bytes, not {type(data).__name__}")
        if self._closing:
            raise LedgerClosedError(f"ledger {self.id}: this handle is closed")
        return self._pipeline.push(bytes(data))

    async def append_many(self, items: Sequence[bytes | bytearray | memoryview]) -> list[int]:
        """Add several entries (pipelined); returns their entry ids once all are durable."""
        payloads = []
        for item in items:
            if not isinstance(item, bytes | bytearray | memoryview):
                raise TypeError(f"append_many() takes bytes items, not {type(item).__name__}")
            payloads.append(bytes(item))
        if self._closing:
            raise LedgerClosedError(f"ledger {self.id}: this handle is closed")
        return await self._pipeline.push_many(payloads)

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Read back confirmed entries ``first..last`` (``last <= last_add_confirmed``)."""
        for name, value in (("first", first), ("last", last)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, not {value!r}")
        if first < 0 or last < first:
            raise ValueError(f"bad range {first}..{last}")
        if last > self.last_add_confirmed:
            raise EntryNotConfirmedError(
                f"ledger {self.id} has no confirmed entry {last}: its last add confirmed is "
                f"{self.last_add_confirmed}"
            )
        decoded = await read_range(self._ctx, self.metadata, self._digest, first, last)
        return [LedgerEntry(d.ledger_id, d.entry_id, d.payload) for d in decoded]

    # -- explicit LAC ------------------------------------------------------------------------

    def _flush_lac(self) -> None:
        if self._closing:
            return
        p = self._pipeline
        if p.lac > self._explicit_lac and p.error is None and not p.pending:
            self._explicit_lac = p.lac
            body = self._digest.frame_lac(p.lac)
            request = WriteLacRequest(self.id, p.lac, p.master_key, body)
            for bookie in p.ensemble:
                fut = self._ctx.transport.send(bookie, request, self._ctx.config.add_timeout)
                fut.add_done_callback(_ignore_result)
        self._lac_timer = asyncio.get_running_loop().call_later(
            self._ctx.config.explicit_lac_interval, self._flush_lac
        )

    # -- close -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for pending adds, then CAS-close the ledger at the last confirmed entry.

        If another client already closed it at the same entry and length, that is success;
        a different close raises MetadataVersionError. A handle whose adds were fenced (the
        ledger is being or was recovered by someone else) closes locally only.
        """
        if self._closed:
            return
        self._closing = True
        if self._lac_timer is not None:
            self._lac_timer.cancel()
        p = self._pipeline
        await p.drain()
        self._closed = True
        if isinstance(p.error, LedgerFencedError | LedgerClosedError | UnauthorizedError):
            return
        lac, length = p.lac, p.lac_length
        ledger_id = self.id

        def transform(md: LedgerMetadata) -> LedgerMetadata | None:
            if md.state == CLOSED:
                if md.last_entry_id == lac and md.length == length:
                    return None
                raise MetadataVersionError(
                    f"ledger {ledger_id} was closed by another client at last entry "
                    f"{md.last_entry_id} (length {md.length}), but this writer confirmed "
                    f"up to {lac} (length {length})"
                )
            return md.with_changes(state=CLOSED, last_entry_id=lac, length=length)

        p.metadata = await self._ctx.store.update_ledger(ledger_id, transform)
        if p.error is None:
            p.error = LedgerClosedError(f"ledger {ledger_id} is closed")

    async def __aenter__(self) -> LedgerHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check(self) -> None:
        self._pipeline._check()

    def __repr__(self) -> str:
        return (
            f"<LedgerHandle {self.id} lac={self.last_add_confirmed} "
            f"lap={self.last_add_pushed} closed={self._closed}>"
        )


def _ignore_result(fut: asyncio.Future[Response]) -> None:
    if not fut.cancelled():
        fut.exception()
