"""A namespace of logs in one metadata store: create, open, list and delete logs by name.

``client.namespace("default")`` on any metadata backend (memory, SQLite, ZooKeeper, etcd): a
log's metadata is one value at ``logs/<namespace>/<name>`` in the store's key/value namespace,
so listing a namespace is one prefix listing and every change is a compare-and-set.

``client.namespace("acme/orders")`` (one '/') is a *tenancy* namespace: it must exist as a
record (pybk.metadata.tenancy; NoSuchNamespaceError otherwise), its policies give new logs
their defaults and cap their number (``max_logs``), and every ledger its logs make carries
the namespace, so bookies enforce its quotas and placement. Its logs are stored under
``logs/acme:orders/`` (':' is not allowed in plain names, so no plain namespace collides).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from pybk.errors import (
    BKError,
    KeyExistsError,
    LogExistsError,
    LogNotFoundError,
    MetadataVersionError,
    NoSuchKeyError,
    QuotaExceededError,
    TimeoutError,
)
from pybk.logs.catalog import LogCatalog
from pybk.logs.config import LogConfig
from pybk.logs.cursor import delete_cursor
from pybk.logs.cursor_meta import cursor_prefix
from pybk.logs.log import Log
from pybk.logs.meta import LogMetadata, log_key
from pybk.logs.offload import delete_objects
from pybk.logs.tier_access import TierOpener
from pybk.metadata.base import MetadataStore
from pybk.metadata.tenancy import NamespacePolicies, TenancyRecords, split_namespace

if TYPE_CHECKING:
    from pybk.client import Client

__all__ = ["Namespace", "check_name"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")


_DEFAULTS = LogConfig()
#: how long a create in a namespace with ``max_logs`` waits for the namespace's create lock
CREATE_LOCK_WAIT = 30.0
#: the in-process half of that lock, per store and namespace
_CREATE_LOCKS: weakref.WeakKeyDictionary[MetadataStore, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary())


def _knobs(given: Mapping[str, object], policies: NamespacePolicies | None) -> dict[str, Any]:
    """Each knob as given; one left at LogConfig's default takes the namespace's policy when
    the policy sets one (a quorum or a compression always does: NamespacePolicies has them)."""
    out = dict(given)
    if policies is not None:
        for knob, value in given.items():
            policy = getattr(policies, knob)
            if value == getattr(_DEFAULTS, knob) and policy is not None:
                out[knob] = dict(policy) if isinstance(policy, dict) else policy
    return out


def check_name(kind: str, name: object) -> str:
    """Namespace and log names: 1-200 of ``[A-Za-z0-9._-]``, not starting with '.' or '-'."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a str, not {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"bad {kind} name {name!r}: 1-200 letters, digits and ._- (not starting with . or -)"
        )
    return name


class Namespace:
    """The logs of one namespace, through one client."""

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        tiers: TierOpener | None = None,
    ) -> None:
        self.client = client
        #: the tenancy namespace ("tenant/namespace") this is, or None for a plain one
        self.tenancy: str | None = None
        if isinstance(name, str) and "/" in name:
            tenant, ns = split_namespace(name)
            self.name = self.tenancy = f"{tenant}/{ns}"
            self._key_ns = f"{tenant}:{ns}"
        else:
            self.name = self._key_ns = check_name("namespace", name)
        #: wall clock for segment times (retention by age); the outermost layer's default
        self._clock = clock if clock is not None else time.time
        self._rng = rng if rng is not None else random.Random()
        #: opens offload tiers (pybk.logs.tier_access; None: fsspec in worker threads)
        self._tiers = tiers

    def _catalog(self, name: str) -> LogCatalog:
        return LogCatalog(self.client, self._key_ns, check_name("log", name), self._clock,
                          tenancy=self.tenancy, tiers=self._tiers)

    def _log(self, name: str) -> Log:
        return Log(self._catalog(name), random.Random(self._rng.getrandbits(64)))

    async def create_log(
        self,
        name: str,
        *,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        compression: str = "none",
        roll_bytes: int | None = 64 << 20,
        roll_entries: int | None = None,
        roll_seconds: float | None = None,
        retention_seconds: float | None = None,
        retention_bytes: int | None = None,
        digest_type: str = "CRC32C",
        backlog_quota_bytes: int | None = None,
        backlog_quota_seconds: float | None = None,
        backlog_policy: str = "refuse",
        offload_url: str | None = None,
        offload_options: dict[str, Any] | None = None,
        offload_deletion_lag: float = 4 * 3600.0,
        offload_threshold_bytes: int | None = None,
        offload_threshold_seconds: float | None = None,
        offload_bytes_per_s: int | None = None,
    ) -> Log:
        """Create an empty log; LogExistsError when the name is taken. The knobs are checked
        (ValueError naming one) before anything is stored; see LogConfig (the ``offload_*``
        ones are :meth:`Log.set_offload`'s, set at creation). In a tenancy
        namespace a knob left at its default takes the namespace's policy (when it sets one),
        and at its ``max_logs`` the create fails with QuotaExceededError."""
        given = {"ensemble_size": ensemble_size, "write_quorum": write_quorum,
                 "ack_quorum": ack_quorum, "compression": compression,
                 "roll_bytes": roll_bytes, "roll_entries": roll_entries,
                 "roll_seconds": roll_seconds, "retention_seconds": retention_seconds,
                 "retention_bytes": retention_bytes,
                 "backlog_quota_bytes": backlog_quota_bytes,
                 "backlog_quota_seconds": backlog_quota_seconds,
                 "backlog_policy": backlog_policy,
                 "offload_url": offload_url, "offload_options": dict(offload_options or {}),
                 "offload_deletion_lag": offload_deletion_lag,
                 "offload_threshold_bytes": offload_threshold_bytes,
                 "offload_threshold_seconds": offload_threshold_seconds,
                 "offload_bytes_per_s": offload_bytes_per_s}
        policies = None
        if self.tenancy is not None:
            policies = (await TenancyRecords(self.client.store).namespace(self.tenancy)).policies
        config = LogConfig(digest_type=digest_type, **_knobs(given, policies))
        cat = self._catalog(name)
        md = LogMetadata(self._key_ns, name, config, ctime_ms=cat.now_ms())
        if policies is not None and policies.max_logs is not None:
            async with self._creating():  # counted and created as one step
                if len(await self.list_logs()) >= policies.max_logs:
                    raise QuotaExceededError(f"namespace {self.name!r} holds "
                                             f"{policies.max_logs} logs, its max_logs")
                await self._create(cat, md)
        else:
            await self._create(cat, md)
        return self._log(name)

    async def _create(self, cat: LogCatalog, md: LogMetadata) -> None:
        try:
            await self.client.store.create_value(cat.key, md.to_bytes())
        except KeyExistsError:
            raise LogExistsError(
                f"log {cat.name!r} already exists in namespace {self.name!r}"
            ) from None

    @contextlib.asynccontextmanager
    async def _creating(self) -> AsyncIterator[None]:
        """Creates in a namespace with ``max_logs`` one at a time: in this process (a lock per
        store and namespace) and across processes (the store's lock, which vanishes with a
        holder that dies); TimeoutError if it stays held for :data:`CREATE_LOCK_WAIT` s."""
        store = self.client.store
        local = _CREATE_LOCKS.setdefault(store, {}).setdefault(self._key_ns, asyncio.Lock())
        name = f"tenancy-creates/{self._key_ns}"
        async with local:
            loop = asyncio.get_running_loop()
            deadline, pause = loop.time() + CREATE_LOCK_WAIT, 0.005
            while not await store.try_lock(name, "log-create"):
                if loop.time() >= deadline:
                    raise TimeoutError(f"namespace {self.name!r}: log creates stayed locked "
                                       f"by {await store.lock_owner(name)} for "
                                       f"{CREATE_LOCK_WAIT} s")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.2)
            try:
                yield
            finally:
                await store.unlock(name)

    async def open_log(self, name: str) -> Log:
        """An existing log; LogNotFoundError when there is none by that name."""
        cat = self._catalog(name)
        await cat.read()
        return self._log(name)

    async def log_exists(self, name: str) -> bool:
        try:
            await self._catalog(name).read()
        except LogNotFoundError:
            return False
        return True

    async def list_logs(self) -> list[str]:
        """The names of the namespace's logs, sorted."""
        prefix = f"logs/{self._key_ns}/"
        return [k[len(prefix):] for k in await self.client.store.list_keys(prefix)
                if "/" not in k[len(prefix):]]

    async def delete_log(self, name: str) -> None:
        """Delete a log, its ledgers, its durable cursors and its offloaded objects. Its
        in-progress segment is fenced first, so its writer's next append fails
        (LedgerFencedError), as does any metadata change it tries; readers get
        LogNotFoundError. LogNotFoundError when there is no such log."""
        cat = self._catalog(name)
        store = self.client.store
        key = log_key(self._key_ns, name)
        for _ in range(100):
            try:
                value = await store.read_value(key)
            except NoSuchKeyError:
                raise LogNotFoundError(
                    f"log {name!r} does not exist in namespace {self.name!r}"
                ) from None
            md = LogMetadata.from_bytes(value.value, value.version)
            if not md.deleting:  # step 1: the log is gone for everyone (epoch bumped too)
                try:
                    value = await store.write_value(
                        key, md.with_changes(deleting=True, epoch=md.epoch + 1).to_bytes(),
                        value.version,
                    )
                except MetadataVersionError:
                    continue
            for seg in md.segments:
                if seg.in_progress:  # fence it: its writer's next add fails at once
                    try:
                        await self.client.open_ledger(seg.ledger_id, recovery=True)
                    except BKError as exc:  # the deletion goes on; the writer fails later
                        log.info("delete_log %s: could not fence ledger %d: %s", name,
                                 seg.ledger_id, exc)
            for lid in [s.ledger_id for s in md.segments] + list(md.allocated):
                await cat.delete_ledger(lid)
            await delete_objects(cat, md, list(md.segments))  # offloaded copies
            for cursor in await store.list_keys(cursor_prefix(self._key_ns, name)):
                try:  # each cursor's ledger (fenced first) and record
                    await delete_cursor(cat, cursor.rsplit("/", 1)[-1])
                except LogNotFoundError:
                    pass  # (CursorNotFoundError: deleted meanwhile)
            try:
                await store.delete_value(key, value.version)
            except MetadataVersionError:
                continue
            except NoSuchKeyError:
                pass  # deleted by a concurrent delete_log
            return
        raise MetadataVersionError(f"log {name!r}: could not delete it (contention)")

    def __repr__(self) -> str:
        return f"<Namespace {self.name}>"
