"""Ephemeral locks in the SQLite file: leases renewed by the owner's heartbeat.

Each lock's row carries a version from the store-wide ``version`` counter, new whenever the
lock changes hands. A released lock keeps its row (expired at the release, with a new
version) for ``TOMBSTONE_KEEP`` seconds, so a watch whose baseline saw it free still finds
that it was taken and released meanwhile. Functions here run on the store's thread.
"""

from __future__ import annotations

import sqlite3
import time

from pybk.metadata.sqlite.schema import TOMBSTONE_KEEP, bump, immediate

__all__ = ["lock_row", "release_lock", "release_locks", "take_lock"]


def take_lock(conn: sqlite3.Connection, name: str, owner: str, holder: str,
              ttl: float) -> tuple[float | None, int | None, float, bool]:
    """Take ``name`` for ``holder`` unless another live holder has it. Returns (the new
    expiry or None when refused, the lock's version now, the time, whether it changed)."""
    now = time.time()
    with immediate(conn):
        row = conn.execute(
            "SELECT holder, expires_at, version FROM locks WHERE name = ?", (name,)
        ).fetchone()
        if row is not None and row[1] > now:
            if row[0] != holder:
                return None, int(row[2]), now, False
            conn.execute("UPDATE locks SET owner = ?, expires_at = ? WHERE name = ?",
                         (owner, now + ttl, name))
            return now + ttl, int(row[2]), now, False
        version = bump(conn)
        conn.execute(
            "INSERT OR REPLACE INTO locks (name, owner, holder, expires_at, version)"
            " VALUES (?, ?, ?, ?, ?)",
            (name, owner, holder, now + ttl, version),
        )
        return now + ttl, version, now, True


def _release(conn: sqlite3.Connection, name: str, holder: str, now: float) -> int | None:
    row = conn.execute(
        "SELECT 1 FROM locks WHERE name = ? AND holder = ? AND expires_at > ?",
        (name, holder, now),
    ).fetchone()
    if row is None:
        return None
    version = bump(conn)
    conn.execute("UPDATE locks SET expires_at = ?, version = ? WHERE name = ?",
                 (now, version, name))
    return version


def release_lock(conn: sqlite3.Connection, name: str, holder: str) -> tuple[int | None, float]:
    """Release ``name`` if ``holder`` has it (its row stays, expired, with a new version);
    drop the rows of locks released long ago. Returns (the version, the time)."""
    now = time.time()
    with immediate(conn):
        version = _release(conn, name, holder, now)
        conn.execute("DELETE FROM locks WHERE expires_at < ?", (now - TOMBSTONE_KEEP,))
    return version, now


def release_locks(conn: sqlite3.Connection, names: list[str], holder: str) -> None:
    """Release several locks inside the caller's transaction (a store closing)."""
    now = time.time()
    for name in names:
        _release(conn, name, holder, now)


def lock_row(conn: sqlite3.Connection, name: str) -> tuple[str | None, int | None, float]:
    """(owner label when held, the row's version, the time it was looked at)."""
    now = time.time()
    row = conn.execute(
        "SELECT owner, version, expires_at FROM locks WHERE name = ?", (name,)
    ).fetchone()
    if row is None:
        return None, None, now
    return (str(row[0]) if row[2] > now else None), int(row[1]), now
