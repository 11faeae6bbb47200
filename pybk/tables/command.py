"""The commands a range appends to its log, and their encoding.

A command is a plain tuple so that applying and replaying it is the same code:
``("put", key, value)``, ``("delete", key)``, ``("incr", key, amount)``,
``("txn", compares, success, failure)``. A compare is ``(key, target, op, operand)`` with
target one of ``version``, ``create_revision``, ``mod_revision``, ``value`` and op one of
``== != < > <= >=``; the operations of a txn are put, delete and incr commands. In the log a
command is a JSON document (bytes as base64) whose record txid is its revision.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pybk.tables.errors import TableBadRequestError

__all__ = [
    "COMPARE_OPS",
    "INT64_MAX",
    "INT64_MIN",
    "TARGETS",
    "Command",
    "check_command",
    "decode",
    "encode",
]

Command = tuple[Any, ...]
TARGETS = frozenset({"version", "create_revision", "mod_revision", "value"})
COMPARE_OPS = frozenset({"==", "!=", "<", ">", "<=", ">="})
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_KEY_BYTES = 64 << 10
MAX_VALUE_BYTES = 512 << 10


def _key(key: object) -> bytes:
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError(f"a key is bytes or str, not {type(key).__name__}")
    key = bytes(key)
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise TableBadRequestError(f"a key is 1-{MAX_KEY_BYTES} bytes, not {len(key)}")
    return key


def _value(value: object) -> bytes:
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"a value is bytes or str, not {type(value).__name__}")
    value = bytes(value)
    if len(value) > MAX_VALUE_BYTES:
        raise TableBadRequestError(f"a value is at most {MAX_VALUE_BYTES} bytes, not {len(value)}")
    return value


def _int64(n: object, what: str) -> int:
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"{what} must be an int, not {type(n).__name__}")
    if not INT64_MIN <= n <= INT64_MAX:
        raise TableBadRequestError(f"{what} {n} does not fit in int64")
    return n


def _op(op: object) -> Command:
    if not isinstance(op, tuple | list) or not op:
        raise TypeError(f"a txn operation is a tuple like ('put', key, value), not {op!r}")
    kind = op[0]
    if kind == "put" and len(op) == 3:
        return ("put", _key(op[1]), _value(op[2]))
    if kind == "delete" and len(op) == 2:
        return ("delete", _key(op[1]))
    if kind == "incr" and len(op) == 3:
        return ("incr", _key(op[1]), _int64(op[2], "amount"))
    raise TableBadRequestError(f"unknown txn operation {op!r} (put k v, delete k, incr k n)")


def _compare(c: object) -> tuple[bytes, str, str, Any]:
    if not isinstance(c, tuple | list) or len(c) != 4:
        raise TypeError(f"a compare is (key, target, op, operand), not {c!r}")
    key, target, op, operand = c
    if target not in TARGETS:
        raise TableBadRequestError(f"compare target {target!r} is not one of {sorted(TARGETS)}")
    if op not in COMPARE_OPS:
        raise TableBadRequestError(f"compare op {op!r} is not one of {sorted(COMPARE_OPS)}")
    if target == "value":
        if operand is not None and not isinstance(operand, int):
            operand = _value(operand)
    else:
        operand = _int64(operand, f"the {target} operand")
    return (_key(key), target, op, operand)


def check_command(cmd: Command) -> Command:
    """``cmd`` normalised (bytes keys and values), or TypeError / TableBadRequestError."""
    if not isinstance(cmd, tuple) or not cmd:
        raise TypeError(f"not a command: {cmd!r}")
    if cmd[0] == "txn" and len(cmd) == 4:
        compares = tuple(_compare(c) for c in cmd[1])
        return ("txn", compares, tuple(_op(o) for o in cmd[2]), tuple(_op(o) for o in cmd[3]))
    return _op(cmd)


def _to_json(x: Any) -> Any:
    if isinstance(x, bytes):
        return {"b": base64.b64encode(x).decode()}
    if isinstance(x, tuple | list):
        return [_to_json(i) for i in x]
    return x


def _from_json(x: Any) -> Any:
    if isinstance(x, dict):
        return base64.b64decode(x["b"])
    if isinstance(x, list):
        return tuple(_from_json(i) for i in x)
    return x


def encode(cmd: Command) -> bytes:
    """The log record of ``cmd``."""
    return json.dumps(_to_json(cmd), separators=(",", ":")).encode()


def decode(data: bytes) -> Command:
    """The command of a log record (what :func:`encode` made)."""
    try:
        cmd = _from_json(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a table command record: {exc}") from exc
    if not isinstance(cmd, tuple) or not cmd:
        raise ValueError(f"not a table command record: {cmd!r}")
    return cmd
