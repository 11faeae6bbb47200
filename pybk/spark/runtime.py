"""One event loop and one client per metadata URI in each Python worker process.

Spark runs a data source's methods in Python worker processes (executors' tasks, and planning
or commit workers on the driver side) and reuses those processes between tasks
(``spark.python.worker.reuse``, on by default). Opening a client costs a metadata session and
a connection per bookie, so each process keeps one event loop in a daemon thread and one
:class:`pybk.Client` per metadata URI, made on first use and reused by every later task. A
process forked from one that had them (Spark's worker daemon forks its workers) starts its
own: the cache is keyed by process id.

Tasks call :func:`run` from Spark's (synchronous) task thread: the coroutine runs on the
loop thread and the call returns its result, or raises its exception.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from pybk.client import Client

__all__ = ["aclient", "client", "drop_client", "run"]

T = TypeVar("T")

log = logging.getLogger(__name__)


class _Runtime:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="pybk-spark",
                                       daemon=True)
        self.thread.start()
        self.clients: dict[str, Client] = {}  # touched on the loop thread only


_runtime: _Runtime | None = None
_guard = threading.Lock()


def _get() -> _Runtime:
    global _runtime
    rt = _runtime
    if rt is not None and rt.pid == os.getpid():
        return rt
    with _guard:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = _Runtime()
        return _runtime


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on this process's pybk loop and return its result (TimeoutError after
    ``timeout`` seconds, the coroutine then cancelled)."""
    rt = _get()
    if threading.current_thread() is rt.thread:
        coro.close()
        raise RuntimeError("pybk.spark.runtime.run called from its own loop thread")
    if timeout is not None:
        coro = asyncio.wait_for(coro, timeout)
    return asyncio.run_coroutine_threadsafe(coro, rt.loop).result()


async def aclient(uri: str) -> Client:
    """This process's client for the metadata URI ``uri`` (made on first use); call it on the
    runtime's loop (inside a coroutine given to :func:`run`)."""
    rt = _get()
    found = rt.clients.get(uri)
    if found is None:
        found = rt.clients[uri] = Client(uri)
    try:
        return await found.start()
    except BaseException:
        if rt.clients.get(uri) is found:
            del rt.clients[uri]
        raise


def client(uri: str) -> Client:
    """This process's client for ``uri`` (see :func:`aclient`), from a synchronous caller.
    Use it only from coroutines passed to :func:`run`."""
    return run(aclient(uri))


async def _drop(uri: str) -> None:
    gone = _get().clients.pop(uri, None)
    if gone is not None:
        await gone.close()


def drop_client(uri: str) -> None:
    """Forget (and close) the client for ``uri``: after it failed to reach its store, so the
    next use starts afresh."""
    try:
        run(_drop(uri), timeout=5.0)
    except Exception as exc:  # closing a client whose store could not be reached
        log.info("closing the client of %s failed: %r", uri, exc)
