"""The tables for applications: ``pybk.AsyncTables`` and its synchronous twin ``pybk.Tables``.

``AsyncTables(path)`` is embedded, as ``pybk.WAL(path)`` is: bookies in this process (a
:class:`pybk.LocalCluster` under ``path``, SQLite metadata), each range's logs written to 3
bookies and acknowledged by 2, one process at a time (``path/LOCK``). ``AsyncTables(metadata=
URI)`` uses bookies that run elsewhere; there, two processes serving the same table take its
ranges from each other (the writer fencing of the range's log decides who serves it).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from pybk.client import Client
from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.runtime.dirlock import DirectoryLock
from pybk.sync.runner import LoopThread
from pybk.tables.catalog import TableInfo
from pybk.tables.engine import TablesEngine
from pybk.tables.errors import NamespaceExistsError, NamespaceNotFoundError
from pybk.tables.mvcc import KeyValue

__all__ = ["AsyncTable", "AsyncTables", "Table", "Tables"]

Op = tuple[Any, ...]


class AsyncTable:
    """One table: ``put``, ``get``, ``delete``, ``increment``, ``txn``, ``scan``."""

    def __init__(self, engine: TablesEngine, info: TableInfo) -> None:
        self._engine = engine
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def namespace(self) -> str:
        return self.info.namespace

    async def put(self, key: bytes | str, value: bytes | str) -> int:
        """Store ``value``; returns the revision it was applied at, once it is durable."""
        return int(await self._engine.execute(self.info, ("put", key, value)))

    async def get(self, key: bytes | str, *, stale: bool = False) -> KeyValue | None:
        """The key's value, version and revisions (None when absent). Linearizable; with
        ``stale=True``, what this process has applied, without checking that it still owns
        the key's range (no metadata read)."""
        return (await self.get_at(key, stale=stale))[0]

    async def get_at(self, key: bytes | str, *,
                     stale: bool = False) -> tuple[KeyValue | None, int]:
        """``get``, with the range's revision the read was served at."""
        k = key.encode() if isinstance(key, str) else bytes(key)
        return await self._engine.get(self.info, k, stale=stale)

    async def delete(self, key: bytes | str) -> bool:
        """Remove the key; whether it existed."""
        return bool(await self._engine.execute(self.info, ("delete", key)))

    async def increment(self, key: bytes | str, amount: int = 1) -> int:
        """Add ``amount`` to the int64 counter (created at 0); the new value."""
        return int(await self._engine.execute(self.info, ("incr", key, amount)))

    async def txn(self, compare: Sequence[Op] = (), success: Sequence[Op] = (),
                  failure: Sequence[Op] = ()) -> bool:
        """If every ``(key, target, op, operand)`` compare holds, apply ``success`` (put,
        delete, incr operations), else ``failure``, atomically; whether they held. All keys
        must be in one range (a table with one range takes any)."""
        return bool(await self._engine.execute(
            self.info, ("txn", tuple(compare), tuple(success), tuple(failure))))

    async def scan(self, start: bytes | None = None, end: bytes | None = None,
                   limit: int | None = None, *, stale: bool = False) -> AsyncIterator[KeyValue]:
        """Keys in ``[start, end)`` in byte order, at most ``limit``."""
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be an int >= 0, not {limit!r}")
        for kv in await self._engine.scan(self.info, start, end, limit, stale=stale):
            yield kv

    async def checkpoint(self) -> list[int]:
        """Checkpoint every range now (they also do every ``checkpoint_every`` commands);
        the revisions checkpointed."""
        return await self._engine.checkpoint(self.info)


class AsyncTables:
    """Table namespaces and tables (``async with pybk.AsyncTables(path) as tables:``)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 metadata: str | None = None, bookies: int = 3, ensemble_size: int = 3,
                 write_quorum: int = 3, ack_quorum: int = 2, checkpoint_every: int = 10_000,
                 client_config: ClientConfig | None = None,
                 cluster_options: dict[str, Any] | None = None,
                 on_event: Callable[[str, float], None] | None = None,
                 follower: bool = False) -> None:
        if (path is None) == (metadata is None):
            raise TypeError("Tables needs a directory (embedded) or metadata=URI, one of them")
        self.path = pathlib.Path(path) if path is not None else None
        self._metadata = metadata
        self._bookies = bookies
        self._knobs: dict[str, Any] = {"ensemble_size": ensemble_size, "write_quorum": write_quorum,
                       "ack_quorum": ack_quorum}
        from pybk.logs.config import LogConfig

        LogConfig(**self._knobs)
        self._checkpoint_every = checkpoint_every
        self._on_event = on_event  # ("checkpoint_seconds" | "recovery_seconds", seconds)
        self._follower = follower  # reads only, from followers of the ranges (stale)
        self._client_config = client_config
        self._cluster_options = dict(cluster_options or {})
        self._lock: DirectoryLock | None = None
        self._cluster: LocalCluster | None = None
        self._client: Client | None = None
        self._engine: TablesEngine | None = None

    async def open(self) -> AsyncTables:
        try:
            if self.path is not None:
                from pybk.bookie import BookieConfig

                self.path.mkdir(parents=True, exist_ok=True)
                self._lock = DirectoryLock(self.path, "tables directory")
                self._lock.acquire()
                options = dict(self._cluster_options)
                options.setdefault("tenancy", False)  # (its own metadata: no tenants)
                options.setdefault(  # as the embedded WAL's bookies (pybk/wal.py)
                    "bookie_config", BookieConfig(journal_preallocate=True, segment_size=16 << 20))
                self._cluster = LocalCluster(self.path, self._bookies,
                                             client_config=self._client_config, **options)
                await self._cluster.start()
                self._client = self._cluster.client()
            else:
                assert self._metadata is not None
                self._client = Client(self._metadata, config=self._client_config)
                await self._client.start()
            self._engine = TablesEngine(self._client, log_knobs=self._knobs,
                                        checkpoint_every=self._checkpoint_every,
                                        on_event=self._on_event, follower=self._follower)
        except BaseException:
            await self._shutdown()
            raise
        return self

    @property
    def engine(self) -> TablesEngine:
        if self._engine is None:
            raise RuntimeError("the tables are not open (use them in an async with block)")
        return self._engine

    @property
    def cluster(self) -> LocalCluster | None:
        return self._cluster

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        try:
            if engine is not None:
                await engine.close()
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        try:
            if self._cluster is None and self._client is not None:
                await self._client.close()
            if self._cluster is not None:
                await self._cluster.close()
        finally:
            self._client = self._cluster = None
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    async def __aenter__(self) -> AsyncTables:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- namespaces and tables ---------------------------------------------------------------

    async def create_namespace(self, name: str) -> None:
        await self.engine.create_namespace(name)

    async def delete_namespace(self, name: str) -> None:
        """Delete the namespace and every table in it."""
        await self.engine.delete_namespace(name)

    async def list_namespaces(self) -> list[str]:
        return await self.engine.catalog.list_namespaces()

    async def create_table(self, name: str, *, namespace: str = "default",
                           num_ranges: int = 4) -> AsyncTable:
        """A new table of ``num_ranges`` ranges (the namespace is made when missing)."""
        try:
            await self.engine.catalog.get_namespace(namespace)
        except NamespaceNotFoundError:
            try:
                await self.engine.create_namespace(namespace)
            except NamespaceExistsError:
                pass
        info = await self.engine.catalog.create_table(namespace, name, num_ranges)
        return AsyncTable(self.engine, info)

    async def open_table(self, name: str, *, namespace: str = "default") -> AsyncTable:
        return AsyncTable(self.engine, await self.engine.catalog.get_table(namespace, name))

    async def delete_table(self, name: str, *, namespace: str = "default") -> None:
        await self.engine.delete_table(namespace, name)

    async def list_tables(self, namespace: str = "default") -> list[str]:
        return await self.engine.catalog.list_tables(namespace)


class Table:
    """A table for synchronous code (what :class:`AsyncTable` does, each call one hop)."""

    def __init__(self, runner: LoopThread, table: AsyncTable) -> None:
        self._runner = runner
        self._t = table

    @property
    def name(self) -> str:
        return self._t.name

    def put(self, key: bytes | str, value: bytes | str) -> int:
        return self._runner.run(self._t.put(key, value))

    def get(self, key: bytes | str, *, stale: bool = False) -> KeyValue | None:
        return self._runner.run(self._t.get(key, stale=stale))

    def delete(self, key: bytes | str) -> bool:
        return self._runner.run(self._t.delete(key))

    def increment(self, key: bytes | str, amount: int = 1) -> int:
        return self._runner.run(self._t.increment(key, amount))

    def txn(self, compare: Sequence[Op] = (), success: Sequence[Op] = (),
            failure: Sequence[Op] = ()) -> bool:
        return self._runner.run(self._t.txn(compare, success, failure))

    def scan(self, start: bytes | None = None, end: bytes | None = None,
             limit: int | None = None) -> Iterator[KeyValue]:
        return self._runner.iterate(self._t.scan(start, end, limit))

    def checkpoint(self) -> list[int]:
        return self._runner.run(self._t.checkpoint())


class Tables:
    """:class:`AsyncTables` for synchronous code (``with pybk.Tables(path) as tables:``)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 loop: str | None = None, **options: Any) -> None:
        self._runner = LoopThread(loop)
        try:
            self._tables = self._runner.run(AsyncTables(path, **options).open())
        except BaseException:
            self._runner.stop()
            raise
        self._closed = False

    def create_namespace(self, name: str) -> None:
        self._runner.run(self._tables.create_namespace(name))

    def delete_namespace(self, name: str) -> None:
        self._runner.run(self._tables.delete_namespace(name))

    def list_namespaces(self) -> list[str]:
        return self._runner.run(self._tables.list_namespaces())

    def create_table(self, name: str, *, namespace: str = "default",
                     num_ranges: int = 4) -> Table:
        return Table(self._runner, self._runner.run(
            self._tables.create_table(name, namespace=namespace, num_ranges=num_ranges)))

    def open_table(self, name: str, *, namespace: str = "default") -> Table:
        return Table(self._runner, self._runner.run(
            self._tables.open_table(name, namespace=namespace)))

    def delete_table(self, name: str, *, namespace: str = "default") -> None:
        self._runner.run(self._tables.delete_table(name, namespace=namespace))

    def list_tables(self, namespace: str = "default") -> list[str]:
        return self._runner.run(self._tables.list_tables(namespace))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._tables.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> Tables:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
