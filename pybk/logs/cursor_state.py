"""What a durable cursor knows, as a pure value: the mark-delete position and the ranges
acknowledged beyond it (Pulsar's ``individualDeletedMessages``), and its binary form.

Positions of a log are not consecutive integers (an envelope holds any number of slots), so
"contiguous" means "no record this cursor handed out and has not acknowledged lies between":
the cursor hands records out in log order, so every record between two acknowledged ones was
handed out too, and is either acknowledged or still pending. Ranges merge on that rule, and
the mark-delete position moves up through the first range once no pending record precedes it.

Design notes: docs/internals.md, "pybk/logs/cursor_state.py".
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Final

import crc32c

from pybk.errors import CorruptRecordError
from pybk.logs.position import Position

__all__ = ["AckState", "decode_state", "encode_state"]

_MAGIC: Final = b"PC"
_HEAD = struct.Struct(">2sBB3q3qI")
_RANGE = struct.Struct(">3q3q")
_CRC = struct.Struct(">I")
_ZERO = (0, 0, 0)


@dataclass
class AckState:
    """Acknowledgement state of one cursor (mutable; the cursor owns it).

    ``mark_delete``: every record at or before it is acknowledged (None: none yet).
    ``start``: where reading begins while ``mark_delete`` is None (None: the oldest kept).
    ``ranges``: disjoint ``(lo, hi)`` pairs above ``mark_delete``, ascending: every record
    with ``lo <= position <= hi`` is acknowledged.
    ``pending``: handed out, not acknowledged (ascending; not stored).
    ``seen``: the highest position handed out (or skipped as acknowledged) since this state
    was loaded (not stored)."""

    mark_delete: Position | None = None
    start: Position | None = None
    ranges: list[tuple[Position, Position]] = field(default_factory=list)
    pending: list[Position] = field(default_factory=list)
    seen: Position | None = None
    floor: Position | None = None  # a truncation point the reader was moved to (not stored)

    # -- reading -----------------------------------------------------------------------------

    def resume_point(self) -> Position | None:
        """Where reading restarts: just after the mark-delete position (None: from the
        oldest record kept)."""
        if self.mark_delete is not None:
            return self.mark_delete.next_slot()
        return self.start

    def read_from(self) -> Position | None:
        """Where a (re)started reader of this state starts: the resume point, past what was
        already seen, and not before a truncation point it was moved to."""
        start = self.resume_point()
        if self.seen is not None and (start is None or self.seen >= start):
            start = self.seen.next_slot()
        if self.floor is not None and (start is None or start < self.floor):
            start = self.floor
        return start

    def is_gone(self, pos: Position) -> bool:
        """Before the truncation point this cursor was moved past (nothing to acknowledge)."""
        return self.floor is not None and pos < self.floor

    def skip_to(self, before: Position) -> None:
        """Records before ``before`` are gone (truncated): forget them (pending, ranges)
        and read on from there. The mark-delete position is left as it is (they were not
        acknowledged, only dropped)."""
        self.pending = [p for p in self.pending if p >= before]
        self.ranges = [r for r in self.ranges if r[1] >= before]
        self.floor = before

    def is_acked(self, pos: Position) -> bool:
        if self.mark_delete is not None and pos <= self.mark_delete:
            return True
        i = bisect_right(self.ranges, (pos, pos)) - 1
        if i >= 0 and self.ranges[i][0] <= pos <= self.ranges[i][1]:
            return True
        return i + 1 < len(self.ranges) and self.ranges[i + 1][0] == pos

    def is_pending(self, pos: Position) -> bool:
        i = bisect_left(self.pending, pos)
        return i < len(self.pending) and self.pending[i] == pos

    def opens_range(self, pos: Position) -> bool:
        """Acknowledging ``pos`` alone would add a range (it joins no neighbour and does
        not move the mark-delete position)."""
        if self.is_acked(pos) or not self.is_pending(pos):
            return False
        if self.pending[0] == pos and (not self.ranges or self.ranges[0][0] > pos):
            return False  # the oldest pending record: the mark-delete position moves
        ranges = self.ranges
        i = bisect_left(ranges, (pos, pos))
        if i > 0 and self._gap_free(ranges[i - 1][1], pos):
            return False
        seen = self.seen
        return not (i < len(ranges) and seen is not None and ranges[i][0] <= seen
                    and self._gap_free(pos, ranges[i][0]))

    def deliver(self, pos: Position) -> bool:
        """The reader reached ``pos`` (in log order): True to hand it out (now pending),
        False when it is already acknowledged (skipped)."""
        if self.seen is None or pos > self.seen:
            self.seen = pos
        if self.is_acked(pos):
            self._advance()
            return False
        i = bisect_left(self.pending, pos)
        if i == len(self.pending) or self.pending[i] != pos:
            self.pending.insert(i, pos)
        return True

    # -- acknowledging -----------------------------------------------------------------------

    def ack(self, pos: Position) -> bool:
        """Acknowledge one handed-out record; False when it was already acknowledged.
        ValueError for a position this cursor never handed out."""
        if self.is_acked(pos) or self.is_gone(pos):
            return False
        i = bisect_left(self.pending, pos)
        if i == len(self.pending) or self.pending[i] != pos:
            raise ValueError(f"position {pos} was not handed out by this cursor")
        del self.pending[i]
        self._insert(pos)
        self._advance()
        return True

    def ack_cumulative(self, pos: Position) -> bool:
        """Acknowledge every record at or before ``pos`` (which must have been handed out,
        or be acknowledged already); False when nothing changed."""
        if self.mark_delete is not None and pos <= self.mark_delete:
            return False
        if self.seen is None or pos > self.seen:
            if self.is_acked(pos):
                return False
            raise ValueError(f"position {pos} is beyond what this cursor handed out "
                             f"({self.seen})")
        cut = bisect_right(self.pending, pos)
        del self.pending[:cut]
        top = pos
        for lo, hi in self.ranges:  # a range holding pos: everything up to its end is acked
            if lo <= pos <= hi:
                top = hi
        self.ranges = [r for r in self.ranges if r[0] > pos]
        self.mark_delete = top
        self._advance()
        return True

    def _gap_free(self, lo: Position, hi: Position) -> bool:
        """No pending record strictly between ``lo`` and ``hi``."""
        i = bisect_right(self.pending, lo)
        return i == len(self.pending) or self.pending[i] >= hi

    def _insert(self, pos: Position) -> None:
        ranges = self.ranges
        i = bisect_left(ranges, (pos, pos))
        lo, hi = pos, pos
        left = i - 1
        if left >= 0 and self._gap_free(ranges[left][1], pos):
            lo = ranges[left][0]
        right = i
        seen = self.seen
        if (right < len(ranges) and seen is not None and ranges[right][0] <= seen
                and self._gap_free(pos, ranges[right][0])):
            hi = ranges[right][1]
        start = left if lo != pos else i
        stop = right + 1 if hi != pos else i
        ranges[start:stop] = [(lo, hi)]

    def _advance(self) -> None:
        """Move the mark-delete position through the first range when nothing pending (and
        nothing not yet seen again) precedes it."""
        while self.ranges:
            lo, hi = self.ranges[0]
            if self.seen is None or lo > self.seen:
                return
            if self.pending and self.pending[0] < lo:
                return
            self.mark_delete = hi
            del self.ranges[0]

    def settle(self) -> None:
        """Drop what is not stored (pending, seen): the state as a restart finds it."""
        self.pending.clear()
        self.seen = None

    def copy_stored(self) -> AckState:
        return AckState(self.mark_delete, self.start, list(self.ranges))


def _triple(p: Position | None) -> tuple[int, int, int]:
    return _ZERO if p is None else (p[0], p[1], p[2])


def encode_state(state: AckState) -> bytes:
    """The stored form of ``state`` (its mark-delete position, start and ranges)."""
    flags = (1 if state.mark_delete is not None else 0) | (2 if state.start is not None else 0)
    parts = [_HEAD.pack(_MAGIC, 1, flags, *_triple(state.mark_delete), *_triple(state.start),
                        len(state.ranges))]
    parts.extend(_RANGE.pack(*lo, *hi) for lo, hi in state.ranges)
    body = b"".join(parts)
    return body + _CRC.pack(crc32c.crc32c(body))


def decode_state(data: bytes) -> AckState:
    """Parse :func:`encode_state`'s bytes; CorruptRecordError on any damage."""
    if len(data) < _HEAD.size + _CRC.size:
        raise CorruptRecordError("cursor state: too short")
    body, (crc,) = data[:-_CRC.size], _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c.crc32c(body) != crc:
        raise CorruptRecordError("cursor state: checksum mismatch")
    magic, version, flags, *rest = _HEAD.unpack_from(body)
    if magic != _MAGIC or version != 1 or flags & ~3:
        raise CorruptRecordError(f"cursor state: bad header ({magic!r}, {version}, {flags})")
    md = Position(*rest[0:3]) if flags & 1 else None
    start = Position(*rest[3:6]) if flags & 2 else None
    count = rest[6]
    if len(body) != _HEAD.size + count * _RANGE.size:
        raise CorruptRecordError("cursor state: length does not match the range count")
    ranges: list[tuple[Position, Position]] = []
    for (a, b, c, d, e, f) in _RANGE.iter_unpack(body[_HEAD.size:]):
        lo, hi = Position(a, b, c), Position(d, e, f)
        if hi < lo or (ranges and lo <= ranges[-1][1]) or (md is not None and lo <= md):
            raise CorruptRecordError("cursor state: ranges out of order")
        ranges.append((lo, hi))
    return AckState(md, start, ranges)
