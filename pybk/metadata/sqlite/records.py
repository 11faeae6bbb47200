"""Under-replication marks, cookies and the file's invariants: plain SQL on the store's thread."""

from __future__ import annotations

import json
import sqlite3

from pybk.errors import MetadataVersionError, NoSuchKeyError, NoSuchLedgerError
from pybk.metadata._common import merge_missing
from pybk.metadata.sqlite.schema import bump, counter, immediate, parse_missing

#: the versioned tables a compare-and-set may name (never text from a caller)
_TABLES = {("ledgers", "data", "id"), ("kv", "value", "key")}


def _version(conn: sqlite3.Connection, table: str, id_column: str, ident: object,
             what: str) -> int:
    row = conn.execute(f"SELECT version FROM {table} WHERE {id_column} = ?",
                       (ident,)).fetchone()
    if row is None:
        missing = NoSuchLedgerError if table == "ledgers" else NoSuchKeyError
        raise missing(f"{what} does not exist")
    return int(row[0])


def cas_row(conn: sqlite3.Connection, *, table: str, column: str, id_column: str,
            ident: object, data: bytes, expected: int, what: str) -> int:
    """Replace a ledger's or a key's bytes if its version is ``expected``; the new version."""
    assert (table, column, id_column) in _TABLES
    with immediate(conn):
        current = _version(conn, table, id_column, ident, what)
        if current != expected:
            raise MetadataVersionError(
                f"{what}: version {expected} is stale (store has {current})")
        version = bump(conn)
        conn.execute(f"UPDATE {table} SET {column} = ?, version = ? WHERE {id_column} = ?",
                     (data, version, ident))
        return version


def delete_row(conn: sqlite3.Connection, *, table: str, id_column: str, ident: object,
               expected: int | None, what: str) -> None:
    """Remove a ledger or a key (if its version is ``expected``, when given)."""
    assert any(t == table and i == id_column for t, _c, i in _TABLES)
    with immediate(conn):
        current = _version(conn, table, id_column, ident, what)
        if expected is not None and current != expected:
            raise MetadataVersionError(
                f"{what}: version {expected} is stale (store has {current})")
        conn.execute(f"DELETE FROM {table} WHERE {id_column} = ?", (ident,))
        bump(conn)

__all__ = [
    "cas_row",
    "check_invariants",
    "clear_mark",
    "delete_cookie",
    "delete_row",
    "list_marks",
    "merge_mark",
    "overwrite_ledger",
    "raw_ledger",
    "read_cookie",
    "write_cookie",
]


def merge_mark(conn: sqlite3.Connection, *, ledger_id: int, added: list[str]) -> None:
    with immediate(conn):
        row = conn.execute(
            "SELECT missing FROM under_replicated WHERE ledger_id = ?", (ledger_id,)
        ).fetchone()
        existing = parse_missing(row[0], ledger_id) if row else []
        conn.execute(
            "INSERT OR REPLACE INTO under_replicated VALUES (?, ?)",
            (ledger_id, json.dumps(merge_missing(existing, added))),
        )


def list_marks(conn: sqlite3.Connection) -> dict[int, list[str]]:
    rows = conn.execute("SELECT ledger_id, missing FROM under_replicated ORDER BY 1")
    return {lid: parse_missing(m, lid) for lid, m in rows}


def clear_mark(conn: sqlite3.Connection, *, ledger_id: int, want: list[str] | None) -> bool:
    """Remove the mark, only if it lists exactly ``want`` when that is given."""
    with immediate(conn):
        row = conn.execute(
            "SELECT missing FROM under_replicated WHERE ledger_id = ?", (ledger_id,)
        ).fetchone()
        if row is None or (want is not None and parse_missing(row[0], ledger_id) != want):
            return False
        conn.execute("DELETE FROM under_replicated WHERE ledger_id = ?", (ledger_id,))
        return True


def read_cookie(conn: sqlite3.Connection, *, bookie_id: str) -> bytes | None:
    row = conn.execute("SELECT cookie FROM cookies WHERE bookie_id = ?", (bookie_id,)).fetchone()
    return None if row is None else bytes(row[0])


def write_cookie(conn: sqlite3.Connection, *, bookie_id: str, cookie: bytes) -> None:
    with immediate(conn):
        conn.execute("INSERT OR REPLACE INTO cookies VALUES (?, ?)", (bookie_id, cookie))


def delete_cookie(conn: sqlite3.Connection, *, bookie_id: str) -> None:
    with immediate(conn):
        conn.execute("DELETE FROM cookies WHERE bookie_id = ?", (bookie_id,))


def overwrite_ledger(conn: sqlite3.Connection, *, ledger_id: int, data: bytes) -> None:
    """Damage a ledger's stored bytes (tests)."""
    with immediate(conn):
        conn.execute("UPDATE ledgers SET data = ? WHERE id = ?", (data, ledger_id))


def raw_ledger(conn: sqlite3.Connection, *, ledger_id: int) -> bytes:
    return bytes(conn.execute("SELECT data FROM ledgers WHERE id = ?", (ledger_id,))
                 .fetchone()[0])


def check_invariants(conn: sqlite3.Connection) -> None:
    """Ids and versions never handed out twice, marks canonical (AssertionError if not)."""
    next_id, version = counter(conn, "next_ledger_id"), counter(conn, "version")
    (max_version,) = conn.execute("SELECT max(version) FROM ledgers").fetchone()
    (below,) = conn.execute("SELECT max(id) FROM ledgers WHERE id < ?",
                            ((1 << 63) - 1,)).fetchone()  # (the largest moves no allocator)
    assert below is None or below < next_id, (below, next_id)
    assert max_version is None or max_version <= version, (max_version, version)
    for table in ("kv", "locks"):
        (top,) = conn.execute(f"SELECT max(version) FROM {table}").fetchone()
        assert top is None or top <= version, (table, top, version)
    for lid, missing in conn.execute("SELECT ledger_id, missing FROM under_replicated"):
        marks = parse_missing(missing, lid)
        assert marks == sorted(set(marks)), (lid, marks)
