"""Tenancy enforcement in the bookie: namespace ownership, rates and storage quotas.

:class:`TenancyEnforcer` is the gate (:class:`pybk.transport.fairness.Gate`) the TCP server
and the in-process transport ask before they start an add or a read:

- a ledger's namespace comes from its metadata (``custom_metadata[NAMESPACE_KEY]``), read
  once per ledger (shared, with the unknown-ledger check too: :mod:`pybk.bookie.lookups`;
  "no namespace" is cached; the cache is bounded, least recently used out);
- a namespace's policies come from its tenancy record, read once and then kept current by a
  watch (an update applies without a restart; a missing record means no limits);
- a principal of another tenant is refused UNAUTHORIZED (ledgers without a namespace are
  open to all; the cluster principal and an unauthenticated bookie are not checked);
- rates are token buckets per (principal, namespace): over the rate the request waits (the
  connection starts and reads nothing meanwhile), it is never failed;
- a namespace at its storage quota (bytes this bookie stores for it) gets QUOTA_EXCEEDED on
  new entries; recovery adds are never refused (they restore entries already acknowledged).

Time is the event loop's (``asyncio.sleep``, ``loop.time``), so the simulator drives it.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pybk.bookie.lookups import LedgerLookups
from pybk.bookie.quota import StorageUsage
from pybk.errors import NoSuchNamespaceError
from pybk.metadata.base import MetadataStore, Watch
from pybk.metadata.tenancy import NAMESPACE_KEY, NamespacePolicies, TenancyRecords
from pybk.storage.engine import LedgerStorage
from pybk.wire import (
    AddBatchRequest,
    AddRequest,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    batch_bytes,
    error_response,
)

__all__ = ["LEDGER_CACHE", "TENANCY_QUOTA_UNCHECKED", "TenancyEnforcer", "TokenBucket",
           "add_payload", "enable_tenancy"]

log = logging.getLogger("pybk.bookie.tenancy")

#: the principals of pybk.transport.identity (the bookie never imports the transport)
ANONYMOUS: Final = "_anonymous"
CLUSTER: Final = "_cluster"
#: ledgers whose namespace is remembered (least recently used ones are read again)
LEDGER_CACHE: Final = 100_000
#: a bucket saves at most this many seconds of its rate (a burst's size): small, so that a
#: throttled tenant's work reaches the journal spread out rather than in bursts
BURST_SECONDS: Final = 0.1
#: mutation switch (pybk.testing.mutations): the storage quota is never checked, so a
#: namespace at its quota keeps getting new entries admitted (counted, never refused)
TENANCY_QUOTA_UNCHECKED: Final = "tenancy_quota_unchecked"
_UNKNOWN: Final = object()


class TokenBucket:
    """``rate`` tokens a second, up to ``burst`` seconds' worth saved; taking may go into
    debt, and the debt is the delay (the request is late, never refused)."""

    __slots__ = ("at", "cap", "rate", "tokens")

    def __init__(self, rate: float, now: float, burst: float = BURST_SECONDS) -> None:
        self.rate = float(rate)
        self.cap = self.tokens = self.rate * burst
        self.at = now

    def take(self, n: float, now: float) -> float:
        """Take ``n`` tokens; the seconds until the bucket is out of debt again."""
        self.tokens = min(self.cap, self.tokens + (now - self.at) * self.rate) - n
        self.at = now
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def add_payload(request: Request) -> tuple[int, int]:
    """(bytes, records) an add carries (0, 0 for any other request): what rates charge."""
    if isinstance(request, AddRequest):
        return len(request.body), 1
    if isinstance(request, AddBatchRequest):
        return batch_bytes(request.bodies), len(request.bodies)
    return 0, 0


class TenancyEnforcer:
    """The bookie's tenancy gate (see the module doc)."""

    def __init__(self, store: MetadataStore, storage: Callable[[], LedgerStorage | None], *,
                 authenticated: bool, ledger_cache: int = LEDGER_CACHE,
                 mutations: frozenset[str] = frozenset(),
                 lookups: LedgerLookups | None = None) -> None:
        self.store = store
        #: the ledger metadata reads (the bookie's, shared with its unknown-ledger check)
        self.lookups = lookups if lookups is not None else LedgerLookups(store)
        self.records = TenancyRecords(store)
        self.storage = storage
        #: are principals real (tokens, certificates)? Else everyone is ANONYMOUS and
        #: namespaces are not checked for ownership (rates and quotas still apply)
        self.authenticated = authenticated
        self.ledger_cache = ledger_cache
        self._quota_checked = TENANCY_QUOTA_UNCHECKED not in mutations
        self._ns: collections.OrderedDict[int, str | None] = collections.OrderedDict()
        #: ledgers the metadata lacked: did this bookie hold the ledger when it was read?
        self._absent: collections.OrderedDict[int, bool] = collections.OrderedDict()
        self._lookups: dict[int, asyncio.Future[str | None]] = {}
        self._policies: dict[str, NamespacePolicies | None] = {}
        self._policy_reads: dict[str, asyncio.Future[None]] = {}
        self._watches: dict[str, Watch] = {}
        self._buckets: dict[tuple[str, str, str], TokenBucket] = {}
        self.usage = StorageUsage()
        #: metadata reads done (ledger metadata, policy records): bounded per new ledger
        self.metadata_reads = 0
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.throttled: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.rejected: collections.Counter[tuple[str, str, str]] = collections.Counter()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Count the bytes each namespace already stores here (survives a restart)."""
        storage = self.storage()
        if storage is not None:
            await self.usage.recompute(storage, self.namespace_of)
            for ns in list(self.usage.by_namespace):
                await self._load_policies(ns)

    def stop(self) -> None:
        for watch in self._watches.values():
            watch.cancel()
        self._watches.clear()

    # -- lookups -----------------------------------------------------------------------

    async def namespace_of(self, ledger_id: int) -> str | None:
        """The ledger's namespace (None: none, or no such ledger), read once and cached."""
        cached = self._ns.get(ledger_id, _UNKNOWN)
        if cached is not _UNKNOWN:
            self._ns.move_to_end(ledger_id)
            return cached  # type: ignore[return-value]
        if self._still_absent(ledger_id, creates=False):
            return None
        pending = self._lookups.get(ledger_id)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._lookups[ledger_id] = pending
            try:
                self.metadata_reads += 1
                md = await self.lookups.read(ledger_id, remember=True)
                raw = None if md is None else md.custom_metadata.get(NAMESPACE_KEY)
                ns = None if raw is None else bytes(raw).decode("utf-8", "replace")
                if md is None:
                    self._absent[ledger_id] = self._holds(ledger_id)
                    if len(self._absent) > self.ledger_cache:
                        self._absent.popitem(last=False)
                else:
                    self._remember(ledger_id, ns)
                pending.set_result(ns)
            except BaseException as exc:
                pending.set_exception(exc)
                pending.exception()  # (retrieved: others may not be waiting)
                raise
            finally:
                del self._lookups[ledger_id]
            if ns is not None:
                await self._load_policies(ns)
            return ns
        return await asyncio.shield(pending)

    def _holds(self, ledger_id: int) -> bool:
        storage = self.storage()
        return storage is not None and storage.find(ledger_id) is not None

    def _still_absent(self, ledger_id: int, *, creates: bool) -> bool:
        """Does "no such ledger", as read before, still stand without reading again? Only
        while whether this bookie holds the ledger is unchanged, and, for a request that can
        create it here (one with a master key), only for a ledger held then and now: a
        ledger created in a namespace after someone asked about its id is guarded."""
        held_then = self._absent.get(ledger_id)
        if held_then is None:
            return False
        if held_then != self._holds(ledger_id) or (creates and not held_then):
            del self._absent[ledger_id]
            return False
        return True

    def _remember(self, ledger_id: int, ns: str | None) -> None:
        self._ns[ledger_id] = ns
        if len(self._ns) > self.ledger_cache:
            self._ns.popitem(last=False)

    async def _load_policies(self, ns: str) -> None:
        if ns in self._policies:
            return
        pending = self._policy_reads.get(ns)
        if pending is not None:
            await asyncio.shield(pending)
            return
        pending = self._policy_reads[ns] = asyncio.get_running_loop().create_future()
        try:
            if ns not in self._watches:
                self._watches[ns] = self.store.watch_value(
                    f"tenancy/namespaces/{ns}", self._policies_changed)
            await self._read_policies(ns)
        finally:
            pending.set_result(None)
            del self._policy_reads[ns]

    async def _read_policies(self, ns: str) -> None:
        self.metadata_reads += 1
        try:
            self._policies[ns] = (await self.records.namespace(ns)).policies
        except (NoSuchNamespaceError, ValueError):
            self._policies[ns] = None

    def _policies_changed(self, key: str) -> None:
        ns = key.removeprefix("tenancy/namespaces/")
        task = asyncio.get_running_loop().create_task(self._read_policies(ns))
        task.add_done_callback(_log_failure)

    def policies(self, ns: str) -> NamespacePolicies | None:
        return self._policies.get(ns)

    # -- the gate ----------------------------------------------------------------------

    def check(self, principal: str,
              request: Request) -> Response | Awaitable[Response | None] | None:
        if principal == CLUSTER:
            return None
        lid = getattr(request, "ledger_id", None)
        if lid is None:
            return None
        ns = self._ns.get(lid, _UNKNOWN)
        if ns is _UNKNOWN and self._still_absent(
                lid, creates=bool(getattr(request, "master_key", b""))):
            return None
        if ns is _UNKNOWN or (ns is not None and ns not in self._policies):
            return self._check_later(principal, request, lid)
        return self._decide(principal, request, ns)

    async def _check_later(self, principal: str, request: Request,
                           lid: int) -> Response | None:
        ns = await self.namespace_of(lid)
        if ns is not None:
            await self._load_policies(ns)
        decision = self._decide(principal, request, ns)
        if inspect.isawaitable(decision):
            return await decision
        return decision

    def _decide(self, principal: str, request: Request,
                ns: str | None) -> Response | Awaitable[Response | None] | None:
        if ns is None:
            return None
        tenant = ns.partition("/")[0]
        if self.authenticated and principal != tenant:
            self.rejected[(principal, ns, "unauthorized")] += 1
            return error_response(request, Status.UNAUTHORIZED,
                                  f"tenant {principal!r} may not use namespace {ns!r}")
        policies = self._policies.get(ns)
        nbytes, records = add_payload(request)
        now = asyncio.get_running_loop().time()
        delay = 0.0
        if records:
            if (policies is not None and policies.max_storage_bytes is not None
                    and not getattr(request, "recovery", False) and self._quota_checked
                    and self._over_quota(ns, policies.max_storage_bytes)):
                self.rejected[(principal, ns, "quota_exceeded")] += 1
                return error_response(
                    request, Status.QUOTA_EXCEEDED,
                    f"namespace {ns!r} is at its storage quota on this bookie "
                    f"({self.usage.bytes(ns)} of {policies.max_storage_bytes} bytes)")
            assert isinstance(request, AddRequest | AddBatchRequest)
            self.usage.add(ns, request.ledger_id, nbytes)
            self.counts[(principal, ns, "write_bytes")] += nbytes
            self.counts[(principal, ns, "write_records")] += records
            if policies is not None:
                delay = max(self._take(principal, ns, "wb", policies.write_bytes_per_s,
                                       nbytes, now),
                            self._take(principal, ns, "wr", policies.write_records_per_s,
                                       records, now))
        elif isinstance(request, ReadRequest | ReadBatchRequest) and policies is not None:
            # the read's bytes are charged once answered (answered()); its records now
            n = len(request.entry_ids) if isinstance(request, ReadBatchRequest) else 1
            delay = max(self._take(principal, ns, "rr", policies.read_records_per_s, n, now),
                        self._take(principal, ns, "rb", policies.read_bytes_per_s, 0, now))
        if delay <= 0:
            return None
        self.throttled[(principal, ns)] += delay
        return _wait(delay)

    def _take(self, principal: str, ns: str, kind: str, rate: int | None, n: int,
              now: float) -> float:
        if rate is None:
            return 0.0
        key = (principal, ns, kind)
        bucket = self._buckets.get(key)
        if bucket is None or bucket.rate != rate:
            bucket = self._buckets[key] = TokenBucket(rate, now)
        return bucket.take(n, now)

    def _over_quota(self, ns: str, quota: int) -> bool:
        if self.usage.bytes(ns) < quota:
            return False
        storage = self.storage()
        if storage is not None:  # deletions (the collector's) lower it: recount
            self.usage.reconcile(ns, storage)
        return self.usage.bytes(ns) >= quota

    def answered(self, principal: str, request: Request, response: Response) -> None:
        """Count a read's bytes and records (and charge its bytes to the read-bytes rate)."""
        if principal == CLUSTER or not isinstance(response, ReadResponse | ReadBatchResponse):
            return
        ns = self._ns.get(getattr(request, "ledger_id", -1))
        if not isinstance(ns, str):
            return
        if isinstance(response, ReadResponse):
            nbytes, records = (len(response.body), 1) if response.body is not None else (0, 0)
        else:
            bodies = [e[2] for e in response.entries if len(e) > 2 and e[2] is not None]
            nbytes, records = sum(map(len, bodies)), len(bodies)
        self.counts[(principal, ns, "read_bytes")] += nbytes
        self.counts[(principal, ns, "read_records")] += records
        policies = self._policies.get(ns)
        if policies is not None and policies.read_bytes_per_s is not None and nbytes:
            self._take(principal, ns, "rb", policies.read_bytes_per_s, nbytes,
                       asyncio.get_running_loop().time())

    # -- metrics -----------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The per-tenant families (labels tenant, namespace; rejected: reason too)."""
        names = {"write_bytes": "Bytes written", "write_records": "Entries written",
                 "read_bytes": "Bytes read", "read_records": "Entries read"}
        for kind, text in names.items():
            fam = CounterMetricFamily(f"pybk_tenant_{kind}", f"{text}, per tenant and namespace",
                                      labels=["tenant", "namespace"])
            for (tenant, ns, k), v in sorted(self.counts.items()):
                if k == kind:
                    fam.add_metric([tenant, ns], v)
            yield fam
        fam = CounterMetricFamily("pybk_tenant_throttled_seconds",
                                  "Seconds requests were delayed by rate limits",
                                  labels=["tenant", "namespace"])
        for (tenant, ns), seconds in sorted(self.throttled.items()):
            fam.add_metric([tenant, ns], seconds)
        yield fam
        fam = CounterMetricFamily("pybk_tenant_rejected_requests", "Requests refused",
                                  labels=["tenant", "namespace", "reason"])
        for (tenant, ns, reason), v in sorted(self.rejected.items()):
            fam.add_metric([tenant, ns, reason], v)
        yield fam
        stored = GaugeMetricFamily("pybk_tenant_storage_bytes",
                                   "Bytes this bookie stores per namespace",
                                   labels=["tenant", "namespace"])
        quota = GaugeMetricFamily("pybk_tenant_storage_quota_bytes",
                                  "Storage quota per namespace (per bookie)",
                                  labels=["tenant", "namespace"])
        for ns in sorted(set(self.usage.by_namespace) | set(self._policies)):
            tenant = ns.partition("/")[0]
            stored.add_metric([tenant, ns], self.usage.bytes(ns))
            policies = self._policies.get(ns)
            if policies is not None and policies.max_storage_bytes is not None:
                quota.add_metric([tenant, ns], policies.max_storage_bytes)
        yield stored
        yield quota

    def summary(self) -> dict[str, Any]:
        return {"authenticated": self.authenticated,
                "principal_without_auth": None if self.authenticated else ANONYMOUS,
                "namespaces": sorted(self.usage.by_namespace)}


async def _wait(delay: float) -> None:
    await asyncio.sleep(delay)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("reading a namespace's policies failed: %r", task.exception())


async def enable_tenancy(bookie: Any, store: MetadataStore, *, authenticated: bool,
                         mutations: frozenset[str] = frozenset()) -> TenancyEnforcer:
    """Give ``bookie`` (started) a tenancy gate against ``store``: both transports ask it
    (and the simulator's network). ``authenticated``: connections carry real principals
    (tenant tokens or certificates). ``mutations``: test-only broken behaviours. The gate
    reads ledger metadata through the bookie's ``ledger_lookups`` when they read ``store``
    (its unknown-ledger check then reuses the gate's read)."""
    shared = getattr(bookie, "ledger_lookups", None)
    enforcer = TenancyEnforcer(
        store, lambda: bookie.store, authenticated=authenticated, mutations=mutations,
        lookups=shared if shared is not None and shared.store is store else None)
    await enforcer.start()
    bookie.tenancy = enforcer
    return enforcer
