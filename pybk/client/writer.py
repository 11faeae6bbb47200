"""The write path's driver: pipelined adds, in-order acks, ensemble changes, close.

The rules live in :class:`pybk.client.pipeline.WritePipeline`, a sans-IO object (events in,
actions out). :class:`AddPipeline` only carries out what it asks: it frames payloads (one
digest per entry: the same body goes to every replica), hands the pipeline's ``Send`` actions
to the transport's typed add path (one request per bookie for the entries pushed in one loop
iteration), feeds the bookies' outcomes back, settles the callers' futures
(:mod:`pybk.client.waiters`), and runs the ensemble change (:mod:`pybk.client.ensemble_change`:
the metadata store's CAS, or recovery's local plan; placed by the ledger's namespace policies)
when asked. Its two users: docs/internals.md, "pybk/client/writer.py".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from pybk.client.ensemble_change import replace_failed_bookies
from pybk.client.pipeline import WritePipeline
from pybk.client.quorum import Quorums
from pybk.client.reads import LedgerEntry, read_range
from pybk.client.waiters import (
    AddTimer,
    BatchWaiter,
    fail_waiters,
    future_maker,
    resolve_waiters,
)
from pybk.client.write_actions import ChangeEnsemble, Fail, Resolve, Send, SendLac
from pybk.errors import (
    BKError,
    EntryNotConfirmedError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    UnauthorizedError,
    UnexpectedConditionError,
    fresh_copy,
)
from pybk.metadata.base import CLOSED, LedgerMetadata
from pybk.wire import (
    AddBatchRequest,
    AddOutcome,
    DigestManager,
    Response,
    WriteLacRequest,
)

if TYPE_CHECKING:
    from pybk.client.context import ClientContext
    from pybk.stats import ClientStats

__all__ = ["ACK_OUT_OF_ORDER", "COUNTS_REPLACED_BOOKIES_ACKS", "LAC_BEFORE_QUORUM", "AddPipeline",
           "AddReply", "LedgerHandle"]

log = logging.getLogger(__name__)

#: loop passes the immediate LAC waits for an add to carry it (see ``_run_actions``)
QUIET_PASSES = 3

#: mutation switch (a name in ``config.mutations``; registry: ``pybk.testing.mutations``):
#: the writer acknowledges adds as soon as they reach Qa, not in entry-id order
ACK_OUT_OF_ORDER: Final = "ack_out_of_order"
#: mutation switch: a reply from a bookie the writer already replaced still counts as an ack
COUNTS_REPLACED_BOOKIES_ACKS: Final = "counts_replaced_bookies_acks"
#: mutation switch: the writer tells its bookies a LAC covering entries before their Qa-th
#: ack (what the immediate LAC must never do)
LAC_BEFORE_QUORUM: Final = "lac_before_quorum"


class AddReply:
    """The transport's ``on_done`` for one :class:`Send` (one per batch, not per entry)."""

    __slots__ = ("pipeline", "send")

    def __init__(self, pipeline: AddPipeline, send: Send) -> None:
        self.pipeline = pipeline
        self.send = send

    def __call__(self, outcome: AddOutcome) -> None:
        self.pipeline._on_reply(self.send, outcome)

    def part(self, indices: list[int]) -> AddReply:
        """The reply for the entries ``indices`` of this batch alone (a transport that splits
        the batch lets each part answer once done: ``pybk.transport.base.split_callback``)."""
        send = self.send
        return AddReply(self.pipeline, send._replace(
            entry_ids=[send.entry_ids[i] for i in indices],
            bodies=[send.bodies[i] for i in indices]))


class AddPipeline:
    """Pipelined adds to one ledger, acknowledged at Qa in entry-id order (the driver of
    :class:`~pybk.client.pipeline.WritePipeline`; see the module docstring)."""

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
        explicit_lac_interval: float = 0.0,
    ) -> None:
        self.ctx = ctx
        self.ledger_id = metadata.ledger_id
        self.metadata = metadata
        self.digest = digest
        self._frame = digest.frame  # (bound once: push runs once per entry)
        self.master_key = master_key
        self.recovery = recovery
        cfg = ctx.config
        self.core = WritePipeline(
            metadata.ledger_id,
            Quorums(metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum),
            metadata.ensembles, lac=lac, length=length, recovery=recovery,
            max_batch_entries=cfg.add_batch_max_entries,
            max_batch_bytes=cfg.add_batch_max_bytes,
            explicit_lac_interval=explicit_lac_interval,
            immediate_lac=cfg.immediate_lac,
            ack_out_of_order=ACK_OUT_OF_ORDER in cfg.mutations,
            count_stale_replies=COUNTS_REPLACED_BOOKIES_ACKS in cfg.mutations,
            lac_before_quorum=LAC_BEFORE_QUORUM in cfg.mutations,
        )
        self._loop = asyncio.get_running_loop()
        self._new_future = future_maker(self._loop)
        self._flush_scheduled = False
        self._quiet_scheduled = False
        self._quiet_passes = 0
        self._quiet_mark = -1  # (the LAC the last add carried when a delayed one was armed)
        self._running = False
        self._change_task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._idle: asyncio.Future[None] | None = None
        self._timeout = cfg.add_timeout
        self._lac_delay = cfg.immediate_lac_delay
        #: the writer's add latency, errors and ensemble changes, when the client keeps
        #: metrics (never a recovery's write-back)
        self._stats: ClientStats | None = None if recovery else ctx.stats
        if explicit_lac_interval > 0:
            self.core.on_timer(self._loop.time())
            self._arm_timer()

    # -- what callers read -------------------------------------------------------------------

    @property
    def lac(self) -> int:
        return self.core.lac

    @property
    def lap(self) -> int:
        return self.core.lap

    @property
    def lac_length(self) -> int:
        return self.core.lac_length

    @property
    def ensembles(self) -> dict[int, tuple[str, ...]]:
        return self.core.ensembles

    @property
    def ensemble(self) -> list[str]:
        return self.core.ensemble

    @property
    def ensemble_changes(self) -> int:
        return self.core.ensemble_changes

    @property
    def error(self) -> BaseException | None:
        return self.core.error

    @property
    def changing(self) -> bool:
        return self.core.changing

    # -- adding ------------------------------------------------------------------------------

    def push(self, payload: bytes) -> asyncio.Future[int]:
        """Frame ``payload`` as the next entry and queue it; the future holds its entry id."""
        core = self.core
        if core.error is not None:
            raise fresh_copy(core.error)
        length = core.length + len(payload)
        fut: asyncio.Future[int] = self._new_future()
        core.push(self._frame(core.lap + 1, core.lac, length, payload), length, fut)
        if self._stats is not None:
            fut.add_done_callback(AddTimer(self._stats, self._loop.time()))
        if not self._flush_scheduled:  # (_schedule, inlined: once per entry)
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return fut

    def push_framed(self, entry_id: int, body: bytes, length: int) -> asyncio.Future[int]:
        """Queue an already framed entry (recovery write-back: the exact bytes read)."""
        core = self.core
        if core.error is not None:
            raise fresh_copy(core.error)
        if entry_id != core.lap + 1:
            raise UnexpectedConditionError(
                f"ledger {self.ledger_id}: write-back of entry {entry_id}, expected "
                f"{core.lap + 1}")
        fut: asyncio.Future[int] = self._loop.create_future()
        core.push(body, length, fut)
        self._schedule()
        return fut

    def push_many(self, payloads: Sequence[bytes]) -> asyncio.Future[list[int]]:
        """Add several entries; one future (for the whole batch) holds their ids."""
        core = self.core
        if core.error is not None:
            raise fresh_copy(core.error)
        fut: asyncio.Future[list[int]] = self._loop.create_future()
        if not payloads:
            fut.set_result([])
            return fut
        if self._stats is not None:
            fut.add_done_callback(AddTimer(self._stats, self._loop.time()))
        first = core.lap + 1
        frame = self.digest.frame
        push = core.push
        length = core.length
        last = len(payloads) - 1
        waiter = BatchWaiter(first, fut)
        try:
            for i, payload in enumerate(payloads):
                length += len(payload)
                push(frame(first + i, core.lac, length, payload), length,
                     waiter if i == last else None)
        except BKError as exc:  # the pipeline failed part way (no bookie left for an entry)
            if not fut.done():
                fut.set_exception(exc)
        self._schedule()
        return fut

    def _schedule(self) -> None:
        """Send what was pushed at the end of this loop iteration: the entries pushed until
        then leave together, one request per bookie."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._run()

    # -- carrying out the pipeline's actions -------------------------------------------------

    def _run(self) -> None:
        """Carry out every action the pipeline has decided, until it has none left.

        Not re-entered: a transport may answer while it is handed a batch (a refusal, an
        entry already held), and that answer's actions must come after the ones being
        carried out (confirmations stay in entry order); the loop below picks them up."""
        if self._running:
            return
        self._running = True
        try:
            self._run_actions()
        finally:
            self._running = False

    def _run_actions(self) -> None:
        core = self.core
        actions = core.actions()
        while actions:
            for action in actions:
                kind = type(action)
                if kind is Resolve:
                    resolve_waiters(action)  # type: ignore[arg-type]
                elif kind is Send:
                    self._send(action)  # type: ignore[arg-type]
                elif kind is Fail:
                    fail_waiters(action)  # type: ignore[arg-type]
                elif kind is ChangeEnsemble:
                    self._change_task = self._loop.create_task(self._change_loop())
                elif kind is SendLac:
                    self._send_lac(action)  # type: ignore[arg-type]
            actions = core.actions()
        if not self._quiet_scheduled and core.lac_due:
            # after the callers answered now had their turn: one who appends again at once
            # carries the LAC on that add, and then there is nothing to send. Three loop
            # passes: a caller behind a log writer's record future wakes in the second and
            # its record leaves as an add at the end of that pass, framed with the LAC
            self._quiet_scheduled = True
            if self._lac_delay:
                self._quiet_mark = core.lac_flush.piggybacked
                self._loop.call_later(self._lac_delay, self._quiet_delayed)
            else:
                self._quiet_passes = QUIET_PASSES
                self._loop.call_soon(self._quiet_later)
        if self._idle is not None and core.idle and not self._idle.done():
            self._idle.set_result(None)

    def _quiet_later(self) -> None:
        self._quiet_passes -= 1
        self._loop.call_soon(self._quiet_later if self._quiet_passes > 1 else self._quiet)

    def _quiet_delayed(self) -> None:
        if self.core.lac_flush.piggybacked != self._quiet_mark:
            # adds went out meanwhile, framed with a newer LAC: the writer is busy; look
            # again after the delay (what they left unconfirmed is due then, if still so)
            self._quiet_scheduled = False
            self._run()
            return
        self._quiet()

    def _quiet(self) -> None:
        self._quiet_scheduled = False
        self.core.on_quiet()
        self._run()

    def _send(self, send: Send) -> None:
        request = AddBatchRequest(self.ledger_id, self.master_key, send.entry_ids, send.bodies,
                                  self.recovery)
        if self._stats is not None:
            self._stats.add_requests += 1
        try:
            self.ctx.transport.add(send.bookie, request, AddReply(self, send), self._timeout)
        except BKError as exc:  # a transport should answer through on_done; be safe anyway
            self._on_reply(send, exc)
        except Exception as exc:  # an exception nobody expected: a finding, and no hang
            log.exception("ledger %s: the transport raised sending to %s", self.ledger_id,
                          send.bookie)
            self.core.fail(exc)

    def _on_reply(self, send: Send, outcome: AddOutcome) -> None:
        try:
            self.core.on_reply(send, outcome)
        except Exception as exc:  # a bug: fail loudly, never hang
            log.exception("ledger %s: handling a reply from %s failed", self.ledger_id,
                          send.bookie)
            self.core.fail(exc)
        self._run()

    def _send_lac(self, action: SendLac) -> None:
        body = self.digest.frame_lac(action.lac)
        request = WriteLacRequest(self.ledger_id, action.lac, self.master_key, body)
        if self._stats is not None:
            self._stats.lac_messages += len(action.bookies)
        for bookie in action.bookies:
            fut = self.ctx.transport.send(bookie, request, self._timeout)
            fut.add_done_callback(_ignore_result)

    def fail(self, exc: BaseException) -> None:
        """Put the pipeline in error: every pending and future add fails with ``exc``."""
        if self.core.error is None:
            log.info("ledger %s: adds fail from now on: %s", self.ledger_id, exc)
        self.core.fail(exc)
        self._run()

    # -- explicit LAC ------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        at = self.core.next_timer
        if at is not None:
            self._timer = self._loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.core.on_timer(self._loop.time())
        self._run()
        self._arm_timer()

    def stop_timer(self) -> None:
        self.core.stop_timer()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- ensemble change ---------------------------------------------------------------------

    async def _change_loop(self) -> None:
        """Carry out a ``ChangeEnsemble`` (:mod:`pybk.client.ensemble_change`), then let the
        pipeline confirm adds again."""
        try:
            await replace_failed_bookies(self, self._stats)
        finally:
            self.core.change_done()
            self._run()

    # -- draining ----------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait until no add is pending (each acknowledged or failed) and no ensemble change
        runs."""
        while not self.core.idle or self._flush_scheduled:
            if self._flush_scheduled:
                await asyncio.sleep(0)  # (the pushes of this iteration leave first)
                continue
            self._idle = self._loop.create_future()
            await self._idle
            self._idle = None
        if self._change_task is not None and not self._change_task.done():
            await self._change_task

    def _check(self) -> None:
        """Assert the pipeline's invariants (tests call this)."""
        self.core._check()


class LedgerHandle:
    """A ledger open for writing by this client (the only writer).

    ``append`` assigns the entry id at once and returns a future that resolves to it once
    Qa bookies of its write set hold it durably and every earlier entry is acknowledged.
    An add that fails with :class:`LedgerFencedError` or a timeout is *indeterminate*: the
    entry may still turn out to be part of the ledger after recovery.
    """

    _driver: type[AddPipeline] = AddPipeline  # (how adds travel: pybk.client.deferred's own)
    def __init__(
        self,
        ctx: ClientContext,
        metadata: LedgerMetadata,
        digest: DigestManager,
        master_key: bytes,
        password: bytes,
    ) -> None:
        self._ctx = ctx
        self._pipeline = self._driver(ctx, metadata, digest, master_key,
                                      explicit_lac_interval=ctx.config.explicit_lac_interval)
        self._digest = digest
        self._password = password
        self._closing = False
        self._closed = False
        self._max_entry = ctx.config.max_entry_size

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
        """Add one entry; returns a future of its entry id (assigned now).

        Refused before an id is taken (nothing half done): a non-bytes payload (TypeError),
        one over ``ClientConfig.max_entry_size`` (:class:`pybk.EntryTooLargeError`), a closed
        handle (LedgerClosedError), a failed one (its error)."""
        if type(data) is not bytes:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise TypeError(f"append() takes bytes, not {type(data).__name__}")
            data = bytes(data)
        if len(data) > self._max_entry:
            raise self._too_large(len(data))
        if self._closing:
            raise LedgerClosedError(f"ledger {self.id}: this handle is closed")
        return self._pipeline.push(data)

    async def append_many(self, items: Sequence[bytes | bytearray | memoryview]) -> list[int]:
        """Add several entries (pipelined, one request per bookie); returns their entry ids
        once all are durable. Every item is checked (like :meth:`append`) before any id is
        taken."""
        return await self.append_many_nowait(items)

    def append_many_nowait(
        self, items: Sequence[bytes | bytearray | memoryview]
    ) -> asyncio.Future[list[int]]:
        """:meth:`append_many` without the coroutine: the ids are taken now and the future
        (one for the whole batch) resolves to them once all are durable."""
        payloads = []
        limit = self._max_entry
        for item in items:
            if type(item) is not bytes:
                if not isinstance(item, bytes | bytearray | memoryview):
                    raise TypeError(
                        f"append_many() takes bytes items, not {type(item).__name__}")
                item = bytes(item)
            if len(item) > limit:
                raise self._too_large(len(item))
            payloads.append(item)
        if self._closing:
            raise LedgerClosedError(f"ledger {self.id}: this handle is closed")
        return self._pipeline.push_many(payloads)

    def _too_large(self, size: int) -> EntryTooLargeError:
        return EntryTooLargeError(
            f"ledger {self.id}: an entry of {size} bytes is over max_entry_size "
            f"({self._max_entry} bytes, ClientConfig.max_entry_size); nothing was added")

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
        entries, _lac = await read_range(self._ctx, self.metadata, self._digest, first, last)
        return entries

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
        p = self._pipeline
        p.stop_timer()
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
            p.fail(LedgerClosedError(f"ledger {ledger_id} is closed"))

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
