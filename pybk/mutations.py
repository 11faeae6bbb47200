"""Mutation switches: deliberately broken behaviours, off unless someone hands them in.

The simulator's checker and the protocol tests must be able to fail. Each switch re-introduces
one real BookKeeper-class bug at one place in the protocol code, and a test turns it on to
show that its checks catch the bug. Switches are a plain immutable :class:`Mutations` value
passed down from the outermost layer (the simulator's runner, a test) through the configs
that the bookie and the client already take (``StoreConfig.mutations``,
``ClientConfig.mutations``); nothing reads them from the environment or from global state,
so two clusters in one process can run with different switches, and a production
configuration carries :data:`NO_MUTATIONS`.

Code that consults a switch reads it once, when it is built (a bool attribute), so the
cost on a hot path is one attribute test.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

__all__ = [
    "ACK_BEFORE_FSYNC",
    "ACK_OUT_OF_ORDER",
    "DELTA_SKIPS_LEDGER_STATE",
    "KNOWN",
    "NO_MUTATIONS",
    "NO_SUCH_ENTRY_ON_IO_ERROR",
    "RECOVERY_READS_DONT_FENCE",
    "Mutations",
]

#: The bookie acknowledges an add before the journal fsync that covers it.
ACK_BEFORE_FSYNC: Final = "ack_before_fsync"
#: Recovery reads (forward reads after the LAC) do not fence (BookKeeper issue #2614).
RECOVERY_READS_DONT_FENCE: Final = "recovery_reads_dont_fence"
#: The bookie answers NoSuchEntry when reading an entry fails with an I/O/checksum error (#2908).
NO_SUCH_ENTRY_ON_IO_ERROR: Final = "no_such_entry_on_io_error"
#: The writer acknowledges adds as soon as they reach Qa, not in entry-id order.
ACK_OUT_OF_ORDER: Final = "ack_out_of_order"
#: A delta index checkpoint leaves out the ledgers whose state changed without new entries
#: (a fence, an explicit LAC): the chain then forgets them once the journal moves past.
DELTA_SKIPS_LEDGER_STATE: Final = "delta_skips_ledger_state"

KNOWN: Final = frozenset(
    {ACK_BEFORE_FSYNC, RECOVERY_READS_DONT_FENCE, NO_SUCH_ENTRY_ON_IO_ERROR, ACK_OUT_OF_ORDER,
     DELTA_SKIPS_LEDGER_STATE}
)


class Mutations:
    """An immutable set of switch names, each one of :data:`KNOWN`.

    ``Mutations("ack_before_fsync")``, ``Mutations.parse("a,b")``; ``name in m`` asks."""

    __slots__ = ("_names",)

    def __init__(self, *names: str) -> None:
        unknown = sorted(set(names) - KNOWN)
        if unknown:
            raise ValueError(
                f"unknown mutation {', '.join(map(repr, unknown))}; known: "
                f"{', '.join(sorted(KNOWN))}")
        self._names = frozenset(names)

    @classmethod
    def parse(cls, text: str) -> Mutations:
        """From a comma-separated list (a command line's ``--mutation a,b``)."""
        return cls(*filter(None, (n.strip() for n in text.split(","))))

    @classmethod
    def of(cls, names: Iterable[str]) -> Mutations:
        return cls(*names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __bool__(self) -> bool:
        return bool(self._names)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mutations) and other._names == self._names

    def __hash__(self) -> int:
        return hash(self._names)

    def __repr__(self) -> str:
        return f"Mutations({', '.join(map(repr, self))})"


#: what every production configuration carries
NO_MUTATIONS: Final = Mutations()
