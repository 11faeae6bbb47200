"""The callers' side of the add path: the futures a writer hands out, and how they are
settled once the write pipeline confirms or fails their entries.

These run once per append (or once per confirmed run of entries), so each is the cheapest
form found for its job (docs/performance.md): futures made by a C partial, a run of
confirmations settled by one ``map``, one future for a whole ``push_many`` batch. Used by the
driver (:class:`pybk.client.writer.AddPipeline`) for the ``Resolve`` and ``Fail`` actions.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pybk.errors import fresh_copy

if TYPE_CHECKING:
    from pybk.client.write_actions import Fail, Resolve
    from pybk.stats import ClientStats

__all__ = ["AddTimer", "BatchWaiter", "fail_waiters", "future_maker", "resolve_waiters"]


class BatchWaiter:
    """The waiter of the last entry of a :meth:`AddPipeline.push_many`: one future for the
    whole batch, resolved with its entry ids once the last one is confirmed."""

    __slots__ = ("first", "future")

    def __init__(self, first: int, future: asyncio.Future[list[int]]) -> None:
        self.first = first
        self.future = future


class AddTimer:
    """Done-callback of an append (or a batch) when the client keeps metrics."""

    __slots__ = ("started", "stats")

    def __init__(self, stats: ClientStats, started: float) -> None:
        self.stats = stats
        self.started = started

    def __call__(self, fut: asyncio.Future[Any]) -> None:
        stats = self.stats
        if fut.cancelled() or fut.exception() is not None:
            stats.add_errors += 1
            return
        stats.adds += 1
        stats.add_latency.observe(fut.get_loop().time() - self.started)


def future_maker(loop: asyncio.AbstractEventLoop) -> Callable[[], asyncio.Future[Any]]:
    """``loop.create_future`` as the cheapest call that makes the same future: asyncio's own
    loops make a plain ``asyncio.Future(loop=loop)`` through a Python method (a frame per
    append); a partial builds it in C. A loop with its own ``create_future`` (uvloop, a
    test's) keeps it."""
    if type(loop).create_future is asyncio.BaseEventLoop.create_future:
        return functools.partial(asyncio.Future, loop=loop)
    return loop.create_future


def resolve_waiters(action: Resolve) -> None:
    """Settle the waiters of a run of confirmed entries: each future with its entry id, a
    batch's with the ids of the whole batch."""
    waiters = action.waiters
    if len(waiters) > 4 and None not in waiters:  # each its own future: one C pass
        try:
            deque(map(_set_result, waiters, range(action.first, action.last + 1)), maxlen=0)
            return
        except (asyncio.InvalidStateError, TypeError):
            pass  # a cancelled future or a batch's waiter: the checked loop below settles
            # the rest (those set already are done, so it skips them)
    eid = action.first
    for waiter in waiters:
        if waiter is not None:
            if type(waiter) is BatchWaiter:
                fut = waiter.future
                if not fut.done():
                    fut.set_result(list(range(waiter.first, eid + 1)))
            elif not waiter.done():
                waiter.set_result(eid)
        eid += 1


#: ``Future.set_result`` unbound (a C function on the loop's own futures; a waiter of another
#: type makes it raise TypeError, and resolve_waiters falls back to the checked loop)
_set_result = asyncio.Future.set_result


def fail_waiters(action: Fail) -> None:
    """Settle every waiter of a failed pipeline with (a fresh copy of) its error."""
    for waiter in action.waiters:
        fut: Any = waiter.future if type(waiter) is BatchWaiter else waiter
        if not fut.done():
            fut.set_exception(fresh_copy(action.error))
            fut.exception()  # the caller may never look; do not warn
