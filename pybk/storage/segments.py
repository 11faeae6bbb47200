"""The journal segments a :class:`~pybk.storage.store.LedgerStore` holds: their file names,
what compaction reads and changes, and what the store's checkpoints name.

Each sealed segment's size is known (the active one's is not: -1). Segments compaction
retired stay named in every checkpoint until their files are known deleted, so a crash
between that checkpoint and the deletion is finished at the next start.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["SEGMENT_SUFFIX", "SegmentTable", "parse_segment_name", "segment_name"]

SEGMENT_SUFFIX = ".seg"


def segment_name(seq: int) -> str:
    """A journal segment's file name."""
    return f"{seq:016x}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The sequence number of a segment file name, None for any other file."""
    if not name.endswith(SEGMENT_SUFFIX) or len(name) != 16 + len(SEGMENT_SUFFIX):
        return None
    try:
        return int(name[:16], 16)
    except ValueError:
        return None


class SegmentTable:
    """seq -> size of every segment held, and those retired but maybe not deleted yet."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}  # seq -> size when sealed (active: -1)
        #: retired by compaction, not yet known deleted (named in each checkpoint)
        self.retiring: list[int] = []

    def __contains__(self, seq: object) -> bool:
        return seq in self.sizes

    def opened(self, sealed: dict[int, int], retiring: list[int]) -> None:
        """What the start-up replay found."""
        self.sizes.update(sealed)
        self.retiring = list(retiring)

    def started(self, active: int) -> None:
        """The journal writes ``active`` (size unknown until sealed)."""
        self.sizes[active] = -1

    def rotated(self, old_seq: int, old_size: int, new_seq: int) -> None:
        self.sizes[old_seq] = old_size
        self.sizes[new_seq] = -1

    def sealed(self) -> Iterator[tuple[int, int]]:
        """(seq, size) of the sealed segments, oldest first."""
        for seq, size in sorted(self.sizes.items()):
            if size >= 0:
                yield seq, size

    def retire(self, seqs: Iterable[int]) -> None:
        """``seqs`` are no longer referenced: the next checkpoint names them retired."""
        self.retiring.extend(seqs)

    def drop(self, seq: int) -> int:
        """Forget a retired segment whose file is being deleted; its size."""
        return self.sizes.pop(seq)

    def deleted(self, seqs: Iterable[int]) -> None:
        """The retired ``seqs``' deletions are durable: checkpoints stop naming them."""
        gone = set(seqs)
        self.retiring = [s for s in self.retiring if s not in gone]
