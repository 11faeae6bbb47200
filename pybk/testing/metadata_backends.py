"""The backends of the metadata conformance suite (:mod:`pybk.testing.metadata_conformance`):
what the suite needs to know about a backend (:class:`MetadataBackend`: open another client on
the one store, make a client's owner vanish, damage stored bytes) and the backends pybk ships
(memory, SQLite, ZooKeeper; etcd's is :class:`pybk.testing.etcd.EtcdBackend`). Apart from the
checks, so that a backend of one's own and the check modules depend on this alone.
"""

from __future__ import annotations

import abc
import asyncio
import tempfile
from pathlib import Path

from pybk.metadata.base import MetadataStore

__all__ = ["DEFAULT_BOUND", "MemoryBackend", "MetadataBackend", "SqliteBackend",
           "ZooKeeperBackend"]

#: How long a check waits for something asynchronous (watch callbacks, lease expiry).
DEFAULT_BOUND = 10.0


class MetadataBackend(abc.ABC):
    """What the suite needs to know about one backend (one shared store, many clients)."""

    #: Seconds within which watches must fire and a dead owner's registration must vanish.
    bound: float = DEFAULT_BOUND

    @abc.abstractmethod
    async def open(self) -> MetadataStore:
        """A new client (its own session/owner) of the one store under test."""

    @abc.abstractmethod
    async def kill_owner(self, store: MetadataStore) -> None:
        """Make ``store``'s owner disappear without a clean unregister (crash, lost session).
        The suite does not use ``store`` afterwards."""

    @abc.abstractmethod
    async def corrupt_ledger(self, store: MetadataStore, ledger_id: int, data: bytes) -> None:
        """Overwrite the stored bytes of a ledger's metadata."""

    async def check_invariants(self) -> None:  # noqa: B027 - optional hook
        """Assert the backend's internal invariants (called after each check)."""

    async def cleanup(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend holds (called once after a check)."""


# -- backends shipped with pybk ---------------------------------------------------------------


class MemoryBackend(MetadataBackend):
    """``memory://``: clients are sessions of one shared state. ``watch_delivery``: a
    :class:`~pybk.metadata.memory_watches.PolledDelivery` makes watches poll."""

    bound = 2.0

    def __init__(self, watch_delivery: object = None) -> None:
        from pybk.metadata.memory import MemoryMetadataStore
        from pybk.metadata.memory_watches import PolledDelivery

        assert watch_delivery is None or isinstance(watch_delivery, PolledDelivery)
        self._root = MemoryMetadataStore(watch_delivery=watch_delivery)
        self._opened: list[MetadataStore] = []

    async def open(self) -> MetadataStore:
        store = self._root.session()
        self._opened.append(store)
        return store

    async def check_invariants(self) -> None:
        self._root._check()

    async def kill_owner(self, store: MetadataStore) -> None:
        from pybk.metadata.memory import MemoryMetadataStore

        assert isinstance(store, MemoryMetadataStore)
        store.expire_session()
        await store.close()  # the owner is gone for good: nothing campaigns for it again

    async def corrupt_ledger(self, store: MetadataStore, ledger_id: int, data: bytes) -> None:
        self._root.corrupt_ledger(ledger_id, data)

    async def cleanup(self) -> None:
        for s in self._opened:
            await s.close()


class SqliteBackend(MetadataBackend):
    """``sqlite:///``: clients are separate connections to one file, short leases."""

    def __init__(self, path: str | None = None, *, ttl: float = 1.0) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pybk-meta-")
            path = str(Path(self._tmp.name) / "metadata.db")
        self.path = path
        self.ttl = ttl
        self.bound = ttl * 5 + 2.0
        self._opened: list[MetadataStore] = []

    async def open(self) -> MetadataStore:
        from pybk.metadata.sqlite import SqliteMetadataStore

        store = SqliteMetadataStore(
            self.path, ttl=self.ttl, heartbeat_interval=self.ttl / 5, poll_interval=0.02
        )
        self._opened.append(store)
        return store

    async def kill_owner(self, store: MetadataStore) -> None:
        from pybk.metadata.sqlite import SqliteMetadataStore

        assert isinstance(store, SqliteMetadataStore)
        await store.crash()

    async def check_invariants(self) -> None:
        from pybk.metadata.sqlite import SqliteMetadataStore

        checker = SqliteMetadataStore(self.path)
        try:
            await checker.check_invariants()
        finally:
            await checker.close()

    async def corrupt_ledger(self, store: MetadataStore, ledger_id: int, data: bytes) -> None:
        from pybk.metadata.sqlite import SqliteMetadataStore

        assert isinstance(store, SqliteMetadataStore)
        await store.corrupt_ledger(ledger_id, data)

    async def cleanup(self) -> None:
        for s in self._opened:
            await s.close()
        if self._tmp is not None:
            self._tmp.cleanup()


class ZooKeeperBackend(MetadataBackend):
    """``zk://``: clients are separate kazoo sessions under one fresh root path.

    ``hosts`` is a running server (e.g. :class:`pybk.testing.zookeeper.ZooKeeperServer`).
    """

    _counter = 0

    def __init__(self, hosts: str, root: str | None = None, *, session_timeout: float = 4.0):
        if root is None:
            ZooKeeperBackend._counter += 1
            root = f"/conformance-{id(self):x}-{ZooKeeperBackend._counter}"
        self.hosts = hosts
        self.root = root
        self.session_timeout = session_timeout
        self.bound = 15.0
        self._opened: list[MetadataStore] = []

    async def open(self) -> MetadataStore:
        from pybk.metadata.zookeeper import ZooKeeperMetadataStore

        store = ZooKeeperMetadataStore(
            self.hosts, self.root, session_timeout=self.session_timeout
        )
        self._opened.append(store)
        return store

    async def kill_owner(self, store: MetadataStore) -> None:
        """The owner dies: it stops re-registering and its session is expired."""
        from pybk.metadata.zookeeper import ZooKeeperMetadataStore
        from pybk.testing.zookeeper import force_session_expiry

        assert isinstance(store, ZooKeeperMetadataStore)
        store.forget_registrations()
        client_id = store.client_id
        assert client_id is not None, "store never connected"
        await asyncio.to_thread(force_session_expiry, self.hosts, client_id)
        await store.close()

    async def corrupt_ledger(self, store: MetadataStore, ledger_id: int, data: bytes) -> None:
        from pybk.metadata.zookeeper import ZooKeeperMetadataStore

        assert isinstance(store, ZooKeeperMetadataStore)
        await store.corrupt_ledger(ledger_id, data)

    async def cleanup(self) -> None:
        for s in self._opened:
            await s.close()
