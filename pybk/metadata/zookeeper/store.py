"""ZooKeeper metadata store (``zk://host:port[,host:port]/root``) with kazoo: the API.

The layout below the root is in :mod:`.paths` (and docs/zookeeper.md), the bridge from kazoo's
threads to the loop in :mod:`.bridge`, watches and the election in :mod:`.recipes`; the
key/value namespace in :mod:`.keyvalues`, locks in :mod:`.locks` and under-replication marks
in :mod:`.underreplication`. This module maps the :class:`~pybk.metadata.base.MetadataStore`
contract onto them, and keeps ledgers, the bookie registry and cookies itself.

Ledger metadata versions are znode versions (CAS = ``set(..., version=v)``). Ids are never
reused by the allocator, so a re-created ledger's restarted znode version cannot be confused
with an old one. Key/value versions are the znode's ``mzxid`` instead (:mod:`.keyvalues`
says why).

Sessions: a registration and a lock are ephemeral znodes. When the session expires ZooKeeper
deletes them; when kazoo establishes a new session this store re-creates its registrations
(locks are *not* re-taken: their holders learn through :meth:`holds_lock` and the lock's watch
that they lost them) and tells every watcher to re-read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from pybk.errors import (
    ClientClosedError,
    CorruptRecordError,
    LedgerExistsError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from pybk.metadata._common import (
    allocatable,
    check_bookie_id,
    check_key,
    check_ledger_id,
    check_metadata,
    check_owner,
    check_registration,
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
from pybk.metadata.zookeeper.bridge import KazooBridge
from pybk.metadata.zookeeper.keyvalues import ZkKeyValues
from pybk.metadata.zookeeper.locks import ZkLocks
from pybk.metadata.zookeeper.paths import BASE_DIRS, Layout
from pybk.metadata.zookeeper.recipes import (
    ChildrenWatches,
    DataWatches,
    Seen,
    ZkElection,
    election_leader,
)
from pybk.metadata.zookeeper.underreplication import ZkUnderReplication, walk_ledger_tree

__all__ = ["ZooKeeperMetadataStore"]

log = logging.getLogger("pybk.metadata.zookeeper")


class ZooKeeperMetadataStore(MetadataStore):
    """A :class:`MetadataStore` on a ZooKeeper ensemble.

    ``session_timeout``: requested ZooKeeper session timeout in seconds (the server clamps it
    to 2..20 ticks); a registration or a lock vanishes this long after its process dies.
    ``op_timeout``: bound on one operation. ``id_block``: ledger ids claimed per CAS on the
    ``idgen`` node.
    """

    def __init__(
        self,
        hosts: str,
        root: str = "/pybk",
        *,
        session_timeout: float = 10.0,
        connect_timeout: float = 15.0,
        op_timeout: float = 10.0,
        id_block: int = 100,
    ) -> None:
        if id_block < 1:
            raise ValueError(f"id_block must be >= 1, got {id_block}")
        self._layout = Layout(root)
        self.hosts = hosts
        self.root = self._layout.root
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        self.op_timeout = op_timeout
        self._id_block = id_block
        self._bridge = KazooBridge(
            hosts, self._layout, session_timeout=session_timeout,
            connect_timeout=connect_timeout, op_timeout=op_timeout, base_dirs=BASE_DIRS,
        )
        self._bridge.on_new_session.append(self._on_new_session)
        self._id_pool: list[int] = []  # claimed ids, next one last
        self._id_lock = asyncio.Lock()  # one block claim at a time per store
        self._own: dict[str, BookieRegistration] = {}
        #: one registration change at a time per store: a re-registration after a new
        #: session and an explicit (un)registration never interleave their ZooKeeper steps
        self._reg_lock = asyncio.Lock()
        self._ledger_watchers: DataWatches[int] = DataWatches(self._bridge, self._layout.ledger)
        self._kv = ZkKeyValues(self._bridge, self._layout)
        self._locks = ZkLocks(self._bridge, self._layout, hosts)
        self._marks = ZkUnderReplication(self._bridge, self._layout)
        self._bookie_watchers = ChildrenWatches(
            self._bridge, [self._layout.bookies(False), self._layout.bookies(True)])
        self._elections: list[ZkElection] = []
        #: Test hook: awaited before registrations are re-created on a new session.
        self.before_reregister: Callable[[], Awaitable[None]] | None = None

    # -- connection and session ----------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the ZooKeeper connection is up: an operation now is attempted at once
        (otherwise it waits up to ``op_timeout`` for kazoo to reconnect)."""
        return self._bridge.connected

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """``(session id, password)`` of the current session (tests force expiry with it)."""
        return self._bridge.client_id

    @property
    def sessions_lost(self) -> int:
        """Number of sessions this store lost (expired); tests and operators look at it."""
        return self._bridge.sessions_lost

    def _on_new_session(self) -> None:
        """Ephemerals of the old session are gone and watches may have missed events:
        re-register, drop the locks, make every watcher re-read."""
        if self._own:
            self._bridge.spawn(self._reregister())
        self._locks.session_lost()
        self._ledger_watchers.fire_all()
        self._kv.watchers.fire_all()
        self._locks.watchers.fire_all()
        self._bookie_watchers.fire()
        self._bookie_watchers.rearm()

    async def _reregister(self) -> None:
        if self.before_reregister is not None:
            await self.before_reregister()
        attempt = 0
        while self._own and not self._bridge.closed:  # until it worked or nobody wants it
            try:
                async with self._reg_lock:  # reads _own as it is now, not as it was
                    for bookie_id in list(self._own):
                        reg = self._own.get(bookie_id)
                        if reg is not None:
                            await self._create_registration(reg, steal=False)
                log.info("re-registered %s after a new ZooKeeper session", sorted(self._own))
                return
            except MetadataStoreError as exc:
                attempt += 1
                log.warning("re-registration attempt %d failed: %s", attempt, exc)
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
            except ClientClosedError:
                return

    # -- ledgers -------------------------------------------------------------------------------

    async def allocate_ledger_id(self) -> int:
        async with self._id_lock:
            return await self._allocate_locked()

    async def _allocate_locked(self) -> int:
        while not self._id_pool:
            path = self._layout.idgen
            data, stat = await self._bridge.call("allocate_ledger_id", "get", path)
            try:
                first = int(data.decode())
            except ValueError:
                raise CorruptRecordError(f"ZooKeeper {path}: not an integer: {data[:32]!r}") \
                    from None
            ids = allocatable(first, self._id_block)
            try:
                await self._bridge.call(
                    "allocate_ledger_id", "set", path,
                    str(ids.stop).encode(), version=stat.version,
                    expect=(BadVersionError,),
                )
            except BadVersionError:
                continue  # another client claimed this block first
            self._id_pool = list(reversed(ids))
        return self._id_pool.pop()

    async def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        check_metadata(metadata)
        metadata = stamped(metadata, time.time())
        lid = metadata.ledger_id
        before = self._bridge.last_zxid()
        try:
            _, stat = await self._bridge.call(
                "create_ledger", "create", self._layout.ledger(lid), metadata.to_bytes(),
                makepath=True, include_data=True, expect=(NodeExistsError,),
            )
        except NodeExistsError:
            raise LedgerExistsError(f"ledger {lid} already exists") from None
        self._ledger_watchers.saw(lid, stat.mzxid, before)
        return metadata.with_changes(version=0)

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        check_ledger_id(ledger_id)
        before = self._bridge.last_zxid()
        try:
            data, stat = await self._bridge.call(
                "read_ledger", "get", self._layout.ledger(ledger_id), expect=(NoNodeError,)
            )
        except NoNodeError:
            self._ledger_watchers.saw(ledger_id, None, before)
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        md = LedgerMetadata.from_bytes(data, stat.version)
        self._ledger_watchers.saw(ledger_id, stat.mzxid, before)
        return md

    async def write_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        check_metadata(metadata)
        lid = metadata.ledger_id
        if expected_version < 0:  # ZooKeeper reads version -1 as "any version": never a CAS
            await self.read_ledger(lid)  # NoSuchLedgerError when absent, like the others
            raise MetadataVersionError(f"ledger {lid}: version {expected_version} is stale")
        before = self._bridge.last_zxid()
        try:
            stat = await self._bridge.call(
                "write_ledger", "set", self._layout.ledger(lid), metadata.to_bytes(),
                version=expected_version, expect=(BadVersionError, NoNodeError),
            )
        except BadVersionError:
            raise MetadataVersionError(
                f"ledger {lid}: version {expected_version} is stale"
            ) from None
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {lid} does not exist") from None
        self._ledger_watchers.saw(lid, stat.mzxid, before)
        return metadata.with_changes(version=stat.version)

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        check_ledger_id(ledger_id)
        if expected_version is not None and expected_version < 0:
            await self.read_ledger(ledger_id)
            raise MetadataVersionError(
                f"ledger {ledger_id}: version {expected_version} is stale"
            )
        before = self._bridge.last_zxid()
        try:
            await self._bridge.call(
                "delete_ledger", "delete", self._layout.ledger(ledger_id),
                version=-1 if expected_version is None else expected_version,
                expect=(BadVersionError, NoNodeError),
            )
        except BadVersionError:
            raise MetadataVersionError(
                f"ledger {ledger_id}: version {expected_version} is stale"
            ) from None
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        self._ledger_watchers.saw(ledger_id, None, before)

    async def list_ledgers(self) -> list[int]:
        return [lid for lid, _ in await walk_ledger_tree(
            self._bridge, "list_ledgers", self._layout.p("ledgers"), "L")]

    # -- key/value namespace ---------------------------------------------------------------------

    async def create_value(self, key: str, value: bytes) -> VersionedValue:
        return await self._kv.create_value(key, value)

    async def read_value(self, key: str) -> VersionedValue:
        return await self._kv.read_value(key)

    async def write_value(
        self, key: str, value: bytes, expected_version: int
    ) -> VersionedValue:
        return await self._kv.write_value(key, value, expected_version)

    async def delete_value(self, key: str, expected_version: int | None = None) -> None:
        await self._kv.delete_value(key, expected_version)

    async def list_keys(self, prefix: str = "") -> list[str]:
        return await self._kv.list_keys(prefix)

    def watch_value(self, key: str, callback: Callable[[str], None]) -> Watch:
        """One kazoo DataWatch per watched key and store (as for ledgers)."""
        return self._kv.watch_value(key, callback)

    # -- bookies -------------------------------------------------------------------------------

    async def _create_registration(self, reg: BookieRegistration, *, steal: bool = True) -> None:
        """Create ``reg``'s ephemeral, then remove its node in the other (writable/read-only)
        list. A node held by another session is replaced when ``steal`` (an explicit
        registration: the newest registrant wins, e.g. a restarted bookie whose old session
        has not expired yet); on re-registration after our own session expired it is left
        alone (a newer incarnation of the bookie owns it now)."""
        path = self._layout.bookie(reg.bookie_id, reg.read_only)
        data = json.dumps({"address": reg.address, "rack": reg.rack, "group": reg.group}).encode()
        for _ in range(5):
            try:
                await self._bridge.call(
                    "register_bookie", "create", path, data, ephemeral=True,
                    expect=(NodeExistsError,),
                )
                break
            except NodeExistsError:
                try:
                    old, stat = await self._bridge.call(
                        "register_bookie", "get", path, expect=(NoNodeError,)
                    )
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == self._bridge.session_id and old == data:
                    break
                if not steal and stat.ephemeralOwner != self._bridge.session_id:
                    log.warning(
                        "bookie %s is registered by another session; not re-registering",
                        reg.bookie_id,
                    )
                    self._own.pop(reg.bookie_id, None)
                    return
                # someone else's (a previous incarnation of this bookie) or stale: replace
                with contextlib.suppress(NoNodeError, BadVersionError):
                    await self._bridge.call(
                        "register_bookie", "delete", path, version=stat.version,
                        expect=(NoNodeError, BadVersionError),
                    )
        else:
            raise MetadataStoreError(f"could not register bookie {reg.bookie_id}: contention")
        with contextlib.suppress(NoNodeError):
            await self._bridge.call(
                "register_bookie", "delete", self._layout.bookie(reg.bookie_id, not reg.read_only),
                expect=(NoNodeError,),
            )

    async def register_bookie(self, registration: BookieRegistration) -> None:
        check_registration(registration)
        async with self._reg_lock:
            self._own[registration.bookie_id] = registration
            await self._create_registration(registration)

    async def unregister_bookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        async with self._reg_lock:
            self._own.pop(bookie_id, None)
            for ro in (False, True):
                with contextlib.suppress(NoNodeError):
                    await self._bridge.call(
                        "unregister_bookie", "delete", self._layout.bookie(bookie_id, ro),
                        expect=(NoNodeError,),
                    )

    async def list_bookies(self) -> list[BookieRegistration]:
        found: dict[str, BookieRegistration] = {}
        before = self._bridge.last_zxid()
        pzxids: list[int] = []
        for ro in (False, True):  # read-only wins while a flip is half done
            base = self._layout.bookies(ro)
            names, stat = await self._bridge.call(
                "list_bookies", "get_children", base, include_data=True)
            names = sorted(names)
            pzxids.append(int(stat.pzxid))

            async def get(name: str, base: str = base) -> bytes | None:
                try:
                    data, _ = await self._bridge.call(
                        "list_bookies", "get", f"{base}/{name}", expect=(NoNodeError,)
                    )
                    return bytes(data)
                except NoNodeError:
                    return None

            for name, data in zip(names, await asyncio.gather(*map(get, names)), strict=True):
                if data is None:
                    continue
                try:
                    doc = json.loads(data)
                    address, rack = str(doc["address"]), str(doc.get("rack", ""))
                    group = str(doc.get("group", ""))  # (absent before isolation groups)
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise CorruptRecordError(
                        f"ZooKeeper registration of bookie {name}: {exc}"
                    ) from exc
                found[name] = BookieRegistration(name, address, ro, rack, group)
        self._bookie_watchers.seen = Seen(tuple(pzxids), before)  # what watches compare with
        return [found[b] for b in sorted(found)]

    # -- watches -------------------------------------------------------------------------------

    def watch_ledger(self, ledger_id: int, callback: Callable[[int], None]) -> Watch:
        """One kazoo DataWatch per watched ledger and store, shared by all its watches (and
        stopped at the next event once the last one is cancelled)."""
        check_ledger_id(ledger_id)
        return self._ledger_watchers.watch(ledger_id, lambda: callback(ledger_id))

    def watch_bookies(self, callback: Callable[[], None]) -> Watch:
        """Two kazoo ChildrenWatches per store (writable, read-only), shared by all watches."""
        return self._bookie_watchers.watch(callback)

    async def sync_reads(self) -> bool:
        """ZooKeeper's ``sync``: this session's server catches up with the leader."""
        await self._bridge.call("sync_reads", "sync", self._layout.root or "/")
        return True

    async def sync_watches(self) -> bool:
        """Wait until every watch set so far had its first report (at most ``op_timeout``)."""
        groups = (self._ledger_watchers, self._kv.watchers, self._locks.watchers)
        waiting = [w for g in groups for w in g.waiting()]
        children = self._bookie_watchers
        if not waiting and not children.waiting():
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.op_timeout
        while not self._bridge.closed and (
                children.waiting() or any(w in g.waiting() for g in groups for w in waiting)):
            left = deadline - loop.time()
            if left <= 0:
                break
            for g in (*groups, children):
                g.progress.clear()
            wakers = [asyncio.ensure_future(g.progress.wait()) for g in (*groups, children)]
            try:
                await asyncio.wait(wakers, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in wakers:
                    t.cancel()
        return True

    # -- locks and elections -------------------------------------------------------------------

    async def try_lock(self, name: str, owner: str) -> bool:
        return await self._locks.try_lock(name, owner)

    async def unlock(self, name: str) -> None:
        await self._locks.unlock(name)

    async def lock_owner(self, name: str) -> str | None:
        return await self._locks.lock_owner(name)

    async def list_locks(self, prefix: str = "") -> dict[str, str]:
        return await self._locks.list_locks(prefix)

    def holds_lock(self, name: str) -> bool:
        return self._locks.holds_lock(name)

    def watch_lock(self, name: str, callback: Callable[[str], None]) -> Watch:
        return self._locks.watch_lock(name, callback)

    def election(self, name: str, candidate: str) -> Election:
        check_key(name)
        check_owner(candidate)
        election = ZkElection(self._bridge, self._layout.election(name), name, candidate)
        self._elections.append(election)
        return election

    async def election_leader(self, name: str) -> str | None:
        check_key(name)
        return await election_leader(self._bridge, self._layout.election(name))

    # -- under-replication marks ---------------------------------------------------------------

    async def mark_under_replicated(self, ledger_id: int, missing_bookies: list[str]) -> None:
        await self._marks.mark_under_replicated(ledger_id, missing_bookies)

    async def list_under_replicated(self) -> dict[int, list[str]]:
        return await self._marks.list_under_replicated()

    async def clear_under_replicated(
        self, ledger_id: int, expected: Sequence[str] | None = None
    ) -> bool:
        return await self._marks.clear_under_replicated(ledger_id, expected)

    # -- cookies -------------------------------------------------------------------------------

    async def read_cookie(self, bookie_id: str) -> bytes | None:
        check_bookie_id(bookie_id)
        try:
            data, _ = await self._bridge.call(
                "read_cookie", "get", self._layout.cookie(bookie_id), expect=(NoNodeError,)
            )
        except NoNodeError:
            return None
        return bytes(data)

    async def write_cookie(self, bookie_id: str, cookie: bytes) -> None:
        check_bookie_id(bookie_id)
        if not isinstance(cookie, bytes | bytearray):
            raise TypeError(f"cookie must be bytes, got {type(cookie).__name__}")
        path = self._layout.cookie(bookie_id)
        for _ in range(10):
            try:
                await self._bridge.call(
                    "write_cookie", "set", path, bytes(cookie), expect=(NoNodeError,))
                return
            except NoNodeError:
                try:
                    await self._bridge.call(
                        "write_cookie", "create", path, bytes(cookie), expect=(NodeExistsError,)
                    )
                    return
                except NodeExistsError:
                    continue
        raise MetadataStoreError(f"could not write the cookie of {bookie_id}: contention")

    async def delete_cookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        with contextlib.suppress(NoNodeError):
            await self._bridge.call(
                "delete_cookie", "delete", self._layout.cookie(bookie_id), expect=(NoNodeError,)
            )

    # -- test hooks / lifecycle ----------------------------------------------------------------

    async def corrupt_ledger(self, ledger_id: int, data: bytes) -> None:
        """Overwrite a ledger's znode data (tests: readers must raise CorruptRecordError)."""
        await self._bridge.call("corrupt_ledger", "set", self._layout.ledger(ledger_id), data)

    def forget_registrations(self) -> None:
        """Stop owning this store's registrations (they will not be re-created); used to
        simulate the owning process dying."""
        self._own.clear()

    async def close(self) -> None:
        """Close the session: its ephemeral registrations and locks go at once. Idempotent."""
        if self._bridge.closed:
            return
        for election in list(self._elections):
            with contextlib.suppress(Exception):
                await election.resign()
        self._own.clear()
        self._locks.forget()
        self._ledger_watchers.cancel_all()
        self._kv.watchers.cancel_all()
        self._locks.watchers.cancel_all()
        self._bookie_watchers.cancel_all()
        await self._bridge.close()
