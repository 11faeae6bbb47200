"""The ledger client: create, open (with or without recovery), delete and list ledgers.

A :class:`Client` owns a metadata store and a transport. Give it a store object or a URI
(``memory://``, ``sqlite:///path``, ``zk://...``); without a transport it builds a TCP
transport (``pybk.transport.tcp``) that finds bookies through the store's registry. The
bookies of a :class:`pybk.LocalCluster` live in its process: reach them with
``cluster.client()`` or ``transport=cluster.transport``.

It uses only the running loop's clock and its injected ``rng``, so the simulator runs it
unchanged.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pybk.client.adv import LedgerHandleAdv
from pybk.client.context import ClientConfig, ClientContext
from pybk.client.deferred import DeferredSyncLedgerHandle, WriteFlag, check_write_flags
from pybk.client.isolation import ledger_namespace, namespace_policies, placement_for
from pybk.client.placement import (
    PlacementPolicy,
    explain_shortage,
    refresh_topology,
    writable_nodes,
)
from pybk.client.quorum import validate_quorums
from pybk.client.reader import LedgerEntry, ReadHandle
from pybk.client.reads import read_lac_covered
from pybk.client.recovery import recover
from pybk.client.writer import LedgerHandle
from pybk.errors import (
    BKError,
    ClientClosedError,
    LedgerExistsError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from pybk.metadata.base import LedgerMetadata, MetadataStore
from pybk.metadata.tenancy_usage import release_ledger, reserve_ledger
from pybk.stats import ClientStats
from pybk.transport.base import Transport
from pybk.wire import (
    DIGEST_TYPES,
    DigestManager,
    mac_key,
    master_key,
    password_hash,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from pybk.logs.namespace import Namespace
    from pybk.logs.tier_access import TierOpener
    from pybk.ops.admin import Admin

__all__ = ["Client", "ClientConfig", "DeferredSyncLedgerHandle", "LedgerEntry", "LedgerHandle",
           "LedgerHandleAdv", "ReadHandle"]

#: ledger ids an unnamed create tries when the ids it was handed exist already
_ALLOCATION_TRIES = 16


class Client:
    """Entry point to ledgers. Use as ``async with Client(...) as client:``."""

    def __init__(
        self,
        metadata: str | MetadataStore,
        *,
        transport: Transport | None = None,
        config: ClientConfig | None = None,
        rng: random.Random | None = None,
        tls: ssl.SSLContext | None = None,
        auth_token: bytes | None = None,
        metrics: CollectorRegistry | None = None,
        placement: PlacementPolicy | None = None,
    ) -> None:
        if not isinstance(metadata, str | MetadataStore):
            raise TypeError(
                f"metadata must be a URI string or a MetadataStore, not {type(metadata).__name__}"
            )
        self._metadata_arg = metadata
        self._transport_arg = transport
        self._config = config if config is not None else ClientConfig()
        self._rng = rng if rng is not None else random.Random()
        self._tls = tls
        self._auth_token = auth_token
        self._placement = placement
        self._ctx: ClientContext | None = None
        self._own_store = False
        self._own_transport = False
        self._closed = False
        #: what this client records when given a Prometheus registry (``metrics=``): add and
        #: read latency, ensemble changes, recoveries, speculative reads (pybk.client.metrics)
        self.stats: ClientStats | None = None
        if metrics is not None:
            from pybk.client.metrics import ClientCollector

            self.stats = ClientStats()
            metrics.register(ClientCollector(self.stats))
        if isinstance(metadata, MetadataStore) and transport is not None:
            self._ctx = self._new_context(metadata, transport)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Client:
        """Open the metadata store and the transport (done lazily by every operation)."""
        self._context()
        return self

    def _context(self) -> ClientContext:
        if self._closed:
            raise ClientClosedError("this client is closed")
        if self._ctx is not None:
            return self._ctx
        store: MetadataStore
        if isinstance(self._metadata_arg, MetadataStore):
            store = self._metadata_arg
        else:
            from pybk.metadata import open_store

            store = open_store(self._metadata_arg)
            self._own_store = True
        transport = self._transport_arg
        if transport is None:
            transport = self._tcp_transport(store)
            self._own_transport = True
        self._ctx = self._new_context(store, transport)
        return self._ctx

    def _new_context(self, store: MetadataStore, transport: Transport) -> ClientContext:
        return ClientContext(store, transport, self._config, self._rng,
                             placement=self._placement, stats=self.stats)

    def _tcp_transport(self, store: MetadataStore) -> Transport:
        try:
            from pybk.transport import tcp
        except ImportError as exc:
            raise RuntimeError(
                "no transport given and the TCP transport (pybk.transport.tcp) is not "
                "available; pass transport=... or use pybk.LocalCluster"
            ) from exc
        factory: Any = tcp.TcpTransport
        kwargs: dict[str, Any] = {"connections_per_bookie": self._config.connections_per_bookie}
        if self._tls is not None:
            kwargs["ssl_context"] = self._tls
        if self._auth_token is not None:
            kwargs["auth_token"] = self._auth_token
        transport: Transport = factory.from_store(store, **kwargs)
        return transport

    async def close(self) -> None:
        """Release the store and transport this client opened itself."""
        if self._closed:
            return
        self._closed = True
        ctx, self._ctx = self._ctx, None
        if ctx is None:
            return
        if self._own_transport:
            await ctx.transport.close()
        if self._own_store:
            await ctx.store.close()

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        metadata = self._metadata_arg
        where = metadata if isinstance(metadata, str) else type(metadata).__name__
        state = "closed" if self._closed else "open"
        return f"<pybk.Client {where} {state}>"

    @property
    def store(self) -> MetadataStore:
        return self._context().store

    @property
    def transport(self) -> Transport:
        return self._context().transport

    @property
    def config(self) -> ClientConfig:
        return self._config

    # -- ledgers -----------------------------------------------------------------------------

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        digest_type: str = "CRC32C",
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        *,
        ledger_id: int | None = None,
        write_flags: Iterable[str] | None = None,
    ) -> LedgerHandle:
        """Create a ledger on ``ensemble_size`` writable bookies and open it for writing.

        ``ledger_id``: create it under an id the caller took from
        ``client.store.allocate_ledger_id()`` (BookKeeper's ``createAdv`` with an id), so the
        caller can record the id before the ledger exists (a bulk writer that must be able to
        find and delete every ledger it may have made); LedgerExistsError if it is taken.
        ``write_flags={"deferred_sync"}``: a :class:`pybk.DeferredSyncLedgerHandle` (adds
        answered before the bookies' fsync, ``force()`` makes them durable)."""
        flags = check_write_flags(write_flags)
        ctx, md, digest, password = await self._new_ledger(
            ensemble_size, write_quorum, ack_quorum, digest_type, password, custom_metadata,
            ledger_id)
        if WriteFlag.DEFERRED_SYNC in flags:
            return DeferredSyncLedgerHandle(ctx, md, digest, master_key(password), password)
        return LedgerHandle(ctx, md, digest, master_key(password), password)

    async def create_ledger_adv(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        digest_type: str = "CRC32C",
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        *,
        ledger_id: int | None = None,
    ) -> LedgerHandleAdv:
        """:meth:`create_ledger` for a writer that chooses each entry's id
        (:class:`pybk.LedgerHandleAdv`, BookKeeper's ``createLedgerAdv``)."""
        ctx, md, digest, password = await self._new_ledger(
            ensemble_size, write_quorum, ack_quorum, digest_type, password, custom_metadata,
            ledger_id)
        return LedgerHandleAdv(ctx, md, digest, master_key(password), password)

    async def _new_ledger(
        self, ensemble_size: int, write_quorum: int, ack_quorum: int, digest_type: str,
        password: bytes, custom_metadata: Mapping[str, bytes] | None, ledger_id: int | None,
    ) -> tuple[ClientContext, LedgerMetadata, DigestManager, bytes]:
        if ledger_id is not None and (isinstance(ledger_id, bool) or not isinstance(ledger_id, int)
                                      or not 0 <= ledger_id < 1 << 63):
            raise ValueError(f"ledger_id must be an int in [0, 2**63 - 1], got {ledger_id!r}")
        validate_quorums(ensemble_size, write_quorum, ack_quorum)
        if digest_type not in DIGEST_TYPES:
            raise ValueError(
                f"digest_type must be one of {', '.join(DIGEST_TYPES)}, not {digest_type!r}"
            )
        _check_password(password)
        custom = dict(custom_metadata or {})
        for key, value in custom.items():
            if not isinstance(key, str) or not isinstance(value, bytes):
                raise TypeError(
                    f"custom_metadata maps str to bytes; got {key!r}: {type(value).__name__}"
                )
        ctx = self._context()
        policy = await placement_for(ctx, custom, creating=True)
        nodes = await writable_nodes(ctx, policy)
        try:
            ensemble = policy.new_ensemble(nodes, ensemble_size, write_quorum, ctx.rng)
        except NotEnoughBookiesError as exc:
            raise await explain_shortage(ctx, exc) from None
        namespace = ledger_namespace(custom)
        if namespace is None:
            return await self._create(ctx, ensemble, ensemble_size, write_quorum, ack_quorum,
                                      digest_type, password, custom, ledger_id)
        limits = await namespace_policies(ctx, namespace)
        await reserve_ledger(ctx.store, namespace, limits.max_ledgers)
        try:
            return await self._create(ctx, ensemble, ensemble_size, write_quorum, ack_quorum,
                                      digest_type, password, custom, ledger_id)
        except BaseException:
            await release_ledger(ctx.store, namespace)
            raise

    @staticmethod
    async def _create(
        ctx: ClientContext, ensemble: Sequence[str], ensemble_size: int, write_quorum: int,
        ack_quorum: int, digest_type: str, password: bytes, custom: dict[str, bytes],
        ledger_id: int | None,
    ) -> tuple[ClientContext, LedgerMetadata, DigestManager, bytes]:
        chosen = ledger_id
        for attempt in range(_ALLOCATION_TRIES):
            lid = chosen if chosen is not None else await ctx.store.allocate_ledger_id()
            md = Client._new_metadata(ctx, lid, ensemble, ensemble_size, write_quorum,
                                      ack_quorum, digest_type, password, custom)
            try:
                md = await ctx.store.create_ledger(md)
            except LedgerExistsError:
                # an allocated id that a caller had created by name (a store whose allocator
                # does not skip those): take the next one, as BookKeeper's create does
                if chosen is not None or attempt == _ALLOCATION_TRIES - 1:
                    raise
                continue
            break
        if ctx.stats is not None:
            ctx.stats.ledgers_created += 1
        return ctx, md, DigestManager(md.ledger_id, digest_type, password), password

    @staticmethod
    def _new_metadata(ctx: ClientContext, ledger_id: int, ensemble: Sequence[str],
                      ensemble_size: int, write_quorum: int, ack_quorum: int, digest_type: str,
                      password: bytes, custom: dict[str, bytes]) -> LedgerMetadata:
        md = LedgerMetadata(
            ledger_id=ledger_id,
            ensemble_size=ensemble_size,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            ensembles={0: tuple(ensemble)},
            digest_type=digest_type,
            password_hash=password_hash(password),
            custom_metadata=custom,
        )
        if ctx.config.recovery_keys_in_metadata:
            md = md.with_changes(**recovery_keys(digest_type, password))
        return md

    async def open_ledger(
        self, ledger_id: int, password: bytes = b"", recovery: bool = True
    ) -> ReadHandle:
        """Open a ledger for reading.

        ``recovery=True`` fences the ledger and seals it (the writer's next add fails with
        LedgerFencedError); ``recovery=False`` reads the LAC without disturbing the writer.
        Raises UnauthorizedError on a wrong password, NoSuchLedgerError if it does not exist.
        """
        _check_password(password)
        ctx = self._context()
        md = await ctx.store.read_ledger(ledger_id)
        if md.password_hash != password_hash(password):
            raise UnauthorizedError(f"ledger {ledger_id}: wrong password")
        digest = DigestManager(ledger_id, md.digest_type, password)
        if ctx.policy.local_rack is not None:  # reads prefer the local rack
            await refresh_topology(ctx)
        if recovery:
            md = await self._recover(ctx, md, digest, master_key(password))
            return ReadHandle(ctx, md, digest, md.last_entry_id)
        if md.is_closed:
            return ReadHandle(ctx, md, digest, md.last_entry_id)
        lac = await read_lac_covered(ctx, md, digest)
        return ReadHandle(ctx, md, digest, lac)

    @staticmethod
    async def _recover(ctx: ClientContext, md: LedgerMetadata, digest: DigestManager,
                       key: bytes) -> LedgerMetadata:
        stats = ctx.stats
        if stats is None or md.is_closed:
            return await recover(ctx, md, digest, key)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            closed = await recover(ctx, md, digest, key)
        except BKError:
            stats.recovery_errors += 1
            raise
        stats.recoveries += 1
        stats.recovery_latency.observe(loop.time() - started)
        return closed

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """The ledger's current metadata."""
        return await self._context().store.read_ledger(ledger_id)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger (its metadata; bookies drop the data lazily). A ledger of a
        namespace leaves its ledger count."""
        store = self._context().store
        try:
            namespace = ledger_namespace((await store.read_ledger(ledger_id)).custom_metadata)
            await store.delete_ledger(ledger_id)
        except NoSuchLedgerError as exc:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from exc
        if namespace is not None:
            await release_ledger(store, namespace)

    async def list_ledgers(self) -> list[int]:
        """Every ledger id, ascending."""
        return await self._context().store.list_ledgers()


    # -- operations ----------------------------------------------------------------------------

    def admin(self, *, passwords: Sequence[bytes] = (b"",)) -> Admin:
        """Cluster administration through this client (pybk.ops.admin): bookies,
        under-replicated ledgers, recover / decommission a bookie, auto-recovery switches.
        ``passwords``: tried for ledgers whose metadata carries no recovery keys."""
        from pybk.ops.admin import Admin

        return Admin(self, passwords=passwords)

    # -- logs ----------------------------------------------------------------------------------

    def namespace(
        self, name: str = "default", *, clock: Callable[[], float] | None = None,
        tiers: TierOpener | None = None,
    ) -> Namespace:
        """The logs of namespace ``name`` in this client's metadata store (pybk.logs).
        ``clock``: wall-clock seconds for segment times (retention by age); time.time by
        default. ``tiers``: opens offload tiers (pybk.logs.tier_access; fsspec by default)."""
        from pybk.logs.namespace import Namespace

        return Namespace(self, name, clock=clock, rng=random.Random(self._rng.getrandbits(64)),
                         tiers=tiers)


def recovery_keys(digest_type: str, password: bytes) -> dict[str, bytes]:
    """The keys a ledger's metadata carries for auto-recovery (see LedgerMetadata)."""
    return {"master_key": master_key(password),
            "mac_key": mac_key(password) if digest_type == "MAC" else b""}


def _check_password(password: object) -> None:
    if not isinstance(password, bytes):
        raise TypeError(f"password must be bytes, not {type(password).__name__}")

