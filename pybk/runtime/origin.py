"""Which peer a request came from, for the bookie's shares per connection (issue 34).

A server sets :data:`REQUEST_ORIGIN` to the connection while it hands a request to the bookie
(for the call on the add path, for the task of any other request), so a bound deep in the
bookie (the unknown-ledger check's metadata slots, :mod:`pybk.bookie.unknown`) can keep one
connection from taking what every other one needs, without every handler's signature carrying
it. Unset (None) where nobody says: in process, in the simulator; a bound then treats all its
requests as one peer's, as before.
"""

from __future__ import annotations

from collections.abc import Hashable
from contextvars import ContextVar
from typing import Final

__all__ = ["REQUEST_ORIGIN"]

#: the connection (any hashable identity) the request being handled came from, or None
REQUEST_ORIGIN: Final[ContextVar[Hashable | None]] = ContextVar("pybk_request_origin",
                                                                default=None)
