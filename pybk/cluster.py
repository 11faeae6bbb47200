"""LocalCluster: real bookies as objects in this process, plus a metadata store.

``async with pybk.LocalCluster(root, bookies=3) as cluster`` starts ``bookies`` bookies on
the real disk under ``root/bookies/<id>`` with a SQLite metadata store at
``root/metadata.db`` (unless ``metadata`` says otherwise) and hands out clients that reach
the bookies through an in-process :class:`~pybk.transport.local.LocalTransport`.

For tests: pass ``fs=MemFileSystem()`` and ``metadata="memory://"`` (or a store object) to
run everything in memory, and ``transport_wrapper=pybk.testing.HookedTransport`` to hold, fail
or drop requests per bookie through ``cluster.transport.hooks`` (or wrap a private transport
from :meth:`LocalCluster.local_transport`).

Design notes: docs/internals.md, "pybk/cluster.py".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pybk.bookie.state import READ_ONLY, STOPPED
from pybk.client import Client
from pybk.client.context import ClientConfig
from pybk.errors import BookieStateError, ClientClosedError
from pybk.metadata.base import BookieRegistration, MetadataStore
from pybk.runtime.gctune import GcTuning
from pybk.storage.fs import FileSystem
from pybk.transport.base import Transport
from pybk.transport.local import LocalTransport

__all__ = ["LocalCluster"]

log = logging.getLogger(__name__)


class LocalCluster:
    """An embedded cluster of in-process bookies (see the module doc)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        bookies: int | Sequence[str] = 3,
        *,
        metadata: str | MetadataStore | None = None,
        fs: FileSystem | None = None,
        bookie_config: Any = None,
        client_config: ClientConfig | None = None,
        rng: random.Random | None = None,
        transport_wrapper: Callable[[Transport], Transport] | None = None,
        racks: Mapping[str, str] | None = None,
        groups: Mapping[str, str] | None = None,
        autorecovery: bool = False,
        autorecovery_config: Any = None,
        metrics: Any = None,
        tune_gc: bool = False,
        bookie_dirs: Sequence[str | os.PathLike[str]] | None = None,
        storage: str | None = None,
        tenancy: bool = True,
    ) -> None:
        if isinstance(bookies, int):
            if bookies < 0:
                raise ValueError(f"bookies must be >= 0, got {bookies}")
            ids = [f"bookie-{i}" for i in range(bookies)]
        else:
            ids = [str(b) for b in bookies]
            if len(set(ids)) != len(ids):
                raise ValueError(f"bookie ids must be distinct, got {ids}")
        self.root = pathlib.Path(root)
        self._initial_ids = ids
        #: bookie id -> its data directory when the caller placed it (``bookie_dirs``, one per
        #: initial bookie, in order); the others live under ``root/bookies/<id>``
        self._dirs: dict[str, pathlib.Path] = {}
        if bookie_dirs is not None:
            dirs = [pathlib.Path(d) for d in bookie_dirs]
            if len(dirs) != len(ids):
                raise ValueError(
                    f"bookie_dirs has {len(dirs)} directories for {len(ids)} bookies")
            self._dirs = dict(zip(ids, dirs, strict=True))
        self._fs = fs
        self._metadata_arg = metadata
        if storage is not None:  # the engine ("journal" or "db") over bookie_config's
            from pybk.bookie import BookieConfig

            bookie_config = dataclasses.replace(bookie_config or BookieConfig(), storage=storage)
        self._bookie_config = bookie_config
        self._client_config = client_config
        self._rng = rng if rng is not None else random.Random()
        self._bookies: dict[str, Any] = {}  # live bookie objects, read by the transports
        self._known: list[str] = []
        self._clients: list[Client] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._store: MetadataStore | None = None
        self._own_store = False
        self._wrap = transport_wrapper
        #: bookie id -> network location ``/region/rack`` it registers with
        self.racks: dict[str, str] = dict(racks or {})
        #: bookie id -> isolation group it registers with
        self.groups: dict[str, str] = dict(groups or {})
        #: run auto-recovery (an auditor candidate and a replication worker) next to each
        #: running bookie; a pybk.ops.AutoRecoveryConfig tunes it
        self.autorecovery = autorecovery
        self._autorecovery_config = autorecovery_config
        self._recoveries: dict[str, Any] = {}  # bookie id -> its pybk.ops.AutoRecovery
        #: a prometheus_client CollectorRegistry: the bookies (and auto-recovery) record
        #: metrics and are exported in it
        self.metrics = metrics
        if metrics is not None:
            from pybk.bookie.metrics import BookieCollector
            from pybk.ops.metrics import AutoRecoveryCollector

            metrics.register(BookieCollector(lambda: list(self._bookies.values())))
            metrics.register(AutoRecoveryCollector(
                lambda: [(b, r.stats) for b, r in self._recoveries.items()]))
        #: enforce namespaces' rates and storage quotas in every bookie, as ``pybk bookie``
        #: does by default (pybk.bookie.tenancy; every principal is anonymous in process)
        self.tenancy = tenancy
        self.transport = self.local_transport()
        self._started = False
        #: apply :func:`pybk.runtime.gctune.tune_gc_for_server` once the bookies have started, and
        #: put the process's previous settings back at :meth:`close` (process-wide: opt-in)
        self.tune_gc = tune_gc
        self._gc = GcTuning()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> LocalCluster:
        if self._started:
            return self
        if self._fs is None:
            self.root.mkdir(parents=True, exist_ok=True)
            self.root = self.root.resolve()
        else:
            self._fs.makedirs(str(self.root))
        metadata = self._metadata_arg
        if metadata is None:
            metadata = "memory://" if self._fs is not None else f"sqlite:///{self.root}/metadata.db"
        if isinstance(metadata, str):
            from pybk.metadata import open_store

            self._store = open_store(metadata)
            self._own_store = True
        else:
            self._store = metadata
        self._started = True
        try:
            for bookie_id in self._initial_ids:
                await self._start(bookie_id)
        except BaseException:
            await self.close()
            raise
        if self.tune_gc:
            self._gc.apply()
        return self

    async def close(self) -> None:
        """Close the clients, stop every bookie cleanly, close the store."""
        if not self._started:
            return
        self._started = False
        for bookie_id in list(self._recoveries):
            await self._stop_autorecovery(bookie_id)
        for client in self._clients:
            await client.close()
        self._clients.clear()
        await self.transport.close()
        for bookie_id in list(self._bookies):
            bookie = self._bookies.pop(bookie_id)
            if bookie.tenancy is not None:
                bookie.tenancy.stop()
            try:
                await bookie.stop()
            except Exception:
                log.exception("bookie %s failed to stop cleanly", bookie_id)
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        if self._store is not None and self._own_store:
            await self._store.close()
        self._gc.restore()

    async def __aenter__(self) -> LocalCluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (f"<pybk.LocalCluster {self.root}: {len(self._bookies)} of "
                f"{len(self._known)} bookies running>")

    # -- bookies -----------------------------------------------------------------------------

    @property
    def store(self) -> MetadataStore:
        if self._store is None:
            raise ClientClosedError("the cluster is not started")
        return self._store

    @property
    def bookie_ids(self) -> list[str]:
        """Every bookie this cluster has started (running or stopped)."""
        return list(self._known)

    @property
    def running_bookie_ids(self) -> list[str]:
        return [b for b in self._known if b in self._bookies]

    def bookie(self, bookie_id: str) -> Any:
        """The running Bookie object (tests poke at it)."""
        try:
            return self._bookies[bookie_id]
        except KeyError:
            raise KeyError(f"bookie {bookie_id!r} is not running") from None

    def bookie_dir(self, bookie_id: str) -> pathlib.Path:
        """That bookie's data directory."""
        if bookie_id not in self._known:
            raise KeyError(f"unknown bookie {bookie_id!r}; known: {self._known}")
        return self._data_dir(bookie_id)

    def _data_dir(self, bookie_id: str) -> pathlib.Path:
        return self._dirs.get(bookie_id) or self.root / "bookies" / bookie_id

    async def _start(self, bookie_id: str) -> None:
        from pybk.bookie import Bookie

        data_dir = str(self._data_dir(bookie_id))
        kwargs: dict[str, Any] = {
            "cookie_store": self.store,
            "rng": random.Random(self._rng.random()),
        }
        if self._fs is not None:
            kwargs["fs"] = self._fs
        if self._bookie_config is not None:
            kwargs["config"] = self._bookie_config
        if self.metrics is not None:
            from pybk.stats import BookieStats

            kwargs["stats"] = BookieStats()
        bookie = Bookie(bookie_id, data_dir, **kwargs)
        await bookie.start()
        if self.tenancy:
            from pybk.bookie.tenancy import enable_tenancy

            await enable_tenancy(bookie, self.store, authenticated=False)
        if bookie_id not in self._known:
            self._known.append(bookie_id)
        self._bookies[bookie_id] = bookie
        bookie.on_state_change = lambda state, b=bookie_id: self._on_state_change(b, state)
        await self._register(bookie_id, bookie.state)
        if self.autorecovery:
            await self._start_autorecovery(bookie_id)

    async def _start_autorecovery(self, bookie_id: str) -> None:
        """Auto-recovery next to ``bookie_id``, on a metadata session of its own (so the
        auditor election and the ledger locks see one candidate per bookie), reaching the
        bookies through the cluster's transport (its test hooks apply)."""
        from pybk.metadata.memory import MemoryMetadataStore
        from pybk.ops.autorecovery import AutoRecovery

        store = self.store
        own = False
        if isinstance(store, MemoryMetadataStore):
            store, own = store.session(), True
        elif isinstance(self._metadata_arg, str) or self._metadata_arg is None:
            from pybk.metadata import open_store
            from pybk.metadata.registry import scheme_of

            uri = self._metadata_arg or f"sqlite:///{self.root}/metadata.db"
            if scheme_of(uri).shared:  # a memory store is the cluster's own, shared as is
                store, own = open_store(uri), True
        recovery = AutoRecovery(
            store, self.transport, name=bookie_id, config=self._autorecovery_config,
            client_config=self._client_config, rng=random.Random(self._rng.random()))
        recovery.owns_store = own
        await recovery.start()
        self._recoveries[bookie_id] = recovery

    async def _stop_autorecovery(self, bookie_id: str) -> None:
        recovery = self._recoveries.pop(bookie_id, None)
        if recovery is None:
            return
        await recovery.stop()
        if recovery.owns_store:
            await recovery.ctx.store.close()

    @property
    def recoveries(self) -> dict[str, Any]:
        """The running auto-recovery instances (pybk.ops.AutoRecovery) by bookie id."""
        return dict(self._recoveries)

    async def _register(self, bookie_id: str, state: str) -> None:
        if state == STOPPED or self._bookies.get(bookie_id) is None:
            await self.store.unregister_bookie(bookie_id)
            return
        await self.store.register_bookie(
            BookieRegistration(bookie_id, "", read_only=(state == READ_ONLY),
                               rack=self.racks.get(bookie_id, ""),
                               group=self.groups.get(bookie_id, ""))
        )

    def _on_state_change(self, bookie_id: str, state: str) -> None:
        if not self._started:
            return
        task = asyncio.get_running_loop().create_task(self._register(bookie_id, state))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop_bookie(self, bookie_id: str) -> None:
        """Crash-stop a bookie (unsynced data is lost as after kill -9) and unregister it."""
        bookie = self._bookies.pop(bookie_id, None)
        if bookie is None:
            raise BookieStateError(f"bookie {bookie_id!r} is not running")
        bookie.on_state_change = None
        if bookie.tenancy is not None:
            bookie.tenancy.stop()
        bookie.crash()
        await self._stop_autorecovery(bookie_id)  # it dies with its bookie
        await self.store.unregister_bookie(bookie_id)

    async def start_bookie(self, bookie_id: str) -> None:
        """Restart a stopped bookie on its data directory."""
        if bookie_id not in self._known:
            raise KeyError(f"unknown bookie {bookie_id!r}; known: {self._known}")
        if bookie_id in self._bookies:
            raise BookieStateError(f"bookie {bookie_id!r} is already running")
        await self._start(bookie_id)

    async def add_bookie(self, bookie_id: str | None = None, *, rack: str | None = None,
                         group: str | None = None) -> str:
        """Start one more bookie (in ``rack`` and isolation ``group`` when given); returns
        its id."""
        if bookie_id is None:
            n = len(self._known)
            while f"bookie-{n}" in self._known:
                n += 1
            bookie_id = f"bookie-{n}"
        elif bookie_id in self._known:
            raise ValueError(f"bookie {bookie_id!r} already exists")
        if rack is not None:
            self.racks[bookie_id] = rack
        if group is not None:
            self.groups[bookie_id] = group
        await self._start(bookie_id)
        return bookie_id

    # -- clients -----------------------------------------------------------------------------

    def local_transport(self) -> Transport:
        """A new in-process transport to this cluster's bookies (wrapped by the cluster's
        ``transport_wrapper``, when it has one)."""
        transport: Transport = LocalTransport(self._bookies)
        return self._wrap(transport) if self._wrap is not None else transport

    def client(
        self,
        *,
        config: ClientConfig | None = None,
        rng: random.Random | None = None,
        transport: Transport | None = None,
    ) -> Client:
        """A client of this cluster (closed with the cluster)."""
        if not self._started:
            raise ClientClosedError("the cluster is not started")
        client = Client(
            self.store,
            transport=transport if transport is not None else self.transport,
            config=config if config is not None else self._client_config,
            rng=rng if rng is not None else random.Random(self._rng.random()),
        )
        self._clients.append(client)
        return client
