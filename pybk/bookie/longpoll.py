"""Long polls: readers parked on a ledger until its LAC moves, it is fenced, or time runs out.

The storage engine calls :meth:`LongPollWaiters.wake` when a watched ledger changes (it is
given :attr:`LongPollWaiters.by_ledger` to know which ledgers are watched, so an add to an
unwatched ledger costs one dict lookup). Timers are the running loop's, so the simulator's
virtual time drives them.
"""

from __future__ import annotations

import asyncio

__all__ = ["LongPollWaiters"]


class LongPollWaiters:
    """The futures of parked long polls, by ledger id."""

    __slots__ = ("by_ledger",)

    def __init__(self) -> None:
        self.by_ledger: dict[int, list[asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        """How many long polls wait (a gauge for operators)."""
        return sum(len(w) for w in self.by_ledger.values())

    def wake(self, ledger_id: int) -> None:
        """Wake every poll parked on ``ledger_id`` (each re-checks its condition)."""
        waiters = self.by_ledger.pop(ledger_id, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def wake_all(self) -> None:
        for lid in list(self.by_ledger):
            self.wake(lid)

    async def wait(self, ledger_id: int, timeout: float) -> None:
        """Park until :meth:`wake` for ``ledger_id`` or ``timeout`` seconds of loop time."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self.by_ledger.setdefault(ledger_id, []).append(fut)
        timer = loop.call_later(timeout, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            waiters = self.by_ledger.get(ledger_id)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self.by_ledger[ledger_id]


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
