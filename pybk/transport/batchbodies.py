"""A large ADD_BATCH's entries left in its frame: walked in pieces, copied out a chunk at a
time (issue 34).

Decoding a batch of 65,536 small entries into two lists of 65,536 objects took a bookie's
loop tens of milliseconds in one go, and every batch in flight kept those objects for the
garbage collector to traverse. A server decodes a batch of more than :data:`LAZY_ENTRIES`
entries as :class:`BatchBodies` (with :class:`BatchIds` beside it): the frame is kept as one
``bytes`` and its entry table (id, length, body; each length checked against the bytes left
before use, as the whole-frame decoder does) is walked :meth:`BatchBodies.walk` a piece at a
time, the starts of the bodies kept in an ``array`` (nothing the collector traverses). Only a
batch walked to its end is used: indexing or slicing an unwalked one walks the rest first (and
raises :class:`ProtocolError` if it is malformed). A slice is a list, made when a chunk of the
batch is admitted.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import Final, overload

from pybk.errors import ProtocolError
from pybk.transport.wireformat import NONE_LEN

__all__ = ["LAZY_ENTRIES", "WALK_STEP", "BatchBodies", "BatchIds"]

#: batches of more entries than this are decoded lazily by a server connection
LAZY_ENTRIES: Final = 2048
#: entries walked per step (well under a millisecond)
WALK_STEP: Final = 2048

_QI = struct.Struct(">qI")  # one entry: id, body length
_Q = struct.Struct(">q")


class BatchBodies(Sequence[bytes]):
    """The bodies of a batch's ``total`` entries, the first entry's id at ``start`` of
    ``frame`` (which holds nothing after the last body)."""

    __slots__ = ("_next", "frame", "nbytes", "starts", "total")

    def __init__(self, frame: bytes, start: int, count: int) -> None:
        if count * 12 > len(frame) - start:
            raise ProtocolError(f"batch of {count} entries: each at least 12 bytes of the "
                                f"{len(frame) - start} left")
        self.frame = frame
        self.total = count
        #: where each walked body starts (its id and length are the 12 bytes before)
        self.starts = array("I" if len(frame) < 1 << 32 else "Q")
        #: where the next entry to walk starts
        self._next = start
        #: bytes of the bodies (known once walked: the frame's bytes past the entry heads)
        self.nbytes = len(frame) - start - 12 * count

    @property
    def walked(self) -> bool:
        """Whether every entry was walked (and found well formed)."""
        return len(self.starts) == self.total

    def walk(self, limit: int = WALK_STEP) -> bool:
        """Walk up to ``limit`` more entries; True once all are. :class:`ProtocolError` when
        the table is malformed (a length past the frame's end, an absent body, bytes left
        over)."""
        f, p, n = self.frame, self._next, len(self.frame)
        starts = self.starts
        todo = min(limit, self.total - len(starts))
        unpack = _QI.unpack_from
        append = starts.append
        for _ in range(todo):
            if n - p < 12:
                raise ProtocolError(f"body truncated: need 12 bytes, {n - p} left")
            blen = unpack(f, p)[1]
            p += 12
            if blen == NONE_LEN:
                raise ProtocolError("entry body must be present")
            if blen > n - p:
                raise ProtocolError(f"byte string of {blen} bytes exceeds the {n - p} "
                                    "bytes left")
            append(p)
            p += blen
        self._next = p
        if len(starts) < self.total:
            return False
        if p != n:
            raise ProtocolError(f"{n - p} trailing bytes after the message body")
        return True

    def walk_all(self) -> None:
        """Walk whatever is left (at once)."""
        self.walk(self.total)

    def _end(self, i: int) -> int:
        return self.starts[i + 1] - 12 if i + 1 < self.total else len(self.frame)

    def __len__(self) -> int:
        return self.total

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if not self.walked:
            self.walk_all()
        if isinstance(i, slice):
            f, starts = self.frame, self.starts
            lo, hi, step = i.indices(self.total)
            if step != 1:
                return [self[k] for k in range(lo, hi, step)]
            if lo >= hi:
                return []
            ends = [s - 12 for s in starts[lo + 1 : hi + 1]]
            if hi == self.total:
                ends.append(len(f))
            return [f[s:e] for s, e in zip(starts[lo:hi], ends, strict=True)]
        if i < 0:
            i += self.total
        if not 0 <= i < self.total:
            raise IndexError("batch index out of range")
        return self.frame[self.starts[i] : self._end(i)]

    def __iter__(self) -> Iterator[bytes]:
        step = WALK_STEP
        for lo in range(0, self.total, step):
            yield from self[lo : lo + step]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == self.total and all(a == b for a, b in zip(self, other,
                                                                              strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BatchBodies({self.total} entries, {self.nbytes} bytes)"


class BatchIds(Sequence[int]):
    """The entry ids of the same batch, read from the frame beside each body."""

    __slots__ = ("bodies",)

    def __init__(self, bodies: BatchBodies) -> None:
        self.bodies = bodies

    def __len__(self) -> int:
        return self.bodies.total

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        b = self.bodies
        if not b.walked:
            b.walk_all()
        unpack, f = _Q.unpack_from, b.frame
        if isinstance(i, slice):
            return [unpack(f, s - 12)[0] for s in b.starts[i]]
        if i < 0:
            i += b.total
        if not 0 <= i < b.total:
            raise IndexError("batch index out of range")
        return int(unpack(f, b.starts[i] - 12)[0])

    def __iter__(self) -> Iterator[int]:
        step = WALK_STEP
        for lo in range(0, len(self), step):
            yield from self[lo : lo + step]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BatchIds({len(self)} entries)"
