"""Test-only mutation switches: deliberately broken behaviours, off by default.

The simulator's checker must be able to fail. Each switch below re-introduces one real
BookKeeper-class bug at one place in the protocol code; a test turns it on and shows that the
seed sweep finds a violation. They are read once, from the environment variable
``PYBK_MUTATIONS`` (comma-separated names) at import time, or set programmatically with
:func:`enable` (tests and the simulator's runner). Protocol code asks ``mutations.ACTIVE``
with a plain set lookup, so the cost when off is one ``in`` test.

Never enable these outside tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

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

ACTIVE: set[str] = set()


def _from_env() -> None:
    raw = os.environ.get("PYBK_MUTATIONS", "")
    for name in filter(None, (n.strip() for n in raw.split(","))):
        enable(name)


def enable(name: str) -> None:
    if name not in KNOWN:
        raise ValueError(f"unknown mutation {name!r}; known: {', '.join(sorted(KNOWN))}")
    ACTIVE.add(name)


def disable_all() -> None:
    ACTIVE.clear()


@contextmanager
def active(*names: str) -> Iterator[None]:
    """Enable ``names`` for the duration of a ``with`` block (tests)."""
    before = set(ACTIVE)
    try:
        for name in names:
            enable(name)
        yield
    finally:
        ACTIVE.clear()
        ACTIVE.update(before)


_from_env()
