"""SQLite metadata store (``sqlite:///abs/path.db``): the embedded default.

Several processes on one machine may share the file:

* WAL mode and a busy timeout, so readers never block the writer and writers queue politely;
* every read-modify-write (CAS, id allocation, mark merging) is one ``BEGIN IMMEDIATE``
  transaction, so the compare and the write are atomic across processes;
* ``synchronous=FULL`` by default: a metadata write that returned survives a power cut (a
  writer acknowledges entries only after their ensemble is in metadata, rule R3).

All SQLite calls run on one dedicated thread per store (one connection, FIFO), never on the
event loop. Liveness of bookies is a lease: a registration carries an expiry that this store
refreshes from a heartbeat task; a registration whose owner stopped heartbeating is simply not
listed once it expires. Watches poll (:mod:`.watches`); the file's schema and shared SQL are
in :mod:`.schema`, locks in :mod:`.locks`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from pybk.errors import (
    ClientClosedError,
    CorruptRecordError,
    KeyExistsError,
    LedgerExistsError,
    MetadataStoreError,
    NoSuchKeyError,
    NoSuchLedgerError,
)
from pybk.metadata._common import (
    MAX_LEDGER_ID,
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
from pybk.metadata.sqlite import forksafe, records
from pybk.metadata.sqlite.locks import lock_row, release_lock, release_locks, take_lock
from pybk.metadata.sqlite.schema import (
    UPSERT_BOOKIE,
    bump,
    bump_bookies,
    connect,
    counter,
    immediate,
    live_bookies,
    refresh_registrations,
    set_counter,
)
from pybk.metadata.sqlite.watches import WatchPoller

__all__ = ["SqliteMetadataStore"]

log = logging.getLogger("pybk.metadata.sqlite")
T = TypeVar("T")


class SqliteMetadataStore(MetadataStore):
    """A :class:`MetadataStore` in one SQLite file, safe to share between local processes.

    ``ttl``: seconds a bookie registration stays listed without a heartbeat;
    ``heartbeat_interval``: how often this store refreshes its registrations;
    ``poll_interval``: how often watches look for changes;
    ``id_block``: ledger ids claimed per allocator transaction (unused ones are skipped).
    """

    def __init__(
        self,
        path: str,
        *,
        ttl: float = 10.0,
        heartbeat_interval: float = 2.0,
        poll_interval: float = 0.05,
        id_block: int = 16,
        busy_timeout: float = 30.0,
        synchronous: str = "FULL",
    ) -> None:
        if not 0 < heartbeat_interval < ttl:
            raise ValueError(
                f"need 0 < heartbeat_interval < ttl, got {heartbeat_interval} and {ttl}"
            )
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        if id_block < 1:
            raise ValueError(f"id_block must be >= 1, got {id_block}")
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"bad synchronous mode {synchronous!r}")
        self.path = path
        self.ttl = ttl
        self.heartbeat_interval = heartbeat_interval
        self.poll_interval = poll_interval
        self._id_block = id_block
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous.upper()
        self.owner = uuid.uuid4().hex  # this store's identity as a registration owner
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="pybk-sqlite"
        )
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._id_pool: list[int] = []  # claimed ids, next one last
        self._id_lock = asyncio.Lock()  # one block claim at a time per store
        self._own: dict[str, BookieRegistration] = {}
        #: locks this store holds: name -> (owner label, wall-clock expiry it last wrote)
        self._held: dict[str, tuple[str, float]] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._watches = WatchPoller(self._run, poll_interval=poll_interval, name=self.owner[:8])
        self._forked = False
        forksafe.track(self)

    def forked(self) -> sqlite3.Connection | None:
        """In a child forked from this store's process: closed for good, and its connection
        handed over to be held unclosed (pybk.metadata.sqlite.forksafe)."""
        conn, self._conn = self._conn, None
        self._closed = self._forked = True
        return conn

    # -- thread plumbing ---------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """The store's connection, opened and initialised on first use (on its thread)."""
        if self._conn is None:
            self._conn = connect(self.path, busy_timeout=self._busy_timeout,
                                 synchronous=self._synchronous)
        return self._conn

    async def _run(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on the store's thread; map SQLite failures to pybk errors."""
        if self._closed:
            if self._forked:
                raise ClientClosedError(
                    f"SQLite metadata store {self.path} was opened in the process this one "
                    f"was forked from: open a store in this process ({op})")
            raise ClientClosedError(f"SQLite metadata store {self.path} is closed ({op})")

        def call() -> T:
            try:
                return fn(self._connect())
            except sqlite3.DatabaseError as exc:
                text = str(exc)
                if "not a database" in text or "malformed" in text:
                    raise CorruptRecordError(
                        f"metadata database {self.path} is damaged: {text}", path=self.path
                    ) from exc
                raise MetadataStoreError(f"SQLite metadata {self.path}: {op}: {text}") from exc
            except sqlite3.Error as exc:
                raise MetadataStoreError(f"SQLite metadata {self.path}: {op}: {exc}") from exc

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, call)

    # -- ledgers -----------------------------------------------------------------------------

    async def allocate_ledger_id(self) -> int:
        async with self._id_lock:
            return await self._allocate_locked()

    async def _allocate_locked(self) -> int:
        if not self._id_pool:
            block = self._id_block

            def claim(conn: sqlite3.Connection) -> list[int]:
                with immediate(conn):
                    ids = allocatable(counter(conn, "next_ledger_id"), block)
                    set_counter(conn, "next_ledger_id", ids.stop)
                return list(ids)

            claimed = await self._run("allocate_ledger_id", claim)
            self._id_pool = claimed[::-1]
        return self._id_pool.pop()

    async def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        check_metadata(metadata)
        metadata = stamped(metadata, time.time())
        data = metadata.to_bytes()
        lid = metadata.ledger_id

        def create(conn: sqlite3.Connection) -> int:
            with immediate(conn):
                if conn.execute("SELECT 1 FROM ledgers WHERE id = ?", (lid,)).fetchone():
                    raise LedgerExistsError(f"ledger {lid} already exists")
                version = bump(conn)
                conn.execute("INSERT INTO ledgers VALUES (?, ?, ?)", (lid, data, version))
                if lid < MAX_LEDGER_ID and counter(conn, "next_ledger_id") <= lid:
                    set_counter(conn, "next_ledger_id", lid + 1)
                return version

        version = await self._run("create_ledger", create)
        self._watches.ledger_returned(lid, version, changed=True)
        return metadata.with_changes(version=version)

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        check_ledger_id(ledger_id)

        def read(conn: sqlite3.Connection) -> tuple[bytes, int] | None:
            row = conn.execute(
                "SELECT data, version FROM ledgers WHERE id = ?", (ledger_id,)
            ).fetchone()
            return None if row is None else (bytes(row[0]), int(row[1]))

        row = await self._run("read_ledger", read)
        if row is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        md = LedgerMetadata.from_bytes(row[0], row[1])
        self._watches.ledger_returned(ledger_id, row[1], changed=False)
        return md

    async def write_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        check_metadata(metadata)
        data = metadata.to_bytes()
        lid = metadata.ledger_id

        cas = functools.partial(records.cas_row, table="ledgers", column="data", id_column="id",
                                ident=lid, data=data, expected=expected_version,
                                what=f"ledger {lid}")
        version = await self._run("write_ledger", cas)
        self._watches.ledger_returned(lid, version, changed=True)
        return metadata.with_changes(version=version)

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        check_ledger_id(ledger_id)

        delete = functools.partial(records.delete_row, table="ledgers", id_column="id",
                                   ident=ledger_id, expected=expected_version,
                                   what=f"ledger {ledger_id}")
        await self._run("delete_ledger", delete)
        self._watches.ledger_returned(ledger_id, None, changed=True)

    async def list_ledgers(self) -> list[int]:
        def ids(conn: sqlite3.Connection) -> list[int]:
            return [r[0] for r in conn.execute("SELECT id FROM ledgers ORDER BY id")]

        return await self._run("list_ledgers", ids)

    # -- key/value namespace -------------------------------------------------------------------

    async def create_value(self, key: str, value: bytes) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)

        def create(conn: sqlite3.Connection) -> int:
            with immediate(conn):
                if conn.execute("SELECT 1 FROM kv WHERE key = ?", (key,)).fetchone():
                    raise KeyExistsError(f"key {key!r} already exists")
                version = bump(conn)
                conn.execute("INSERT INTO kv VALUES (?, ?, ?)", (key, data, version))
                return version

        version = await self._run("create_value", create)
        self._watches.value_returned(key, version, changed=True)
        return VersionedValue(key, data, version)

    async def read_value(self, key: str) -> VersionedValue:
        check_key(key)

        def read(conn: sqlite3.Connection) -> tuple[bytes, int] | None:
            row = conn.execute("SELECT value, version FROM kv WHERE key = ?", (key,)).fetchone()
            return None if row is None else (bytes(row[0]), int(row[1]))

        row = await self._run("read_value", read)
        if row is None:
            raise NoSuchKeyError(f"key {key!r} does not exist")
        self._watches.value_returned(key, row[1], changed=False)
        return VersionedValue(key, row[0], row[1])

    async def write_value(
        self, key: str, value: bytes, expected_version: int
    ) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)

        cas = functools.partial(records.cas_row, table="kv", column="value", id_column="key",
                                ident=key, data=data, expected=expected_version,
                                what=f"key {key!r}")
        version = await self._run("write_value", cas)
        self._watches.value_returned(key, version, changed=True)
        return VersionedValue(key, data, version)

    async def delete_value(self, key: str, expected_version: int | None = None) -> None:
        check_key(key)

        delete = functools.partial(records.delete_row, table="kv", id_column="key", ident=key,
                                   expected=expected_version, what=f"key {key!r}")
        await self._run("delete_value", delete)
        self._watches.value_returned(key, None, changed=True)

    async def list_keys(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)

        def keys(conn: sqlite3.Connection) -> list[str]:
            # a range on the primary key: '0' is the character after '/'
            if not prefix:
                rows = conn.execute("SELECT key FROM kv ORDER BY key")
            else:
                rows = conn.execute(
                    "SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                    (prefix, prefix[:-1] + "0"),
                )
            return [str(r[0]) for r in rows]

        return await self._run("list_keys", keys)

    def watch_value(self, key: str, callback: Callable[[str], None]) -> Watch:
        check_key(key)
        return self._watches.watch_value(key, lambda: callback(key))

    # -- bookies -----------------------------------------------------------------------------

    async def register_bookie(self, registration: BookieRegistration) -> None:
        check_registration(registration)
        r = registration
        owner, ttl = self.owner, self.ttl

        def upsert(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                conn.execute(
                    UPSERT_BOOKIE,
                    (r.bookie_id, r.address, int(r.read_only), owner, time.time() + ttl, r.rack,
                     r.group),
                )
                bump_bookies(conn)

        await self._run("register_bookie", upsert)
        self._own[r.bookie_id] = r
        self._ensure_heartbeat()

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(
                self._heartbeat_loop(), name=f"pybk-sqlite-heartbeat-{self.owner[:8]}"
            )

    async def unregister_bookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        self._own.pop(bookie_id, None)

        def delete(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                cur = conn.execute("DELETE FROM bookies WHERE bookie_id = ?", (bookie_id,))
                if cur.rowcount:
                    bump_bookies(conn)

        await self._run("unregister_bookie", delete)

    async def list_bookies(self) -> list[BookieRegistration]:
        bookies, version, at = await self._run("list_bookies", live_bookies)
        self._watches.returned_bookies = (version, at)
        return bookies

    async def _heartbeat_loop(self) -> None:
        """Refresh our registrations' expiry; re-create any that lapsed (e.g. after a pause),
        but never take over a bookie id that another live owner registered since."""
        owner = self.owner
        while self._own or self._held:
            await asyncio.sleep(self.heartbeat_interval)
            self._expire_held_locks()
            renewing = dict(self._held)
            refresh = functools.partial(
                refresh_registrations, regs=list(self._own.values()), owner=owner, ttl=self.ttl,
                locks=sorted(renewing),
            )
            try:
                kept, expiry = await self._run("heartbeat", refresh)
            except (MetadataStoreError, CorruptRecordError) as exc:
                log.warning("bookie registration heartbeat failed: %s", exc)
                continue
            except ClientClosedError:
                return
            for name, taken in renewing.items():
                if self._held.get(name) is not taken:
                    continue  # released or taken again while renewing: that take stands
                if name in kept:
                    self._held[name] = (self._held[name][0], expiry)
                else:  # taken over after our lease lapsed, or removed by hand
                    self._lost_lock(name)

    def _expire_held_locks(self) -> None:
        """Stop claiming locks whose lease ran out without a successful renewal."""
        now = time.time()
        for name, (_, expiry) in list(self._held.items()):
            if expiry <= now:
                self._lost_lock(name)

    def _lost_lock(self, name: str) -> None:
        if self._held.pop(name, None) is not None:
            log.warning("SQLite metadata %s: lost lock %s (lease not renewed)", self.path, name)
            self._watches.lock_lost(name)

    # -- watches (see .watches for the guarantee and how each baseline is kept) ---------------

    def watch_ledger(self, ledger_id: int, callback: Callable[[int], None]) -> Watch:
        check_ledger_id(ledger_id)
        return self._watches.watch_ledger(ledger_id, lambda: callback(ledger_id))

    def watch_bookies(self, callback: Callable[[], None]) -> Watch:
        return self._watches.watch_bookies(callback)

    async def sync_watches(self) -> bool:
        """Wait for the poll that compares every watch set so far (bounded by 100 polls)."""
        return await self._watches.established(max(1.0, 100 * self.poll_interval))

    # -- under-replication marks (SQL in .records) ---------------------------------------------

    async def mark_under_replicated(self, ledger_id: int, missing_bookies: list[str]) -> None:
        check_ledger_id(ledger_id)
        for b in missing_bookies:
            check_bookie_id(b)
        await self._run("mark_under_replicated", functools.partial(
            records.merge_mark, ledger_id=ledger_id, added=list(missing_bookies)))

    async def list_under_replicated(self) -> dict[int, list[str]]:
        return await self._run("list_under_replicated", records.list_marks)

    async def clear_under_replicated(
        self, ledger_id: int, expected: Sequence[str] | None = None
    ) -> bool:
        check_ledger_id(ledger_id)
        want = check_expected_marks(expected)
        return bool(await self._run("clear_under_replicated", functools.partial(
            records.clear_mark, ledger_id=ledger_id, want=want)))

    # -- locks and elections -------------------------------------------------------------------

    async def try_lock(self, name: str, owner: str) -> bool:
        check_key(name)
        check_owner(owner)
        take = functools.partial(take_lock, name=name, owner=owner, holder=self.owner,
                                 ttl=self.ttl)
        expiry, version, at, changed = await self._run("try_lock", take)
        self._watches.lock_returned(name, version, at, changed=changed)
        if expiry is None:
            return False
        self._held[name] = (owner, expiry)
        self._ensure_heartbeat()
        return True

    async def unlock(self, name: str) -> None:
        check_key(name)
        if self._held.pop(name, None) is None:
            return
        self._watches.lock_lost(name)  # not holding it any more, whatever the file says
        release = functools.partial(release_lock, name=name, holder=self.owner)
        version, at = await self._run("unlock", release)
        if version is not None:
            self._watches.lock_returned(name, version, at, changed=True)

    async def lock_owner(self, name: str) -> str | None:
        check_key(name)
        owner, version, at = await self._run("lock_owner", functools.partial(lock_row, name=name))
        self._watches.lock_returned(name, version, at, changed=False)
        return owner

    async def list_locks(self, prefix: str = "") -> dict[str, str]:
        check_prefix(prefix)

        def held(conn: sqlite3.Connection) -> dict[str, str]:
            rows = conn.execute(
                "SELECT name, owner FROM locks WHERE expires_at > ? ORDER BY name", (time.time(),)
            )
            return {str(n): str(o) for n, o in rows if str(n).startswith(prefix)}

        return await self._run("list_locks", held)

    @property
    def polls(self) -> int:
        """Completed watch polls (tests wait on it; a gauge for operators)."""
        return self._watches.polls

    def holds_lock(self, name: str) -> bool:
        held = self._held.get(name)
        return not self._closed and held is not None and held[1] > time.time()

    def watch_lock(self, name: str, callback: Callable[[str], None]) -> Watch:
        check_key(name)
        return self._watches.watch_lock(name, lambda: callback(name))

    def election(self, name: str, candidate: str) -> Election:
        return LockElection(self, name, candidate, retry_interval=self.heartbeat_interval)

    async def election_leader(self, name: str) -> str | None:
        return await self.lock_owner(election_lock(name))

    # -- cookies (SQL in .records) ----------------------------------------------------------------

    async def read_cookie(self, bookie_id: str) -> bytes | None:
        check_bookie_id(bookie_id)
        return await self._run("read_cookie", functools.partial(
            records.read_cookie, bookie_id=bookie_id))

    async def write_cookie(self, bookie_id: str, cookie: bytes) -> None:
        check_bookie_id(bookie_id)
        if not isinstance(cookie, bytes | bytearray):
            raise TypeError(f"cookie must be bytes, got {type(cookie).__name__}")
        await self._run("write_cookie", functools.partial(
            records.write_cookie, bookie_id=bookie_id, cookie=bytes(cookie)))

    async def delete_cookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        await self._run("delete_cookie", functools.partial(
            records.delete_cookie, bookie_id=bookie_id))

    # -- test hooks / lifecycle ----------------------------------------------------------------

    async def corrupt_ledger(self, ledger_id: int, data: bytes) -> None:
        """Overwrite a ledger's stored bytes (tests: readers must raise CorruptRecordError)."""
        await self._run("corrupt_ledger", functools.partial(
            records.overwrite_ledger, ledger_id=ledger_id, data=data))

    async def raw_ledger(self, ledger_id: int) -> bytes:
        return await self._run("raw_ledger", functools.partial(
            records.raw_ledger, ledger_id=ledger_id))

    async def check_invariants(self) -> None:
        """Assert the file's invariants (the ``_check()`` habit; tests call it after
        concurrent work): ids and versions are never handed out twice, marks are canonical."""
        await self._run("check_invariants", records.check_invariants)

    async def crash(self) -> None:
        """Stop at once without unregistering (an in-process kill -9 of the owner): the
        registrations and locks stay in the file until their lease expires."""
        self._own.clear()
        self._held.clear()
        await self._shutdown()

    async def close(self) -> None:
        """Unregister this store's bookies, stop heartbeats and watch polling. Idempotent."""
        if self._closed:
            return
        own = sorted(self._own)
        self._own.clear()
        held = sorted(self._held)
        self._held.clear()
        if own or held:
            owner = self.owner

            def delete(conn: sqlite3.Connection) -> None:
                with immediate(conn):
                    for b in own:
                        conn.execute(
                            "DELETE FROM bookies WHERE bookie_id = ? AND owner = ?", (b, owner)
                        )
                    release_locks(conn, held, owner)
                    if own:
                        bump_bookies(conn)

            try:
                await self._run("close", delete)
            except (MetadataStoreError, CorruptRecordError) as exc:
                log.warning("could not unregister %s on close: %s", own, exc)
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        task = self._heartbeat
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._watches.stop()

        def close_conn() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, close_conn)
        self._executor.shutdown(wait=False)
