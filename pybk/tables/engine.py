"""The tables of one metadata store as this process serves them: the catalog, the ranges it
owns (opened on first use, which takes them over), and each operation routed to its range.

Both the Python API (:mod:`pybk.tables.api`) and the gRPC server use it. Scans read every
range of the table and merge them in key order (keys are spread over ranges by hash).
"""

from __future__ import annotations

import asyncio
import heapq
import os
from collections.abc import Callable
from typing import Any

from pybk.client import Client
from pybk.tables.catalog import NamespaceInfo, TableCatalog, TableInfo
from pybk.tables.command import Command, check_command
from pybk.tables.errors import RangeFencedError, TableBadRequestError, TableError
from pybk.tables.follower import RangeFollower
from pybk.tables.hashing import range_for
from pybk.tables.mvcc import KeyValue
from pybk.tables.range import RangeOwner, log_names

__all__ = ["LOG_NAMESPACE", "TablesEngine"]

#: the log namespace holding every range's logs
LOG_NAMESPACE = "tables"


class TablesEngine:
    """Namespaces, tables and the ranges this process owns, over one client."""

    def __init__(self, client: Client, *, log_knobs: dict[str, Any] | None = None,
                 checkpoint_every: int = 10_000, label: str | None = None,
                 on_event: Callable[[str, float], None] | None = None,
                 follower: bool = False) -> None:
        self.client = client
        self.catalog = TableCatalog(client.store)
        self._ns = client.namespace(LOG_NAMESPACE)
        self._knobs = dict(log_knobs or {})
        self.checkpoint_every = checkpoint_every
        self._label = label or f"table server pid {os.getpid()}"
        self._on_event = on_event
        self._ranges: dict[tuple[int, int], RangeOwner] = {}
        self._opening: dict[tuple[int, int], asyncio.Future[RangeOwner]] = {}
        #: reads only, from followers of the ranges (stale; no range is taken over)
        self.follower = follower
        self._followers: dict[tuple[int, int], asyncio.Future[RangeFollower]] = {}

    # -- ranges ------------------------------------------------------------------------------

    async def owner(self, table: TableInfo, range_id: int) -> RangeOwner:
        """The open range (taken over and caught up on first use)."""
        key = (table.table_id, range_id)
        owner = self._ranges.get(key)
        if owner is not None and owner.failed is None:
            return owner
        if owner is not None:  # fenced or failed: drop it; this call takes the range back
            self._ranges.pop(key, None)
            await owner.abandon()
        pending = self._opening.get(key)
        if pending is None:
            pending = asyncio.ensure_future(RangeOwner(
                self._ns, table.table_id, range_id, log_knobs=self._knobs,
                checkpoint_every=self.checkpoint_every, label=self._label,
                on_event=self._on_event, mutations=self.client.config.mutations).open())
            self._opening[key] = pending
            try:
                owner = await asyncio.shield(pending)
                self._ranges[key] = owner
            finally:
                self._opening.pop(key, None)
            return owner
        return await asyncio.shield(pending)

    async def follower_of(self, table: TableInfo, range_id: int) -> RangeFollower:
        """The range's follower (opened on first use: checkpoint, then the log's tail)."""
        key = (table.table_id, range_id)
        fut = self._followers.get(key)
        if fut is None:
            fut = self._followers[key] = asyncio.ensure_future(RangeFollower(
                self._ns, table.table_id, range_id, log_knobs=self._knobs).open())
        try:
            return await asyncio.shield(fut)
        except BaseException:
            if fut.done():
                self._followers.pop(key, None)
            raise

    def owned(self) -> list[RangeOwner]:
        return list(self._ranges.values())

    async def owner_for(self, table: TableInfo, key: bytes) -> RangeOwner:
        return await self.owner(table, range_for(table.ranges, key).range_id)

    # -- operations --------------------------------------------------------------------------

    async def execute(self, table: TableInfo, cmd: Command) -> Any:
        """Check ``cmd``, append it to its range's log, return its applied result. A txn's
        keys must all be in one range (as in BookKeeper, where a txn is per routing key)."""
        return await (await self.submit(table, cmd))

    async def submit(self, table: TableInfo, cmd: Command) -> asyncio.Future[Any]:
        """:meth:`execute` in two steps: ``cmd`` checked and appended to its range's log (its
        range taken over first if need be), and the future of its applied result. When this
        raises the command was not appended: it did not apply, and will not; once the future
        exists, a failure of it leaves that unknown (the append may be in the log)."""
        if self.follower:
            raise TableError("a follower serves reads only")
        cmd = check_command(cmd)
        key = _routing_key(cmd)
        owner = await self.owner_for(table, key)
        if cmd[0] == "txn":
            rid = owner.range_id
            for k in _txn_keys(cmd):
                if range_for(table.ranges, k).range_id != rid:
                    raise TableBadRequestError(
                        f"txn keys {key!r} and {k!r} are in different ranges of the table")
        return owner.submit(cmd)

    async def get(self, table: TableInfo, key: bytes, *,
                  stale: bool = False) -> tuple[KeyValue | None, int]:
        """The key (or None) and the range's revision the read was served at.

        Linearizable unless ``stale``: the owner first checks that it still owns the range
        (one metadata read); if another server took it over, this one takes it back (and
        catches up) before answering. ``stale=True`` answers from what this server has
        applied, without the check. A follower engine answers every read from the range's
        follower (stale: behind the owner, never ahead)."""
        if self.follower:
            f = await self.follower_of(table, range_for(table.ranges, key).range_id)
            return f.get(key), f.revision
        owner = await self.owner_for(table, key)
        if not stale:
            try:
                await owner.confirm_owner()
            except RangeFencedError:
                owner = await self.owner_for(table, key)  # taken back, caught up
        return owner.get(key), owner.revision

    async def scan(self, table: TableInfo, start: bytes | None, end: bytes | None,
                   limit: int | None, *, stale: bool = False) -> list[KeyValue]:
        """Keys in ``[start, end)`` of every range, merged in key order (each range read
        as :meth:`get` reads it; the ranges are not read at one instant)."""
        if self.follower:
            parts = [(await self.follower_of(table, r.range_id)).scan(start, end, limit)
                     for r in table.ranges]
            return _merge(parts, limit)
        owners = []
        for r in table.ranges:
            owner = await self.owner(table, r.range_id)
            if not stale:
                try:
                    await owner.confirm_owner()
                except RangeFencedError:
                    owner = await self.owner(table, r.range_id)
            owners.append(owner)
        return _merge([o.scan(start, end, limit) for o in owners], limit)

    async def checkpoint(self, table: TableInfo) -> list[int]:
        return [await (await self.owner(table, r.range_id)).checkpoint() for r in table.ranges]

    # -- catalog -----------------------------------------------------------------------------

    async def create_namespace(self, name: str, extra: str = "") -> NamespaceInfo:
        return await self.catalog.create_namespace(name, extra)

    async def delete_namespace(self, name: str) -> None:
        for table in await self.catalog.list_tables(name):
            await self.delete_table(name, table)
        await self.catalog.delete_namespace(name)

    async def delete_table(self, namespace: str, name: str) -> None:
        info = await self.catalog.delete_table(namespace, name)
        for r in info.ranges:
            owner = self._ranges.pop((info.table_id, r.range_id), None)
            if owner is not None:
                await owner.close()
            for log_name in log_names(info.table_id, r.range_id):
                if await self._ns.log_exists(log_name):
                    await self._ns.delete_log(log_name)

    async def close(self) -> None:
        """Let every range go (writers closed: the next owner has nothing to recover)."""
        owners, self._ranges = list(self._ranges.values()), {}
        for o in owners:
            await o.close()
        followers, self._followers = list(self._followers.values()), {}
        for fut in followers:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                await fut.result().close()
            else:
                fut.cancel()

    async def abandon(self) -> None:
        """Stop serving at once, completing nothing (as a crash would)."""
        owners, self._ranges = list(self._ranges.values()), {}
        for o in owners:
            await o.abandon()


def _merge(parts: list[list[KeyValue]], limit: int | None) -> list[KeyValue]:
    out = []
    for kv in heapq.merge(*parts, key=lambda kv: kv.key):
        out.append(kv)
        if limit is not None and len(out) >= limit:
            break
    return out


def _txn_keys(cmd: Command) -> list[bytes]:
    keys = [c[0] for c in cmd[1]]
    keys += [op[1] for op in cmd[2]] + [op[1] for op in cmd[3]]
    return keys


def _routing_key(cmd: Command) -> bytes:
    if cmd[0] == "txn":
        keys = _txn_keys(cmd)
        if not keys:
            raise TableBadRequestError("a txn needs at least one key")
        return keys[0]
    return bytes(cmd[1])
