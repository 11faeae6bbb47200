"""The etcd metadata store (``etcd://host:port[,host:port]/root``).

Everything lives below ``/root/`` (:mod:`.keys`). A record's version is its etcd
``mod_revision``: it changes on every write and is never reused, not even for a key deleted
and created again. Every compare-and-set is one etcd transaction comparing it; creation
compares ``create_revision == 0`` (absent). Bookie registrations and locks are attached to
the store's lease (:mod:`.lease`) and vanish with it; watches share one watch stream
(:mod:`.watches`). Under-replication marks are ordinary records changed by
compare-and-set, so auto-recovery runs on etcd as on the other stores.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pybk.errors import (
    ClientClosedError,
    KeyExistsError,
    LedgerExistsError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchKeyError,
    NoSuchLedgerError,
)
from pybk.metadata._common import (
    LockElection,
    allocatable,
    check_bookie_id,
    check_expected_marks,
    check_key,
    check_ledger_id,
    check_metadata,
    check_owner,
    check_prefix,
    check_registration,
    check_value,
    election_lock,
    merge_missing,
    stamped,
)
from pybk.metadata.base import (
    BookieRegistration,
    Election,
    LedgerMetadata,
    MetadataStore,
    VersionedValue,
    Watch,
)
from pybk.metadata.etcd.client import EtcdClient, b64, unb64
from pybk.metadata.etcd.keys import Keys
from pybk.metadata.etcd.lease import EtcdLease
from pybk.metadata.etcd.watches import EtcdWatcher

__all__ = ["EtcdMetadataStore"]

log = logging.getLogger("pybk.metadata.etcd")

Json = dict[str, Any]


def _put(key: bytes, value: bytes, lease: int = 0) -> Json:
    req: Json = {"key": b64(key), "value": b64(value)}
    if lease:
        req["lease"] = str(lease)
    return {"request_put": req}


def _absent(key: bytes) -> Json:
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def _at(key: bytes, revision: int) -> Json:
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def _exists(key: bytes) -> Json:
    return {"key": b64(key), "target": "CREATE", "result": "GREATER", "create_revision": "0"}


def _range(key: bytes) -> Json:
    return {"request_range": {"key": b64(key)}}


def _rev(kv: Json, field: str = "mod_revision") -> int:
    return int(kv.get(field, 0))


class EtcdMetadataStore(MetadataStore):
    """A :class:`MetadataStore` on an etcd cluster (v3 API, through its JSON gateway).

    ``hosts``: ``host:port[,host:port]`` of the members' client URLs; ``root``: the key
    prefix everything lives under; ``session_timeout``: the lease TTL, seconds a dead
    owner's registrations and locks outlive it (>= 1); ``op_timeout``: bound of one call,
    every member tried; ``id_block``: ledger ids claimed per allocation transaction.
    """

    def __init__(self, hosts: str, root: str = "/pybk", *, session_timeout: float = 10.0,
                 op_timeout: float = 10.0, connect_timeout: float = 5.0,
                 id_block: int = 16) -> None:
        if not isinstance(root, str) or not root.startswith("/") or not root.strip("/"):
            raise ValueError(f"etcd root must be an absolute path like /pybk, got {root!r}")
        check_key(root.strip("/"))  # segments of letters, digits and ._:- (ASCII keys)
        if id_block < 1:
            raise ValueError(f"id_block must be >= 1, got {id_block}")
        self.hosts = hosts
        self.root = "/" + root.strip("/")
        self._client = EtcdClient(hosts, op_timeout=op_timeout, connect_timeout=connect_timeout)
        self.keys = Keys(self.root)
        self._lease = EtcdLease(self._client, session_timeout, self._lease_lost)
        self._watcher = EtcdWatcher(self._client, self.keys.prefix, (self.keys.bookies,))
        self.owner = uuid.uuid4().hex  # this store's identity as a lock holder
        self._own: dict[str, BookieRegistration] = {}
        self._held: dict[str, str] = {}  # lock name -> owner label
        self._id_pool: list[int] = []
        self._id_lock = asyncio.Lock()
        self._id_block = id_block
        self._closed = False
        self.poll_interval = session_timeout / 3

    @property
    def session_timeout(self) -> float:
        return self._lease.ttl

    @property
    def lease_losses(self) -> int:
        """Leases found expired (tests wait on it; a counter for operators)."""
        return self._lease.losses

    @property
    def watch_resumes(self) -> int:
        """Watch streams opened again after one was lost or cancelled (tests read it)."""
        return self._watcher.resumes

    @property
    def lease_id(self) -> int:
        return self._lease.id

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"etcd metadata store {self.hosts}{self.root} is closed")

    # -- ledgers -----------------------------------------------------------------------------

    async def allocate_ledger_id(self) -> int:
        async with self._id_lock:
            while not self._id_pool:
                await self._claim_ids()
            return self._id_pool.pop()

    async def _claim_ids(self) -> None:
        self._check_open()
        key = self.keys.idgen
        kv, _ = await self._client.get(key)
        first = int(unb64(kv.get("value"))) if kv else 0
        ids = allocatable(first, self._id_block)
        cmp = _at(key, _rev(kv)) if kv else _absent(key)
        ok, _ = await self._client.txn([cmp], [_put(key, b"%d" % ids.stop)])
        if not ok:
            return  # another allocator won this block: the caller claims again
        # skip ids a caller created by hand (create_ledger with its own id)
        block = await self._client.get_range(
            self.keys.ledger(ids[0]), self.keys.ledger(ids[-1] + 1), keys_only=True)
        taken = {self.keys.ledger_id(k["key"]) for k in block[0]}
        self._id_pool = [i for i in reversed(ids) if i not in taken]

    async def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        check_metadata(metadata)
        self._check_open()
        metadata = stamped(metadata, time.time())
        key = self.keys.ledger(metadata.ledger_id)
        ok, answer = await self._client.txn([_absent(key)], [_put(key, metadata.to_bytes())])
        if not ok:
            raise LedgerExistsError(f"ledger {metadata.ledger_id} already exists")
        version = int(answer["header"]["revision"])
        self._watcher.returned(key, version)
        return metadata.with_changes(version=version)

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        check_ledger_id(ledger_id)
        self._check_open()
        key = self.keys.ledger(ledger_id)
        kv, rev = await self._client.get(key)
        self._watcher.returned(key, rev)
        if kv is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return LedgerMetadata.from_bytes(unb64(kv.get("value")), _rev(kv))

    async def write_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        check_metadata(metadata)
        self._check_open()
        key = self.keys.ledger(metadata.ledger_id)
        version = await self._cas(key, metadata.to_bytes(), expected_version,
                                  f"ledger {metadata.ledger_id}", NoSuchLedgerError)
        return metadata.with_changes(version=version)

    async def _cas(self, key: bytes, data: bytes, expected: int, what: str,
                   missing: type[Exception]) -> int:
        ok, answer = await self._client.txn([_exists(key), _at(key, expected)],
                                            [_put(key, data)], [_range(key)])
        rev = int(answer["header"]["revision"])
        self._watcher.returned(key, rev)
        if ok:
            return rev
        kvs = answer["responses"][0]["response_range"].get("kvs") or []
        if not kvs:
            raise missing(f"{what} does not exist")
        raise MetadataVersionError(
            f"{what}: version {expected} expected, found {_rev(kvs[0])}")

    async def _delete(self, key: bytes, expected: int | None, what: str,
                      missing: type[Exception]) -> None:
        cmp = [_exists(key)] + ([_at(key, expected)] if expected is not None else [])
        ok, answer = await self._client.txn(
            cmp, [{"request_delete_range": {"key": b64(key)}}], [_range(key)])
        self._watcher.returned(key, int(answer["header"]["revision"]))
        if ok:
            return
        kvs = answer["responses"][0]["response_range"].get("kvs") or []
        if not kvs:
            raise missing(f"{what} does not exist")
        raise MetadataVersionError(f"{what}: version {expected} expected, found {_rev(kvs[0])}")

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        check_ledger_id(ledger_id)
        self._check_open()
        await self._delete(self.keys.ledger(ledger_id), expected_version,
                           f"ledger {ledger_id}", NoSuchLedgerError)

    async def list_ledgers(self) -> list[int]:
        self._check_open()
        kvs, _ = await self._client.get_prefix(self.keys.ledgers, keys_only=True)
        return sorted(self.keys.ledger_id(kv["key"]) for kv in kvs)

    # -- key/value namespace -------------------------------------------------------------------

    async def create_value(self, key: str, value: bytes) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)
        self._check_open()
        k = self.keys.value(key)
        ok, answer = await self._client.txn([_absent(k)], [_put(k, data)])
        if not ok:
            raise KeyExistsError(f"key {key!r} already exists")
        version = int(answer["header"]["revision"])
        self._watcher.returned(k, version)
        return VersionedValue(key, data, version)

    async def read_value(self, key: str) -> VersionedValue:
        check_key(key)
        self._check_open()
        k = self.keys.value(key)
        kv, rev = await self._client.get(k)
        self._watcher.returned(k, rev)
        if kv is None:
            raise NoSuchKeyError(f"key {key!r} does not exist")
        return VersionedValue(key, unb64(kv.get("value")), _rev(kv))

    async def write_value(self, key: str, value: bytes, expected_version: int) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)
        self._check_open()
        version = await self._cas(self.keys.value(key), data, expected_version,
                                  f"key {key!r}", NoSuchKeyError)
        return VersionedValue(key, data, version)

    async def delete_value(self, key: str, expected_version: int | None = None) -> None:
        check_key(key)
        self._check_open()
        await self._delete(self.keys.value(key), expected_version, f"key {key!r}",
                           NoSuchKeyError)

    async def list_keys(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        self._check_open()
        kvs, _ = await self._client.get_prefix(self.keys.value(prefix), keys_only=True)
        return sorted(self.keys.value_name(kv["key"]) for kv in kvs)

    def watch_value(self, key: str, callback: Callable[[str], None]) -> Watch:
        check_key(key)
        return self._watcher.watch(self.keys.value(key), lambda: callback(key))

    # -- bookies -----------------------------------------------------------------------------

    async def register_bookie(self, registration: BookieRegistration) -> None:
        r = check_registration(registration)
        self._check_open()
        self._own[r.bookie_id] = r
        await self._put_registration(r)

    async def _put_registration(self, r: BookieRegistration) -> None:
        lease = await self._lease.ensure()
        doc = {"address": r.address, "read_only": r.read_only, "rack": r.rack,
               "group": r.group, "holder": self.owner}
        await self._client.put(self.keys.bookie(r.bookie_id),
                               json.dumps(doc, sort_keys=True).encode(), lease)

    async def unregister_bookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        self._check_open()
        self._own.pop(bookie_id, None)
        await self._client.delete(self.keys.bookie(bookie_id))

    async def list_bookies(self) -> list[BookieRegistration]:
        self._check_open()
        kvs, rev = await self._client.get_prefix(self.keys.bookies)
        self._watcher.returned(self.keys.bookies, rev)
        out = []
        for kv in kvs:
            doc = json.loads(unb64(kv.get("value")))
            out.append(BookieRegistration(self.keys.bookie_name(kv["key"]), str(doc["address"]),
                                          bool(doc.get("read_only")), str(doc.get("rack", "")),
                                          str(doc.get("group", ""))))
        return sorted(out, key=lambda b: b.bookie_id)

    async def _lease_lost(self) -> None:
        """The lease expired: our registrations and locks are gone. Locks stay lost (another
        may hold them now); registrations are made again under a new lease."""
        for name in list(self._held):
            log.warning("etcd metadata %s: lost lock %s (lease expired)", self.root, name)
        self._held.clear()
        for r in list(self._own.values()):
            try:
                await self._put_registration(r)
            except (MetadataStoreError, ClientClosedError) as exc:
                log.warning("etcd metadata: re-registering %s failed: %s", r.bookie_id, exc)

    # -- watches -------------------------------------------------------------------------------

    def watch_ledger(self, ledger_id: int, callback: Callable[[int], None]) -> Watch:
        check_ledger_id(ledger_id)
        return self._watcher.watch(self.keys.ledger(ledger_id), lambda: callback(ledger_id))

    def watch_bookies(self, callback: Callable[[], None]) -> Watch:
        return self._watcher.watch(self.keys.bookies, callback)

    async def sync_watches(self) -> bool:
        return await self._watcher.established(max(1.0, self._client.op_timeout))

    # -- under-replication marks ----------------------------------------------------------------

    async def mark_under_replicated(self, ledger_id: int, missing_bookies: list[str]) -> None:
        check_ledger_id(ledger_id)
        for b in missing_bookies:
            check_bookie_id(b)
        self._check_open()
        key = self.keys.mark(ledger_id)
        for _ in range(100):
            kv, _rv = await self._client.get(key)
            old = json.loads(unb64(kv.get("value"))) if kv else []
            new = merge_missing(old, missing_bookies)
            if kv is not None and new == old:
                return
            cmp = _at(key, _rev(kv)) if kv else _absent(key)
            ok, _ = await self._client.txn([cmp], [_put(key, json.dumps(new).encode())])
            if ok:
                return
        raise MetadataVersionError(f"ledger {ledger_id}: mark gave up after 100 conflicts")

    async def list_under_replicated(self) -> dict[int, list[str]]:
        self._check_open()
        kvs, _ = await self._client.get_prefix(self.keys.marks)
        return {self.keys.mark_id(kv["key"]): list(json.loads(unb64(kv.get("value"))))
                for kv in kvs}

    async def clear_under_replicated(
        self, ledger_id: int, expected: Sequence[str] | None = None
    ) -> bool:
        check_ledger_id(ledger_id)
        want = check_expected_marks(expected)
        self._check_open()
        key = self.keys.mark(ledger_id)
        if want is None:
            return bool(await self._client.delete(key))
        kv, _ = await self._client.get(key)
        if kv is None or json.loads(unb64(kv.get("value"))) != want:
            return False
        ok, _ = await self._client.txn(
            [_at(key, _rev(kv))], [{"request_delete_range": {"key": b64(key)}}])
        return ok

    # -- locks and elections -------------------------------------------------------------------

    async def try_lock(self, name: str, owner: str) -> bool:
        check_key(name)
        check_owner(owner)
        self._check_open()
        if self.holds_lock(name):
            return True
        lease = await self._lease.ensure()
        key = self.keys.lock(name)
        doc = json.dumps({"owner": owner, "holder": self.owner}).encode()
        ok, answer = await self._client.txn([_absent(key)], [_put(key, doc, lease)],
                                            [_range(key)])
        self._watcher.returned(key, int(answer["header"]["revision"]))
        if not ok:
            kvs = answer["responses"][0]["response_range"].get("kvs") or []
            if not kvs or json.loads(unb64(kvs[0].get("value"))).get("holder") != self.owner \
                    or int(kvs[0].get("lease", 0)) != lease:
                return False
        self._held[name] = owner
        return True

    async def unlock(self, name: str) -> None:
        check_key(name)
        self._check_open()
        if self._held.pop(name, None) is None:
            return
        key = self.keys.lock(name)
        lease = self._lease.id
        if not lease:
            return
        cmp = {"key": b64(key), "target": "LEASE", "result": "EQUAL", "lease": str(lease)}
        _ok, answer = await self._client.txn(
            [cmp], [{"request_delete_range": {"key": b64(key)}}])
        self._watcher.returned(key, int(answer["header"]["revision"]))

    async def lock_owner(self, name: str) -> str | None:
        check_key(name)
        self._check_open()
        key = self.keys.lock(name)
        kv, rev = await self._client.get(key)
        self._watcher.returned(key, rev)
        return None if kv is None else str(json.loads(unb64(kv.get("value")))["owner"])

    async def list_locks(self, prefix: str = "") -> dict[str, str]:
        check_prefix(prefix)
        self._check_open()
        kvs, _ = await self._client.get_prefix(self.keys.lock(prefix))
        return {self.keys.lock_name(kv["key"]): str(json.loads(unb64(kv.get("value")))["owner"])
                for kv in sorted(kvs, key=lambda kv: str(kv["key"]))}

    def holds_lock(self, name: str) -> bool:
        return not self._closed and name in self._held and self._lease.alive()

    def watch_lock(self, name: str, callback: Callable[[str], None]) -> Watch:
        check_key(name)
        return self._watcher.watch(self.keys.lock(name), lambda: callback(name))

    def election(self, name: str, candidate: str) -> Election:
        return LockElection(self, name, candidate, retry_interval=self._lease.ttl / 3)

    async def election_leader(self, name: str) -> str | None:
        return await self.lock_owner(election_lock(name))

    # -- cookies --------------------------------------------------------------------------------

    async def read_cookie(self, bookie_id: str) -> bytes | None:
        check_bookie_id(bookie_id)
        self._check_open()
        kv, _ = await self._client.get(self.keys.cookie(bookie_id))
        return None if kv is None else unb64(kv.get("value"))

    async def write_cookie(self, bookie_id: str, cookie: bytes) -> None:
        check_bookie_id(bookie_id)
        if not isinstance(cookie, bytes | bytearray):
            raise TypeError(f"cookie must be bytes, got {type(cookie).__name__}")
        self._check_open()
        await self._client.put(self.keys.cookie(bookie_id), bytes(cookie))

    async def delete_cookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        self._check_open()
        await self._client.delete(self.keys.cookie(bookie_id))

    # -- test hooks / lifecycle ----------------------------------------------------------------

    async def corrupt_ledger(self, ledger_id: int, data: bytes) -> None:
        """Overwrite a ledger's stored bytes (tests: readers must raise CorruptRecordError)."""
        await self._client.put(self.keys.ledger(ledger_id), data)

    async def expire_lease(self) -> None:
        """Revoke this store's lease behind its back (tests: what an expiry does)."""
        if self._lease.id:
            await self._client.revoke(self._lease.id)

    async def crash(self) -> None:
        """Stop at once without unregistering (an in-process kill -9 of the owner): the
        registrations and locks stay until the lease's TTL runs out."""
        self._own.clear()
        self._held.clear()
        self._lease.forget()
        await self._shutdown(revoke=False)

    async def close(self) -> None:
        """Revoke the lease (its registrations and locks go with it), stop the watch
        stream. Idempotent."""
        if self._closed:
            return
        self._own.clear()
        self._held.clear()
        await self._shutdown(revoke=True)

    async def _shutdown(self, *, revoke: bool) -> None:
        if self._closed:
            return
        await self._lease.stop(revoke=revoke)
        self._closed = True
        await self._watcher.stop()
        await self._client.close()
