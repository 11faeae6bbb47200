"""ZooKeeper metadata store (``zk://host:port[,host:port]/root``) with kazoo.

Layout under ``/root`` (see docs/zookeeper.md)::

    ledgers/<id // 10^8 : 11 digits>/<(id // 10^4) % 10^4 : 4 digits>/L<id % 10^4 : 4 digits>
    idgen                       next unclaimed ledger id (ASCII); clients claim blocks by CAS
    bookies/writable/<bookie>   ephemeral, JSON {"address": ...}
    bookies/readonly/<bookie>   ephemeral, JSON {"address": ...}
    cookies/<bookie>            the bookie's cookie bytes
    underreplication/ledgers/<same two levels>/urL<id % 10^4>   JSON list of missing bookies
    kv/<key path>               the key/value namespace: a key's znode holds b"\x01" + value;
                                nodes made only as parents of deeper keys hold b""

Ledger metadata versions are znode versions (CAS = ``set(..., version=v)``). Ids are never
reused by the allocator, so a re-created ledger's restarted znode version cannot be confused
with an old one. Key/value versions are the znode's ``mzxid`` (the zxid of its last change,
unique across the ensemble): a znode's own version restarts at 0 when a key is deleted and
created again, and a stale compare-and-set must never succeed on the new key. A CAS reads the
node, compares its mzxid and writes with the node's own version (a change in between fails it).

Threads: kazoo runs its own threads. Operations use kazoo's async API and are bridged to the
event loop with ``call_soon_threadsafe``; no operation blocks the loop. Watch and session
callbacks come from kazoo threads and are delivered on the loop the same way.

Sessions: a registration is an ephemeral znode. When the session expires ZooKeeper deletes
it; when kazoo establishes a new session this store re-creates its registrations and tells
every watcher to re-read. Operations issued while the client is not connected fail at once
with MetadataStoreError, and operations that were in flight when the connection or session
went away fail with MetadataStoreError ("outcome unknown"): nothing acts on stale state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    ZookeeperError,
)
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from pybk.errors import (
    ClientClosedError,
    CorruptRecordError,
    KeyExistsError,
    LedgerExistsError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchKeyError,
    NoSuchLedgerError,
)
from pybk.metadata._common import (
    CallbackWatch,
    check_bookie_id,
    check_key,
    check_ledger_id,
    check_metadata,
    check_prefix,
    check_registration,
    check_value,
    merge_missing,
)
from pybk.metadata.base import (
    BookieRegistration,
    LedgerMetadata,
    MetadataStore,
    VersionedValue,
    Watch,
)

__all__ = [
    "ZooKeeperMetadataStore",
    "ledger_subpath",
]

log = logging.getLogger(__name__)

#: kazoo calls that are safe to repeat after a lost connection.
_IDEMPOTENT = frozenset({"get", "get_children", "exists"})

_UNSEEN: Any = object()  # "no version known yet" (None means "the ledger does not exist")

#: First byte of a key's znode data (parents made by ``makepath`` hold b"").
_KEY_MARK = b"\x01"


@dataclass
class _LedgerRecipe:
    """State of the one DataWatch a store keeps for a watched ledger."""

    baseline: Any  # version this store last saw when the recipe was made, or _UNSEEN
    version: Any = _UNSEEN  # version the DataWatch last reported
    stopped: bool = False


def ledger_subpath(ledger_id: int, prefix: str = "L") -> str:
    """Hierarchical path of a ledger below ``ledgers/`` (at most 10^4 children per node)."""
    top, rest = divmod(ledger_id, 10**8)
    mid, low = divmod(rest, 10**4)
    return f"{top:011d}/{mid:04d}/{prefix}{low:04d}"


def _ledger_id_from(top: str, mid: str, leaf: str, prefix: str) -> int | None:
    if not (top.isdigit() and mid.isdigit() and leaf.startswith(prefix)):
        return None
    low = leaf[len(prefix):]
    if not low.isdigit():
        return None
    return int(top) * 10**8 + int(mid) * 10**4 + int(low)


class ZooKeeperMetadataStore(MetadataStore):
    """A :class:`MetadataStore` on a ZooKeeper ensemble.

    ``session_timeout``: requested ZooKeeper session timeout in seconds (the server clamps it
    to 2..20 ticks); a registration vanishes this long after its process dies.
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
        if not root.startswith("/") or (root.endswith("/") and root != "/"):
            raise ValueError(f"ZooKeeper root must be an absolute path, got {root!r}")
        if id_block < 1:
            raise ValueError(f"id_block must be >= 1, got {id_block}")
        self.hosts = hosts
        self.root = root.rstrip("/")
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        self.op_timeout = op_timeout
        self._id_block = id_block
        self._zk = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry={"max_tries": -1, "delay": 0.05, "max_delay": 1.0},
            command_retry={"max_tries": 3, "delay": 0.05, "max_delay": 0.5},
        )
        self._zk.add_listener(self._on_state)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock = asyncio.Lock()
        self._connected_event = asyncio.Event()  # set by the loop when (re)connected
        self._started = False
        self._closed = False
        self._connected = False
        self._session_id: int | None = None
        self._id_pool: list[int] = []  # claimed ids, next one last
        self._id_lock = asyncio.Lock()  # one block claim at a time per store
        self._own: dict[str, BookieRegistration] = {}
        self._ledger_watches: dict[int, list[CallbackWatch]] = {}
        self._bookie_watches: list[CallbackWatch] = []
        self._seen: dict[int, int | None] = {}
        self._value_watches: dict[str, list[CallbackWatch]] = {}
        self._value_recipes: dict[str, _LedgerRecipe] = {}
        self._seen_values: dict[str, int | None] = {}
        self._pending_recipes: list[Callable[[], Any]] = []  # watches made before connecting
        self._ledger_recipes: dict[int, _LedgerRecipe] = {}
        self._bookie_recipes = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: Test hook: awaited before registrations are re-created on a new session.
        self.before_reregister: Callable[[], Awaitable[None]] | None = None
        #: Number of sessions this store lost (expired); tests and operators look at it.
        self.sessions_lost = 0

    # -- paths ---------------------------------------------------------------------------------

    def _p(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def _ledger_path(self, ledger_id: int) -> str:
        return self._p("ledgers", ledger_subpath(ledger_id))

    def _bookie_path(self, bookie_id: str, read_only: bool) -> str:
        return self._p("bookies", "readonly" if read_only else "writable", bookie_id)

    # -- connection and session ----------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the ZooKeeper connection is up: an operation now is attempted at once
        (otherwise it waits up to ``op_timeout`` for kazoo to reconnect)."""
        return self._connected

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """``(session id, password)`` of the current session (tests force expiry with it)."""
        cid = self._zk.client_id
        return None if cid is None else (int(cid[0]), bytes(cid[1]))

    def _is_started(self) -> bool:
        return self._started

    def _is_connected(self) -> bool:
        return self._connected

    async def _ensure_started(self) -> None:
        if self._closed:
            raise ClientClosedError(f"ZooKeeper metadata store {self.hosts}{self.root} is closed")
        if self._started:
            return
        async with self._start_lock:
            if self._is_started():  # another task connected while we waited
                return
            self._loop = asyncio.get_running_loop()

            def start() -> None:
                self._zk.start(timeout=self.connect_timeout)
                for sub in ("ledgers", "bookies/writable", "bookies/readonly", "cookies",
                            "underreplication/ledgers", "kv"):
                    self._zk.ensure_path(self._p(*sub.split("/")))
                if not self._zk.exists(self._p("idgen")):
                    with contextlib.suppress(NodeExistsError):
                        self._zk.create(self._p("idgen"), b"0")

            try:
                await asyncio.to_thread(start)
            except Exception as exc:
                await asyncio.to_thread(self._zk.stop)
                raise MetadataStoreError(
                    f"cannot connect to ZooKeeper at {self.hosts} (root {self.root}): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            cid = self._zk.client_id
            self._session_id = None if cid is None else cid[0]
            self._connected = True
            self._started = True
            self._start_recipes()

    def _on_state(self, state: str) -> None:
        """kazoo connection-state listener (kazoo's thread): must not block or call ZK."""
        if state == KazooState.CONNECTED:
            cid = self._zk.client_id
            self._schedule(self._on_connected, None if cid is None else cid[0])
        else:
            self._connected = False
            if state == KazooState.LOST:
                self._schedule(self._on_lost)

    def _schedule(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closed meanwhile
            loop.call_soon_threadsafe(fn, *args)

    def _on_lost(self) -> None:
        if self._closed:
            return  # kazoo reports LOST when we close the session ourselves
        self.sessions_lost += 1
        log.warning("ZooKeeper session to %s expired; registrations will be re-created", self.hosts)

    def _on_connected(self, session_id: int | None) -> None:
        if self._closed:
            return
        # re-check: the connection may have dropped again since kazoo's thread queued this
        self._connected = self._zk.state == KazooState.CONNECTED
        if self._connected:
            self._connected_event.set()
        if session_id == self._session_id:
            return
        # A new session: ephemerals of the old one are gone and watches may have missed
        # events. Re-register and make every watcher re-read.
        self._session_id = session_id
        if self._own:
            self._spawn(self._reregister())
        for watches in list(self._ledger_watches.values()):
            for w in list(watches):
                w.fire()
        for vw in list(self._value_watches.values()):
            for w in list(vw):
                w.fire()
        for bw in list(self._bookie_watches):
            bw.fire()

    def _spawn(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reregister(self) -> None:
        if self.before_reregister is not None:
            await self.before_reregister()
        attempt = 0
        while self._own and not self._closed:  # until it worked or nobody wants it
            try:
                for reg in list(self._own.values()):
                    await self._create_registration(reg, steal=False)
                log.info("re-registered %s after a new ZooKeeper session", sorted(self._own))
                return
            except MetadataStoreError as exc:
                attempt += 1
                log.warning("re-registration attempt %d failed: %s", attempt, exc)
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
            except ClientClosedError:
                return

    # -- the async bridge ----------------------------------------------------------------------

    async def _call(
        self,
        op: str,
        method: str,
        *args: Any,
        expect: tuple[type[Exception], ...] = (),
        **kwargs: Any,
    ) -> Any:
        """Run ``self._zk.<method>_async(*args, **kwargs)`` without blocking the loop.

        While the client is disconnected the operation waits for the connection to come
        back, at most ``op_timeout`` seconds in all (ZooKeeper restarts and leader changes
        are absorbed); then it fails with MetadataStoreError, never touching the server.
        Reads interrupted by a lost connection are retried within the same bound; a write
        interrupted that way fails with MetadataStoreError ("outcome unknown").
        kazoo errors listed in ``expect`` propagate (the caller maps them to pybk errors).
        """
        await self._ensure_started()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.op_timeout
        while True:
            await self._wait_connected(op, deadline)
            result = await self._issue(op, method, args, kwargs, deadline)
            try:
                return result.get_nowait()
            except expect:
                raise
            except (ConnectionLoss, SessionExpiredError) as exc:
                if method in _IDEMPOTENT and loop.time() < deadline and not self._closed:
                    await asyncio.sleep(0.02)  # let the state listener report the loss
                    continue
                what = "session expired" if isinstance(exc, SessionExpiredError) else (
                    "connection lost"
                )
                raise MetadataStoreError(
                    f"ZooKeeper {self.hosts}: {what} during {op}; outcome unknown"
                ) from exc
            except ConnectionClosedError as exc:
                raise ClientClosedError(
                    f"ZooKeeper metadata store {self.hosts}{self.root} is closed ({op})"
                ) from exc
            except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError) as exc:
                raise MetadataStoreError(
                    f"ZooKeeper {self.hosts}: {op}: unexpected {type(exc).__name__} "
                    f"(was {self.root} changed by hand?)"
                ) from exc
            except (KazooException, ZookeeperError) as exc:
                raise MetadataStoreError(
                    f"ZooKeeper {self.hosts}: {op} failed ({type(exc).__name__}); "
                    "outcome unknown"
                ) from exc

    async def _wait_connected(self, op: str, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while not self._connected:
            if self._closed:
                raise ClientClosedError(
                    f"ZooKeeper metadata store {self.hosts}{self.root} is closed ({op})"
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise MetadataStoreError(
                    f"ZooKeeper {self.hosts}: not connected for {self.op_timeout}s "
                    f"(server unreachable or session lost); {op} not attempted"
                )
            self._connected_event.clear()
            if self._is_connected():  # (cannot change in between: both run on the loop)
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connected_event.wait(), remaining)

    async def _issue(
        self, op: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
        deadline: float,
    ) -> Any:
        """Send one request and wait (bounded) for kazoo to complete it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def resolve() -> None:
            if not fut.done():
                fut.set_result(None)

        try:
            result = getattr(self._zk, method + "_async")(*args, **kwargs)
        except (SessionExpiredError, ConnectionClosedError) as exc:
            raise MetadataStoreError(f"ZooKeeper {self.hosts}: {op}: session lost") from exc
        result.rawlink(lambda _r: loop.call_soon_threadsafe(resolve))
        try:
            await asyncio.wait_for(fut, max(deadline - loop.time(), 0.001))
        except TimeoutError:
            raise MetadataStoreError(
                f"ZooKeeper {self.hosts}: {op} timed out after {self.op_timeout}s; "
                "outcome unknown"
            ) from None
        return result

    # -- ledgers -------------------------------------------------------------------------------

    async def allocate_ledger_id(self) -> int:
        async with self._id_lock:
            return await self._allocate_locked()

    async def _allocate_locked(self) -> int:
        while not self._id_pool:
            path = self._p("idgen")
            data, stat = await self._call("allocate_ledger_id", "get", path)
            try:
                first = int(data.decode())
            except ValueError:
                raise CorruptRecordError(f"ZooKeeper {path}: not an integer: {data[:32]!r}") \
                    from None
            try:
                await self._call(
                    "allocate_ledger_id", "set", path,
                    str(first + self._id_block).encode(), version=stat.version,
                    expect=(BadVersionError,),
                )
            except BadVersionError:
                continue  # another client claimed this block first
            self._id_pool = list(range(first + self._id_block - 1, first - 1, -1))
        return self._id_pool.pop()

    async def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        check_metadata(metadata)
        lid = metadata.ledger_id
        try:
            await self._call(
                "create_ledger", "create", self._ledger_path(lid), metadata.to_bytes(),
                makepath=True, expect=(NodeExistsError,),
            )
        except NodeExistsError:
            raise LedgerExistsError(f"ledger {lid} already exists") from None
        self._seen[lid] = 0
        return metadata.with_changes(version=0)

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        check_ledger_id(ledger_id)
        try:
            data, stat = await self._call(
                "read_ledger", "get", self._ledger_path(ledger_id), expect=(NoNodeError,)
            )
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        md = LedgerMetadata.from_bytes(data, stat.version)
        self._seen[ledger_id] = stat.version
        return md

    async def write_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        check_metadata(metadata)
        lid = metadata.ledger_id
        if expected_version < 0:  # ZooKeeper reads version -1 as "any version": never a CAS
            await self.read_ledger(lid)  # NoSuchLedgerError when absent, like the others
            raise MetadataVersionError(f"ledger {lid}: version {expected_version} is stale")
        try:
            stat = await self._call(
                "write_ledger", "set", self._ledger_path(lid), metadata.to_bytes(),
                version=expected_version, expect=(BadVersionError, NoNodeError),
            )
        except BadVersionError:
            raise MetadataVersionError(
                f"ledger {lid}: version {expected_version} is stale"
            ) from None
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {lid} does not exist") from None
        self._seen[lid] = stat.version
        return metadata.with_changes(version=stat.version)

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        check_ledger_id(ledger_id)
        if expected_version is not None and expected_version < 0:
            await self.read_ledger(ledger_id)
            raise MetadataVersionError(
                f"ledger {ledger_id}: version {expected_version} is stale"
            )
        try:
            await self._call(
                "delete_ledger", "delete", self._ledger_path(ledger_id),
                version=-1 if expected_version is None else expected_version,
                expect=(BadVersionError, NoNodeError),
            )
        except BadVersionError:
            raise MetadataVersionError(
                f"ledger {ledger_id}: version {expected_version} is stale"
            ) from None
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        self._seen[ledger_id] = None

    async def _children(self, op: str, path: str) -> list[str]:
        try:
            return sorted(await self._call(op, "get_children", path, expect=(NoNodeError,)))
        except NoNodeError:
            return []  # removed meanwhile

    async def _walk(self, op: str, base: str, prefix: str) -> list[tuple[int, str]]:
        """(ledger id, path) of every leaf under a two-level hierarchical tree."""
        out: list[tuple[int, str]] = []
        for top in await self._children(op, base):
            mids = await self._children(op, f"{base}/{top}")
            leaves = await asyncio.gather(*(self._children(op, f"{base}/{top}/{m}") for m in mids))
            for mid, names in zip(mids, leaves, strict=True):
                for leaf in names:
                    lid = _ledger_id_from(top, mid, leaf, prefix)
                    if lid is not None:
                        out.append((lid, f"{base}/{top}/{mid}/{leaf}"))
        return sorted(out)

    async def list_ledgers(self) -> list[int]:
        return [lid for lid, _ in await self._walk("list_ledgers", self._p("ledgers"), "L")]

    # -- key/value namespace ---------------------------------------------------------------------

    def _kv_path(self, key: str) -> str:
        return self._p("kv", key)

    async def _get_key(self, op: str, key: str) -> tuple[bytes, Any]:
        """(value, stat) of a key; NoSuchKeyError when absent or only a parent node."""
        try:
            data, stat = await self._call(op, "get", self._kv_path(key), expect=(NoNodeError,))
        except NoNodeError:
            raise NoSuchKeyError(f"key {key!r} does not exist") from None
        data = bytes(data or b"")
        if not data.startswith(_KEY_MARK):
            raise NoSuchKeyError(f"key {key!r} does not exist")
        return data[len(_KEY_MARK):], stat

    async def create_value(self, key: str, value: bytes) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)
        path = self._kv_path(key)
        for _ in range(20):
            try:
                _, stat = await self._call(
                    "create_value", "create", path, _KEY_MARK + data, makepath=True,
                    include_data=True, expect=(NodeExistsError,),
                )
            except NodeExistsError:
                # a parent node of deeper keys: it becomes this key, by CAS
                try:
                    old, stat = await self._call(
                        "create_value", "get", path, expect=(NoNodeError,)
                    )
                except NoNodeError:
                    continue
                if bytes(old or b"").startswith(_KEY_MARK):
                    raise KeyExistsError(f"key {key!r} already exists") from None
                try:
                    stat = await self._call(
                        "create_value", "set", path, _KEY_MARK + data, version=stat.version,
                        expect=(BadVersionError, NoNodeError),
                    )
                except (BadVersionError, NoNodeError):
                    continue
            self._seen_values[key] = stat.mzxid
            return VersionedValue(key, data, stat.mzxid)
        raise MetadataStoreError(f"could not create key {key!r}: contention")

    async def read_value(self, key: str) -> VersionedValue:
        check_key(key)
        data, stat = await self._get_key("read_value", key)
        self._seen_values[key] = stat.mzxid
        return VersionedValue(key, data, stat.mzxid)

    async def write_value(
        self, key: str, value: bytes, expected_version: int
    ) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)
        _, stat = await self._get_key("write_value", key)
        if stat.mzxid != expected_version:
            raise MetadataVersionError(
                f"key {key!r}: version {expected_version} is stale (store has {stat.mzxid})"
            )
        try:
            new = await self._call(
                "write_value", "set", self._kv_path(key), _KEY_MARK + data,
                version=stat.version, expect=(BadVersionError, NoNodeError),
            )
        except BadVersionError:
            raise MetadataVersionError(
                f"key {key!r}: version {expected_version} is stale (changed meanwhile)"
            ) from None
        except NoNodeError:
            raise NoSuchKeyError(f"key {key!r} does not exist") from None
        self._seen_values[key] = new.mzxid
        return VersionedValue(key, data, new.mzxid)

    async def delete_value(self, key: str, expected_version: int | None = None) -> None:
        check_key(key)
        path = self._kv_path(key)
        for _ in range(20):
            _, stat = await self._get_key("delete_value", key)
            if expected_version is not None and stat.mzxid != expected_version:
                raise MetadataVersionError(
                    f"key {key!r}: version {expected_version} is stale (store has {stat.mzxid})"
                )
            try:
                if stat.numChildren:  # keys below it stay: it becomes a bare parent node
                    await self._call(
                        "delete_value", "set", path, b"", version=stat.version,
                        expect=(BadVersionError, NoNodeError),
                    )
                else:
                    await self._call(
                        "delete_value", "delete", path, version=stat.version,
                        expect=(BadVersionError, NoNodeError, NotEmptyError),
                    )
            except (BadVersionError, NoNodeError, NotEmptyError):
                continue  # changed meanwhile: look again (a CAS then fails on the mzxid)
            self._seen_values[key] = None
            return
        raise MetadataStoreError(f"could not delete key {key!r}: contention")

    async def list_keys(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        found: list[str] = []

        async def walk(rel: str) -> None:
            base = self._p("kv", rel) if rel else self._p("kv")
            names = await self._children("list_keys", base)

            async def visit(name: str) -> None:
                child = f"{rel}/{name}" if rel else name
                try:
                    data, _ = await self._call(
                        "list_keys", "get", f"{base}/{name}", expect=(NoNodeError,)
                    )
                except NoNodeError:
                    return
                if bytes(data or b"").startswith(_KEY_MARK):
                    found.append(child)
                await walk(child)

            await asyncio.gather(*map(visit, names))

        await walk(prefix[:-1])
        return sorted(found)

    def watch_value(self, key: str, callback: Callable[[str], None]) -> Watch:
        """One kazoo DataWatch per watched key and store (as for ledgers)."""
        check_key(key)
        loop = self._watch_loop()

        def forget(w: CallbackWatch) -> None:
            lst = self._value_watches.get(key, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                self._value_watches.pop(key, None)
                recipe = self._value_recipes.pop(key, None)
                if recipe is not None:
                    recipe.stopped = True

        w = CallbackWatch(loop, lambda: callback(key), forget, threadsafe=True)
        self._value_watches.setdefault(key, []).append(w)
        recipe = self._value_recipes.get(key)
        if recipe is None:
            recipe = _LedgerRecipe(baseline=self._seen_values.get(key, _UNSEEN))
            self._value_recipes[key] = recipe
            path = self._kv_path(key)
            on_data = functools.partial(self._on_value_data, key, recipe)
            self._add_recipe(lambda: DataWatch(self._zk, path, on_data))
        elif recipe.version is not _UNSEEN and self._seen_values.get(key, _UNSEEN) not in (
            _UNSEEN, recipe.version,
        ):
            w.fire()
        return w

    def _on_value_data(
        self, key: str, recipe: _LedgerRecipe, data: bytes | None, stat: Any, *_: Any
    ) -> bool:
        """DataWatch callback (a kazoo thread): a parent-only node counts as absent."""
        if recipe.stopped:
            return False
        is_key = stat is not None and bytes(data or b"").startswith(_KEY_MARK)
        self._schedule(self._value_event, key, recipe, stat.mzxid if is_key else None)
        return True

    def _value_event(self, key: str, recipe: _LedgerRecipe, version: int | None) -> None:
        first = recipe.version is _UNSEEN
        recipe.version = version
        if first and recipe.baseline in (_UNSEEN, version):
            return
        if not recipe.stopped:
            for w in list(self._value_watches.get(key, ())):
                w.fire()

    # -- bookies -------------------------------------------------------------------------------

    async def _create_registration(self, reg: BookieRegistration, *, steal: bool = True) -> None:
        """Create ``reg``'s ephemeral, then remove its node in the other (writable/read-only)
        list. A node held by another session is replaced when ``steal`` (an explicit
        registration: the newest registrant wins, e.g. a restarted bookie whose old session
        has not expired yet); on re-registration after our own session expired it is left
        alone (a newer incarnation of the bookie owns it now)."""
        path = self._bookie_path(reg.bookie_id, reg.read_only)
        data = json.dumps({"address": reg.address}).encode()
        for _ in range(5):
            try:
                await self._call(
                    "register_bookie", "create", path, data, ephemeral=True,
                    expect=(NodeExistsError,),
                )
                break
            except NodeExistsError:
                try:
                    old, stat = await self._call(
                        "register_bookie", "get", path, expect=(NoNodeError,)
                    )
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == self._session_id and old == data:
                    break
                if not steal and stat.ephemeralOwner != self._session_id:
                    log.warning(
                        "bookie %s is registered by another session; not re-registering",
                        reg.bookie_id,
                    )
                    self._own.pop(reg.bookie_id, None)
                    return
                # someone else's (a previous incarnation of this bookie) or stale: replace
                with contextlib.suppress(NoNodeError, BadVersionError):
                    await self._call(
                        "register_bookie", "delete", path, version=stat.version,
                        expect=(NoNodeError, BadVersionError),
                    )
        else:
            raise MetadataStoreError(f"could not register bookie {reg.bookie_id}: contention")
        with contextlib.suppress(NoNodeError):
            await self._call(
                "register_bookie", "delete", self._bookie_path(reg.bookie_id, not reg.read_only),
                expect=(NoNodeError,),
            )

    async def register_bookie(self, registration: BookieRegistration) -> None:
        check_registration(registration)
        self._own[registration.bookie_id] = registration
        await self._create_registration(registration)

    async def unregister_bookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        self._own.pop(bookie_id, None)
        for ro in (False, True):
            with contextlib.suppress(NoNodeError):
                await self._call(
                    "unregister_bookie", "delete", self._bookie_path(bookie_id, ro),
                    expect=(NoNodeError,),
                )

    async def list_bookies(self) -> list[BookieRegistration]:
        found: dict[str, BookieRegistration] = {}
        for ro in (False, True):  # read-only wins while a flip is half done
            base = self._p("bookies", "readonly" if ro else "writable")
            names = await self._children("list_bookies", base)

            async def get(name: str, base: str = base) -> bytes | None:
                try:
                    data, _ = await self._call(
                        "list_bookies", "get", f"{base}/{name}", expect=(NoNodeError,)
                    )
                    return bytes(data)
                except NoNodeError:
                    return None

            for name, data in zip(names, await asyncio.gather(*map(get, names)), strict=True):
                if data is None:
                    continue
                try:
                    address = str(json.loads(data)["address"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise CorruptRecordError(
                        f"ZooKeeper registration of bookie {name}: {exc}"
                    ) from exc
                found[name] = BookieRegistration(name, address, ro)
        return [found[b] for b in sorted(found)]

    # -- watches -------------------------------------------------------------------------------

    def watch_ledger(self, ledger_id: int, callback: Callable[[int], None]) -> Watch:
        """One kazoo DataWatch per watched ledger and store, shared by all its watches (and
        stopped at the next event once the last one is cancelled)."""
        check_ledger_id(ledger_id)
        loop = self._watch_loop()

        def forget(w: CallbackWatch) -> None:
            lst = self._ledger_watches.get(ledger_id, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                self._ledger_watches.pop(ledger_id, None)
                recipe = self._ledger_recipes.pop(ledger_id, None)
                if recipe is not None:
                    recipe.stopped = True

        w = CallbackWatch(loop, lambda: callback(ledger_id), forget, threadsafe=True)
        self._ledger_watches.setdefault(ledger_id, []).append(w)
        recipe = self._ledger_recipes.get(ledger_id)
        if recipe is None:
            recipe = _LedgerRecipe(baseline=self._seen.get(ledger_id, _UNSEEN))
            self._ledger_recipes[ledger_id] = recipe
            path = self._ledger_path(ledger_id)
            on_data = functools.partial(self._on_ledger_data, ledger_id, recipe)
            self._add_recipe(lambda: DataWatch(self._zk, path, on_data))
        elif recipe.version is not _UNSEEN and self._seen.get(ledger_id, _UNSEEN) not in (
            _UNSEEN, recipe.version,
        ):
            w.fire()  # the caller read a version other than the one the watch knows
        return w

    def _on_ledger_data(
        self, ledger_id: int, recipe: _LedgerRecipe, data: bytes | None, stat: Any, *_: Any
    ) -> bool:
        """DataWatch callback (a kazoo thread): hand the new version to the loop."""
        if recipe.stopped:
            return False
        version = None if stat is None else stat.version
        self._schedule(self._ledger_event, ledger_id, recipe, version)
        return True

    def _ledger_event(self, ledger_id: int, recipe: _LedgerRecipe, version: int | None) -> None:
        first = recipe.version is _UNSEEN
        recipe.version = version
        if first and recipe.baseline in (_UNSEEN, version):
            return  # the first look: nothing changed since the caller last read
        if not recipe.stopped:
            for w in list(self._ledger_watches.get(ledger_id, ())):
                w.fire()

    def watch_bookies(self, callback: Callable[[], None]) -> Watch:
        """Two kazoo ChildrenWatches per store (writable, read-only), shared by all watches."""
        loop = self._watch_loop()

        def forget(w: CallbackWatch) -> None:
            if w in self._bookie_watches:
                self._bookie_watches.remove(w)

        w = CallbackWatch(loop, callback, forget, threadsafe=True)
        self._bookie_watches.append(w)
        if not self._bookie_recipes:
            self._bookie_recipes = True
            for ro in (False, True):
                base = self._p("bookies", "readonly" if ro else "writable")
                first = [True]

                def on_children(children: list[str], first: list[bool] = first) -> bool:
                    if self._closed:
                        return False
                    if first[0]:
                        first[0] = False
                    else:
                        self._schedule(self._bookies_event)
                    return True

                def make(base: str = base, fn: Any = on_children) -> Any:
                    return ChildrenWatch(self._zk, base, fn)

                self._add_recipe(make)
        return w

    def _bookies_event(self) -> None:
        for w in list(self._bookie_watches):
            w.fire()

    def _add_recipe(self, make: Callable[[], Any]) -> None:
        if self._started:
            self._spawn_recipe(make)
        else:
            self._pending_recipes.append(make)

    def _watch_loop(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise ClientClosedError(f"ZooKeeper metadata store {self.hosts}{self.root} is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        if not self._started:
            self._spawn(self._ensure_started_quietly())
        return loop

    async def _ensure_started_quietly(self) -> None:
        try:
            await self._ensure_started()
        except (MetadataStoreError, ClientClosedError) as exc:
            log.warning("ZooKeeper watch could not be established: %s", exc)

    def _start_recipes(self) -> None:
        pending, self._pending_recipes = self._pending_recipes, []
        for make in pending:
            self._spawn_recipe(make)

    def _spawn_recipe(self, make: Callable[[], Any]) -> None:
        """kazoo recipes do a blocking round trip in their constructor: run it off the loop."""
        assert self._loop is not None

        async def establish() -> None:
            try:
                await asyncio.to_thread(make)
            except (KazooException, ZookeeperError) as exc:
                log.warning("ZooKeeper watch could not be established: %r", exc)

        self._spawn(establish())

    # -- under-replication marks ---------------------------------------------------------------

    def _ur_path(self, ledger_id: int) -> str:
        return self._p("underreplication", "ledgers", ledger_subpath(ledger_id, "urL"))

    async def mark_under_replicated(self, ledger_id: int, missing_bookies: list[str]) -> None:
        check_ledger_id(ledger_id)
        for b in missing_bookies:
            check_bookie_id(b)
        path = self._ur_path(ledger_id)
        for _ in range(100):
            try:
                data, stat = await self._call(
                    "mark_under_replicated", "get", path, expect=(NoNodeError,)
                )
            except NoNodeError:
                value = json.dumps(merge_missing([], missing_bookies)).encode()
                try:
                    await self._call(
                        "mark_under_replicated", "create", path, value, makepath=True,
                        expect=(NodeExistsError, NoNodeError),
                    )
                    return
                except (NodeExistsError, NoNodeError):
                    continue
            merged = merge_missing(_parse_missing(data, ledger_id), missing_bookies)
            try:
                await self._call(
                    "mark_under_replicated", "set", path, json.dumps(merged).encode(),
                    version=stat.version, expect=(BadVersionError, NoNodeError),
                )
                return
            except (BadVersionError, NoNodeError):
                continue
        raise MetadataVersionError(f"under-replication mark of ledger {ledger_id}: too contended")

    async def list_under_replicated(self) -> dict[int, list[str]]:
        base = self._p("underreplication", "ledgers")
        out: dict[int, list[str]] = {}
        for lid, path in await self._walk("list_under_replicated", base, "urL"):
            try:
                data, _ = await self._call(
                    "list_under_replicated", "get", path, expect=(NoNodeError,)
                )
            except NoNodeError:
                continue
            out[lid] = _parse_missing(data, lid)
        return out

    async def clear_under_replicated(self, ledger_id: int) -> None:
        check_ledger_id(ledger_id)
        with contextlib.suppress(NoNodeError):
            await self._call(
                "clear_under_replicated", "delete", self._ur_path(ledger_id),
                expect=(NoNodeError,),
            )

    # -- cookies -------------------------------------------------------------------------------

    async def read_cookie(self, bookie_id: str) -> bytes | None:
        check_bookie_id(bookie_id)
        try:
            data, _ = await self._call(
                "read_cookie", "get", self._p("cookies", bookie_id), expect=(NoNodeError,)
            )
        except NoNodeError:
            return None
        return bytes(data)

    async def write_cookie(self, bookie_id: str, cookie: bytes) -> None:
        check_bookie_id(bookie_id)
        if not isinstance(cookie, bytes | bytearray):
            raise TypeError(f"cookie must be bytes, got {type(cookie).__name__}")
        path = self._p("cookies", bookie_id)
        for _ in range(10):
            try:
                await self._call("write_cookie", "set", path, bytes(cookie), expect=(NoNodeError,))
                return
            except NoNodeError:
                try:
                    await self._call(
                        "write_cookie", "create", path, bytes(cookie), expect=(NodeExistsError,)
                    )
                    return
                except NodeExistsError:
                    continue
        raise MetadataStoreError(f"could not write the cookie of {bookie_id}: contention")

    async def delete_cookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        with contextlib.suppress(NoNodeError):
            await self._call(
                "delete_cookie", "delete", self._p("cookies", bookie_id), expect=(NoNodeError,)
            )

    # -- test hooks / lifecycle ----------------------------------------------------------------

    async def corrupt_ledger(self, ledger_id: int, data: bytes) -> None:
        """Overwrite a ledger's znode data (tests: readers must raise CorruptRecordError)."""
        await self._call("corrupt_ledger", "set", self._ledger_path(ledger_id), data)

    def forget_registrations(self) -> None:
        """Stop owning this store's registrations (they will not be re-created); used to
        simulate the owning process dying."""
        self._own.clear()

    async def close(self) -> None:
        """Close the session: its ephemeral registrations go at once. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._own.clear()
        for watches in list(self._ledger_watches.values()):
            for w in list(watches):
                w.cancel()
        for vw in list(self._value_watches.values()):
            for w in list(vw):
                w.cancel()
        for bw in list(self._bookie_watches):
            bw.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

        def stop() -> None:
            self._zk.stop()
            self._zk.close()

        await asyncio.to_thread(stop)


def _parse_missing(data: bytes, ledger_id: int) -> list[str]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise CorruptRecordError(f"under-replication mark of ledger {ledger_id}: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(b, str) for b in value):
        raise CorruptRecordError(f"under-replication mark of ledger {ledger_id}: not a list")
    return value
