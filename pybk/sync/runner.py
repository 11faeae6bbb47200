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
        """Call ``start()`` on the loop and wait for the future it returns: no task, no
        thread-safe future; the loop releases a lock this thread waits on once the future is
        done, and this thread reads the outcome (a lone append's hops are most of its
        latency: one wake-up of this thread, no condition variable)."""
        self._refuse_own_thread()
        hand = _Handoff()
        self.loop.call_soon_threadsafe(hand.begin, start)
        hand.lock.acquire()
        if hand.error is not None:
            raise hand.error
        fut: asyncio.Future[T] | None = hand.fut
        assert fut is not None
        if fut.cancelled():
            raise concurrent.futures.CancelledError()
        return fut.result()

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


class _Handoff:
    """One :meth:`LoopThread.resolve`: the lock its caller waits on (held until the outcome
    is in), and the outcome: the done future, or what ``start()`` raised."""

    __slots__ = ("error", "fut", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.fut: asyncio.Future[Any] | None = None
        self.error: BaseException | None = None

    def begin(self, start: Callable[[], asyncio.Future[Any]]) -> None:
        try:
            fut = start()
        except BaseException as exc:
            self.error = exc
            self.lock.release()
            return
        fut.add_done_callback(self.done)

    def done(self, fut: asyncio.Future[Any]) -> None:
        self.fut = fut
        self.lock.release()


async def _take(agen: AsyncIterator[T], n: int) -> list[T]:
    out: list[T] = []
    async for item in agen:
        out.append(item)
        if len(out) >= n:
            break
    return out
