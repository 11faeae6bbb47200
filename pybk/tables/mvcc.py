"""One range's applied state: an MVCC key/value store in SQLite.

Every key holds bytes or an int64 counter, with the revision that created it, the revision
of its last change and its version (0 when created, +1 per change). The store applies
commands at revisions given by the range's log (the record's txid), in order; a revision at
or below the last applied one is skipped, so replaying a log over a checkpoint is idempotent.
Applying is deterministic: a command that cannot apply (a put on a counter) fails the same
way on every replica and on every replay, and changes nothing.

The store is in memory by default (``path=None``): the range's durable state is its log and
its checkpoints in pybk, never the local disk (docs/tables.md says why SQLite).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pybk.tables.command import INT64_MAX, INT64_MIN, Command
from pybk.tables.errors import TableBadRequestError

__all__ = ["KeyValue", "MVCCStore", "Row"]

#: (key, bytes value or None, counter or None, create_revision, mod_revision, version)
Row = tuple[bytes, bytes | None, int | None, int, int, int]


@dataclass(frozen=True)
class KeyValue:
    """A key as a read found it: ``value`` is bytes, or an int for a counter."""

    key: bytes
    value: bytes | int
    version: int
    create_revision: int
    mod_revision: int

    @property
    def is_number(self) -> bool:
        return isinstance(self.value, int)


def _kv(row: Row) -> KeyValue:
    key, value, num, crev, mrev, ver = row
    if value is None:
        assert num is not None
        return KeyValue(key, num, ver, crev, mrev)
    return KeyValue(key, value, ver, crev, mrev)


_CMP = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
}


class MVCCStore:
    """The applied state of one range (not thread-safe: one event loop uses it)."""

    def __init__(self, path: str | None = None) -> None:
        # a memory journal, not none: a failed command (a txn half done) is rolled back
        self._db = sqlite3.connect(path or ":memory:", isolation_level=None)
        mode = "MEMORY" if path is None else "WAL"
        self._db.execute(f"PRAGMA journal_mode={mode}")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB, num INTEGER,"
            " crev INTEGER NOT NULL, mrev INTEGER NOT NULL, ver INTEGER NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER)")
        row = self._db.execute("SELECT v FROM meta WHERE k='revision'").fetchone()
        #: the last revision applied (0: none)
        self.revision: int = row[0] if row else 0

    def close(self) -> None:
        self._db.close()

    # -- reads -------------------------------------------------------------------------------

    def _row(self, key: bytes) -> Row | None:
        return self._db.execute(  # type: ignore[no-any-return]
            "SELECT key, value, num, crev, mrev, ver FROM kv WHERE key=?", (key,)).fetchone()

    def get(self, key: bytes) -> KeyValue | None:
        row = self._row(key)
        return None if row is None else _kv(row)

    def scan(self, start: bytes | None, end: bytes | None, limit: int | None) -> list[KeyValue]:
        """Keys in ``[start, end)`` in byte order, at most ``limit``."""
        sql = "SELECT key, value, num, crev, mrev, ver FROM kv WHERE 1"
        args: list[Any] = []
        if start is not None:
            sql += " AND key >= ?"
            args.append(start)
        if end is not None:
            sql += " AND key < ?"
            args.append(end)
        sql += " ORDER BY key"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [_kv(r) for r in self._db.execute(sql, args)]

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM kv").fetchone()[0])

    # -- applying ----------------------------------------------------------------------------

    def apply(self, revision: int, cmd: Command) -> Any:
        """Apply ``cmd`` at ``revision``; its result (put: the revision; delete: whether the
        key existed; incr: the new value; txn: whether the compares held). Raises
        TableBadRequestError, having changed nothing, when it cannot apply. A revision at or
        below the last applied one changes nothing and returns None."""
        if revision <= self.revision:
            return None
        db = self._db
        db.execute("SAVEPOINT c")
        try:
            result = self._do(revision, cmd)
        except BaseException:
            db.execute("ROLLBACK TO c")
            db.execute("RELEASE c")
            self._set_revision(revision)  # the revision is spent either way
            raise
        self._set_revision(revision)
        db.execute("RELEASE c")
        return result

    def _set_revision(self, revision: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('revision', ?)", (revision,))
        self.revision = revision

    def _do(self, rev: int, cmd: Command) -> Any:
        kind = cmd[0]
        if kind == "put":
            return self._put(rev, cmd[1], cmd[2])
        if kind == "delete":
            return self._db.execute("DELETE FROM kv WHERE key=?", (cmd[1],)).rowcount > 0
        if kind == "incr":
            return self._incr(rev, cmd[1], cmd[2])
        if kind == "txn":
            ok = all(self._holds(c) for c in cmd[1])
            for op in cmd[2] if ok else cmd[3]:
                self._do(rev, op)
            return ok
        if kind == "noop":
            return None
        raise TableBadRequestError(f"unknown command {kind!r}")

    def _put(self, rev: int, key: bytes, value: bytes) -> int:
        row = self._row(key)
        if row is None:
            self._db.execute("INSERT INTO kv VALUES (?, ?, NULL, ?, ?, 0)", (key, value, rev, rev))
        elif row[1] is None:
            raise TableBadRequestError(f"key {key!r} holds a counter: put refused")
        else:
            self._db.execute("UPDATE kv SET value=?, mrev=?, ver=ver+1 WHERE key=?",
                             (value, rev, key))
        return rev

    def _incr(self, rev: int, key: bytes, amount: int) -> int:
        row = self._row(key)
        if row is None:
            new = amount
            self._db.execute("INSERT INTO kv VALUES (?, NULL, ?, ?, ?, 0)", (key, new, rev, rev))
            return new
        if row[1] is not None:
            raise TableBadRequestError(f"key {key!r} holds bytes: increment refused")
        assert row[2] is not None
        new = row[2] + amount
        if not INT64_MIN <= new <= INT64_MAX:
            raise TableBadRequestError(f"key {key!r}: {row[2]} + {amount} overflows int64")
        self._db.execute("UPDATE kv SET num=?, mrev=?, ver=ver+1 WHERE key=?", (new, rev, key))
        return new

    def _holds(self, compare: tuple[bytes, str, str, Any]) -> bool:
        key, target, op, operand = compare
        kv = self.get(key)
        if target == "value":
            if kv is None:
                return _CMP[op](None, operand) if op in ("==", "!=") else False
            if type(kv.value) is not type(operand):
                return op == "!="
            return bool(_CMP[op](kv.value, operand))
        # a missing key has version -1 (a new key's is 0) and revisions 0
        actual = (-1 if target == "version" else 0) if kv is None else getattr(kv, target)
        return bool(_CMP[op](actual, operand))

    # -- checkpoints -------------------------------------------------------------------------

    def rows(self) -> Iterator[Row]:
        """Every key's row, in key order (for a checkpoint)."""
        yield from self._db.execute("SELECT key, value, num, crev, mrev, ver FROM kv ORDER BY key")

    def restore(self, revision: int, rows: list[Row]) -> None:
        """Replace everything by a checkpoint's rows taken at ``revision``."""
        db = self._db
        db.execute("BEGIN")
        db.execute("DELETE FROM kv")
        db.executemany("INSERT INTO kv VALUES (?, ?, ?, ?, ?, ?)", rows)
        db.execute("INSERT OR REPLACE INTO meta VALUES ('revision', ?)", (revision,))
        db.execute("COMMIT")
        self.revision = revision
