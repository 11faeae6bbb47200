"""When a writer tells its bookies the LAC explicitly (sans-IO, part of the write pipeline).

Bookies learn a writer's LAC from the entries it sends (each carries the LAC of when it was
framed), so an entry becomes visible to tailing readers only when a later entry brings its
confirmation. Two rules send it on its own (a ``WriteLac`` to the bookies of the ensemble):

* immediate (``ClientConfig.immediate_lac``, on by default): the LAC moved, nothing follows it
  in the pipeline and no entry framed since carries it. The driver asks :meth:`LacFlush.due`
  after each round of actions and comes back with :meth:`LacFlush.take` three loop
  iterations later (``immediate_lac_delay``: a time instead), so a caller who appends again
  at once carries the LAC on that add: a writer at saturation sends none, an idle writer's
  last record one (docs/internals.md);
* periodic (``ClientConfig.explicit_lac_interval``, BookKeeper's ExplicitLacFlushPolicy): at
  a tick, when idle with entries confirmed past what the bookies were told, and no add since
  the last tick carried a newer LAC. With the immediate rule it is the fallback for a lost
  message.

Either way the LAC told never passes what the pipeline confirmed (Qa acks, in order).
"""

from __future__ import annotations

__all__ = ["LacFlush"]


class LacFlush:
    """The LAC a writer's bookies were told, and when to tell them more."""

    __slots__ = ("immediate", "interval", "piggybacked", "told")

    def __init__(self, *, immediate: bool = False, interval: float = 0.0) -> None:
        self.immediate = immediate
        self.interval = interval
        #: the LAC the last entry framed carries (what its bookies learn with it)
        self.piggybacked = -1
        #: the last LAC sent on its own (or, for the periodic rule, seen piggybacked)
        self.told = -1

    def framed(self, lac: int) -> None:
        """An entry was framed carrying ``lac``."""
        self.piggybacked = lac

    def due(self, lac: int, pending: int) -> bool:
        """Should the immediate rule send ``lac`` (``pending``: entries after it)?"""
        return (self.immediate and not pending and lac > self.told
                and lac > self.piggybacked)

    def take(self, lac: int, pending: int) -> int | None:
        """The LAC to send now by the immediate rule (None: nothing to send), noted as told."""
        if not self.due(lac, pending):
            return None
        self.told = lac
        return lac

    def tick(self, lac: int, pending: int) -> int | None:
        """The periodic rule at a timer tick: the LAC to send, or None."""
        if lac <= self.told or pending:
            return None
        if self.piggybacked > self.told:
            self.told = self.piggybacked  # adds carried it since the last tick: not yet
            return None
        self.told = lac
        return lac
