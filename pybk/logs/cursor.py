"""Durable named cursors (subscriptions) on a log: a consumer that remembers where it is.

``cur = await log.subscribe("billing")`` takes the cursor over (its owner epoch + 1 in the
cursor's metadata record; Pulsar's exclusive subscription), recovers its state and reads from
just after its mark-delete position, skipping records acknowledged beyond it, following the
tail. ``await cur.ack(pos)`` / ``ack_cumulative(pos)`` return once the new state is durable:
each persisted state is one entry of the cursor's own ledger (acknowledgements of one loop
pass share an entry), so an acknowledgement that returned is never redelivered, whatever
crashes later. ``nack(pos)`` redelivers after ``redelivery_delay``; with ``ack_timeout`` a
record not acknowledged in time is redelivered too.

Design notes: docs/internals.md, "pybk/logs/cursor.py".
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from pybk.errors import (
    AlreadyTruncatedError,
    BKError,
    ClientClosedError,
    CursorNotFoundError,
    KeyExistsError,
    LedgerFencedError,
    NoSuchKeyError,
    NoSuchLedgerError,
    TooManyRequestsError,
    fresh_copy,
)
from pybk.logs.config import CursorOptions, LogConfig
from pybk.logs.cursor_meta import CursorRecord, cursor_key
from pybk.logs.cursor_state import AckState, decode_state, encode_state
from pybk.logs.position import LogRecord, Position
from pybk.logs.reader import LogReader
from pybk.logs.retention import apply_retention
from pybk.logs.tail import last_position

if TYPE_CHECKING:
    from pybk.client.writer import LedgerHandle
    from pybk.logs.catalog import LogCatalog
    from pybk.logs.cursor_consumer import CursorConsumer
    from pybk.metadata.base import VersionedValue

__all__ = ["MARK_DELETE_PAST_PENDING", "Cursor", "check_cursor_name", "delete_cursor",
           "retire_ledger"]

log = logging.getLogger(__name__)

#: mutation switch (a name in ``ClientConfig.mutations``; registry: ``pybk.testing.mutations``):
#: the persisted state's mark-delete position moves through the first acknowledged range even
#: when a record handed out and not acknowledged lies before it, so a consumer that restarts
#: skips that record (the simulator's CU2/CU3 catch it)
MARK_DELETE_PAST_PENDING: Final = "cursor_mark_delete_past_pending"

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")


def check_cursor_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"cursor name must be a str, not {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad cursor name {name!r}: 1-200 letters, digits and ._- "
                         "(not starting with . or -)")
    return name


class Cursor:
    """One durable cursor, owned by this consumer (use :meth:`pybk.logs.Log.subscribe`)."""

    def __init__(self, cat: LogCatalog, name: str, record: CursorRecord, state: AckState,
                 lh: LedgerHandle, options: CursorOptions) -> None:
        self._cat = cat
        self.name = name
        self._record = record
        self._state = state
        self._lh = lh
        self._opts = options
        self._loop = asyncio.get_running_loop()
        self._reader: LogReader | None = None
        self._next: asyncio.Task[LogRecord] | None = None
        #: (due loop time, position): nacked or timed-out records to hand out again
        self._redeliver: list[tuple[float, Position]] = []
        self._redeliver_wake = asyncio.Event()
        #: receivers take turns (each record handed out to one)
        self._dispatch = asyncio.Lock()
        self._consumers = 0  # consumers made (their default names)
        self._want = 0  # state changes made
        self._written = 0  # state changes durable
        self._writing: asyncio.Task[None] | None = None
        self._entries = 1  # entries in the current ledger (its first is the recovered state)
        self._error: BaseException | None = None
        self._closed = False
        #: acknowledgement entries written (tests, benchmarks)
        self.persisted = 0
        self._retention: asyncio.Task[None] | None = None
        self._retain_again = False
        self._md_past_pending = MARK_DELETE_PAST_PENDING in cat.client.config.mutations

    # -- opening (takeover) ------------------------------------------------------------------

    @classmethod
    async def open(cls, cat: LogCatalog, name: str, start: object, options: CursorOptions,
                   label: str) -> Cursor:
        key = cursor_key(cat.namespace, cat.name, check_cursor_name(name))
        md = await cat.read()
        begin = await _start_position(cat, start)
        store = cat.store
        try:
            await store.create_value(key, CursorRecord(name, ctime_ms=cat.now_ms(),
                                                       start=begin).to_bytes())
        except KeyExistsError:
            pass  # an existing cursor keeps its position
        taken = await _update(cat, key, lambda r: r.with_changes(epoch=r.epoch + 1,
                                                                  owner=label))
        epoch = taken.epoch
        state = await _recover(cat, taken)
        tb = md.truncated_before
        resume = state.resume_point()
        if tb is not None and (resume is None or resume < tb):
            # (a range the truncation point falls inside keeps its part from there on: its
            # records were acknowledged and must not be handed out again)
            state = AckState(start=tb, ranges=[(max(lo, tb), hi) for lo, hi in state.ranges
                                               if hi >= tb])
        lh = await _new_ledger(cat, key, md.config)
        try:
            await lh.append(encode_state(state))
            old = taken.ledger
            record = await _update(cat, key, lambda r: _own(r, epoch).with_changes(
                ledger=lh.id, state=encode_state(state), mark_delete=state.mark_delete))
        except BaseException:
            await _drop_ledger(cat, lh)
            raise
        if old >= 0:
            await _delete_ledger(cat, old)
        return cls(cat, name, record, state, lh, options)

    # -- reading -----------------------------------------------------------------------------

    def __aiter__(self) -> Cursor:
        return self

    async def __anext__(self) -> LogRecord:
        rec = await self.receive()
        if rec is None:
            raise StopAsyncIteration
        return rec

    async def receive(self) -> LogRecord | None:
        """The next record to process: a redelivery that is due, else the next new one
        (waiting for the writer); None once the log is ended and everything was handed out.
        Callers waiting at once (the consumers of :meth:`consumer`, threads of the sync
        facade) are served in turn, each record to one of them."""
        async with self._dispatch:
            return await self._receive()

    def consumer(self, name: str | None = None) -> CursorConsumer:
        """A consumer sharing this cursor with others (Pulsar's shared subscription, within
        this process): each record goes to one consumer; what a consumer received and did
        not acknowledge goes to the others when it closes."""
        from pybk.logs.cursor_consumer import CursorConsumer

        self._check()
        self._consumers += 1
        return CursorConsumer(self, name or f"{self.name}-{self._consumers}")

    async def _receive(self) -> LogRecord | None:
        while True:
            self._check()
            due = await self._take_due()
            if due is not None:
                return due
            if self._reader is None:
                self._reader = LogReader(self._cat, start=self._state.read_from(),
                                         options=self._opts.reader)
            if self._next is None:
                self._next = self._loop.create_task(self._reader.__anext__())
            wait: set[asyncio.Future[object]] = {self._next}  # type: ignore[arg-type]
            timeout = None
            if self._redeliver:
                timeout = max(0.0, self._redeliver[0][0] - self._loop.time())
            waker = self._loop.create_task(self._redeliver_wake.wait())
            wait.add(waker)  # type: ignore[arg-type]
            try:
                await asyncio.wait(wait, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waker.cancel()
            self._redeliver_wake.clear()
            if self._next is None or not self._next.done():
                continue  # (None: the cursor closed meanwhile; _check says so)
            task, self._next = self._next, None
            if task.cancelled():
                continue  # (the cursor closing stopped its reader; _check says so)
            try:
                rec = task.result()
            except StopAsyncIteration:
                if self._redeliver:
                    await asyncio.sleep(max(0.0, self._redeliver[0][0] - self._loop.time()))
                    continue
                return None
            except AlreadyTruncatedError:
                await self._skip_truncated()  # retention went past it: go on from there
                continue
            if self._state.deliver(rec.position):
                if self._opts.ack_timeout is not None:
                    self._schedule(rec.position, self._opts.ack_timeout)
                return rec

    async def _skip_truncated(self) -> None:
        """The log was truncated past this cursor's reader (retention by age or size, or by
        hand): forget what is gone and read on from the truncation point (Pulsar moves a
        cursor past deleted ledgers the same way)."""
        tb = (await self._cat.read()).truncated_before
        await self._stop_reader()
        if tb is not None:
            self._state.skip_to(tb)

    def _schedule(self, pos: Position, delay: float) -> None:
        heapq.heappush(self._redeliver, (self._loop.time() + delay, pos))
        self._redeliver_wake.set()

    async def _take_due(self) -> LogRecord | None:
        now = self._loop.time()
        while self._redeliver and self._redeliver[0][0] <= now:
            _, pos = heapq.heappop(self._redeliver)
            if self._state.is_acked(pos) or not self._state.is_pending(pos):
                continue
            rec = await self._read_one(pos)
            if rec is not None:
                if self._opts.ack_timeout is not None:
                    self._schedule(pos, self._opts.ack_timeout)
                return rec
        return None

    async def _read_one(self, pos: Position) -> LogRecord | None:
        try:
            async with LogReader(self._cat, start=pos, stop_at=pos, stop_at_acknowledged=True,
                                 options=self._opts.reader) as reader:
                got = await reader.read_batch(1)
        except AlreadyTruncatedError:
            return None
        return got[0] if got and got[0].position == pos else None

    # -- acknowledging -----------------------------------------------------------------------

    async def ack(self, position: Position) -> None:
        """Acknowledge one record handed out by this cursor; returns once that is durable.
        ValueError for a position it never handed out; TooManyRequestsError when keeping
        the acknowledgement would exceed ``max_ack_ranges`` ranges."""
        self._check()
        pos = _as_position(position)
        st = self._state
        if st.opens_range(pos) and len(st.ranges) >= self._opts.max_ack_ranges:
            raise TooManyRequestsError(
                f"cursor {self.name!r}: {len(st.ranges)} acknowledged ranges beyond the "
                f"mark-delete position {st.mark_delete} (max_ack_ranges); acknowledge the "
                "oldest pending records first")
        if st.ack(pos):
            await self._persist()

    async def ack_cumulative(self, position: Position) -> None:
        """Acknowledge every record at or before ``position``; returns once durable."""
        self._check()
        if self._state.ack_cumulative(_as_position(position)):
            await self._persist()

    def nack(self, position: Position, delay: float | None = None) -> None:
        """Hand this record out again after ``delay`` (default ``redelivery_delay``)."""
        self._check()
        pos = _as_position(position)
        if self._state.is_acked(pos) or self._state.is_gone(pos):
            return
        if not self._state.is_pending(pos):
            raise ValueError(f"position {pos} was not handed out by cursor {self.name!r}")
        self._schedule(pos, self._opts.redelivery_delay if delay is None else delay)

    async def mark_delete_position(self) -> Position | None:
        """Every record at or before it is acknowledged (None: none yet)."""
        return self._state.mark_delete

    def pending(self) -> list[Position]:
        """Records handed out and not yet acknowledged, in log order."""
        return list(self._state.pending)

    @property
    def ack_ranges(self) -> list[tuple[Position, Position]]:
        """Acknowledged ranges beyond the mark-delete position."""
        return list(self._state.ranges)

    async def _persist(self) -> None:
        self._want += 1
        target = self._want
        while self._written < target:
            if self._error is not None:
                raise fresh_copy(self._error)
            if self._writing is None:
                self._writing = self._loop.create_task(self._write_once())
            await asyncio.shield(self._writing)

    async def _write_once(self) -> None:
        try:
            snap = self._want
            data = encode_state(self._stored())
            await self._lh.append(data)
            self._written = snap
            self._entries += 1
            self.persisted += 1
            md = self._state.mark_delete
            stored = self._record.mark_delete
            moved = md is not None and (stored is None or md.segment > stored.segment)
            if self._entries >= self._opts.rollover_entries:
                await self._roll()
            elif moved:
                self._record = await _update(self._cat, self._record_key(), lambda r: _own(
                    r, self._record.epoch).with_changes(mark_delete=md))
            if moved:
                self._kick_retention()
        except BaseException as exc:
            self._error = (exc if isinstance(exc, Exception)
                           else ClientClosedError(f"cursor {self.name!r} was stopped"))
            raise
        finally:
            self._writing = None

    def _stored(self) -> AckState:
        """The state to persist (the switch above breaks it)."""
        if not self._md_past_pending or not self._state.ranges:
            return self._state
        st = self._state.copy_stored()
        st.mark_delete = st.ranges.pop(0)[1]
        return st

    def _kick_retention(self) -> None:
        """The mark-delete position reached a later segment: a segment may now be consumed
        by every cursor, so apply retention (in the background; acks do not wait for it)."""
        self._retain_again = True
        if self._retention is None or self._retention.done():
            self._retention = self._loop.create_task(self._retain())

    async def _retain(self) -> None:
        while self._retain_again:  # once more if the position moved on meanwhile
            self._retain_again = False
            try:
                if (await self._cat.read()).config.retention_after_consumed:
                    await apply_retention(self._cat)
            except (BKError, OSError) as exc:
                log.info("cursor %s: retention failed (the writer retries): %s", self.name,
                         exc)

    async def _roll(self) -> None:
        """A new cursor ledger starting with the current state; the old one deleted."""
        st = self._state
        data = encode_state(st)
        old = self._lh
        lh = await _new_ledger(self._cat, self._record_key(), (await self._cat.read()).config)
        try:
            await lh.append(data)
            epoch = self._record.epoch
            self._record = await _update(self._cat, self._record_key(), lambda r: _own(
                r, epoch).with_changes(ledger=lh.id, state=data, mark_delete=st.mark_delete))
        except BaseException:
            await _drop_ledger(self._cat, lh)
            raise
        self._lh, self._entries = lh, 1
        await old.close()
        await _delete_ledger(self._cat, old.id)

    def _record_key(self) -> str:
        return cursor_key(self._cat.namespace, self._cat.name, self.name)

    def _check(self) -> None:
        if self._error is not None:
            raise fresh_copy(self._error)
        if self._closed:
            raise ValueError(f"cursor {self.name!r} is closed")

    # -- closing -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for acknowledgements under way, stop reading, close the cursor ledger and
        record the mark-delete position. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._writing is not None:
            await asyncio.wait([self._writing])
        await self._stop_reading()
        if self._error is None:
            try:
                await self._lh.close()
            except BKError as exc:  # taken over (fenced, or its ledger already deleted)
                log.info("cursor %s: closing its ledger failed: %s", self.name, exc)
                return
            md = self._state.mark_delete
            epoch = self._record.epoch
            try:
                self._record = await _update(self._cat, self._record_key(), lambda r: _own(
                    r, epoch).with_changes(mark_delete=md))
            except (LedgerFencedError, CursorNotFoundError):
                pass  # taken over or deleted meanwhile: nothing of ours to record

    async def abort(self) -> None:
        """Stop at once, as a crash would (the next owner recovers from the ledger)."""
        self._closed = True
        if self._writing is not None:
            self._writing.cancel()
        await self._stop_reading()

    async def _stop_reading(self) -> None:
        if self._retention is not None:
            self._retention.cancel()
            await asyncio.wait([self._retention])
            self._retention = None
        await self._stop_reader()

    async def _stop_reader(self) -> None:
        if self._next is not None:
            self._next.cancel()
            await asyncio.wait([self._next])
            self._next = None
        if self._reader is not None:
            await self._reader.aclose()
            self._reader = None

    async def __aenter__(self) -> Cursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (f"<Cursor {self._cat.namespace}/{self._cat.name}:{self.name} "
                f"mark_delete={self._state.mark_delete}>")


def _as_position(p: object) -> Position:
    if isinstance(p, LogRecord):
        return p.position
    if not isinstance(p, Position):
        raise TypeError(f"expected a Position (or LogRecord), not {type(p).__name__}")
    return p


async def _start_position(cat: LogCatalog, start: object) -> Position | None:
    if start == "earliest":
        return None
    if start == "latest":
        last = await last_position(cat)
        return None if last is None else last.next_slot()
    if isinstance(start, Position):
        return start
    raise ValueError(f"start must be 'earliest', 'latest' or a Position, not {start!r}")


def _own(record: CursorRecord, epoch: int) -> CursorRecord:
    if record.epoch != epoch:
        raise LedgerFencedError(f"cursor {record.name!r}: another consumer ({record.owner}, "
                                f"epoch {record.epoch}) took it over from this one ({epoch})")
    return record


async def _update(cat: LogCatalog, key: str,
                  change: Callable[[CursorRecord], CursorRecord]) -> CursorRecord:
    def apply(value: VersionedValue) -> bytes:
        return change(CursorRecord.from_bytes(value.value, value.version)).to_bytes()

    try:
        value = await cat.store.update_value(key, apply)
    except NoSuchKeyError:
        raise CursorNotFoundError(f"cursor {key.rsplit('/', 1)[-1]!r} of log {cat.name!r} "
                                  "was deleted") from None
    return CursorRecord.from_bytes(value.value, value.version)


async def _recover(cat: LogCatalog, record: CursorRecord) -> AckState:
    """The state the cursor's last owner made durable (fencing its ledger)."""
    if record.ledger < 0:
        return record.stored_state()
    try:
        rh = await cat.client.open_ledger(record.ledger, recovery=True)
    except NoSuchLedgerError:
        return record.stored_state()
    try:
        lac = rh.last_add_confirmed
        if lac < 0:
            return record.stored_state()
        (entry,) = await rh.read(lac, lac)
        return decode_state(entry.data)
    finally:
        await rh.close()


async def _new_ledger(cat: LogCatalog, key: str, cfg: LogConfig) -> LedgerHandle:
    return await cat.client.create_ledger(
        cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum, cfg.digest_type, b"",
        custom_metadata={"pybk.cursor": key.encode(), **cat.ledger_tags},
    )


async def _drop_ledger(cat: LogCatalog, lh: LedgerHandle) -> None:
    try:
        await lh.close()
    except Exception as exc:
        log.debug("cursor ledger %d: close failed (%s)", lh.id, exc)
    await _delete_ledger(cat, lh.id)


async def _delete_ledger(cat: LogCatalog, ledger_id: int) -> None:
    try:
        await cat.client.delete_ledger(ledger_id)
    except NoSuchLedgerError:
        pass


async def retire_ledger(cat: LogCatalog, ledger_id: int) -> None:
    """Fence a cursor's acknowledgement ledger (its owner's next acknowledgement fails) and
    delete it; a ledger already gone is fine."""
    try:
        rh = await cat.client.open_ledger(ledger_id, recovery=True)
        await rh.close()
    except NoSuchLedgerError:
        pass
    await _delete_ledger(cat, ledger_id)


async def delete_cursor(cat: LogCatalog, name: str) -> None:
    """Delete a cursor: fence its ledger (its owner's next acknowledgement fails), delete
    the ledger and the record. CursorNotFoundError when there is none."""
    key = cursor_key(cat.namespace, cat.name, check_cursor_name(name))
    try:
        value = await cat.store.read_value(key)
    except NoSuchKeyError:
        raise CursorNotFoundError(f"log {cat.name!r} has no cursor {name!r}") from None
    record = CursorRecord.from_bytes(value.value, value.version)
    if record.ledger >= 0:
        await retire_ledger(cat, record.ledger)
    try:
        await cat.store.delete_value(key)
    except NoSuchKeyError:
        pass
