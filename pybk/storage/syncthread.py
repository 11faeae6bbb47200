"""One thread that runs blocking syncs (``fdatasync``, a directory's ``fsync``) for the
event loop, in the order they are asked for.

Why not ``loop.run_in_executor``: a journal syncs once per batch, and at moderate rates its
batches are small, so the hand-off is paid often. An executor's costs a
``concurrent.futures.Future`` (a lock and a condition), a work item, the idle-semaphore
check, and on completion a chained callback that calls back into the loop to copy the
state over; here a call is one queue put, and its answer one ``call_soon_threadsafe`` that
settles the loop's future directly: about 50 us less wall time per sync on the 2-core VM the
benchmarks run on (docs/performance.md), and less CPU on both threads.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["SyncThread"]

_Job = tuple[Callable[[Any], object], Any, "asyncio.Future[Any]"]


class SyncThread:
    """A daemon thread started on first use; :meth:`close` stops it once what was asked
    has run (like ``ThreadPoolExecutor.shutdown(wait=True)``)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()

    def run(self, call: Callable[[Any], object], arg: Any) -> asyncio.Future[Any]:
        """``call(arg)`` on the thread; the future (of the running loop) gets its result or
        its exception. Once closed: RuntimeError, as a shut-down executor raises."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: cannot schedule a sync after close")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name,
                                                daemon=True)
                self._thread.start()
            self._jobs.put((call, arg, fut))
        return fut

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._jobs.put(None)
        if thread is not None:
            thread.join()

    def _work(self) -> None:
        get = self._jobs.get
        while (job := get()) is not None:
            call, arg, fut = job
            settle: Callable[[asyncio.Future[Any], object], None] = _succeed
            try:
                result: object = call(arg)
            except BaseException as exc:  # the caller's future carries it
                result, settle = exc, _fail
            try:
                fut.get_loop().call_soon_threadsafe(settle, fut, result)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass


def _succeed(fut: asyncio.Future[Any], result: object) -> None:
    if not fut.done():
        fut.set_result(result)


def _fail(fut: asyncio.Future[Any], exc: object) -> None:
    if not fut.done():
        assert isinstance(exc, BaseException)
        fut.set_exception(exc)
