"""Watches of the SQLite store: one polling task per store, a baseline per watch.

The guarantee (:class:`~pybk.metadata.base.MetadataStore`): a watch fires for every change
committed after the state this store last returned to a caller for that subject, or after
the watch was set when the store never returned that subject. So each watch starts from

Design notes: docs/internals.md, "pybk/metadata/sqlite/watches.py".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from pybk.errors import ClientClosedError, CorruptRecordError, MetadataStoreError
from pybk.metadata._common import CallbackWatch
from pybk.metadata.sqlite.schema import counters

__all__ = ["UNKNOWN", "PolledWatch", "WatchPoller"]

log = logging.getLogger("pybk.metadata.sqlite")

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
Run = Callable[[str, Callable[[sqlite3.Connection], Any]], Awaitable[Any]]

#: a watch's state before its first comparison when the store never returned its subject
UNKNOWN: Any = object()


class PolledWatch(CallbackWatch):
    """A watch and the state of its subject it last compared with."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None],
                 on_cancel: Callable[[CallbackWatch], None], *, state: Any, at: float,
                 after: dict[str, int] | None, after_at: float) -> None:
        super().__init__(loop, callback, on_cancel)
        self.state = state
        self.at = at
        self.after = after
        self.after_at = after_at
        self.fresh = True

    def saw(self, state: Any, at: float) -> None:
        self.state, self.at, self.fresh = state, at, False


@dataclass
class _Poll:
    counters: dict[str, int]
    ledgers: dict[int, int] | None
    values: dict[str, int] | None
    expiries: list[float]
    locks: dict[str, tuple[int, float]]
    now: float


def _poll(conn: sqlite3.Connection, *, ledgers: list[int], keys: list[str], locks: list[str],
          bookies_since: float | None, force: bool, last_changes: int) -> _Poll:
    now = time.time()
    cs = counters(conn)  # first: a write after it shows at the next poll
    versions = key_versions = None
    if force or cs["changes"] != last_changes:
        if ledgers:
            marks = ",".join("?" * len(ledgers))
            versions = dict(conn.execute(
                f"SELECT id, version FROM ledgers WHERE id IN ({marks})", ledgers))
        if keys:
            marks = ",".join("?" * len(keys))
            key_versions = dict(conn.execute(
                f"SELECT key, version FROM kv WHERE key IN ({marks})", keys))
    expiries: list[float] = []
    if bookies_since is not None:
        expiries = [float(e) for (e,) in conn.execute(
            "SELECT expires_at FROM bookies WHERE expires_at > ? AND expires_at <= ?",
            (bookies_since, now))]
    rows: dict[str, tuple[int, float]] = {}
    if locks:
        marks = ",".join("?" * len(locks))
        rows = {str(n): (int(v), float(e)) for n, v, e in conn.execute(
            f"SELECT name, version, expires_at FROM locks WHERE name IN ({marks})", locks)}
    return _Poll(cs, versions, key_versions, expiries, rows, now)


def _version_changed(w: PolledWatch, cur: int | None, cs: dict[str, int]) -> bool:
    """A ledger or key (versions from the store-wide ``version`` counter)."""
    if w.state is UNKNOWN:
        if w.after is None:
            return True
        if cur is not None:
            return cur > w.after["version"]
        return cs["version"] != w.after["version"]
    return bool(cur != w.state)


def _lock_changed(w: PolledWatch, row: tuple[int, float] | None, cs: dict[str, int],
                  now: float) -> bool:
    if w.state is UNKNOWN:
        if w.after is None:
            return True
        return row is not None and (row[0] > w.after["version"] or w.after_at < row[1] <= now)
    version = None if row is None else row[0]
    return version != w.state or (row is not None and w.at < row[1] <= now)


def _bookies_changed(w: PolledWatch, p: _Poll) -> bool:
    if w.state is UNKNOWN:
        if w.after is None:
            return True
        base, at = w.after["bookies"], w.after_at
    else:
        base, at = w.state, w.at
    return p.counters["bookies"] != base or any(at < e <= p.now for e in p.expiries)


class WatchPoller:
    """The watches of one store and the task that polls for them."""

    def __init__(self, run: Run, *, poll_interval: float, name: str) -> None:
        self._run = run
        self.poll_interval = poll_interval
        self._name = name
        self.ledgers: dict[int, list[PolledWatch]] = {}
        self.values: dict[str, list[PolledWatch]] = {}
        self.locks: dict[str, list[PolledWatch]] = {}
        self.bookies: list[PolledWatch] = []
        #: what this store last returned to a caller, per subject
        self.returned_ledgers: dict[int, int | None] = {}
        self.returned_values: dict[str, int | None] = {}
        self.returned_locks: dict[str, tuple[int | None, float]] = {}
        self.returned_bookies: tuple[int, float] | None = None
        self._last: dict[str, int] | None = None  # counters of the last finished poll
        self._last_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self.closed = False
        #: completed polls (tests wait on it; a gauge for operators)
        self.polls = 0
        self._polled = asyncio.Event()

    # -- making watches ------------------------------------------------------------------------

    def _make(self, registry: dict[K, list[PolledWatch]], key: K, callback: Callable[[], None],
              state: Any, at: float) -> PolledWatch:
        def forget(w: CallbackWatch) -> None:
            lst = registry.get(key, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                registry.pop(key, None)

        w = PolledWatch(asyncio.get_running_loop(), callback, forget, state=state, at=at,
                        after=self._last, after_at=self._last_at)
        registry.setdefault(key, []).append(w)
        self._ensure_task()
        return w

    def watch_ledger(self, ledger_id: int, callback: Callable[[], None]) -> PolledWatch:
        state = self.returned_ledgers.get(ledger_id, UNKNOWN)
        return self._make(self.ledgers, ledger_id, callback, state, 0.0)

    def watch_value(self, key: str, callback: Callable[[], None]) -> PolledWatch:
        state = self.returned_values.get(key, UNKNOWN)
        return self._make(self.values, key, callback, state, 0.0)

    def watch_lock(self, name: str, callback: Callable[[], None]) -> PolledWatch:
        state, at = self.returned_locks.get(name, (UNKNOWN, 0.0))
        return self._make(self.locks, name, callback, state, at)

    def watch_bookies(self, callback: Callable[[], None]) -> PolledWatch:
        def forget(w: CallbackWatch) -> None:
            if w in self.bookies:
                self.bookies.remove(w)

        state, at = self.returned_bookies or (UNKNOWN, 0.0)
        w = PolledWatch(asyncio.get_running_loop(), callback, forget, state=state, at=at,
                        after=self._last, after_at=self._last_at)
        self.bookies.append(w)
        self._ensure_task()
        return w

    # -- changes made or seen through this store -------------------------------------------------

    def ledger_returned(self, ledger_id: int, version: int | None, *, changed: bool) -> None:
        """This store returned (or, ``changed``, wrote) ``version`` of a ledger; a write
        made here is heard at once by this store's watchers."""
        self.returned_ledgers[ledger_id] = version
        if changed:
            for w in list(self.ledgers.get(ledger_id, ())):
                w.saw(version, 0.0)
                w.fire()

    def value_returned(self, key: str, version: int | None, *, changed: bool) -> None:
        self.returned_values[key] = version
        if changed:
            for w in list(self.values.get(key, ())):
                w.saw(version, 0.0)
                w.fire()

    def lock_returned(self, name: str, version: int | None, at: float, *,
                      changed: bool) -> None:
        self.returned_locks[name] = (version, at)
        if changed:
            for w in list(self.locks.get(name, ())):
                w.saw(version, at)
                w.fire()

    def lock_lost(self, name: str) -> None:
        """This store's lease of ``name`` lapsed: its watchers re-read (the poll compares
        the row as usual afterwards)."""
        for w in list(self.locks.get(name, ())):
            w.fire()

    # -- the polling task ----------------------------------------------------------------------

    def _ensure_task(self) -> None:
        if self.closed:
            raise ClientClosedError(f"SQLite metadata store {self._name} is closed")
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"pybk-sqlite-watch-{self._name}")

    def _any(self) -> bool:
        return bool(self.ledgers or self.values or self.locks or self.bookies)

    async def _loop(self) -> None:
        """Poll while any watch exists; idle cost one counter query per interval (plus the
        lapses of registrations and watched locks, found by their expiry)."""
        last_changes = -1
        while not self.closed and self._any():
            ledgers = {k: list(v) for k, v in self.ledgers.items()}
            values = {k: list(v) for k, v in self.values.items()}
            locks = {k: list(v) for k, v in self.locks.items()}
            bookies = list(self.bookies)
            force = any(w.fresh for lst in (*ledgers.values(), *values.values()) for w in lst)
            since = min((w.after_at if w.state is UNKNOWN else w.at for w in bookies),
                        default=None)
            poll = functools.partial(
                _poll, ledgers=sorted(ledgers), keys=sorted(values), locks=sorted(locks),
                bookies_since=since, force=force, last_changes=last_changes)
            try:
                p: _Poll = await self._run("watch poll", poll)
            except ClientClosedError:
                return
            except (MetadataStoreError, CorruptRecordError) as exc:
                log.warning("metadata watch poll failed: %s", exc)
                await asyncio.sleep(self.poll_interval)
                continue
            self._compare(p, ledgers, values, locks, bookies)
            last_changes = p.counters["changes"]
            self._last, self._last_at = p.counters, p.now
            self.polls += 1
            self._polled.set()
            await asyncio.sleep(self.poll_interval)

    def _compare(self, p: _Poll, ledgers: dict[int, list[PolledWatch]],
                 values: dict[str, list[PolledWatch]], locks: dict[str, list[PolledWatch]],
                 bookies: list[PolledWatch]) -> None:
        if p.ledgers is not None:
            for lid, lst in ledgers.items():
                cur = p.ledgers.get(lid)
                for w in lst:
                    if _version_changed(w, cur, p.counters):
                        w.fire()
                    w.saw(cur, p.now)
        if p.values is not None:
            for key, vl in values.items():
                cur = p.values.get(key)
                for w in vl:
                    if _version_changed(w, cur, p.counters):
                        w.fire()
                    w.saw(cur, p.now)
        for name, ll in locks.items():  # every poll: a lease lapses without any write
            row = p.locks.get(name)
            for w in ll:
                if _lock_changed(w, row, p.counters, p.now):
                    w.fire()
                w.saw(None if row is None else row[0], p.now)
        for w in bookies:
            if _bookies_changed(w, p):
                w.fire()
            w.saw(p.counters["bookies"], p.now)

    async def established(self, bound: float) -> bool:
        """Wait (at most ``bound`` seconds) until every watch existing now was compared with
        the file once; True when some had not been."""
        waiting = [w for registry in (self.ledgers, self.values, self.locks)
                   for lst in registry.values() for w in lst if w.fresh]
        waiting += [w for w in self.bookies if w.fresh]
        if not waiting:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound
        while any(w.fresh and not w.cancelled for w in waiting) and not self.closed:
            left = deadline - loop.time()
            if left <= 0:
                break
            self._polled.clear()
            try:
                async with asyncio.timeout(left):
                    await self._polled.wait()
            except TimeoutError:
                break
        return True

    async def stop(self) -> None:
        self.closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for registry in (self.ledgers, self.values, self.locks):
            for lst in list(registry.values()):
                for w in list(lst):
                    w.cancel()
        for w in list(self.bookies):
            w.cancel()
