"""The SQLite metadata file: its schema, opening it, and the SQL every operation shares.

Everything here runs on the store's own thread (never on the event loop).

Counters (table ``counters``): ``next_ledger_id``; ``version``, the store-wide version every
ledger, key and lock write takes (never reused); ``changes``, ticked by every ledger, key
and lock write (watch polls look at it before reading versions); ``bookies``, ticked by
every change of the bookie registry that is a write (register, unregister, a lapsed
registration brought back by its owner's heartbeat). A registration or a lock whose lease
lapses changes nothing in the file: watchers find it from the lease's expiry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Iterator

from pybk.errors import CorruptRecordError, MetadataStoreError, NoSuchKeyError, NoSuchLedgerError
from pybk.metadata.base import BookieRegistration
from pybk.metadata.files import private_file

__all__ = [
    "SCHEMA_VERSION",
    "TOMBSTONE_KEEP",
    "UPSERT_BOOKIE",
    "bump",
    "bump_bookies",
    "bump_changes",
    "connect",
    "counter",
    "counters",
    "immediate",
    "ledger_version",
    "live_bookies",
    "open_connection",
    "parse_missing",
    "refresh_registrations",
    "set_counter",
    "value_version",
]

log = logging.getLogger("pybk.metadata.sqlite")

SCHEMA_VERSION = 4  # 2: bookies.rack, locks; 3: locks.version, released locks kept a while;
#                    4: bookies.isolation_group
#: seconds a released lock's row is kept (its version tells watchers it was released)
TOMBSTONE_KEEP = 3600.0

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
INSERT OR IGNORE INTO counters VALUES
    ('next_ledger_id', 0), ('version', 0), ('changes', 0), ('bookies', 0);
"""

UPSERT_BOOKIE = """
INSERT INTO bookies (bookie_id, address, read_only, owner, expires_at, rack, isolation_group)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (bookie_id) DO UPDATE SET address = excluded.address,
    read_only = excluded.read_only, owner = excluded.owner, expires_at = excluded.expires_at,
    rack = excluded.rack, isolation_group = excluded.isolation_group
"""


def connect(path: str, *, busy_timeout: float, synchronous: str) -> sqlite3.Connection:
    """:func:`open_connection`, retried while the file is busy.

    Several stores (often several processes) may open a new file at the same moment. The
    switch to WAL mode then needs a lock that two connections can each be waiting to
    upgrade to; SQLite resolves such a deadlock by answering SQLITE_BUSY at once instead
    of invoking the busy timeout, so initialisation is retried (bounded by the busy
    timeout, with a growing pause) rather than failing the caller's first operation."""
    deadline = time.monotonic() + busy_timeout
    pause = 0.002
    while True:
        try:
            return open_connection(path, busy_timeout=busy_timeout, synchronous=synchronous)
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # primary result code
            if code not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)  # on the store's own thread, never the event loop
            pause = min(pause * 2, 0.1)


def open_connection(path: str, *, busy_timeout: float, synchronous: str) -> sqlite3.Connection:
    """Open ``path`` in WAL mode and bring its schema to :data:`SCHEMA_VERSION`."""
    private_file(path)  # (it holds every ledger's master key: the owner's only)
    conn = sqlite3.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=False,
    )
    try:
        (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if str(mode).lower() != "wal":  # e.g. a filesystem without shared memory
            log.warning("%s: WAL mode unavailable (journal_mode=%s)", path, mode)
        conn.execute(f"PRAGMA synchronous={synchronous}")
        (found,) = conn.execute("PRAGMA user_version").fetchone()
        if found > SCHEMA_VERSION:
            raise MetadataStoreError(
                f"{path}: metadata schema version {found} is newer than this "
                f"pybk understands ({SCHEMA_VERSION})"
            )
        with immediate(conn):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(bookies)")}
            if "rack" not in columns:  # a version 1 file: registrations gain a location
                conn.execute("ALTER TABLE bookies ADD COLUMN rack TEXT NOT NULL DEFAULT ''")
            if "isolation_group" not in columns:  # before version 4: no isolation groups
                conn.execute(
                    "ALTER TABLE bookies ADD COLUMN isolation_group TEXT NOT NULL DEFAULT ''")
            columns = {row[1] for row in conn.execute("PRAGMA table_info(locks)")}
            if "version" not in columns:  # a version 2 file: locks gain a version
                conn.execute("ALTER TABLE locks ADD COLUMN version INTEGER NOT NULL DEFAULT 0")
            conn.execute("CREATE INDEX IF NOT EXISTS locks_expiry ON locks (expires_at)")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: take the write lock first, so compare and write are atomic."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def counter(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise CorruptRecordError(f"metadata database: counter {name!r} is missing")
    return int(row[0])


def counters(conn: sqlite3.Connection) -> dict[str, int]:
    """Every counter, read at once (one statement: one snapshot)."""
    return {str(n): int(v) for n, v in conn.execute("SELECT name, value FROM counters")}


def set_counter(conn: sqlite3.Connection, name: str, value: int) -> None:
    conn.execute("UPDATE counters SET value = ? WHERE name = ?", (value, name))


def bump(conn: sqlite3.Connection) -> int:
    """Next store-wide version (never reused, so a re-created ledger never matches a stale
    CAS), and tick the change counter watchers poll."""
    version = counter(conn, "version") + 1
    set_counter(conn, "version", version)
    bump_changes(conn)
    return version


def bump_changes(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'changes'")


def bump_bookies(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'bookies'")


def ledger_version(conn: sqlite3.Connection, ledger_id: int) -> int:
    row = conn.execute("SELECT version FROM ledgers WHERE id = ?", (ledger_id,)).fetchone()
    if row is None:
        raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
    return int(row[0])


def value_version(conn: sqlite3.Connection, key: str) -> int:
    row = conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
    if row is None:
        raise NoSuchKeyError(f"key {key!r} does not exist")
    return int(row[0])


def live_bookies(conn: sqlite3.Connection) -> tuple[list[BookieRegistration], int, float]:
    """The live registrations, the ``bookies`` counter and the wall time they are live at
    (the state a watch set afterwards compares with)."""
    now = time.time()
    version = counter(conn, "bookies")  # before the rows: a write in between fires a watch
    rows = conn.execute(
        "SELECT bookie_id, address, read_only, rack, isolation_group FROM bookies"
        " WHERE expires_at > ?"
        " ORDER BY bookie_id",
        (now,),
    ).fetchall()
    return [BookieRegistration(b, a, bool(ro), str(rack), str(group))
            for b, a, ro, rack, group in rows], version, now


def refresh_registrations(
    conn: sqlite3.Connection, *, regs: list[BookieRegistration], owner: str, ttl: float,
    locks: list[str],
) -> tuple[set[str], float]:
    """Renew our registrations and the leases of our locks; returns the locks still ours
    and their new expiry. A registration that had lapsed (or was removed) and comes back
    is a change of the registry: the ``bookies`` counter ticks."""
    now = time.time()
    kept: set[str] = set()
    with immediate(conn):
        revived = False
        for r in regs:
            row = conn.execute(
                "SELECT owner, expires_at FROM bookies WHERE bookie_id = ?", (r.bookie_id,)
            ).fetchone()
            cur = conn.execute(
                UPSERT_BOOKIE
                + " WHERE bookies.owner = excluded.owner OR bookies.expires_at <= ?",
                (r.bookie_id, r.address, int(r.read_only), owner, now + ttl, r.rack, r.group,
                 now),
            )
            if cur.rowcount and (row is None or row[1] <= now or row[0] != owner):
                revived = True
        if revived:
            bump_bookies(conn)
        for name in locks:
            cur = conn.execute(
                "UPDATE locks SET expires_at = ? WHERE name = ? AND holder = ? AND expires_at > ?",
                (now + ttl, name, owner, now),
            )
            if cur.rowcount:
                kept.add(name)
    return kept, now + ttl


def parse_missing(text: str, ledger_id: int) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CorruptRecordError(f"under-replication mark of ledger {ledger_id}: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(b, str) for b in value):
        raise CorruptRecordError(f"under-replication mark of ledger {ledger_id}: not a list")
    return value
