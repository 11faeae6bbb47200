"""A bookie process: one :class:`pybk.bookie.Bookie` behind a :class:`BookieServer`.

This is the outermost layer (it reads signals, the wall clock and files), so it owns what the
bookie itself never does: an exclusive lock on the data directory for the process's life
(:class:`pybk.runtime.dirlock.DirectoryLock`: a second bookie on the same directory is
refused before it reads a byte, whatever its id), registering in the metadata store's bookie
registry (the SQLite and ZooKeeper stores keep the registration alive by heartbeat /
session), flipping the registry's read-only flag when the bookie's state changes, and a
clean shutdown on SIGTERM (listed in docs/internals.md, "pybk/server/process.py").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Gauge

from pybk.bookie.state import READ_ONLY, STOPPED, WRITABLE
from pybk.metadata.base import BookieRegistration, MetadataStore
from pybk.runtime.dirlock import DirectoryLock
from pybk.runtime.gctune import SERVER_GC_THRESHOLD, tune_gc_for_server
from pybk.runtime.loopwatch import LoopWatch
from pybk.storage.store import INLINE_SYNC_ALWAYS
from pybk.transport.listener import raise_open_file_limit
from pybk.transport.server import BookieServer, ServerConfig
from pybk.transport.tls import server_context

__all__ = [
    "SERVER_GC_THRESHOLD",
    "BookieProcess",
    "BookieProcessConfig",
    "run",
    "serve",
    "tune_gc_for_server",
]

log = logging.getLogger("pybk.server.process")

#: adds in a bookie's add path at once before tenants take turns (pybk.transport.fairness)
FAIR_SHARE = 512


@dataclass
class BookieProcessConfig:
    """Everything ``pybk bookie`` takes on its command line."""

    data_dir: str
    metadata: str
    port: int = 3181
    host: str = "127.0.0.1"
    bookie_id: str | None = None
    advertised_host: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    require_client_cert: bool = False
    auth_token: bytes | None = None
    ready_file: str | None = None
    stop_grace: float = 10.0
    server_config: ServerConfig | None = None
    bookie_config: Any = None  # pybk.bookie.BookieConfig
    metrics_port: int | None = None  # serve /metrics (and /heartbeat) only, on host:port
    #: the local scrubber verifies every stored record at most this many bytes a second
    #: (pybk.bookie.scrubbing; damage marks the ledger under-replicated); 0: no scrubber
    scrub_rate: float = 8 << 20
    #: seconds between the scrubber's passes (the first one runs at start)
    scrub_interval: float = 3600.0
    #: the HTTP admin endpoint (pybk.server.http) on this port; None: none
    http_port: int | None = None
    #: its bounds and token (a pybk.server.http.HttpConfig; host/port are filled in)
    http_config: Any = None
    #: run auto-recovery (an auditor candidate and a replication worker) in this process
    autorecovery: bool = False
    autorecovery_config: Any = None  # pybk.ops.AutoRecoveryConfig
    #: the registration vanishes this long after the process dies (SQLite lease, ZooKeeper
    #: session); None: the store's default
    session_timeout: float | None = None
    #: network location ``/region/rack`` for rack-aware placement
    rack: str = ""
    #: isolation group: namespaces bound to it place their ledgers on its bookies only
    group: str = ""
    #: how auto-recovery and the admin endpoint choose target bookies (a pybk
    #: PlacementPolicy; None: random among writable bookies)
    placement: Any = None
    #: journal segment size and preallocation (used when ``bookie_config`` is None)
    segment_size: int = 64 << 20
    preallocate: bool = True
    #: the storage engine (used when ``bookie_config`` is None): "journal" or "db"
    storage: str = "journal"
    #: files of ``tenant:token`` and ``tenant:certificate-subject-CN`` lines (docs/tenancy.md)
    tenant_tokens: str | None = None
    tenant_subjects: str | None = None
    #: enforce namespace ownership, rates and storage quotas (docs/tenancy.md)
    tenancy: bool = True

    def resolved_bookie_id(self) -> str:
        if self.bookie_id:
            return self.bookie_id
        if self.port == 0:
            raise ValueError("--bookie-id is required with --port 0 (the id must survive restarts)")
        return f"{self.advertise()}:{self.port}"

    def advertise(self) -> str:
        """The host name to register: --advertised-host, else --host unless it is a wildcard
        address (clients elsewhere cannot dial 0.0.0.0), then this machine's name."""
        if self.advertised_host:
            return self.advertised_host
        if self.host in ("", "0.0.0.0", "::"):
            return socket.getfqdn()
        return self.host

    def warnings(self) -> list[str]:
        """What an operator should hear about this configuration at start."""
        found = []
        if self.auth_token is not None and self.tls_cert is None:
            found.append(
                "token authentication without TLS: the token crosses the network in the "
                "clear, so anyone who sees one connection can replay it; add --tls-cert "
                "(and --tls-key), or use mutual TLS (--require-client-cert) instead")
        return found

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.tls_cert is None:
            if self.tls_key or self.tls_ca or self.require_client_cert:
                raise ValueError("--tls-key/--tls-ca/--require-client-cert need --tls-cert")
            return None
        return server_context(
            self.tls_cert,
            self.tls_key,
            cafile=self.tls_ca,
            require_client_cert=self.require_client_cert,
        )


def process_bookie_config(*, preallocate: bool = True, segment_size: int = 64 << 20,
                          storage: str = "journal") -> Any:
    """The ``BookieConfig`` a ``pybk bookie`` process runs with (benchmarks give an
    in-process cluster the same one, to compare like with like).

    A bookie process hosts one bookie alone on its loop: a batch syncs inline when the loop
    has nothing else to do, else through the sync process while the loop completes the batch
    before it (rare: an inline sync blocks the loop, so nothing waits when it returns; the
    overlap starts only after a split, see pybk.storage.journal); its segments are
    preallocated (syncs that flush data only)."""
    from pybk.bookie import BookieConfig

    return BookieConfig(journal_inline_sync_max=INLINE_SYNC_ALWAYS,
                        journal_overlap_syncs=True,
                        journal_preallocate=preallocate,
                        segment_size=segment_size, storage=storage)


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class BookieProcess:
    """Runs one bookie until :meth:`request_stop` (or SIGTERM/SIGINT via :func:`run`)."""

    def __init__(self, config: BookieProcessConfig, *, store: MetadataStore | None = None) -> None:
        self.config = config
        self.bookie_id = config.resolved_bookie_id()
        self._ssl = config.ssl_context()
        self._store_arg = store
        self.store: MetadataStore | None = None
        self.bookie: Any = None
        self.server: BookieServer | None = None
        self.tenancy: Any = None  # the bookie's tenancy gate (pybk.bookie.tenancy)
        self.address = ""
        self._stop = asyncio.Event()
        self._registry_updates: list[asyncio.Task[None]] = []
        self._http: list[Any] = []  # pybk.server.http.AdminHttpServer objects
        self.metrics_address = ""
        self.http_address = ""
        self.autorecovery: Any = None  # pybk.ops.AutoRecovery when enabled
        self._client: Any = None  # the pybk.Client of the admin endpoint and auto-recovery
        self.registry: Any = None
        self.loop_watch = LoopWatch()
        self._marks: set[asyncio.Task[None]] = set()
        self._lock = DirectoryLock(config.data_dir, "bookie data directory")
        #: this process put the bookie in the registry (only then does it take it out)
        self._registered = False

    def request_stop(self) -> None:
        self._stop.set()

    async def start(self, *, tune_gc: bool = False) -> None:
        """Start the bookie, its server and endpoints, then register it. ``tune_gc``:
        :func:`tune_gc_for_server` just before registering (``pybk bookie``), and the loop
        watch started after it: the start-up's one full collection held the loop, once, and
        was counted as the longest stall of the bookie's life."""
        from pybk.bookie import Bookie
        from pybk.metadata import open_store
        from pybk.metadata.uri import session_options

        cfg = self.config
        for warning in cfg.warnings():
            log.warning("%s", warning)
        self.store = self._store_arg or open_store(
            cfg.metadata, **session_options(cfg.metadata, cfg.session_timeout))
        await asyncio.to_thread(Path(cfg.data_dir).mkdir, mode=0o700, parents=True,
                                exist_ok=True)
        # before anything reads or writes the directory: a second bookie on it (even with
        # another id) is refused here, and the lock lasts as long as this process
        self._lock.acquire()
        bookie_config = cfg.bookie_config
        if bookie_config is None:
            bookie_config = process_bookie_config(preallocate=cfg.preallocate,
                                                  segment_size=cfg.segment_size,
                                                  storage=cfg.storage)
        bookie_config = dataclasses.replace(bookie_config, scrub_rate=cfg.scrub_rate,
                                            scrub_interval=cfg.scrub_interval)
        stats = None
        if cfg.http_port is not None or cfg.metrics_port is not None:
            from pybk.stats import BookieStats

            stats = BookieStats()
        self.bookie = Bookie(
            self.bookie_id, cfg.data_dir, cookie_store=self.store, config=bookie_config,
            stats=stats,
        )
        await self.bookie.start()
        identities = await self._identities()
        if cfg.tenancy:
            from pybk.bookie.tenancy import enable_tenancy

            self.tenancy = await enable_tenancy(
                self.bookie, self.store, authenticated=bool(identities.tokens
                                                            or identities.subjects))
        server_cfg = cfg.server_config or ServerConfig(stop_grace=cfg.stop_grace)
        self.server = BookieServer(
            self.bookie.handle,
            add=self.bookie.add_request,
            response_size=self.bookie.response_size_hint,
            host=cfg.host,
            port=cfg.port,
            ssl_context=self._ssl,
            auth_token=cfg.auth_token,
            config=server_cfg,
            identities=identities,
            gate=self.tenancy,
            fair_share=FAIR_SHARE if cfg.tenancy else None,
        )
        await self.server.start()
        if self.tenancy is not None:
            self.server.registry.register(self.tenancy)
        self.bookie.on_descriptors_exhausted = self._descriptors_exhausted
        _, port = self.server.address
        host = cfg.advertise()
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.registry = self.server.registry
        self._damage_gauge()
        stall = Gauge("pybk_loop_stall_seconds_max", "the longest the event loop was held "
                      "(a timer's lateness, since start)", registry=self.registry)
        stall.set_function(lambda: self.loop_watch.max_stall)
        if stats is not None:
            from pybk.bookie.metrics import BookieCollector

            self.registry.register(BookieCollector(lambda: [self.bookie]))
        if cfg.autorecovery or cfg.http_port is not None:
            await self._start_operations()
        if cfg.metrics_port is not None:
            self.metrics_address = await self._start_http(cfg.metrics_port, admin_paths=False)
        if cfg.http_port is not None:
            self.http_address = await self._start_http(cfg.http_port, admin_paths=True)
        self.bookie.on_state_change = self._on_state_change
        if tune_gc:  # (its one full collection before anyone can know of this bookie)
            tune_gc_for_server()
        self.loop_watch.start()  # (the stalls counted are those its clients can meet)
        await self._register()
        if self.autorecovery is not None:
            await self.autorecovery.start()
        info = {
            "event": "ready",
            "bookie_id": self.bookie_id,
            "address": self.address,
            "pid": os.getpid(),
            "tls": self._ssl is not None,
            "metrics": self.metrics_address,
            "http": self.http_address,
            "autorecovery": self.autorecovery is not None,
            "tenancy": identities.describe() if cfg.tenancy else "not enforced",
        }
        line = json.dumps(info, sort_keys=True)
        print(line, flush=True)
        if cfg.ready_file:
            _write_atomically(cfg.ready_file, line + "\n")
        log.info("bookie %s serving on %s", self.bookie_id, self.address)

    async def _identities(self) -> Any:
        """Who connections are: the tenant files, checked against the tenant records (a
        tenant named there must exist); logged once."""
        from pybk.errors import NoSuchTenantError
        from pybk.metadata.tenancy import TenancyRecords
        from pybk.transport.identity import Identities, unknown_tenants

        cfg = self.config
        identities = Identities.from_files(cfg.tenant_tokens, cfg.tenant_subjects)
        if identities.tenants():
            assert self.store is not None
            unknown = unknown_tenants(identities,
                                      await TenancyRecords(self.store).list_tenants())
            if unknown:
                raise NoSuchTenantError(f"the tenant files name tenants that do not exist: "
                                 f"{', '.join(unknown)} (create them: pybk tenant create)")
        log.info("tenancy: %s%s", identities.describe(),
                 "" if cfg.tenancy else " (enforcement off)")
        return identities

    async def _start_operations(self) -> None:
        """The client that reaches the other bookies (as a client of the cluster: the same
        TLS and token), the bookie's collectors, and auto-recovery when asked for."""
        from pybk.client import Client, ClientConfig
        from pybk.ops import AutoRecovery
        from pybk.ops.metrics import AutoRecoveryCollector
        from pybk.transport.tcp import TcpTransport
        from pybk.transport.tls import client_context

        cfg = self.config
        assert self.store is not None
        tls = None
        if cfg.tls_cert is not None:
            tls = client_context(cfg.tls_ca, certfile=cfg.tls_cert, keyfile=cfg.tls_key)
        kwargs: dict[str, Any] = {}
        if tls is not None:
            kwargs["ssl_context"] = tls
        if cfg.auth_token is not None:
            kwargs["auth_token"] = cfg.auth_token
        transport = TcpTransport.from_store(self.store, **kwargs)
        client_config = ClientConfig() if cfg.placement is None else ClientConfig(
            placement=cfg.placement)
        self._client = Client(self.store, transport=transport, config=client_config)
        if cfg.autorecovery:
            self.autorecovery = AutoRecovery(
                self.store, transport, name=self.bookie_id, config=cfg.autorecovery_config,
                client_config=client_config)
            recovery = self.autorecovery
            self.registry.register(AutoRecoveryCollector(
                lambda: [(self.bookie_id, recovery.stats)]))

    def _damage_gauge(self) -> None:
        """The bookie's scrubber (pybk.bookie.scrubbing) reports damage in its info and
        marks the ledger under-replicated; the metrics count what is not repaired yet."""
        bookie = self.bookie
        damaged = Gauge("pybk_bookie_damaged_entries", "entries the scrubber found damaged "
                        "(not repaired yet)", registry=self.registry)
        damaged.set_function(lambda: len(bookie.store.damaged) if bookie.store else 0)

    async def _start_http(self, port: int, *, admin_paths: bool) -> str:
        from dataclasses import replace

        from pybk.server.http import AdminHttpServer, HttpConfig

        cfg = self.config
        http_cfg = replace(cfg.http_config or HttpConfig(), host=cfg.host, port=port)
        server = AdminHttpServer(
            http_cfg, registry=self.registry,
            admin=self._client.admin() if admin_paths and self._client is not None else None,
            info=self._info, gc=self._gc if admin_paths else None,
            # the admin endpoint carries a bearer token: HTTPS when the bookie has TLS (the
            # metrics-only port stays plain HTTP for scrapers)
            ssl_context=self._ssl if admin_paths else None)
        await server.start()
        self._http.append(server)
        host, bound = server.address
        return f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"

    def _gc(self) -> Any:
        """The bookie's garbage collector (None before it started or without one)."""
        return getattr(self.bookie, "gc", None)

    async def _info(self) -> dict[str, Any]:
        bookie = self.bookie
        try:
            free, total = bookie.disk_usage()
        except OSError:
            free = total = -1
        store = bookie.store
        return {
            "bookie_id": self.bookie_id, "address": self.address, "state": bookie.state,
            "reason": bookie.state_reason, "rack": self.config.rack,
            "group": self.config.group,
            "free_bytes": free, "total_bytes": total,
            "ledgers": len(store.ledger_ids()) if store is not None else 0,
            "autorecovery": None if self.autorecovery is None else self.autorecovery.status(),
        }

    async def _register(self) -> None:
        assert self.store is not None
        read_only = getattr(self.bookie, "state", WRITABLE) == READ_ONLY
        await self.store.register_bookie(
            BookieRegistration(self.bookie_id, self.address, read_only=read_only,
                               rack=self.config.rack, group=self.config.group)
        )
        self._registered = True

    def _descriptors_exhausted(self, exc: OSError) -> None:
        """The bookie's journal could not open a file (EMFILE/ENFILE): close connections so
        its retry finds descriptors, and keep the connection cap lower for a while."""
        if self.server is not None:
            self.server.shed(max(8, self.server.config.fd_reserve // 4),
                             f"the journal could not open a file ({exc.strerror or exc})")

    def _on_state_change(self, state: str) -> None:
        """The bookie flipped writable/read-only: mirror it in the registry (in order)."""
        if state == STOPPED or self._stop.is_set():
            return
        previous = self._registry_updates[-1] if self._registry_updates else None

        async def update() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            try:
                await self._register()
                log.info("bookie %s is now %s in the registry", self.bookie_id, state)
            except Exception as exc:
                log.warning("could not update registry for state %s: %s", state, exc)

        task = asyncio.get_running_loop().create_task(update())
        self._registry_updates = [*self._registry_updates[-3:], task]

    async def wait(self) -> None:
        await self._stop.wait()

    async def stop(self) -> None:
        """Clean shutdown (see the module doc for the order)."""
        self._stop.set()
        self.loop_watch.stop()
        if self.autorecovery is not None:
            await self.autorecovery.stop()
        for http in self._http:
            await http.stop()
        self._http.clear()
        if self.server is not None:
            await self.server.stop(self.config.stop_grace)
        if self._client is not None:
            await self._client.transport.close()
            await self._client.close()
        for task in self._registry_updates:
            task.cancel()
        if self.tenancy is not None:
            self.tenancy.stop()
        if self.bookie is not None:
            try:
                await self.bookie.stop()
            except Exception as exc:
                log.error("bookie stop failed: %s", exc)
        if self.store is not None:
            if self._registered:  # never the registration of another process (a refused
                try:              # duplicate must not take the live bookie off the list)
                    await self.store.unregister_bookie(self.bookie_id)
                except Exception as exc:
                    log.warning("could not deregister %s: %s", self.bookie_id, exc)
            if self._store_arg is None:
                await self.store.close()
        self._lock.release()
        log.info("bookie %s stopped", self.bookie_id)


async def serve(config: BookieProcessConfig) -> int:
    """Run a bookie until SIGTERM/SIGINT, then shut it down cleanly; the exit status: 0
    after SIGTERM, 130 (128 + SIGINT, what a shell expects of Ctrl-C) after SIGINT."""
    process = BookieProcess(config)
    loop = asyncio.get_running_loop()
    stopped_by: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.append(sig)
        process.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await process.start(tune_gc=True)
        await process.wait()
    finally:
        await process.stop()
    return 128 + signal.SIGINT if stopped_by[:1] == [signal.SIGINT] else 0


def run(config: BookieProcessConfig, loop: str | None = None) -> int:
    """Blocking entry point for ``pybk bookie``; returns the process exit code. ``loop``
    names the event loop (:mod:`pybk.runtime.eventloop`; ``"uvloop"`` needs ``pybk[speed]``)."""
    logging.basicConfig(
        level=os.environ.get("PYBK_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    before, after = raise_open_file_limit()
    if after != before:
        log.info("open-file limit raised from %d to %d", before, after)
    from pybk.runtime.eventloop import run as run_on_loop

    return run_on_loop(serve(config), loop)
