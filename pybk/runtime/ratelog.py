"""Log lines about events a peer can cause at will (refused connections, failed accepts,
malformed requests, handler failures), logged at most once per interval per kind with a
count, so an attack cannot fill the disk with the bookie's log."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """One warning per ``interval`` seconds per kind of event, naming how many happened.

    The first event of a quiet period is logged at once; later ones are counted and
    summarised by the next :meth:`event` after the interval, or by :meth:`flush` (a timer
    calls it, so the last burst is reported too). ``clock`` is the running loop's time."""

    def __init__(self, logger: logging.Logger, interval: float, clock: Callable[[], float]):
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: collections.Counter[str] = collections.Counter()
        self._detail: dict[str, str] = {}
        self._level: dict[str, int] = {}
        #: warnings actually written (tests and operators: the log stays small)
        self.emitted = 0

    def event(self, kind: str, detail: str, level: int = logging.WARNING,
              exc: BaseException | None = None) -> None:
        """One event of ``kind``; ``detail`` says what happened (the newest is reported),
        logged at ``level``; ``exc``, an exception nobody expected, goes with the line that
        is written (its traceback: the simulator's findings read it from the record)."""
        self._level[kind] = level
        now = self.clock()
        last = self._last.get(kind)
        if last is None or now - last >= self.interval:
            self._emit(kind, detail, now, exc=exc)
        else:
            self._suppressed[kind] += 1
            self._detail[kind] = detail

    def flush(self) -> None:
        """Report the events held back once their interval has passed."""
        now = self.clock()
        for kind in [k for k, n in self._suppressed.items() if n]:
            if now - self._last.get(kind, 0.0) >= self.interval:
                self._emit(kind, self._detail.pop(kind, ""), now, repeat=True)

    def _emit(self, kind: str, detail: str, now: float, repeat: bool = False,
              exc: BaseException | None = None) -> None:
        held = self._suppressed.pop(kind, 0)
        level = self._level.get(kind, logging.WARNING)
        if exc is not None:
            self.logger.log(level, "%s: %s (further ones reported at most every %.0f s)",
                            kind, detail, self.interval, exc_info=exc)
        elif repeat:
            self.logger.log(level, "%s: %d more in the last %.0f s (latest: %s)",
                            kind, held, self.interval, detail)
        elif held:
            self.logger.log(level, "%s: %s (and %d more since the last report)", kind, detail,
                            held)
        else:
            self.logger.log(level, "%s: %s (further ones reported at most every %.0f s)",
                            kind, detail, self.interval)
        self._last[kind] = now
        self.emitted += 1
