"""An add's ``on_done`` objects: the outcome as a response (:class:`Respond`), and counted
into the bookie's stats first (:class:`CountedAdd`). Small objects rather than closures and
their cells: less for the garbage collector on the add path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pybk.errors import BKError
from pybk.stats import BookieStats
from pybk.wire import (
    AddBatchRequest,
    AddCallback,
    AddOutcome,
    AddRequest,
    Response,
    add_response,
    batch_bytes,
)

__all__ = ["CountedAdd", "Respond"]


class Respond:
    """``on_done`` of :meth:`Bookie.add_nowait`: the outcome as a response (a small object
    rather than a closure and its cells: less for the GC)."""

    __slots__ = ("reply", "request")

    def __init__(self, request: AddRequest, reply: Callable[[Response], None]) -> None:
        self.request = request
        self.reply = reply

    def __call__(self, outcome: AddOutcome) -> None:
        self.reply(add_response(self.request, outcome))


class CountedAdd:
    """``on_done`` of an add request on a bookie that keeps stats: counts its entries and
    bytes (a batch's outcome may be one per entry), observes its latency once (with the
    batch's weight), then hands the outcome on."""

    __slots__ = ("clock", "on_done", "request", "started", "stats")

    def __init__(self, stats: BookieStats, request: AddRequest | AddBatchRequest,
                 on_done: AddCallback, clock: Callable[[], float]) -> None:
        self.stats = stats
        self.request = request
        self.on_done = on_done
        self.clock = clock
        self.started = clock()

    def __call__(self, outcome: AddOutcome) -> None:
        stats = self.stats
        request = self.request
        if type(request) is AddBatchRequest:
            bodies: Sequence[bytes] = request.bodies
        else:
            assert isinstance(request, AddRequest)
            bodies = (request.body,)
        if outcome is None:
            n = len(bodies)
            stats.adds += n
            stats.add_bytes += batch_bytes(bodies)
            if request.recovery:
                stats.recovery_adds += n
            stats.add_latency.observe(self.clock() - self.started, n)
        elif isinstance(outcome, BKError):
            stats.add_errors += len(bodies)
        else:  # one outcome per entry
            stored = outcome.count(None)  # (none, for a flood of refusals: no body looked at)
            stats.adds += stored
            if stored:
                stats.add_bytes += sum(len(b) for b, o in zip(bodies, outcome, strict=False)
                                       if o is None)
            stats.add_errors += len(outcome) - stored
            if request.recovery:
                stats.recovery_adds += stored
            if stored:
                stats.add_latency.observe(self.clock() - self.started, stored)
        self.on_done(outcome)


def state_message(reason: str, store: Any) -> str:
    """What a bookie's info answer says of its state: why, its suspect segments and damaged
    entries (found by the scrubber)."""
    message = reason
    if store is not None and store.suspect:
        message += "; suspect segments: " + ", ".join(store.suspect)
    if store is not None and store.damaged:
        message += f"; {len(store.damaged)} damaged entries, e.g. " + ", ".join(
            f"{lid}:{eid}" for lid, eid in list(store.damaged)[:5])
    return message
