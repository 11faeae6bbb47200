"""Request hooks: make every failure interleaving of a test deterministic, with no sleeps.

BookKeeper tests the client's hardest paths (``LedgerRecovery2Test``, ``HandleFailuresTest``)
against mock bookies whose requests can be paused, failed or released one by one. These
hooks give the same control over *real* bookies: wrap any transport (in-process, TCP,
simulated) in a :class:`HookedTransport` and add rules to its ``hooks``. Production code never
sees them; ``LocalCluster(..., transport_wrapper=HookedTransport)`` puts them in front of an
embedded cluster's bookies.

A rule matches requests by bookie and optionally by operation, ledger, entry, or any
predicate, and then (listed in docs/internals.md, "pybk/testing/hooks.py").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from pybk.errors import BKError, BookieUnavailableError, TimeoutError, error_for_status
from pybk.transport.base import (
    Transport,
    read_batch_by_singles,
    split_batch,
    split_callback,
)
from pybk.transport.deadlines import Deadlines
from pybk.transport.refusals import Refusal
from pybk.wire import (
    AddBatchRequest,
    AddCallback,
    AddLike,
    AddOutcome,
    AddRequest,
    Op,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    error_response,
)

Action = Literal["hold", "fail", "drop", "before"]
BeforeCallback = Callable[[str, Request], Awaitable[None]]


def _entry_of(request: Request) -> int | None:
    if isinstance(request, AddRequest | ReadRequest):
        return request.entry_id
    return None


@dataclass(eq=False)
class HeldRequest:
    """A request parked by a ``hold`` rule, with the callback that delivers it."""

    bookie_id: str
    request: Request
    deliver: Callable[[], None]
    fail: Callable[[Status | None], None]
    drop: Callable[[], None]


@dataclass(eq=False)
class Rule:
    """One hook rule. Built by the :class:`Hooks` helpers, not directly."""

    hooks: Hooks
    action: Action
    bookie: str | None = None
    op: Op | None = None
    ledger_id: int | None = None
    entry_id: int | None = None
    predicate: Callable[[str, Request], bool] | None = None
    status: Status | None = None
    callback: BeforeCallback | None = None
    times: int | None = None
    matched: int = 0
    held: list[HeldRequest] = field(default_factory=list)
    _changed: asyncio.Event | None = None

    def matches(self, bookie_id: str, request: Request) -> bool:
        if self.times is not None and self.matched >= self.times:
            return False
        if self.bookie is not None and self.bookie != bookie_id:
            return False
        if self.op is not None and request.op != self.op:
            return False
        if self.ledger_id is not None and getattr(request, "ledger_id", None) != self.ledger_id:
            return False
        if self.entry_id is not None and _entry_of(request) != self.entry_id:
            return False
        return self.predicate is None or self.predicate(bookie_id, request)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait_matched(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until this rule has matched ``count`` requests (bounded by ``timeout``)."""
        async with asyncio.timeout(timeout):
            while self.matched < count:
                if self._changed is None:
                    self._changed = asyncio.Event()
                await self._changed.wait()

    async def wait_held(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until at least ``count`` requests are parked by this ``hold`` rule."""
        async with asyncio.timeout(timeout):
            while len(self.held) < count:
                if self._changed is None:
                    self._changed = asyncio.Event()
                await self._changed.wait()

    def _take(self, n: int | None) -> list[HeldRequest]:
        taken = self.held if n is None else self.held[:n]
        self.held = [] if n is None else self.held[n:]
        return taken

    def release(self, n: int | None = None) -> int:
        """Deliver the first ``n`` held requests (all when None), in arrival order."""
        taken = self._take(n)
        for h in taken:
            h.deliver()
        return len(taken)

    def fail_held(self, status: Status | None = Status.IO_ERROR, n: int | None = None) -> int:
        """Answer held requests with ``status`` (None: BookieUnavailableError)."""
        taken = self._take(n)
        for h in taken:
            h.fail(status)
        return len(taken)

    def drop_held(self, n: int | None = None) -> int:
        """Never deliver the held requests: their callers time out."""
        taken = self._take(n)
        for h in taken:
            h.drop()
        return len(taken)

    def remove(self, *, release: bool = True) -> None:
        """Retire the rule; by default deliver whatever it still holds."""
        if self in self.hooks.rules:
            self.hooks.rules.remove(self)
        if release:
            self.release()


class Hooks:
    """An ordered list of rules consulted for every request a transport sends."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []

    def __bool__(self) -> bool:
        return bool(self.rules)

    def match(self, bookie_id: str, request: Request) -> Rule | None:
        """The first live rule matching this request (and count the match)."""
        for rule in self.rules:
            if rule.matches(bookie_id, request):
                rule.matched += 1
                rule._notify()
                return rule
        return None

    def _add(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule

    def hold(
        self,
        bookie: str | None = None,
        *,
        op: Op | None = None,
        ledger_id: int | None = None,
        entry_id: int | None = None,
        predicate: Callable[[str, Request], bool] | None = None,
        times: int | None = None,
    ) -> Rule:
        """Park matching requests until released."""
        return self._add(
            Rule(self, "hold", bookie, op, ledger_id, entry_id, predicate, times=times)
        )

    def fail(
        self,
        bookie: str | None = None,
        *,
        status: Status | None = Status.IO_ERROR,
        op: Op | None = None,
        ledger_id: int | None = None,
        entry_id: int | None = None,
        predicate: Callable[[str, Request], bool] | None = None,
        times: int | None = None,
    ) -> Rule:
        """Answer matching requests with ``status``, or BookieUnavailableError when None."""
        return self._add(
            Rule(
                self, "fail", bookie, op, ledger_id, entry_id, predicate, status=status,
                times=times,
            )
        )

    def unavailable(self, bookie: str | None = None, **kwargs: object) -> Rule:
        """Matching requests fail with BookieUnavailableError (the bookie is unreachable)."""
        return self.fail(bookie, status=None, **kwargs)  # type: ignore[arg-type]

    def drop(
        self,
        bookie: str | None = None,
        *,
        op: Op | None = None,
        ledger_id: int | None = None,
        entry_id: int | None = None,
        predicate: Callable[[str, Request], bool] | None = None,
        times: int | None = None,
    ) -> Rule:
        """Lose matching requests: callers see their timeout."""
        return self._add(
            Rule(self, "drop", bookie, op, ledger_id, entry_id, predicate, times=times)
        )

    def before(
        self,
        bookie: str | None,
        callback: BeforeCallback,
        *,
        op: Op | None = None,
        ledger_id: int | None = None,
        entry_id: int | None = None,
        predicate: Callable[[str, Request], bool] | None = None,
        times: int | None = None,
    ) -> Rule:
        """Await ``callback(bookie_id, request)`` before delivering matching requests."""
        return self._add(
            Rule(
                self, "before", bookie, op, ledger_id, entry_id, predicate,
                callback=callback, times=times,
            )
        )

    def clear(self, *, release: bool = True) -> None:
        """Remove every rule (delivering held requests unless ``release=False``)."""
        for rule in list(self.rules):
            rule.remove(release=release)


def is_fencing(bookie_id: str, request: Request) -> bool:
    """Predicate: a fencing read (LAC read or recovery read of a recovering client)."""
    return isinstance(request, ReadRequest) and request.fence


def is_recovery_add(bookie_id: str, request: Request) -> bool:
    """Predicate: a recovery add (write-back by a recovering client)."""
    return isinstance(request, AddRequest) and request.recovery


def is_normal_add(bookie_id: str, request: Request) -> bool:
    """Predicate: an add from a writer (not a recovery write-back)."""
    return isinstance(request, AddRequest) and not request.recovery


class HookedTransport(Transport):
    """A transport that consults :attr:`hooks` before handing a request to ``inner``.

    A request no rule matches goes straight to ``inner`` with its timeout. A held or
    dropped request keeps its caller's deadline here (it never reached ``inner``): it fails
    with :class:`pybk.errors.TimeoutError` when the deadline passes first, and a held request
    released later goes to ``inner`` with what is left of it.

    Adds are matched entry by entry, as if each entry of a batch were a single
    :class:`~pybk.wire.AddRequest` (that is what rules and predicates see, and what a
    hold parks): the entries no rule matches still travel together as one batch, each
    matched entry is acted on alone, and the batch's caller gets one outcome for the lot."""

    def __init__(self, inner: Transport, hooks: Hooks | None = None) -> None:
        self.inner = inner
        self.hooks = hooks if hooks is not None else Hooks()
        self._tasks: set[asyncio.Task[None]] = set()
        self._deadlines = Deadlines()

    def send(
        self, bookie_id: str, request: Request, timeout: float | None = None
    ) -> asyncio.Future[Response]:
        if type(request) is ReadBatchRequest and self.hooks.rules:
            return self._send_read_batch(bookie_id, request, timeout)
        rule = self.hooks.match(bookie_id, request) if self.hooks.rules else None
        if rule is None:
            return self.inner.send(bookie_id, request, timeout)
        return self._send_hooked(rule, bookie_id, request, timeout)

    def _send_read_batch(self, bookie_id: str, request: ReadBatchRequest,
                         timeout: float | None) -> asyncio.Future[Response]:
        """Match each entry of a batched read as a single read: the entries no rule matches
        are read together, each matched one is acted on alone; one answer for the lot."""
        rules = {e: self.hooks.match(bookie_id, ReadRequest(request.ledger_id, e))
                 for e in request.entry_ids}
        free = [e for e in request.entry_ids if rules[e] is None]
        if len(free) == len(request.entry_ids):
            return self.inner.send(bookie_id, request, timeout)
        loop = asyncio.get_running_loop()
        batch: asyncio.Future[Response] | None = None
        if free:
            batch = self.inner.send(bookie_id, ReadBatchRequest(request.ledger_id, free),
                                    timeout)

        def single(read: ReadRequest) -> asyncio.Future[Response]:
            rule = rules[read.entry_id]
            if rule is None:  # answered by the batch of the free entries
                fut: asyncio.Future[Response] = loop.create_future()
                assert batch is not None
                batch.add_done_callback(lambda b: _pick(b, read, fut))
                return fut
            return self._send_hooked(rule, bookie_id, read, timeout)

        return read_batch_by_singles(single, request)

    def _send_hooked(self, rule: Rule, bookie_id: str, request: Request,
                     timeout: float | None) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Response] = loop.create_future()

        def deliver(left: float | None) -> None:
            _chain(self.inner.send(bookie_id, request, left), fut)

        def settle(outcome: BKError | None) -> None:
            if outcome is None or fut.done():
                return
            if isinstance(outcome, BookieUnavailableError | TimeoutError):
                fut.set_exception(outcome)
            else:
                fut.set_result(error_response(request, outcome.status, str(outcome)))

        self._apply(rule, bookie_id, request, timeout, deliver, settle, lambda: fut.done())
        return fut

    def add(self, bookie_id: str, request: AddLike, on_done: AddCallback,
            timeout: float | None = None) -> None:
        if not self.hooks.rules:
            self.inner.add(bookie_id, request, on_done, timeout)
            return
        if type(request) is AddRequest:
            rule = self.hooks.match(bookie_id, request)
            if rule is None:
                self.inner.add(bookie_id, request, on_done, timeout)
            else:
                self._hook_add(rule, bookie_id, request, on_done, timeout)
            return
        assert isinstance(request, AddBatchRequest)
        singles = split_batch(request)
        rules = [self.hooks.match(bookie_id, single) for single in singles]
        free = [i for i, rule in enumerate(rules) if rule is None]
        hooked = [i for i, rule in enumerate(rules) if rule is not None]
        groups = ([free] if free else []) + [[i] for i in hooked]
        parts = split_callback(on_done, len(singles), groups)
        if free:
            rest = AddBatchRequest(request.ledger_id, request.master_key,
                                   [request.entry_ids[i] for i in free],
                                   [request.bodies[i] for i in free], request.recovery,
                                   request.deferred_sync)
            self.inner.add(bookie_id, rest, parts.pop(0), timeout)
        for i, part in zip(hooked, parts, strict=True):
            rule = rules[i]
            assert rule is not None
            self._hook_add(rule, bookie_id, singles[i], part, timeout)

    def _hook_add(self, rule: Rule, bookie_id: str, request: AddRequest,
                  on_done: Callable[[AddOutcome], None], timeout: float | None) -> None:
        settled = False

        def settle(outcome: AddOutcome) -> None:
            nonlocal settled
            if not settled:
                settled = True
                on_done(outcome)

        def deliver(left: float | None) -> None:
            self.inner.add(bookie_id, request, settle, left)

        self._apply(rule, bookie_id, request, timeout, deliver, settle, lambda: settled)

    def _apply(self, rule: Rule, bookie_id: str, request: Request, timeout: float | None,
               deliver: Callable[[float | None], None],
               settle: Callable[[BKError | None], None], done: Callable[[], bool]) -> None:
        """Act on ``request`` as ``rule`` says; ``deliver(time left)`` hands it to the inner
        transport, ``settle(error)`` answers it here."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        token = None
        if timeout is not None and rule.action in ("hold", "drop", "before"):
            token = self._deadlines.add(timeout, lambda: settle(TimeoutError(
                f"bookie {bookie_id}: no answer to {request.op.name} within {timeout}s")))

        def deliver_now() -> None:
            if token is not None:
                self._deadlines.discard(token)
            if done():
                return
            deliver(None if deadline is None else max(0.0, deadline - loop.time()))

        def fail(status: Status | None) -> None:
            if token is not None:
                self._deadlines.discard(token)
            settle(_injected(bookie_id, status))

        if rule.action == "fail":
            settle(_injected(bookie_id, rule.status))
        elif rule.action == "drop":
            pass
        elif rule.action == "hold":
            rule.held.append(HeldRequest(bookie_id, request, deliver=deliver_now, fail=fail,
                                         drop=lambda: None))
            rule._notify()
        else:  # before
            assert rule.callback is not None
            callback = rule.callback

            async def run_then_deliver() -> None:
                try:
                    await callback(bookie_id, request)
                except Exception as exc:  # a failing hook fails the request, visibly
                    if token is not None:
                        self._deadlines.discard(token)
                    settle(BookieUnavailableError(f"{bookie_id}: hook failed: {exc!r}"))
                    return
                deliver_now()

            task = loop.create_task(run_then_deliver())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self.hooks.clear(release=False)
        self._deadlines.close()
        for task in list(self._tasks):
            task.cancel()
        await self.inner.close()

    async def refusals(self, since: float | None = None) -> list[Refusal]:
        return await self.inner.refusals(since)


def _pick(batch: asyncio.Future[Response], read: ReadRequest,
          fut: asyncio.Future[Response]) -> None:
    """Settle ``fut`` (one entry's read) from the answer of the batched read holding it."""
    if fut.done():
        return
    exc = None if batch.cancelled() else batch.exception()
    if batch.cancelled() or exc is not None:
        fut.set_exception(exc or BookieUnavailableError("read cancelled"))
        return
    response = batch.result()
    if isinstance(response, ReadBatchResponse) and response.status == Status.OK:
        for eid, status, body in response.entries:
            if eid == read.entry_id:
                fut.set_result(ReadResponse(status, read.ledger_id, eid, body, response.lac))
                return
        status = Status.TIMEOUT  # the bookie stopped before it (its answer was full)
    else:
        status = response.status
    fut.set_result(ReadResponse(status, read.ledger_id, read.entry_id, None))


def _chain(src: asyncio.Future[Response], dst: asyncio.Future[Response]) -> None:
    def copy(f: asyncio.Future[Response]) -> None:
        if dst.done():
            if not f.cancelled():
                f.exception()  # retrieved: nobody waits for it any more
            return
        if f.cancelled():
            dst.set_exception(BookieUnavailableError("request cancelled"))
        elif f.exception() is not None:
            dst.set_exception(f.exception())  # type: ignore[arg-type]
        else:
            dst.set_result(f.result())

    src.add_done_callback(copy)


def _injected(bookie_id: str, status: Status | None) -> BKError:
    """The error a ``fail`` rule answers with: unreachable, a timeout, or the bookie's
    error status."""
    if status is None or status == Status.UNAVAILABLE:
        return BookieUnavailableError(f"bookie {bookie_id} unavailable (hook)")
    if status == Status.TIMEOUT:
        return TimeoutError(f"bookie {bookie_id}: timed out (hook)")
    return error_for_status(status, f"injected {status.name}")


__all__ = [
    "HeldRequest",
    "HookedTransport",
    "Hooks",
    "Rule",
    "is_fencing",
    "is_normal_add",
    "is_recovery_add",
]
