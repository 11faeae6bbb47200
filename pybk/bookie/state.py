"""A bookie's state: writable, read-only or stopped.

A ``StrEnum`` so the value travels as the plain string it always was (the registry, the
wire's BookieInfo answer, logs) while code compares against named members.
"""

from __future__ import annotations

import enum

__all__ = ["READ_ONLY", "STOPPED", "WRITABLE", "BookieState"]


class BookieState(enum.StrEnum):
    """What a bookie accepts: everything, reads and recovery adds only, or nothing."""

    WRITABLE = "writable"
    READ_ONLY = "read-only"
    STOPPED = "stopped"


WRITABLE = BookieState.WRITABLE
READ_ONLY = BookieState.READ_ONLY
STOPPED = BookieState.STOPPED
