"""One range of a table, owned by this process: commands go to the range's log first and are
applied to its MVCC store once the log acknowledges them.

Two logs per range, in the log namespace ``tables``: ``r-<table>-<range>`` holds the
commands (the record's txid is the command's revision) and ``c-<table>-<range>`` the
checkpoints. Opening a range takes both logs' writer locks, which fences any previous owner
(its next append fails: :class:`RangeFencedError`) and completes what it left in its last
segment; then it loads the newest complete checkpoint and replays the commands after its
revision up to the writer's last position (the catch-up point: nothing else can append while
this owner holds the lock). It serves only if the command log's writer epoch is still its own
once it has caught up: a server that took the range over meanwhile may have checkpointed and
truncated both logs past what this one read, leaving it behind (its revisions would restart
below the log's). A checkpoint is every row at one applied revision, written as
records to the checkpoint log (a header, chunks, a footer); once it is durable both logs are
truncated behind it, so no state lives only on a server's disk and the logs do not grow.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable
from typing import Any, Final

from pybk.errors import (
    LedgerFencedError,
    LogExistsError,
    LogNotFoundError,
    WriterConflictError,
)
from pybk.logs.log import Log
from pybk.logs.namespace import Namespace
from pybk.logs.position import Position
from pybk.logs.writer import LogWriter
from pybk.tables.command import Command, decode, encode
from pybk.tables.errors import RangeFencedError, TableError
from pybk.tables.mvcc import KeyValue, MVCCStore, Row

__all__ = [
    "APPLY_BEFORE_ACK", "TABLES_CATCH_UP_UNCHECKED", "RangeOwner", "load_checkpoint",
    "log_names", "open_or_create",
]

#: mutation switch (registry: ``pybk.testing.mutations``): a command is applied (visible to
#: reads) when it is appended, before the log acknowledges it; a crash then loses what readers
#: saw. The simulator's table servers serve several clients at once and die, aimed, just after
#: answering a read of a key beside a write of it in flight (pybk.sim.tablefaults): TB1 at CI
#: seed 19 (regression_seeds.txt)
APPLY_BEFORE_ACK: Final = "tables_apply_before_ack"

#: mutation switch (registry: ``pybk.testing.mutations``): a new owner serves once it has
#: replayed, without checking that no other owner took the range over while it caught up;
#: one that did may have truncated the logs past what this owner read, which then numbers
#: its commands below the log's last txid (simulator seed 226; now regression seed 4282)
TABLES_CATCH_UP_UNCHECKED: Final = "tables_catch_up_unchecked"

log = logging.getLogger(__name__)

#: rows per checkpoint record
_CHUNK_ROWS = 512
_READ_BATCH = 1000


def log_names(table_id: int, range_id: int) -> tuple[str, str]:
    """The names of a range's command log and checkpoint log."""
    return f"r-{table_id}-{range_id}", f"c-{table_id}-{range_id}"


async def open_or_create(ns: Namespace, name: str, knobs: dict[str, Any]) -> Log:
    try:
        return await ns.open_log(name)
    except LogNotFoundError:
        try:
            return await ns.create_log(name, **knobs)
        except LogExistsError:
            return await ns.open_log(name)


def _row_json(r: Row) -> list[Any]:
    return [base64.b64encode(r[0]).decode(),
            None if r[1] is None else base64.b64encode(r[1]).decode(), r[2], r[3], r[4], r[5]]


def _row(j: list[Any]) -> Row:
    return (base64.b64decode(j[0]), None if j[1] is None else base64.b64decode(j[1]),
            j[2], j[3], j[4], j[5])


async def load_checkpoint(ckpt_log: Log, last: Position | None) -> tuple[int, list[Row]] | None:
    """The newest checkpoint whose footer is in the checkpoint log up to ``last``: its
    revision and rows (None: no complete checkpoint)."""
    if last is None:
        return None
    best: tuple[int, list[Row]] | None = None
    current: tuple[int, list[Row]] | None = None
    async with ckpt_log.reader(None, stop_at=last, stop_at_acknowledged=True) as reader:
        while batch := await reader.read_batch(_READ_BATCH):
            for rec in batch:
                doc = json.loads(rec.data)
                if "begin" in doc:
                    current = (doc["begin"], [])
                elif "rows" in doc and current is not None:
                    current[1].extend(_row(j) for j in doc["rows"])
                elif "end" in doc and current is not None and current[0] == doc["end"]:
                    best, current = current, None
    return best


class RangeOwner:
    """The serving copy of one range: its store, its logs' writers, the commands in flight."""

    def __init__(self, ns: Namespace, table_id: int, range_id: int, *,
                 log_knobs: dict[str, Any] | None = None, checkpoint_every: int = 10_000,
                 label: str = "table server",
                 on_event: Callable[[str, float], None] | None = None,
                 mutations: frozenset[str] = frozenset()) -> None:
        self._ns = ns
        self.table_id, self.range_id = table_id, range_id
        self._knobs = dict(log_knobs or {})
        self.checkpoint_every = checkpoint_every
        self._label = label
        self._on_event = on_event or (lambda name, value: None)
        self.store = MVCCStore()
        self._writer: LogWriter | None = None
        self._cmd_log: Log | None = None
        self._ckpt_writer: LogWriter | None = None
        self._next_rev = 1
        #: revision -> (command, caller's future, acknowledged position or None)
        self._pending: dict[int, tuple[Command, asyncio.Future[Any], Position | None]] = {}
        self._applied_pos: Position | None = None
        self._since_checkpoint = 0
        self._checkpointing: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None
        self.replayed = 0
        self.checkpoint_revision = 0
        self._apply_early = APPLY_BEFORE_ACK in mutations
        self._catch_up_unchecked = TABLES_CATCH_UP_UNCHECKED in mutations
        self._early: dict[int, tuple[str, Any]] = {}  # (the mutation's results)

    # -- opening: take over, restore, replay ---------------------------------------------------

    async def open(self) -> RangeOwner:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            await self._take_over_and_catch_up()
        except BaseException:
            await self.abandon()  # (its writers: a failed open leaves nothing running)
            raise
        self._on_event("recovery_seconds", loop.time() - t0)
        return self

    async def _take_over_and_catch_up(self) -> None:
        cmd_name, ckpt_name = log_names(self.table_id, self.range_id)
        cmd_log = await open_or_create(self._ns, cmd_name, self._knobs)
        ckpt_log = await open_or_create(self._ns, ckpt_name, self._knobs)
        self._cmd_log = cmd_log
        self._writer = await cmd_log.writer(label=self._label)
        self._ckpt_writer = await ckpt_log.writer(label=self._label)
        await self._restore(ckpt_log, self._ckpt_writer.last_position)
        last = self._writer.last_position
        if last is not None:
            async with cmd_log.reader(None, stop_at=last, stop_at_acknowledged=True) as reader:
                while batch := await reader.read_batch(_READ_BATCH):
                    for rec in batch:
                        if rec.txid is not None and rec.txid > self.store.revision:
                            try:
                                self._apply(rec.txid, decode(rec.data))
                            except TableError:
                                pass  # it failed for its caller too, and changed nothing
                            self.replayed += 1
                        self._applied_pos = rec.position
        if not self._catch_up_unchecked:
            await self._check_caught_up()
        self._since_checkpoint = self.replayed
        self._next_rev = self.store.revision + 1

    async def _check_caught_up(self) -> None:
        """The state just restored is the range's whole state: no other owner took the
        command log over since this one did. One that did may have checkpointed and
        truncated both logs past what this owner read (its newer checkpoint beyond this
        owner's end of the checkpoint log, the commands before it gone), leaving this owner
        behind with no error from either reader; it must not serve (nor number commands) from
        there: RangeFencedError, and the caller's next call opens the range again."""
        cmd_log, writer = self._cmd_log, self._writer
        assert cmd_log is not None and writer is not None
        md = await cmd_log.metadata()
        if md.epoch != writer.epoch:
            raise RangeFencedError(
                f"range {self.range_id} was taken over while this server caught up (the "
                f"command log is at writer epoch {md.epoch}, this server's is {writer.epoch})")
        floor = writer.metadata.max_txid
        if self.store.revision < floor:  # (cannot happen while the epoch is this owner's)
            raise TableError(
                f"range {self.range_id} caught up to revision {self.store.revision}, below "
                f"the command log's last txid {floor}")

    async def _restore(self, ckpt_log: Log, last: Position | None) -> None:
        found = await load_checkpoint(ckpt_log, last)
        if found is not None:
            self.store.restore(*found)
            self.checkpoint_revision = found[0]

    # -- commands ----------------------------------------------------------------------------

    def _apply(self, rev: int, cmd: Command) -> Any:
        return self.store.apply(rev, cmd)

    def submit(self, cmd: Command) -> asyncio.Future[Any]:
        """Append ``cmd`` (already checked) to the log; the future holds its result once it is
        acknowledged and applied (or the error that applying it raised)."""
        if self.failed is not None:
            raise RangeFencedError(f"range {self.range_id} is no longer served here: {self.failed}")
        if self._writer is None:
            raise TableError("the range is not open")
        rev = self._next_rev
        try:
            appended = self._writer.append(encode(cmd), txid=rev)
        except (LedgerFencedError, WriterConflictError) as exc:  # the writer already knew
            self._fail(exc)
            self._check_serving()
            raise
        self._next_rev = rev + 1
        if self._apply_early:  # the mutation: applied (visible) now, before the log has it
            early: Any = None
            try:
                early = ("ok", self.store.apply(rev, cmd))
            except TableError as exc:
                early = ("error", exc)
            self._early[rev] = early
        result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rev] = (cmd, result, None)
        appended.add_done_callback(lambda f: self._acknowledged(rev, f))
        return result

    def _acknowledged(self, rev: int, fut: asyncio.Future[Position]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
            self._fail(exc or TableError("append cancelled"))
            return
        entry = self._pending.get(rev)
        if entry is None:
            return
        self._pending[rev] = (entry[0], entry[1], fut.result())
        if self._apply_early:
            self._acknowledged_early(rev)
            return
        # apply in revision order: entries are acknowledged in order, but be exact
        while (nxt := self.store.revision + 1) in self._pending and self._pending[nxt][2]:
            cmd, result, pos = self._pending.pop(nxt)
            try:
                value = self._apply(nxt, cmd)
            except TableError as exc:
                if not result.done():
                    result.set_exception(exc)
            else:
                if not result.done():
                    result.set_result(value)
            self._applied_pos = pos
            self._since_checkpoint += 1
        if (self._since_checkpoint >= self.checkpoint_every and self._checkpointing is None
                and self.failed is None):
            self._checkpointing = asyncio.ensure_future(self._auto_checkpoint())

    def _acknowledged_early(self, rev: int) -> None:
        """(The mutation) the result of a command applied when it was appended."""
        _, result, pos = self._pending.pop(rev)
        kind, value = self._early.pop(rev)
        if not result.done():
            if kind == "error":
                result.set_exception(value)
            else:
                result.set_result(value)
        self._applied_pos = pos

    def _fail(self, exc: BaseException) -> None:
        if self.failed is None:
            fenced = isinstance(exc, LedgerFencedError | WriterConflictError)
            self.failed = exc
            log.warning("range %s/%s stops serving: %r", self.table_id, self.range_id, exc)
            err: BaseException = (RangeFencedError(f"range {self.range_id} was taken over")
                                  if fenced else exc)
        else:
            err = self.failed
        for _, result, _ in self._pending.values():
            if not result.done():
                result.set_exception(err)
        self._pending.clear()

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: bytes) -> KeyValue | None:
        self._check_serving()
        return self.store.get(key)

    def scan(self, start: bytes | None, end: bytes | None, limit: int | None) -> list[KeyValue]:
        self._check_serving()
        return self.store.scan(start, end, limit)

    async def confirm_owner(self) -> None:
        """Check that no other server has taken the range over (the log's writer epoch is
        still this owner's): a read served after this reflects every write acknowledged
        before it began, by anyone (a new owner bumps the epoch before it acknowledges
        anything). RangeFencedError otherwise."""
        self._check_serving()
        log, writer = self._cmd_log, self._writer
        assert log is not None and writer is not None
        md = await log.metadata()
        self._check_serving()  # (it may have stopped meanwhile)
        if md.epoch != writer.epoch:
            self._fail(LedgerFencedError(f"the range's log is at writer epoch {md.epoch}"))
            self._check_serving()

    def _check_serving(self) -> None:
        if self.failed is not None:
            raise RangeFencedError(f"range {self.range_id} is no longer served here: {self.failed}")

    @property
    def revision(self) -> int:
        return self.store.revision

    @property
    def in_flight(self) -> int:
        """Commands appended to the log and not acknowledged (or failed) yet."""
        return len(self._pending)

    # -- checkpoints -------------------------------------------------------------------------

    async def _auto_checkpoint(self) -> None:
        try:
            await self.checkpoint()
        except Exception as exc:  # the commands stay in the log; the next one tries again
            log.warning("checkpoint of range %s failed: %r", self.range_id, exc)
        finally:
            self._checkpointing = None

    async def checkpoint(self) -> int:
        """Write every row at the current applied revision into the checkpoint log, then
        truncate both logs behind it; returns the checkpoint's revision."""
        self._check_serving()
        w, cw = self._writer, self._ckpt_writer
        assert w is not None and cw is not None
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        rev, upto = self.store.revision, self._applied_pos
        rows = list(self.store.rows())  # one consistent snapshot: nothing applies meanwhile
        self._since_checkpoint = 0
        head = cw.append(json.dumps({"begin": rev}).encode())
        for i in range(0, len(rows), _CHUNK_ROWS):
            cw.append(json.dumps({"rows": [_row_json(r) for r in rows[i:i + _CHUNK_ROWS]]},
                                 separators=(",", ":")).encode())
        await cw.append(json.dumps({"end": rev}).encode())
        await cw.truncate(await head)
        if upto is not None:
            await w.truncate(upto.next_slot())
        self.checkpoint_revision = rev
        self._on_event("checkpoint_seconds", loop.time() - t0)
        return rev

    # -- closing -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Finish what is in flight, let the logs' writers go (another owner may take over)."""
        if self._checkpointing is not None:
            await asyncio.gather(self._checkpointing, return_exceptions=True)
        for w in (self._writer, self._ckpt_writer):
            if w is not None:
                try:
                    if self.failed is None:
                        await w.close()
                    else:
                        await w.abort()
                except Exception as exc:
                    log.debug("closing a range writer: %r", exc)
        self._writer = self._ckpt_writer = None
        self.store.close()
        if self.failed is None:
            self.failed = TableError("the range was closed")

    async def abandon(self) -> None:
        """Stop at once without completing the logs (as a crash would; tests and takeovers)."""
        self.failed = self.failed or TableError("the range was abandoned")
        for w in (self._writer, self._ckpt_writer):
            if w is not None:
                try:
                    await w.abort()
                except Exception as exc:
                    log.debug("aborting a range writer: %r", exc)
        self._writer = self._ckpt_writer = None
