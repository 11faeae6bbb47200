"""Which event loop pybk runs on where pybk itself makes the loop: an opt-in seam for uvloop.

pybk's async API runs on whatever loop the caller runs it on: pick uvloop for your own
program with ``asyncio.Runner(loop_factory=uvloop.new_event_loop)`` (or ``uvloop.run``),
nothing here is needed for that. pybk makes a loop of its own in four places, and each takes
a ``loop`` option naming one of :data:`LOOPS` (default ``"asyncio"``: never forced):

* ``pybk.sync.LocalCluster(root, loop="uvloop")`` and ``pybk.sync.Client(..., loop=...)``
  (the background loop thread of the synchronous API);
* ``pybk.WAL(path, loop="uvloop")`` (the synchronous WAL's loop thread);
* the command line: ``pybk bookie --loop uvloop`` (a bookie process) and
  ``pybk bench --loop uvloop``.

uvloop is an optional dependency: ``pip install pybk[speed]``. Asking for it without it
installed is a clear error (:class:`LoopUnavailableError`), never a silent fallback, so a
measurement never reports asyncio's numbers under uvloop's name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine, Generator
from typing import Any, Final, TypeVar, cast

__all__ = [
    "DEFAULT_LOOP",
    "LOOPS",
    "LoopUnavailableError",
    "available_loops",
    "loop_factory",
    "new_event_loop",
    "run",
    "wait",
    "yield_now",
]

T = TypeVar("T")

#: the event loops pybk knows how to make, by name
LOOPS: Final = ("asyncio", "uvloop")
DEFAULT_LOOP: Final = "asyncio"


class _YieldNow:
    """``await yield_now``: give every other ready callback a turn, as ``await
    asyncio.sleep(0)`` does (the task is resumed on the loop's next turn), without a
    coroutine and a generator made per call: what a store operation or a gathering journal
    does thousands of times a second."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        # a bare None yielded to the task ("run me again next turn"), from a tuple's iterator:
        # what ``await`` drives like a generator's
        return cast(Generator[None, None, None], iter((None,)))


yield_now: Final = _YieldNow()


async def wait(fs: Collection[asyncio.Future[Any]], timeout: float | None = None, *,
               first: bool = False) -> tuple[set[asyncio.Future[Any]], set[asyncio.Future[Any]]]:
    """``asyncio.wait(fs, timeout=timeout, return_when=FIRST_COMPLETED if first else
    ALL_COMPLETED)`` for futures (and tasks) that already exist: (done, pending).

    The same steps on the loop in the same order (one waiter future, the timeout's timer, a
    done callback on each of ``fs``, removed again after the wake-up), so a simulated run
    schedules exactly what it did with ``asyncio.wait``; without what asyncio's costs per
    call on top (a second coroutine, the set built twice, the per-element checks for
    coroutines and ``ensure_future``): a read waits like this once or twice per entry read
    one at a time. An empty ``fs`` is a ValueError, as there (it would wait forever)."""
    if not fs:
        raise ValueError("wait() needs at least one future to wait for")
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    left = len(fs)

    def on_done(_f: asyncio.Future[Any]) -> None:
        nonlocal left
        left -= 1
        if (first or left <= 0) and not waiter.done():
            waiter.set_result(None)

    handle = None if timeout is None else loop.call_later(timeout, _release, waiter)
    for f in fs:
        f.add_done_callback(on_done)
    try:
        await waiter
    finally:
        if handle is not None:
            handle.cancel()
        for f in fs:
            f.remove_done_callback(on_done)
    done: set[asyncio.Future[Any]] = set()
    pending: set[asyncio.Future[Any]] = set()
    for f in fs:
        (done if f.done() else pending).add(f)
    return done, pending


def _release(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class LoopUnavailableError(RuntimeError):
    """The named event loop cannot be made here (unknown name, or its package is missing)."""


def loop_factory(name: str | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """A function making a new event loop of kind ``name`` (None: the default, asyncio's).

    Checked at once: an unknown name or a missing uvloop raises :class:`LoopUnavailableError`
    here, before anything was started."""
    name = DEFAULT_LOOP if name is None else name
    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        try:
            import uvloop
        except ImportError as exc:
            raise LoopUnavailableError(
                "loop 'uvloop' needs the uvloop package: pip install 'pybk[speed]'"
            ) from exc
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    raise LoopUnavailableError(f"unknown event loop {name!r}; known: {', '.join(LOOPS)}")


def new_event_loop(name: str | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop of kind ``name`` (see :func:`loop_factory`)."""
    return loop_factory(name)()


def available_loops() -> list[str]:
    """The names in :data:`LOOPS` that can be made in this environment."""
    out = []
    for name in LOOPS:
        try:
            loop_factory(name)
        except LoopUnavailableError:
            continue
        out.append(name)
    return out


def run(coro: Coroutine[Any, Any, T], loop: str | None = None) -> T:
    """``asyncio.run(coro)`` on a new loop of kind ``loop``."""
    try:
        factory = loop_factory(loop)
    except BaseException:
        coro.close()  # never awaited: say nothing about it
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)
