"""Where a record lives in a log: ``Position(segment, entry, slot)`` (DistributedLog's DLSN).

``segment`` is the segment's sequence number (1, 2, ... in log order), ``entry`` the ledger
entry holding the record's envelope, ``slot`` the record's index inside that envelope. Positions
compare lexicographically, which is log order, and are hashable.

A position is a tuple subclass, so that making one per record costs what a tuple costs: the
writer resolves one per acknowledged record and the reader returns one per record read.
``str()`` gives ``"segment:entry:slot"`` and :meth:`Position.parse` reads it back;
``bytes(pos)``/:meth:`Position.from_bytes` is a 25-byte form (version byte + three big-endian
int64, DistributedLog's serialized DLSN layout).
"""

from __future__ import annotations

import struct
from typing import Any, Final, NamedTuple

__all__ = ["LogRecord", "Position"]

_BYTES = struct.Struct(">Bqqq")
_BYTES_VERSION: Final = 1
_INT64_MAX: Final = (1 << 63) - 1


def _check_part(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Position {name} must be an int, not {type(value).__name__}")
    if not low <= value <= _INT64_MAX:
        raise ValueError(f"Position {name} must be in {low}..2**63-1, got {value}")
    return value


class Position(tuple[int, int, int]):
    """A record's place in a log; ordered, hashable, ``str()``/``parse()`` and bytes round trips.

    The smallest position a record can have is ``Position(1, 0, 0)``.
    """

    __slots__ = ()

    def __new__(cls, segment: int, entry: int, slot: int) -> Position:
        return tuple.__new__(
            cls,
            (
                _check_part("segment", segment, 1),
                _check_part("entry", entry, 0),
                _check_part("slot", slot, 0),
            ),
        )

    @property
    def segment(self) -> int:
        return self[0]

    @property
    def entry(self) -> int:
        return self[1]

    @property
    def slot(self) -> int:
        return self[2]

    def __str__(self) -> str:
        return f"{self[0]}:{self[1]}:{self[2]}"

    def __repr__(self) -> str:
        return f"Position({self[0]}, {self[1]}, {self[2]})"

    def __bytes__(self) -> bytes:
        return _BYTES.pack(_BYTES_VERSION, *self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Position, tuple(self))

    @classmethod
    def parse(cls, text: str) -> Position:
        """Read ``"segment:entry:slot"`` back; ValueError naming the text otherwise."""
        if not isinstance(text, str):
            raise TypeError(f"Position.parse takes a str, not {type(text).__name__}")
        parts = text.strip().split(":")
        if len(parts) != 3 or not all(p.isdigit() and p.isascii() for p in parts):
            raise ValueError(f"not a position: {text!r} (expected 'segment:entry:slot')")
        return cls(int(parts[0]), int(parts[1]), int(parts[2]))

    @classmethod
    def from_bytes(cls, data: bytes) -> Position:
        """Read the 25-byte form back; ValueError on any other length or version."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"Position.from_bytes takes bytes, not {type(data).__name__}")
        if len(data) != _BYTES.size:
            raise ValueError(f"a position is {_BYTES.size} bytes, got {len(data)}")
        version, segment, entry, slot = _BYTES.unpack(data)
        if version != _BYTES_VERSION:
            raise ValueError(f"unknown position format version {version}")
        return cls(segment, entry, slot)

    def next_slot(self) -> Position:
        """The smallest position after this one (the same envelope's next slot): every
        record written after this position's record has a position at least this big."""
        return tuple.__new__(Position, (self[0], self[1], self[2] + 1))


#: Fast constructor for code that builds positions from ids it already knows are valid
#: (the writer's ack path and the reader's decode loop make one per record).
def make_position(segment: int, entry: int, slot: int) -> Position:
    return tuple.__new__(Position, (segment, entry, slot))


class LogRecord(NamedTuple):
    """One record read from a log (``key``: the record's key when its writer gave one, e.g.
    a Spark write with a ``key`` column; None otherwise)."""

    position: Position
    data: bytes
    txid: int | None
    key: bytes | None = None
