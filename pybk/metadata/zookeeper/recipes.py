"""Watches and elections on ZooKeeper, on top of :class:`~.bridge.KazooBridge`.

* :class:`DataWatches`: one kazoo ``DataWatch`` per watched znode and store, shared by every
  watch of it, reporting a *version* derived from the node (the ledger's znode version, a
  key's mzxid, a lock's holder session); stopped at the next event once the last watch of
  the node is cancelled.
* :class:`ChildrenWatches`: kazoo ``ChildrenWatch`` es over a few directories (the bookie
  registry), shared by every watch.
* :class:`ZkElection`: ZooKeeper's leader election recipe with ephemeral-sequential nodes
  (BookKeeper's ``AuditorElector``): every candidate makes ``elections/<name>/n_<seq>``;
  the lowest sequence number leads; every other candidate watches only the node just below
  its own (no herd when the leader goes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kazoo.exceptions import NoNodeError
from kazoo.recipe.watchers import DataWatch

from pybk.errors import BKError, ClientClosedError
from pybk.metadata._common import CallbackWatch
from pybk.metadata.base import Election
from pybk.metadata.zookeeper.bridge import KazooBridge
from pybk.metadata.zookeeper.paths import CANDIDATE_PREFIX

__all__ = [
    "UNSEEN", "ChildrenWatches", "DataWatches", "Seen", "ZkElection", "election_leader", "mzxid_of",
]

log = logging.getLogger("pybk.metadata.zookeeper")

K = TypeVar("K", bound=Hashable)

#: "no version known yet" (None means "the node does not exist")
UNSEEN: Any = object()


@dataclass(frozen=True)
class Seen:
    """What a watch compares with first: the state this store last returned for its node
    (the node's ``mzxid``, None when absent, or UNSEEN when never returned) and a zxid this
    store had seen before that state (or before the watch, when UNSEEN): a change after it
    has a greater zxid."""

    state: Any
    after: int


@dataclass
class _Recipe:
    """State of the one DataWatch a store keeps for a watched node."""

    version: Any = UNSEEN  # state the DataWatch last reported
    stopped: bool = False


def mzxid_of(data: bytes | None, stat: Any) -> int | None:
    """A node's state for watches: the zxid of its last change (None when absent). It
    grows with every change, a re-creation included, so a change and its undoing still
    leave a new value."""
    return None if stat is None else int(stat.mzxid)


class DataWatches(Generic[K]):
    """Watches on znodes named by keys of type ``K`` (ledger ids, keys, lock names).

    Each watch first compares the node's state, once its DataWatch reports it, with what
    this store last returned for the node (``seen[key]``, kept by the store's own reads and
    writes), so a change made between a caller's read and its watch, or before the
    DataWatch is established, is still reported. A node absent both then and now may have
    been made and removed meanwhile: its parent's ``pzxid`` (the zxid of its last child
    change) tells, at the price of a fire when a sibling changed.
    """

    def __init__(
        self,
        bridge: KazooBridge,
        path_of: Callable[[K], str],
        version_of: Callable[[bytes | None, Any], Any] = mzxid_of,
    ) -> None:
        self._bridge = bridge
        self._path_of = path_of
        self._version_of = version_of
        self.watches: dict[K, list[CallbackWatch]] = {}
        self.recipes: dict[K, _Recipe] = {}
        self.seen: dict[K, Seen] = {}
        self._pending: dict[CallbackWatch, Seen] = {}  # not yet compared with the node
        #: set whenever a DataWatch reports (``established`` waits on it)
        self.progress = asyncio.Event()

    def saw(self, key: K, state: Any, after: int) -> None:
        """This store returned ``state`` for ``key`` (``after``: a zxid seen before it)."""
        self.seen[key] = Seen(state, after)

    def watch(self, key: K, fire: Callable[[], None]) -> CallbackWatch:
        loop = self._bridge.watch_loop()

        def forget(w: CallbackWatch) -> None:
            self._pending.pop(w, None)
            lst = self.watches.get(key, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                self.watches.pop(key, None)
                recipe = self.recipes.pop(key, None)
                if recipe is not None:
                    recipe.stopped = True

        w = CallbackWatch(loop, fire, forget, threadsafe=True)
        self.watches.setdefault(key, []).append(w)
        base = self.seen.get(key) or Seen(UNSEEN, self._bridge.last_zxid())
        recipe = self.recipes.get(key)
        if recipe is None:
            recipe = _Recipe()
            self.recipes[key] = recipe
            self._pending[w] = base
            path = self._path_of(key)
            on_data = functools.partial(self._on_data, key, recipe)
            self._bridge.add_recipe(lambda: DataWatch(self._bridge.zk, path, on_data))
        elif recipe.version is UNSEEN:
            self._pending[w] = base
        else:
            self._compare(key, w, base, recipe.version)
        return w

    def _on_data(self, key: K, recipe: _Recipe, data: bytes | None, stat: Any, *_: Any) -> bool:
        """DataWatch callback (a kazoo thread): hand the new version to the loop."""
        if recipe.stopped:
            return False
        self._bridge.schedule(self._event, key, recipe, self._version_of(data, stat))
        return True

    def _event(self, key: K, recipe: _Recipe, version: Any) -> None:
        first = recipe.version is UNSEEN
        recipe.version = version
        self.progress.set()
        if recipe.stopped:
            return
        if not first:
            self.fire(key)
            return
        for w in list(self.watches.get(key, ())):
            base = self._pending.pop(w, None)
            if base is not None:
                self._compare(key, w, base, version)

    def _compare(self, key: K, w: CallbackWatch, base: Seen, now: Any) -> None:
        """Fire ``w`` if the node changed after ``base``, its state now being ``now``."""
        if now is not None:
            if (base.state is UNSEEN and now > base.after) or (
                    base.state is not UNSEEN and now != base.state):
                w.fire()
        elif base.state not in (UNSEEN, None):
            w.fire()  # removed since
        else:
            self._bridge.spawn(self._parent_changed(key, w, base.after))

    async def _parent_changed(self, key: K, w: CallbackWatch, after: int) -> None:
        parent = self._path_of(key).rsplit("/", 1)[0] or "/"
        try:
            stat = await self._bridge.call("watch", "exists", parent)
        except BKError:
            w.fire()  # cannot tell: the watcher re-reads
            return
        if stat is None or int(stat.pzxid) > after:
            w.fire()

    def waiting(self) -> list[CallbackWatch]:
        """The watches not yet compared with their node."""
        return list(self._pending)

    def fire(self, key: K) -> None:
        for w in list(self.watches.get(key, ())):
            w.fire()

    def fire_all(self) -> None:
        for key in list(self.watches):
            self.fire(key)

    def cancel_all(self) -> None:
        for lst in list(self.watches.values()):
            for w in list(lst):
                w.cancel()


class ChildrenWatches:
    """Watches on the children of a fixed set of directories (the bookie registry), shared
    by every watch. A directory's state is its ``pzxid`` (the zxid of its last child
    change): a bookie that goes and comes back still moves it. Each watch compares it with
    what this store last returned (``seen``, set by ``list_bookies``), else with the zxid it
    had seen before the watch."""

    def __init__(self, bridge: KazooBridge, paths: list[str]) -> None:
        self._bridge = bridge
        self._paths = paths
        self.watches: list[CallbackWatch] = []
        self.seen: Seen | None = None  # state: a tuple of pzxids, one per path
        self._base: dict[CallbackWatch, list[Any]] = {}  # per watch: pzxid per path
        self._after: dict[CallbackWatch, int] = {}
        self._now: list[Any] = [UNSEEN] * len(paths)
        self._wake: list[asyncio.Event] = []
        #: set whenever a directory reports (``established`` waits on it)
        self.progress = asyncio.Event()

    def watch(self, callback: Callable[[], None]) -> CallbackWatch:
        loop = self._bridge.watch_loop()

        def forget(w: CallbackWatch) -> None:
            if w in self.watches:
                self.watches.remove(w)
            self._base.pop(w, None)
            self._after.pop(w, None)

        w = CallbackWatch(loop, callback, forget, threadsafe=True)
        self.watches.append(w)
        seen = self.seen or Seen(UNSEEN, self._bridge.last_zxid())
        self._base[w] = list(seen.state) if seen.state is not UNSEEN else [UNSEEN] * len(
            self._paths)
        self._after[w] = seen.after
        if not self._wake:
            self._wake = [asyncio.Event() for _ in self._paths]
            for i in range(len(self._paths)):
                self._bridge.spawn(self._follow(i))
        for i, now in enumerate(self._now):
            if now is not UNSEEN:
                self._compare(w, i, now)
        return w

    async def _follow(self, i: int) -> None:
        """Read directory ``i`` with a watch, report its pzxid, wait for the watch (or a
        lost connection, a new session), again; until the store closes."""
        path, wake = self._paths[i], self._wake[i]

        def trigger(_event: Any) -> None:  # a kazoo thread
            self._bridge.schedule(wake.set)

        while not self._bridge.closed:
            wake.clear()
            try:
                _, stat = await self._bridge.call(
                    "watch_bookies", "get_children", path, watch=trigger, include_data=True)
            except ClientClosedError:
                return
            except BKError as exc:
                log.warning("ZooKeeper bookie watch on %s: %s; retrying", path, exc)
                await asyncio.sleep(0.1)
                continue
            self._report(i, int(stat.pzxid))
            await wake.wait()

    def waiting(self) -> bool:
        """Whether some watch has not been compared with every directory yet."""
        return bool(self.watches) and any(now is UNSEEN for now in self._now)

    def rearm(self) -> None:
        """A new session: the server forgot our watches; read every directory again."""
        for wake in self._wake:
            wake.set()

    def _report(self, i: int, pzxid: int) -> None:
        self._now[i] = pzxid
        self.progress.set()
        for w in list(self.watches):
            self._compare(w, i, pzxid)

    def _compare(self, w: CallbackWatch, i: int, now: int) -> None:
        base = self._base.get(w)
        if base is None:
            return
        was = base[i]
        if (was is UNSEEN and now > self._after.get(w, 0)) or (was is not UNSEEN and now != was):
            w.fire()
        base[i] = now

    def fire(self) -> None:
        for w in list(self.watches):
            w.fire()

    def cancel_all(self) -> None:
        for w in list(self.watches):
            w.cancel()


class ZkElection(Election):
    """Leader election with ephemeral-sequential nodes (see the module doc).

    Leadership is given up as soon as the connection drops (the session may be about to
    expire, and another candidate would then lead while this one still believed it did) and
    re-checked when it comes back; after a new session the candidate's node is gone, so it
    makes a new one and queues again.
    """

    def __init__(self, bridge: KazooBridge, directory: str, name: str, candidate: str) -> None:
        super().__init__(name, candidate)
        self._bridge = bridge
        self._dir = directory
        self._node: str | None = None  # our candidate node's name
        self._node_session: int | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._resigned = False

    async def join(self) -> None:
        if self._task is not None or self._resigned:
            return
        await self._bridge.ensure_started()
        self._bridge.on_disconnect.append(self._disconnected)
        self._bridge.on_new_session.append(self._wake.set)
        await self._enter()
        self._task = asyncio.get_running_loop().create_task(
            self._campaign(), name=f"pybk-election-{self.name}")

    def _disconnected(self) -> None:
        self._set_leader(False)
        self._wake.set()

    async def _enter(self) -> None:
        path = await self._bridge.call(
            "election", "create", f"{self._dir}/{CANDIDATE_PREFIX}", self.candidate.encode(),
            ephemeral=True, sequence=True, makepath=True,
        )
        self._node = str(path).rsplit("/", 1)[1]
        self._node_session = self._bridge.session_id

    async def _campaign(self) -> None:
        while not self._resigned:
            self._wake.clear()
            try:
                await self._step()
            except ClientClosedError:
                self._set_leader(False)
                return
            except BKError as exc:
                log.info("election %s: candidate %s could not campaign: %s",
                         self.name, self.candidate, exc)
                self._set_leader(False)
            # the wake-up comes from the predecessor's watch, a lost connection or a new
            # session; the bound covers a watch that could not be set
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._bridge.session_timeout)

    async def _step(self) -> None:
        if not self._bridge.connected:
            self._set_leader(False)
            return
        if self._node is None or self._node_session != self._bridge.session_id:
            self._set_leader(False)  # a new session: our node went with the old one
            await self._enter()
        candidates = [c for c in await self._bridge.children("election", self._dir)
                      if c.startswith(CANDIDATE_PREFIX)]
        candidates.sort(key=lambda c: c[len(CANDIDATE_PREFIX):])
        if self._node not in candidates:  # deleted by hand, or the session is going
            self._node = None
            self._set_leader(False)
            self._wake.set()
            return
        index = candidates.index(self._node)
        if index == 0:
            self._set_leader(not self._resigned and self._bridge.connected)
            return
        self._set_leader(False)
        predecessor = f"{self._dir}/{candidates[index - 1]}"

        def gone(_event: Any) -> None:  # a kazoo thread
            self._bridge.schedule(self._wake.set)

        stat = await self._bridge.call("election", "exists", predecessor, watch=gone)
        if stat is None:
            self._wake.set()  # it went between our listing and the watch

    async def resign(self) -> None:
        if self._resigned:
            return
        self._resigned = True
        self._set_leader(False)
        with contextlib.suppress(ValueError):
            self._bridge.on_disconnect.remove(self._disconnected)
        with contextlib.suppress(ValueError):
            self._bridge.on_new_session.remove(self._wake.set)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        node, self._node = self._node, None
        if node is not None and self._node_session == self._bridge.session_id:
            with contextlib.suppress(NoNodeError, BKError):
                await self._bridge.call("election", "delete", f"{self._dir}/{node}",
                                        expect=(NoNodeError,))


async def election_leader(bridge: KazooBridge, directory: str) -> str | None:
    """The label of the lowest live candidate of an election directory."""
    names = [c for c in await bridge.children("election_leader", directory)
             if c.startswith(CANDIDATE_PREFIX)]
    for name in sorted(names, key=lambda c: c[len(CANDIDATE_PREFIX):]):
        try:
            data, _ = await bridge.call("election_leader", "get", f"{directory}/{name}",
                                        expect=(NoNodeError,))
        except NoNodeError:
            continue  # it went meanwhile: the next one leads
        return bytes(data).decode(errors="replace")
    return None
