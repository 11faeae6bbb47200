"""A set of integers kept as sorted, disjoint, non-adjacent ranges.

Why: the bookie must remember every ledger it deleted (an add, fence or LAC write to one is
refused for ever, and a rebuild must not bring its entries back), and a long-lived bookie
under rolling logs deletes ledgers without end. Ledger ids come from a counter and old
ledgers are deleted roughly in order, so where a bookie holds consecutive ids (an ensemble of
every bookie) a whole history of deletions collapses into a handful of ``(first, last)``
pairs, in memory and in every checkpoint. A bookie that holds a fraction of the cluster's
ledgers has gaps between its ids (ranges must not bridge them: a ledger never held here may
still come here), so it pays about one range, ~100 bytes, per deleted ledger: still far less
than the state object per deleted ledger it replaces (about 740 bytes, and a comparison at
every checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sortedcontainers import SortedDict

__all__ = [
    "IdRanges",
]


class IdRanges:
    """Integers as ranges ``first -> last`` (inclusive) in a sortedcontainers ``SortedDict``.

    Membership and insertion cost O(log ranges). Only insertion is supported: what it holds
    (deleted ledgers) is never taken back."""

    __slots__ = ("_count", "_ranges")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._ranges: SortedDict = SortedDict()
        self._count = 0
        for x in ids:
            self.add(x)

    @classmethod
    def from_ranges(cls, ranges: Iterable[tuple[int, int]]) -> IdRanges:
        """Rebuild from :meth:`ranges` output; ValueError unless they are sorted, disjoint
        and non-adjacent (as :meth:`ranges` gives them)."""
        out = cls()
        prev = None
        for first, last in ranges:
            if first > last or (prev is not None and first <= prev + 1):
                raise ValueError(f"id range ({first}, {last}) out of order after {prev}")
            out._ranges[first] = last
            out._count += last - first + 1
            prev = last
        return out

    def __contains__(self, x: object) -> bool:
        if not isinstance(x, int):
            return False
        ranges = self._ranges
        i = ranges.bisect_right(x)
        return bool(i) and x <= ranges.peekitem(i - 1)[1]

    def add(self, x: int) -> bool:
        """Insert ``x``, merging with the ranges beside it; False if it was already held."""
        ranges = self._ranges
        i = ranges.bisect_right(x)
        start = None
        if i:
            start, last = ranges.peekitem(i - 1)
            if x <= last:
                return False
            if x != last + 1:
                start = None
        if i < len(ranges):
            nxt, nxt_last = ranges.peekitem(i)
            if nxt == x + 1:  # joins the next range (and maybe the previous one)
                del ranges[nxt]
                ranges[x if start is None else start] = nxt_last
                self._count += 1
                return True
        ranges[x if start is None else start] = x
        self._count += 1
        return True

    def add_range(self, first: int, last: int) -> None:
        """Insert every integer of ``first..last`` at once (merging with the ranges it
        overlaps or touches): the cost is in ranges, not in ids, so a range read from a file
        costs the same whatever its length."""
        if first > last:
            raise ValueError(f"id range ({first}, {last}) is empty")
        ranges = self._ranges
        i = ranges.bisect_right(first - 1)  # ranges from i on start at ``first`` or later
        if i and ranges.peekitem(i - 1)[1] >= first - 1:
            i -= 1  # the range before reaches ``first``: merged too
        new_first, new_last, held = first, last, 0
        while i < len(ranges):
            start, end = ranges.peekitem(i)
            if start > last + 1:
                break
            new_first, new_last = min(new_first, start), max(new_last, end)
            held += end - start + 1
            del ranges[start]
        ranges[new_first] = new_last
        self._count += new_last - new_first + 1 - held

    def ranges(self) -> list[tuple[int, int]]:
        """The ``(first, last)`` ranges, ascending."""
        return list(self._ranges.items())

    def first_missing_from(self, other: IdRanges) -> int | None:
        """The smallest integer held here but not by ``other``; None if ``other`` holds all
        of them (found without expanding the ranges)."""
        theirs = other._ranges
        first: int
        last: int
        for first, last in self._ranges.items():
            i = theirs.bisect_right(first)
            end: int = theirs.peekitem(i - 1)[1] if i else first - 1  # covers ``first``?
            if end < first:
                return first
            if end < last:
                return end + 1
        return None

    def __iter__(self) -> Iterator[int]:
        for first, last in self._ranges.items():
            yield from range(first, last + 1)

    def __len__(self) -> int:
        """How many integers are held (not how many ranges)."""
        return self._count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IdRanges):
            return NotImplemented
        return bool(self._ranges == other._ranges)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def _check(self) -> None:
        """Assert the invariants (stateful tests): ranges non-empty, ascending, disjoint and
        never adjacent (adjacent ones are merged), and the count their sizes' sum."""
        prev: int | None = None
        total = 0
        for first, last in self._ranges.items():
            assert type(first) is int and type(last) is int, (first, last)
            assert first <= last, (first, last)
            assert prev is None or first > prev + 1, f"range from {first} touches {prev}"
            total += last - first + 1
            prev = last
        assert total == self._count, (total, self._count)

    def __repr__(self) -> str:
        shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.ranges()[:8])
        more = ", ..." if len(self._ranges) > 8 else ""
        return f"IdRanges({shown}{more})"
