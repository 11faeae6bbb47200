"""A bookie's state: writable, read-only or stopped (:class:`pybk.wire.BookieState`).

Named here for the bookie's own code and its users (``pybk.bookie.WRITABLE``); the enum
itself lives in :mod:`pybk.wire` because the wire's BookieInfo answer carries it.
"""

from __future__ import annotations

from pybk.wire import BookieState

__all__ = ["READ_ONLY", "STOPPED", "WRITABLE", "BookieState"]

WRITABLE = BookieState.WRITABLE
READ_ONLY = BookieState.READ_ONLY
STOPPED = BookieState.STOPPED
