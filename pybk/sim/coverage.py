"""Coverage markers (Antithesis-style ``sometimes``): proof that a run reached a dangerous state.

Protocol code may call ``sometimes("name")`` at a point worth reaching (e.g. "recovery saw
NoSuchEntry from a fenced bookie"). It costs one dict update and never changes behaviour; the
simulator resets the counters before a run and reports them in the summary, so a sweep that
never reaches a marker is visible.
"""

from __future__ import annotations

from collections import Counter

COUNTS: Counter[str] = Counter()


def sometimes(name: str) -> None:
    """Count that the state ``name`` was reached."""
    COUNTS[name] += 1


def reset() -> None:
    COUNTS.clear()


def snapshot() -> dict[str, int]:
    return dict(COUNTS)
