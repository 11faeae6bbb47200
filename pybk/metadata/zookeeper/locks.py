"""The ZooKeeper store's locks: an ephemeral znode ``locks/<name>`` holding the owner's label.

A lock is the session's: when the session expires ZooKeeper deletes the node and the holder
learns it through :meth:`ZkLocks.holds_lock` and the lock's watch (:meth:`ZkLocks.session_lost`;
locks are never re-taken on a new session). A lock with deeper locks below it is a
persistent parent node, held by nobody. :class:`~.store.ZooKeeperMetadataStore` hands its
lock calls to :class:`ZkLocks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from pybk.errors import MetadataStoreError
from pybk.metadata._common import check_key, check_owner, check_prefix
from pybk.metadata.base import Watch
from pybk.metadata.zookeeper.bridge import KazooBridge
from pybk.metadata.zookeeper.paths import Layout
from pybk.metadata.zookeeper.recipes import DataWatches

__all__ = ["ZkLocks"]

log = logging.getLogger("pybk.metadata.zookeeper")


class ZkLocks:
    """The lock part of the :class:`~pybk.metadata.base.MetadataStore` contract on one
    store's session (``bridge``); ``hosts`` names the ensemble in messages, ``watchers``
    are the shared lock watches."""

    def __init__(self, bridge: KazooBridge, layout: Layout, hosts: str) -> None:
        self._bridge = bridge
        self._layout = layout
        self._hosts = hosts
        self._held: dict[str, int] = {}  # lock name -> session id it was taken in
        self.watchers: DataWatches[str] = DataWatches(bridge, layout.lock)

    def session_lost(self) -> None:
        """The session these locks were taken in is gone: each holder hears it lost its lock."""
        lost, self._held = self._held, {}
        for name in lost:
            log.warning("ZooKeeper %s: lock %s lost with the session", self._hosts, name)
            self.watchers.fire(name)

    def forget(self) -> None:
        """The store closes: nothing is held any more (the session takes the nodes along)."""
        self._held.clear()

    async def try_lock(self, name: str, owner: str) -> bool:
        check_key(name)
        check_owner(owner)
        path = self._layout.lock(name)
        await self._bridge.ensure_started()
        before = self._bridge.last_zxid()
        for _ in range(20):
            session = self._bridge.session_id
            try:
                _, stat = await self._bridge.call(
                    "try_lock", "create", path, owner.encode(), ephemeral=True, makepath=True,
                    include_data=True, expect=(NodeExistsError,),
                )
                self.watchers.saw(name, stat.mzxid, before)
                self._took_lock(name, session)
                return True
            except NodeExistsError:
                pass
            try:
                _, stat = await self._bridge.call("try_lock", "get", path, expect=(NoNodeError,))
            except NoNodeError:
                continue  # released meanwhile: try again
            self.watchers.saw(name, stat.mzxid, before)
            if stat.ephemeralOwner == self._bridge.session_id:
                self._took_lock(name, self._bridge.session_id)
                return True
            if stat.ephemeralOwner == 0:  # a persistent node: a parent of deeper locks
                raise MetadataStoreError(
                    f"ZooKeeper {self._hosts}: lock {name!r} is a parent of other locks")
            return False
        raise MetadataStoreError(f"could not take lock {name!r}: contention")

    def _took_lock(self, name: str, session: int | None) -> None:
        if session is None or session != self._bridge.session_id:
            return  # the session changed under us: the node went with the old one
        fresh = name not in self._held
        self._held[name] = session
        if fresh:
            self.watchers.fire(name)

    async def unlock(self, name: str) -> None:
        check_key(name)
        session = self._held.pop(name, None)
        if session is None:
            return
        self.watchers.fire(name)
        path = self._layout.lock(name)
        before = self._bridge.last_zxid()
        try:
            _, stat = await self._bridge.call("unlock", "get", path, expect=(NoNodeError,))
        except NoNodeError:
            self.watchers.saw(name, None, before)
            return
        if stat.ephemeralOwner != session:
            self.watchers.saw(name, stat.mzxid, before)
            return  # not ours any more
        with contextlib.suppress(NoNodeError, BadVersionError, NotEmptyError):
            await self._bridge.call(
                "unlock", "delete", path, version=stat.version,
                expect=(NoNodeError, BadVersionError, NotEmptyError),
            )
            self.watchers.saw(name, None, before)

    async def lock_owner(self, name: str) -> str | None:
        check_key(name)
        before = self._bridge.last_zxid()
        try:
            data, stat = await self._bridge.call(
                "lock_owner", "get", self._layout.lock(name), expect=(NoNodeError,))
        except NoNodeError:
            self.watchers.saw(name, None, before)
            return None
        self.watchers.saw(name, stat.mzxid, before)
        if stat.ephemeralOwner == 0:
            return None  # a parent node of deeper locks
        return bytes(data).decode(errors="replace")

    async def list_locks(self, prefix: str = "") -> dict[str, str]:
        check_prefix(prefix)
        found: dict[str, str] = {}

        async def walk(rel: str) -> None:
            names = await self._bridge.children("list_locks", self._layout.lock(rel))

            async def visit(name: str) -> None:
                child = f"{rel}/{name}" if rel else name
                try:
                    data, stat = await self._bridge.call(
                        "list_locks", "get", self._layout.lock(child), expect=(NoNodeError,))
                except NoNodeError:
                    return
                if stat.ephemeralOwner:
                    found[child] = bytes(data).decode(errors="replace")
                elif stat.numChildren:
                    await walk(child)

            await asyncio.gather(*map(visit, names))

        await walk(prefix[:-1])
        return dict(sorted(found.items()))

    def holds_lock(self, name: str) -> bool:
        session = self._held.get(name)
        return (session is not None and session == self._bridge.session_id
                and self._bridge.connected and not self._bridge.closed)

    def watch_lock(self, name: str, callback: Callable[[str], None]) -> Watch:
        check_key(name)
        return self.watchers.watch(name, lambda: callback(name))
