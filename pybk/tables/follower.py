"""A follower of one range: stale reads without owning it.

A follower loads the range's newest checkpoint and then tails the range's command log,
applying each acknowledged command as the owner did, without taking the writer lock (the
owner is not fenced and keeps writing). Its state is a prefix of the owner's: reads from it
may be behind, never ahead, and never show a command that is not in the log. Commands carry
consecutive revisions, so a follower that finds a gap (the owner checkpointed and truncated
past what it had read) reloads the newer checkpoint and goes on from there.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pybk.errors import AlreadyTruncatedError, BKError
from pybk.logs.log import Log
from pybk.logs.namespace import Namespace
from pybk.tables.command import decode
from pybk.tables.errors import TableError
from pybk.tables.mvcc import KeyValue, MVCCStore
from pybk.tables.range import load_checkpoint, log_names, open_or_create

__all__ = ["RangeFollower"]

log = logging.getLogger(__name__)

#: seconds between attempts after the log could not be read (bookies down)
_RETRY = 0.5


class _Gap(Exception):
    """The log's next command is past the one the store needs."""


class RangeFollower:
    """The following copy of one range (``await RangeFollower(ns, table, range).open()``)."""

    def __init__(self, ns: Namespace, table_id: int, range_id: int, *,
                 log_knobs: dict[str, Any] | None = None) -> None:
        self._ns = ns
        self.table_id, self.range_id = table_id, range_id
        self._knobs = dict(log_knobs or {})
        self.store = MVCCStore()
        self._task: asyncio.Task[None] | None = None
        self.reloads = 0

    async def open(self) -> RangeFollower:
        cmd_name, ckpt_name = log_names(self.table_id, self.range_id)
        self._cmd_log = await open_or_create(self._ns, cmd_name, self._knobs)
        self._ckpt_log = await open_or_create(self._ns, ckpt_name, self._knobs)
        await self._reload()
        self._task = asyncio.ensure_future(self._follow())
        return self

    async def _reload(self) -> None:
        found = await load_checkpoint(self._ckpt_log, await self._ckpt_log.last_position())
        if found is not None and found[0] > self.store.revision:
            self.store.restore(*found)
            self.reloads += 1

    async def _follow(self) -> None:
        while True:
            try:
                await self._tail(self._cmd_log)
                return  # the log ended
            except (_Gap, AlreadyTruncatedError):
                await self._reload()
            except BKError as exc:
                log.debug("follower of range %s: %r; again soon", self.range_id, exc)
                await asyncio.sleep(_RETRY)

    async def _tail(self, cmd_log: Log) -> None:
        async with cmd_log.reader(None) as reader:
            async for rec in reader:
                if rec.txid is None or rec.txid <= self.store.revision:
                    continue
                if rec.txid != self.store.revision + 1:
                    raise _Gap()
                try:
                    self.store.apply(rec.txid, decode(rec.data))
                except TableError:
                    pass  # failed for its caller too; the revision is spent either way

    @property
    def revision(self) -> int:
        return self.store.revision

    def get(self, key: bytes) -> KeyValue | None:
        return self.store.get(key)

    def scan(self, start: bytes | None, end: bytes | None, limit: int | None) -> list[KeyValue]:
        return self.store.scan(start, end, limit)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.store.close()
