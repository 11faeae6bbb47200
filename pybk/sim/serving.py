"""One request a simulated bookie is answering, stepped by hand (no task per request).

The simulated network (:mod:`pybk.sim.net`) starts a bookie's handler coroutine and steps it
itself, resuming it when the future it waits on is done: what a Task does, without a Task
per request. The answer goes back through ``network.answer(job, response)``; a handler that
raises is reported through ``network.raised(job, exc)`` (a bookie must answer, never raise).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

from pybk.wire import Request, Response

if TYPE_CHECKING:
    from pybk.sim.links import Conn
    from pybk.sim.net import SimNetwork

__all__ = ["Serving", "await_answer"]


async def await_answer(answer: Awaitable[Response]) -> Response:
    """A handler's awaitable answer as a coroutine (what :class:`Serving` steps)."""
    return await answer


class Serving:
    """One request being answered: steps the handler's coroutine by hand, resuming it when
    the future it waits on is done."""

    __slots__ = ("bookie_id", "client", "conn", "coro", "gen", "incarnation", "net", "request",
                 "seq")

    def __init__(self, net: SimNetwork, coro: Coroutine[Any, Any, Response], incarnation: int,
                 client: str, bookie_id: str, conn: Conn, gen: int, seq: int,
                 request: Request) -> None:
        self.net = net
        self.coro = coro
        self.incarnation = incarnation
        self.client = client
        self.bookie_id = bookie_id
        self.conn = conn
        self.gen = gen
        self.seq = seq
        self.request = request

    def step(self, _done: object = None) -> None:
        try:
            waiting = self.coro.send(None)
        except StopIteration as stop:
            self.net.answer(self, stop.value)
            return
        except asyncio.CancelledError:
            return  # (what it waited on was cancelled: the bookie went away)
        except Exception as exc:
            self.net.raised(self, exc)
            return
        if waiting is None:  # a bare yield (asyncio.sleep(0)): resume on the next turn
            self.net.running_loop().call_soon(self.step)
        else:  # a future: resume once it is done (its result is read by the coroutine)
            waiting._asyncio_future_blocking = False
            waiting.add_done_callback(self.step)
