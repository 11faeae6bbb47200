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
from collections.abc import Awaitable, Callable, Collection, Coroutine, Generator
from typing import Any, Final, TypeVar, cast

__all__ = [
    "DEFAULT_LOOP",
    "LOOPS",
    "LoopUnavailableError",
    "available_loops",
    "gather",
    "loop_factory",
    "new_event_loop",
    "run",
    "wait",
    "within",
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


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``awaitable``'s result, TimeoutError after ``seconds``: ``asyncio.wait_for`` with the
    same steps on every Python. 3.11's ``wait_for`` wraps a coroutine in a task of its own,
    3.12's runs it in the caller's task under ``asyncio.timeout``: a simulated run that
    used it scheduled different things on each (and a run makes thousands of these).

    What ``async with asyncio.timeout(seconds)`` does, step for step (one timer made at
    entry, the task cancelled when it fires, the cancellation turned into TimeoutError when
    no other one was asked for meanwhile), without its context-manager object, state enum
    and two extra coroutines per call."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task(loop)
    if task is None:
        raise RuntimeError("within() should be used inside a task")
    cancelling = task.cancelling()
    expired = False

    def expire() -> None:
        nonlocal expired
        task.cancel()
        expired = True

    when = loop.time() + seconds
    handle = loop.call_soon(expire) if when <= loop.time() else loop.call_at(when, expire)
    try:
        result = await awaitable
    except BaseException as exc:
        handle.cancel()
        if expired and task.uncancel() <= cancelling and type(exc) is asyncio.CancelledError:
            raise TimeoutError from exc
        raise
    handle.cancel()
    if expired:
        task.uncancel()
    return result


class _Gathering(asyncio.Future[list[Any]]):
    """:func:`gather`'s outer future: cancelling it cancels the children (as a task's cancel
    does, it is not marked cancelled at once)."""

    def __init__(self, children: list[asyncio.Future[Any]],
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.children = children
        self.cancel_requested = False

    def cancel(self, msg: Any | None = None) -> bool:
        if self.done():
            return False
        cancelled = False
        for child in self.children:
            if child.cancel(msg=msg):
                cancelled = True
        if cancelled:
            self.cancel_requested = True
        return cancelled


def _cancelled_error(fut: asyncio.Future[Any]) -> asyncio.CancelledError:
    try:
        fut.result()
    except asyncio.CancelledError as exc:
        return exc
    return asyncio.CancelledError()


def gather(*aws: Awaitable[Any], return_exceptions: bool = False) -> asyncio.Future[list[Any]]:
    """``asyncio.gather`` with the same steps on every Python: Python 3.11's.

    From 3.12 on, ``asyncio.gather`` takes a child that is already done at once, where 3.11
    adds a done callback to it, which runs on the loop's next turn: what runs in between (and
    so a simulated run's trace) differed between versions. Here every child, done or not, is
    counted through its done callback, as on 3.11. The results, the error raised (the first
    child's that failed, unless ``return_exceptions``), and cancellation (cancelling the
    outer future cancels the children; a child's cancellation is its error) are asyncio's."""
    if not aws:
        done: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        done.set_result([])
        return done
    children: list[asyncio.Future[Any]] = []
    made: dict[Awaitable[Any], asyncio.Future[Any]] = {}
    finished = 0
    loop: asyncio.AbstractEventLoop | None = None
    outer: _Gathering | None = None

    def on_done(fut: asyncio.Future[Any]) -> None:
        nonlocal finished
        finished += 1
        if outer is None or outer.done():
            if not fut.cancelled():
                fut.exception()  # (retrieved: no "exception never retrieved" report)
            return
        if not return_exceptions:
            if fut.cancelled():
                outer.set_exception(_cancelled_error(fut))
                return
            exc = fut.exception()
            if exc is not None:
                outer.set_exception(exc)
                return
        if finished == len(made):
            results: list[Any] = []
            for child in children:
                if child.cancelled():
                    results.append(_cancelled_error(child))
                else:
                    exc = child.exception()
                    results.append(child.result() if exc is None else exc)
            if outer.cancel_requested:
                outer.set_exception(_cancelled_error(fut))
            else:
                outer.set_result(results)

    for aw in aws:
        fut = made.get(aw)
        if fut is None:
            fut = asyncio.ensure_future(aw, loop=loop)
            loop = fut.get_loop()
            made[aw] = fut
            fut.add_done_callback(on_done)
        children.append(fut)
    assert loop is not None
    outer = _Gathering(children, loop)
    return outer


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
