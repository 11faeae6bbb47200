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
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from pybk.errors import BKError, ClientClosedError
from pybk.metadata._common import CallbackWatch
from pybk.metadata.base import Election
from pybk.metadata.zookeeper.bridge import KazooBridge
from pybk.metadata.zookeeper.paths import CANDIDATE_PREFIX

__all__ = ["UNSEEN", "ChildrenWatches", "DataWatches", "ZkElection", "election_leader"]

log = logging.getLogger("pybk.metadata.zookeeper")

K = TypeVar("K", bound=Hashable)

#: "no version known yet" (None means "the node does not exist")
UNSEEN: Any = object()


@dataclass
class _Recipe:
    """State of the one DataWatch a store keeps for a watched node."""

    baseline: Any  # version this store last saw when the recipe was made, or UNSEEN
    version: Any = UNSEEN  # version the DataWatch last reported
    stopped: bool = False


class DataWatches(Generic[K]):
    """Watches on znodes named by keys of type ``K`` (ledger ids, keys, lock names).

    ``version_of(data, stat)`` turns a DataWatch report into the version compared with what
    this store last saw (``seen[key]``, kept up to date by the store's own reads and
    writes), so a change made between a caller's read and its watch is still reported.
    """

    def __init__(
        self,
        bridge: KazooBridge,
        path_of: Callable[[K], str],
        version_of: Callable[[bytes | None, Any], Any],
    ) -> None:
        self._bridge = bridge
        self._path_of = path_of
        self._version_of = version_of
        self.watches: dict[K, list[CallbackWatch]] = {}
        self.recipes: dict[K, _Recipe] = {}
        self.seen: dict[K, Any] = {}

    def watch(self, key: K, fire: Callable[[], None]) -> CallbackWatch:
        loop = self._bridge.watch_loop()

        def forget(w: CallbackWatch) -> None:
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
        recipe = self.recipes.get(key)
        if recipe is None:
            recipe = _Recipe(baseline=self.seen.get(key, UNSEEN))
            self.recipes[key] = recipe
            path = self._path_of(key)
            on_data = functools.partial(self._on_data, key, recipe)
            self._bridge.add_recipe(lambda: DataWatch(self._bridge.zk, path, on_data))
        elif recipe.version is not UNSEEN and self.seen.get(key, UNSEEN) not in (
            UNSEEN, recipe.version,
        ):
            w.fire()  # the caller read a version other than the one the watch knows
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
        if first and recipe.baseline in (UNSEEN, version):
            return  # the first look: nothing changed since the caller last read
        if not recipe.stopped:
            self.fire(key)

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
    """Watches on the children of a fixed set of directories, shared by every watch."""

    def __init__(self, bridge: KazooBridge, paths: list[str]) -> None:
        self._bridge = bridge
        self._paths = paths
        self.watches: list[CallbackWatch] = []
        self._established = False

    def watch(self, callback: Callable[[], None]) -> CallbackWatch:
        loop = self._bridge.watch_loop()

        def forget(w: CallbackWatch) -> None:
            if w in self.watches:
                self.watches.remove(w)

        w = CallbackWatch(loop, callback, forget, threadsafe=True)
        self.watches.append(w)
        if not self._established:
            self._established = True
            for path in self._paths:
                first = [True]

                def on_children(children: list[str], first: list[bool] = first) -> bool:
                    if self._bridge.closed:
                        return False
                    if first[0]:
                        first[0] = False
                    else:
                        self._bridge.schedule(self.fire)
                    return True

                def make(path: str = path, fn: Any = on_children) -> Any:
                    return ChildrenWatch(self._bridge.zk, path, fn)

                self._bridge.add_recipe(make)
        return w

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
