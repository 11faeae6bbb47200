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
listed once it expires. Watches poll: one cheap query of a change counter per interval while
any ledger watch exists, plus the live bookie list while any bookie watch exists.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

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
    LockElection,
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
from pybk.metadata.files import private_file

__all__ = [
    "SCHEMA_VERSION",
    "SqliteMetadataStore",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMA_VERSION = 2  # 2: bookies.rack, locks
_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledgers (
    id INTEGER PRIMARY KEY, data BLOB NOT NULL, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS bookies (
    bookie_id TEXT PRIMARY KEY, address TEXT NOT NULL, read_only INTEGER NOT NULL,
    owner TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS cookies (bookie_id TEXT PRIMARY KEY, cookie BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS under_replicated (ledger_id INTEGER PRIMARY KEY, missing TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY, value BLOB NOT NULL, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS locks (
    name TEXT PRIMARY KEY, owner TEXT NOT NULL, holder TEXT NOT NULL, expires_at REAL NOT NULL);
INSERT OR IGNORE INTO counters VALUES ('next_ledger_id', 0), ('version', 0), ('changes', 0);
"""

_UPSERT_BOOKIE = """
INSERT INTO bookies (bookie_id, address, read_only, owner, expires_at, rack)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (bookie_id) DO UPDATE SET address = excluded.address,
    read_only = excluded.read_only, owner = excluded.owner, expires_at = excluded.expires_at,
    rack = excluded.rack
"""


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
        self._lock_watches: dict[str, list[CallbackWatch]] = {}
        self._seen_locks: dict[str, str | None] = {}  # lock name -> holder last seen
        self._heartbeat: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._ledger_watches: dict[int, list[CallbackWatch]] = {}
        self._bookie_watches: list[CallbackWatch] = []
        self._seen: dict[int, int | None] = {}  # ledger id -> last version seen (None = absent)
        self._value_watches: dict[str, list[CallbackWatch]] = {}
        self._seen_values: dict[str, int | None] = {}  # key -> last version seen (None = absent)
        #: Completed watch polls (tests wait on it; a gauge for operators).
        self.polls = 0

    # -- thread plumbing ---------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """The store's connection, opened and initialised on first use.

        Several stores (often several processes) may open a new file at the same moment. The
        switch to WAL mode then needs a lock that two connections can each be waiting to
        upgrade to; SQLite resolves such a deadlock by answering SQLITE_BUSY at once instead
        of invoking the busy timeout, so initialisation is retried (bounded by the busy
        timeout, with a growing pause) rather than failing the caller's first operation."""
        if self._conn is None:
            deadline = time.monotonic() + self._busy_timeout
            pause = 0.002
            while True:
                try:
                    self._conn = self._open_connection()
                    break
                except sqlite3.OperationalError as exc:
                    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # primary result code
                    if code not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                        raise
                    if time.monotonic() + pause > deadline:
                        raise
                    time.sleep(pause)  # on the store's own thread, never the event loop
                    pause = min(pause * 2, 0.1)
        return self._conn

    def _open_connection(self) -> sqlite3.Connection:
        private_file(self.path)
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            if str(mode).lower() != "wal":  # e.g. a filesystem without shared memory
                log.warning("%s: WAL mode unavailable (journal_mode=%s)", self.path, mode)
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            (found,) = conn.execute("PRAGMA user_version").fetchone()
            if found > SCHEMA_VERSION:
                raise MetadataStoreError(
                    f"{self.path}: metadata schema version {found} is newer than this "
                    f"pybk understands ({SCHEMA_VERSION})"
                )
            with _immediate(conn):
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                columns = {row[1] for row in conn.execute("PRAGMA table_info(bookies)")}
                if "rack" not in columns:  # a version 1 file: registrations gain a location
                    conn.execute("ALTER TABLE bookies ADD COLUMN rack TEXT NOT NULL DEFAULT ''")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.close()
            raise
        return conn

    async def _run(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on the store's thread; map SQLite failures to pybk errors."""
        if self._closed:
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
                with _immediate(conn):
                    first = _counter(conn, "next_ledger_id")
                    _set_counter(conn, "next_ledger_id", first + block)
                return list(range(first, first + block))

            claimed = await self._run("allocate_ledger_id", claim)
            self._id_pool = claimed[::-1]
        return self._id_pool.pop()

    async def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        check_metadata(metadata)
        metadata = stamped(metadata, time.time())
        data = metadata.to_bytes()
        lid = metadata.ledger_id

        def create(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                if conn.execute("SELECT 1 FROM ledgers WHERE id = ?", (lid,)).fetchone():
                    raise LedgerExistsError(f"ledger {lid} already exists")
                version = _bump(conn)
                conn.execute("INSERT INTO ledgers VALUES (?, ?, ?)", (lid, data, version))
                if _counter(conn, "next_ledger_id") <= lid:
                    _set_counter(conn, "next_ledger_id", lid + 1)
                return version

        version = await self._run("create_ledger", create)
        self._changed_here(lid, version)
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
        self._seen[ledger_id] = row[1]
        return md

    async def write_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        check_metadata(metadata)
        data = metadata.to_bytes()
        lid = metadata.ledger_id

        def cas(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                current = _ledger_version(conn, lid)
                if current != expected_version:
                    raise MetadataVersionError(
                        f"ledger {lid}: version {expected_version} is stale (store has {current})"
                    )
                version = _bump(conn)
                conn.execute(
                    "UPDATE ledgers SET data = ?, version = ? WHERE id = ?", (data, version, lid)
                )
                return version

        version = await self._run("write_ledger", cas)
        self._changed_here(lid, version)
        return metadata.with_changes(version=version)

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        check_ledger_id(ledger_id)

        def delete(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                current = _ledger_version(conn, ledger_id)
                if expected_version is not None and current != expected_version:
                    raise MetadataVersionError(
                        f"ledger {ledger_id}: version {expected_version} is stale "
                        f"(store has {current})"
                    )
                conn.execute("DELETE FROM ledgers WHERE id = ?", (ledger_id,))
                _bump(conn)

        await self._run("delete_ledger", delete)
        self._changed_here(ledger_id, None)

    async def list_ledgers(self) -> list[int]:
        def ids(conn: sqlite3.Connection) -> list[int]:
            return [r[0] for r in conn.execute("SELECT id FROM ledgers ORDER BY id")]

        return await self._run("list_ledgers", ids)

    # -- key/value namespace -------------------------------------------------------------------

    async def create_value(self, key: str, value: bytes) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)

        def create(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                if conn.execute("SELECT 1 FROM kv WHERE key = ?", (key,)).fetchone():
                    raise KeyExistsError(f"key {key!r} already exists")
                version = _bump(conn)
                conn.execute("INSERT INTO kv VALUES (?, ?, ?)", (key, data, version))
                return version

        version = await self._run("create_value", create)
        self._value_changed_here(key, version)
        return VersionedValue(key, data, version)

    async def read_value(self, key: str) -> VersionedValue:
        check_key(key)

        def read(conn: sqlite3.Connection) -> tuple[bytes, int] | None:
            row = conn.execute("SELECT value, version FROM kv WHERE key = ?", (key,)).fetchone()
            return None if row is None else (bytes(row[0]), int(row[1]))

        row = await self._run("read_value", read)
        if row is None:
            raise NoSuchKeyError(f"key {key!r} does not exist")
        self._seen_values[key] = row[1]
        return VersionedValue(key, row[0], row[1])

    async def write_value(
        self, key: str, value: bytes, expected_version: int
    ) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)

        def cas(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                current = _value_version(conn, key)
                if current != expected_version:
                    raise MetadataVersionError(
                        f"key {key!r}: version {expected_version} is stale (store has {current})"
                    )
                version = _bump(conn)
                conn.execute(
                    "UPDATE kv SET value = ?, version = ? WHERE key = ?", (data, version, key)
                )
                return version

        version = await self._run("write_value", cas)
        self._value_changed_here(key, version)
        return VersionedValue(key, data, version)

    async def delete_value(self, key: str, expected_version: int | None = None) -> None:
        check_key(key)

        def delete(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                current = _value_version(conn, key)
                if expected_version is not None and current != expected_version:
                    raise MetadataVersionError(
                        f"key {key!r}: version {expected_version} is stale (store has {current})"
                    )
                conn.execute("DELETE FROM kv WHERE key = ?", (key,))
                _bump(conn)

        await self._run("delete_value", delete)
        self._value_changed_here(key, None)

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

        def forget(w: CallbackWatch) -> None:
            lst = self._value_watches.get(key, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                self._value_watches.pop(key, None)

        w = CallbackWatch(asyncio.get_running_loop(), lambda: callback(key), forget)
        self._value_watches.setdefault(key, []).append(w)
        self._ensure_poller()
        return w

    # -- bookies -----------------------------------------------------------------------------

    async def register_bookie(self, registration: BookieRegistration) -> None:
        check_registration(registration)
        r = registration
        owner, ttl = self.owner, self.ttl

        def upsert(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute(
                    _UPSERT_BOOKIE,
                    (r.bookie_id, r.address, int(r.read_only), owner, time.time() + ttl, r.rack),
                )

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
            with _immediate(conn):
                conn.execute("DELETE FROM bookies WHERE bookie_id = ?", (bookie_id,))

        await self._run("unregister_bookie", delete)

    async def list_bookies(self) -> list[BookieRegistration]:
        return await self._run("list_bookies", _live_bookies)

    async def _heartbeat_loop(self) -> None:
        """Refresh our registrations' expiry; re-create any that lapsed (e.g. after a pause),
        but never take over a bookie id that another live owner registered since."""
        owner = self.owner
        while self._own or self._held:
            await asyncio.sleep(self.heartbeat_interval)
            self._expire_held_locks()
            refresh = functools.partial(
                _refresh_registrations, regs=list(self._own.values()), owner=owner, ttl=self.ttl,
                locks=sorted(self._held),
            )
            try:
                kept, expiry = await self._run("heartbeat", refresh)
            except (MetadataStoreError, CorruptRecordError) as exc:
                log.warning("bookie registration heartbeat failed: %s", exc)
                continue
            except ClientClosedError:
                return
            for name in list(self._held):
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
            self._lock_changed_here(name, None)

    # -- watches -----------------------------------------------------------------------------

    def _changed_here(self, ledger_id: int, version: int | None) -> None:
        """A change made through this store: watchers here hear of it at once (the poller
        only reports versions that differ from what this store last saw, its own writes
        included)."""
        self._seen[ledger_id] = version
        for w in list(self._ledger_watches.get(ledger_id, ())):
            w.fire()

    def _value_changed_here(self, key: str, version: int | None) -> None:
        self._seen_values[key] = version
        for w in list(self._value_watches.get(key, ())):
            w.fire()

    def watch_ledger(self, ledger_id: int, callback: Callable[[int], None]) -> Watch:
        check_ledger_id(ledger_id)

        def forget(w: CallbackWatch) -> None:
            lst = self._ledger_watches.get(ledger_id, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                self._ledger_watches.pop(ledger_id, None)

        w = CallbackWatch(asyncio.get_running_loop(), lambda: callback(ledger_id), forget)
        self._ledger_watches.setdefault(ledger_id, []).append(w)
        self._ensure_poller()
        return w

    def watch_bookies(self, callback: Callable[[], None]) -> Watch:
        def forget(w: CallbackWatch) -> None:
            if w in self._bookie_watches:
                self._bookie_watches.remove(w)

        w = CallbackWatch(asyncio.get_running_loop(), callback, forget)
        self._bookie_watches.append(w)
        self._ensure_poller()
        return w

    def _ensure_poller(self) -> None:
        if self._closed:
            raise ClientClosedError(f"SQLite metadata store {self.path} is closed")
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(
                self._poll_loop(), name=f"pybk-sqlite-watch-{self.owner[:8]}"
            )

    async def _poll_loop(self) -> None:
        """Compare versions / the live bookie set with what watchers last saw.

        Ledger baselines are the versions this store last read or wrote (so a change made by
        someone else between the caller's read and its watch is still reported), else the
        version found on the first poll. Idle cost: one counter query per interval.
        """
        last_changes = -1
        last_bookies: list[BookieRegistration] | None = None
        while not self._closed and (
            self._ledger_watches or self._bookie_watches or self._value_watches
            or self._lock_watches
        ):
            watched = sorted(self._ledger_watches)
            keys = sorted(self._value_watches)
            lock_names = sorted(self._lock_watches)
            want_bookies = bool(self._bookie_watches)
            force = any(lid not in self._seen for lid in watched) or any(
                k not in self._seen_values for k in keys
            )
            poll = functools.partial(
                _poll_changes,
                watched=watched,
                keys=keys,
                force=force,
                last_changes=last_changes,
                want_bookies=want_bookies,
                lock_names=lock_names,
            )
            try:
                changes, versions, key_versions, bookies, holders = await self._run(
                    "watch poll", poll)
            except ClientClosedError:
                return
            except (MetadataStoreError, CorruptRecordError) as exc:
                log.warning("metadata watch poll failed: %s", exc)
                await asyncio.sleep(self.poll_interval)
                continue
            if versions is not None:
                for lid in watched:
                    now = versions.get(lid)
                    if lid not in self._seen:
                        self._seen[lid] = now
                    elif self._seen[lid] != now:
                        self._seen[lid] = now
                        for w in list(self._ledger_watches.get(lid, ())):
                            w.fire()
            if key_versions is not None:
                for key in keys:
                    now_v = key_versions.get(key)
                    if key not in self._seen_values:
                        self._seen_values[key] = now_v
                    elif self._seen_values[key] != now_v:
                        self._seen_values[key] = now_v
                        for w in list(self._value_watches.get(key, ())):
                            w.fire()
            for name in lock_names:  # every poll: a lease lapses without any write
                now_h = holders.get(name)
                if name not in self._seen_locks:
                    self._seen_locks[name] = now_h
                elif self._seen_locks[name] != now_h:
                    self._seen_locks[name] = now_h
                    for w in list(self._lock_watches.get(name, ())):
                        w.fire()
            last_changes = changes
            self.polls += 1
            if bookies is not None:
                if last_bookies is not None and bookies != last_bookies:
                    for bw in list(self._bookie_watches):
                        bw.fire()
                last_bookies = bookies
            await asyncio.sleep(self.poll_interval)

    # -- under-replication marks ---------------------------------------------------------------

    async def mark_under_replicated(self, ledger_id: int, missing_bookies: list[str]) -> None:
        check_ledger_id(ledger_id)
        for b in missing_bookies:
            check_bookie_id(b)
        added = list(missing_bookies)

        def merge(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                row = conn.execute(
                    "SELECT missing FROM under_replicated WHERE ledger_id = ?", (ledger_id,)
                ).fetchone()
                existing = _parse_missing(row[0], ledger_id) if row else []
                conn.execute(
                    "INSERT OR REPLACE INTO under_replicated VALUES (?, ?)",
                    (ledger_id, json.dumps(merge_missing(existing, added))),
                )

        await self._run("mark_under_replicated", merge)

    async def list_under_replicated(self) -> dict[int, list[str]]:
        def marks(conn: sqlite3.Connection) -> dict[int, list[str]]:
            rows = conn.execute("SELECT ledger_id, missing FROM under_replicated ORDER BY 1")
            return {lid: _parse_missing(m, lid) for lid, m in rows}

        return await self._run("list_under_replicated", marks)

    async def clear_under_replicated(
        self, ledger_id: int, expected: Sequence[str] | None = None
    ) -> bool:
        check_ledger_id(ledger_id)
        want = check_expected_marks(expected)

        def clear(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                row = conn.execute(
                    "SELECT missing FROM under_replicated WHERE ledger_id = ?", (ledger_id,)
                ).fetchone()
                if row is None or (want is not None and _parse_missing(row[0], ledger_id) != want):
                    return False
                conn.execute("DELETE FROM under_replicated WHERE ledger_id = ?", (ledger_id,))
                return True

        return await self._run("clear_under_replicated", clear)

    # -- locks and elections -------------------------------------------------------------------

    async def try_lock(self, name: str, owner: str) -> bool:
        check_key(name)
        check_owner(owner)
        holder, ttl = self.owner, self.ttl

        def take(conn: sqlite3.Connection) -> float | None:
            now = time.time()
            with _immediate(conn):
                row = conn.execute(
                    "SELECT holder, expires_at FROM locks WHERE name = ?", (name,)
                ).fetchone()
                if row is not None and row[0] != holder and row[1] > now:
                    return None
                conn.execute(
                    "INSERT OR REPLACE INTO locks VALUES (?, ?, ?, ?)",
                    (name, owner, holder, now + ttl),
                )
                _bump_changes(conn)
                return now + ttl

        expiry = await self._run("try_lock", take)
        if expiry is None:
            return False
        fresh = name not in self._held
        self._held[name] = (owner, expiry)
        self._ensure_heartbeat()
        if fresh:
            self._lock_changed_here(name, holder)
        return True

    async def unlock(self, name: str) -> None:
        check_key(name)
        holder = self.owner
        if self._held.pop(name, None) is None:
            return

        def release(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute("DELETE FROM locks WHERE name = ? AND holder = ?", (name, holder))
                _bump_changes(conn)

        self._lock_changed_here(name, None)
        await self._run("unlock", release)

    async def lock_owner(self, name: str) -> str | None:
        check_key(name)

        def owner(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT owner FROM locks WHERE name = ? AND expires_at > ?", (name, time.time())
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._run("lock_owner", owner)

    async def list_locks(self, prefix: str = "") -> dict[str, str]:
        check_prefix(prefix)

        def held(conn: sqlite3.Connection) -> dict[str, str]:
            rows = conn.execute(
                "SELECT name, owner FROM locks WHERE expires_at > ? ORDER BY name", (time.time(),)
            )
            return {str(n): str(o) for n, o in rows if str(n).startswith(prefix)}

        return await self._run("list_locks", held)

    def holds_lock(self, name: str) -> bool:
        held = self._held.get(name)
        return not self._closed and held is not None and held[1] > time.time()

    def watch_lock(self, name: str, callback: Callable[[str], None]) -> Watch:
        check_key(name)

        def forget(w: CallbackWatch) -> None:
            lst = self._lock_watches.get(name, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                self._lock_watches.pop(name, None)

        w = CallbackWatch(asyncio.get_running_loop(), lambda: callback(name), forget)
        self._lock_watches.setdefault(name, []).append(w)
        self._ensure_poller()
        return w

    def _lock_changed_here(self, name: str, holder: str | None) -> None:
        self._seen_locks[name] = holder
        for w in list(self._lock_watches.get(name, ())):
            w.fire()

    def election(self, name: str, candidate: str) -> Election:
        return LockElection(self, name, candidate, retry_interval=self.heartbeat_interval)

    async def election_leader(self, name: str) -> str | None:
        return await self.lock_owner(election_lock(name))

    # -- cookies -------------------------------------------------------------------------------

    async def read_cookie(self, bookie_id: str) -> bytes | None:
        check_bookie_id(bookie_id)

        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(
                "SELECT cookie FROM cookies WHERE bookie_id = ?", (bookie_id,)
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run("read_cookie", read)

    async def write_cookie(self, bookie_id: str, cookie: bytes) -> None:
        check_bookie_id(bookie_id)
        if not isinstance(cookie, bytes | bytearray):
            raise TypeError(f"cookie must be bytes, got {type(cookie).__name__}")
        value = bytes(cookie)

        def write(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute("INSERT OR REPLACE INTO cookies VALUES (?, ?)", (bookie_id, value))

        await self._run("write_cookie", write)

    async def delete_cookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)

        def delete(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute("DELETE FROM cookies WHERE bookie_id = ?", (bookie_id,))

        await self._run("delete_cookie", delete)

    # -- test hooks / lifecycle ----------------------------------------------------------------

    async def corrupt_ledger(self, ledger_id: int, data: bytes) -> None:
        """Overwrite a ledger's stored bytes (tests: readers must raise CorruptRecordError)."""

        def write(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute("UPDATE ledgers SET data = ? WHERE id = ?", (data, ledger_id))

        await self._run("corrupt_ledger", write)

    async def raw_ledger(self, ledger_id: int) -> bytes:
        def read(conn: sqlite3.Connection) -> bytes:
            return bytes(conn.execute("SELECT data FROM ledgers WHERE id = ?", (ledger_id,))
                         .fetchone()[0])

        return await self._run("raw_ledger", read)

    async def check_invariants(self) -> None:
        """Assert the file's invariants (the ``_check()`` habit; tests call it after
        concurrent work): ids and versions are never handed out twice, marks are canonical."""

        def check(conn: sqlite3.Connection) -> None:
            next_id, version = _counter(conn, "next_ledger_id"), _counter(conn, "version")
            max_id, max_version = conn.execute(
                "SELECT max(id), max(version) FROM ledgers"
            ).fetchone()
            assert max_id is None or max_id < next_id, (max_id, next_id)
            assert max_version is None or max_version <= version, (max_version, version)
            (max_kv,) = conn.execute("SELECT max(version) FROM kv").fetchone()
            assert max_kv is None or max_kv <= version, (max_kv, version)
            for lid, missing in conn.execute("SELECT ledger_id, missing FROM under_replicated"):
                marks = _parse_missing(missing, lid)
                assert marks == sorted(set(marks)), (lid, marks)

        await self._run("check_invariants", check)

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
                with _immediate(conn):
                    for b in own:
                        conn.execute(
                            "DELETE FROM bookies WHERE bookie_id = ? AND owner = ?", (b, owner)
                        )
                    for name in held:
                        conn.execute(
                            "DELETE FROM locks WHERE name = ? AND holder = ?", (name, owner))
                    _bump_changes(conn)

            try:
                await self._run("close", delete)
            except (MetadataStoreError, CorruptRecordError) as exc:
                log.warning("could not unregister %s on close: %s", own, exc)
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in (self._heartbeat, self._poller):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for lst in list(self._ledger_watches.values()):
            for w in list(lst):
                w.cancel()
        for bw in list(self._bookie_watches):
            bw.cancel()
        for vl in list(self._value_watches.values()):
            for w in list(vl):
                w.cancel()
        for ll in list(self._lock_watches.values()):
            for w in list(ll):
                w.cancel()

        def close_conn() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, close_conn)
        self._executor.shutdown(wait=False)


# -- SQL helpers (run on the store thread) ------------------------------------------------------


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: take the write lock first, so compare and write are atomic."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _counter(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise CorruptRecordError(f"metadata database: counter {name!r} is missing")
    return int(row[0])


def _set_counter(conn: sqlite3.Connection, name: str, value: int) -> None:
    conn.execute("UPDATE counters SET value = ? WHERE name = ?", (value, name))


def _bump(conn: sqlite3.Connection) -> int:
    """Next store-wide version (never reused, so a re-created ledger never matches a stale
    CAS), and tick the change counter watchers poll."""
    version = _counter(conn, "version") + 1
    _set_counter(conn, "version", version)
    conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'changes'")
    return version


def _ledger_version(conn: sqlite3.Connection, ledger_id: int) -> int:
    row = conn.execute("SELECT version FROM ledgers WHERE id = ?", (ledger_id,)).fetchone()
    if row is None:
        raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
    return int(row[0])


def _value_version(conn: sqlite3.Connection, key: str) -> int:
    row = conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
    if row is None:
        raise NoSuchKeyError(f"key {key!r} does not exist")
    return int(row[0])


def _live_bookies(conn: sqlite3.Connection) -> list[BookieRegistration]:
    rows = conn.execute(
        "SELECT bookie_id, address, read_only, rack FROM bookies WHERE expires_at > ?"
        " ORDER BY bookie_id",
        (time.time(),),
    )
    return [BookieRegistration(b, a, bool(ro), str(rack)) for b, a, ro, rack in rows]


def _refresh_registrations(
    conn: sqlite3.Connection, *, regs: list[BookieRegistration], owner: str, ttl: float,
    locks: list[str],
) -> tuple[set[str], float]:
    """Renew our registrations and the leases of our locks; returns the locks still ours
    and their new expiry."""
    now = time.time()
    kept: set[str] = set()
    with _immediate(conn):
        for r in regs:
            conn.execute(
                _UPSERT_BOOKIE
                + " WHERE bookies.owner = excluded.owner OR bookies.expires_at <= ?",
                (r.bookie_id, r.address, int(r.read_only), owner, now + ttl, r.rack, now),
            )
        for name in locks:
            cur = conn.execute(
                "UPDATE locks SET expires_at = ? WHERE name = ? AND holder = ? AND expires_at > ?",
                (now + ttl, name, owner, now),
            )
            if cur.rowcount:
                kept.add(name)
    return kept, now + ttl


def _bump_changes(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'changes'")


def _poll_changes(
    conn: sqlite3.Connection,
    *,
    watched: list[int],
    keys: list[str],
    force: bool,
    last_changes: int,
    want_bookies: bool,
    lock_names: list[str],
) -> tuple[
    int, dict[int, int] | None, dict[str, int] | None, list[BookieRegistration] | None,
    dict[str, str],
]:
    """One watch poll: the change counter; versions of watched ledgers and keys only if
    something changed (or a new watch needs a baseline); the live bookies if anyone watches
    them."""
    changes = _counter(conn, "changes")
    versions: dict[int, int] | None = None
    key_versions: dict[str, int] | None = None
    if force or changes != last_changes:
        if watched:
            marks = ",".join("?" * len(watched))
            versions = dict(
                conn.execute(f"SELECT id, version FROM ledgers WHERE id IN ({marks})", watched)
            )
        if keys:
            marks = ",".join("?" * len(keys))
            key_versions = dict(
                conn.execute(f"SELECT key, version FROM kv WHERE key IN ({marks})", keys)
            )
    bookies = _live_bookies(conn) if want_bookies else None
    holders: dict[str, str] = {}
    if lock_names:
        marks = ",".join("?" * len(lock_names))
        holders = {
            str(n): str(h) for n, h in conn.execute(
                f"SELECT name, holder FROM locks WHERE name IN ({marks}) AND expires_at > ?",
                [*lock_names, time.time()])
        }
    return changes, versions, key_versions, bookies, holders


def _parse_missing(text: str, ledger_id: int) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CorruptRecordError(f"under-replication mark of ledger {ledger_id}: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(b, str) for b in value):
        raise CorruptRecordError(f"under-replication mark of ledger {ledger_id}: not a list")
    return value
