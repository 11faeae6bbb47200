"""The one loop-thread runner behind every synchronous class (``pybk.sync``, ``pybk.WAL``).

A :class:`LoopThread` owns an event loop running forever in a daemon thread. Synchronous
code hands it coroutines (:meth:`run`, :meth:`submit`), a call that starts a future on the
loop (:meth:`resolve`: one hop there and one back, no task, for the lone-writer path), or an
async iterator to drain a batch per hop (:meth:`iterate`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from functools import partial
from typing import Any, TypeVar

from pybk.runtime.eventloop import new_event_loop

T = TypeVar("T")

__all__ = ["LoopThread"]


class LoopThread:
    """One event loop running forever in a daemon thread; ``loop`` names its kind
    (:mod:`pybk.runtime.eventloop`: ``"asyncio"``, the default, or ``"uvloop"``)."""

    def __init__(self, loop: str | None = None) -> None:
        self.loop = new_event_loop(loop)
        self._thread = threading.Thread(target=self.loop.run_forever, name="pybk-sync", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def _refuse_own_thread(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError("pybk's synchronous API called from its own event loop thread")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result."""
        self._refuse_own_thread()
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its result as a thread-safe future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def resolve(self, start: Callable[[], asyncio.Future[T]]) -> T:
        """Call ``start()`` on the loop and wait for the future it returns: no task, its
        result chained straight to a thread-safe future (a lone append's hops are most of
        its latency)."""
        self._refuse_own_thread()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def begin() -> None:
            try:
                fut = start()
            except BaseException as exc:
                done.set_exception(exc)
                return
            fut.add_done_callback(partial(_chain, done))

        self.loop.call_soon_threadsafe(begin)
        return done.result()

    def iterate(self, agen: AsyncIterator[T], batch: int = 1024) -> Iterator[T]:
        """The items of ``agen``, fetched ``batch`` per hop; closes it when done or abandoned."""
        try:
            while True:
                items = self.run(_take(agen, batch))
                if not items:
                    return
                yield from items
        finally:
            close = getattr(agen, "aclose", None)
            if close is not None:
                with contextlib.suppress(RuntimeError):  # the loop already stopped
                    self.run(close())

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _chain(done: concurrent.futures.Future[T], fut: asyncio.Future[T]) -> None:
    if fut.cancelled():
        done.cancel()
    elif (exc := fut.exception()) is not None:
        done.set_exception(exc)
    else:
        done.set_result(fut.result())


async def _take(agen: AsyncIterator[T], n: int) -> list[T]:
    out: list[T] = []
    async for item in agen:
        out.append(item)
        if len(out) >= n:
            break
    return out
