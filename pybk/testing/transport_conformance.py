"""A conformance suite any :class:`~pybk.transport.base.Transport` can run.

In the spirit of ``trio.testing.check_two_way_stream``: describe how to run real bookies
behind your transport with a :class:`TransportBackend` (start them, crash one, silence one,
run a coroutine on the loop the transport needs), and :func:`run_check` exercises the
contract of :mod:`pybk.transport.base` (listed in docs/internals.md,
"pybk/testing/transport_conformance.py").
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from pybk.errors import (
    BKError,
    BookieUnavailableError,
    EntryExistsError,
    LedgerFencedError,
    TimeoutError,
    UnauthorizedError,
)
from pybk.transport.base import Transport
from pybk.wire import (
    AddBatchRequest,
    AddOutcome,
    AddRequest,
    AddResponse,
    DigestManager,
    FenceRequest,
    ListEntriesRequest,
    ListEntriesResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    ReadResponse,
    Status,
    master_key,
)

__all__ = [
    "BACKENDS",
    "CHECKS",
    "LocalBackend",
    "SimBackend",
    "SimOldClientBackend",
    "TcpBackend",
    "TransportBackend",
    "run_check",
]

T = TypeVar("T")
KEY = master_key(b"conformance")
#: the bookies every backend runs
BOOKIES = ("b0", "b1", "b2")


class TransportBackend(abc.ABC):
    """Real bookies (:data:`BOOKIES`) behind the transport under test."""

    #: seconds (of the loop's clock) within which an answer must come
    bound: float = 10.0

    @abc.abstractmethod
    def run(self, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``main()`` to completion on the loop the transport needs; return its result."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start the bookies (called inside :meth:`run`)."""

    @abc.abstractmethod
    def transport(self) -> Transport:
        """A client's transport to the bookies (a new one each call)."""

    @abc.abstractmethod
    async def crash(self, bookie_id: str) -> None:
        """The bookie's process dies (kill -9): its connections go, it answers nothing."""

    @abc.abstractmethod
    async def silence(self, bookie_id: str) -> None:
        """The bookie stays reachable but never answers (a frozen process)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop everything :meth:`start` started."""


def run_check(make_backend: Callable[[], TransportBackend],
              check: Callable[[TransportBackend], Awaitable[None]]) -> None:
    """Run one check on a fresh backend: start, check, stop (also when the check fails)."""
    backend = make_backend()

    async def main() -> None:
        await backend.start()
        try:
            await check(backend)
        finally:
            await backend.stop()

    backend.run(main)


# -- helpers -------------------------------------------------------------------------------------


def body(ledger_id: int, entry_id: int, payload: bytes = b"") -> bytes:
    return DigestManager(ledger_id).frame(entry_id, entry_id - 1, entry_id + 1,
                                          payload or b"entry %d" % entry_id)


def batch(ledger_id: int, entry_ids: list[int], *, key: bytes = KEY,
          recovery: bool = False) -> AddBatchRequest:
    return AddBatchRequest(ledger_id, key, entry_ids, [body(ledger_id, e) for e in entry_ids],
                           recovery)


async def add(backend: TransportBackend, t: Transport, bookie: str, request: Any,
              timeout: float | None = None) -> AddOutcome:
    """``t.add`` as an awaitable, asserting ``on_done`` is called exactly once."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[AddOutcome] = loop.create_future()
    calls: list[AddOutcome] = []

    def on_done(outcome: AddOutcome) -> None:
        calls.append(outcome)
        assert len(calls) == 1, f"on_done called {len(calls)} times: {calls}"
        done.set_result(outcome)

    t.add(bookie, request, on_done, backend.bound if timeout is None else timeout)
    async with asyncio.timeout(backend.bound * 2):
        outcome = await done
    for _ in range(3):
        await asyncio.sleep(0)  # a second call would come now: the check above catches it
    return outcome


async def stored(backend: TransportBackend, t: Transport, bookie: str, ledger_id: int,
                 entry_id: int) -> bytes | None:
    resp = await t.send(bookie, ReadRequest(ledger_id, entry_id), backend.bound)
    assert isinstance(resp, ReadResponse)
    return resp.body if resp.status == Status.OK else None


def _all_failed_with(outcome: AddOutcome, cls: type[BKError], n: int) -> bool:
    if isinstance(outcome, cls):
        return True
    return isinstance(outcome, list) and len(outcome) == n and all(
        isinstance(o, cls) for o in outcome)


# -- checks --------------------------------------------------------------------------------------


async def check_single_add(backend: TransportBackend) -> None:
    t = backend.transport()
    assert await add(backend, t, "b0", AddRequest(1, 0, KEY, body(1, 0))) is None
    assert await stored(backend, t, "b0", 1, 0) == body(1, 0)
    await t.close()


async def check_batch_add(backend: TransportBackend) -> None:
    t = backend.transport()
    ids = [0, 2, 3, 5, 6, 8]  # striped: the ids one bookie of E3/Qw2 holds
    request = batch(2, ids)
    assert await add(backend, t, "b1", request) is None
    resp = await t.send("b1", ListEntriesRequest(2), backend.bound)
    assert isinstance(resp, ListEntriesResponse) and resp.ranges == ((0, 0), (2, 3), (5, 6),
                                                                     (8, 8))
    for eid, data in zip(request.entry_ids, request.bodies, strict=True):
        assert await stored(backend, t, "b1", 2, eid) == data
    # the same body objects to several bookies (framed once): each stores them
    assert await add(backend, t, "b2", request) is None
    assert await stored(backend, t, "b2", 2, 5) == request.bodies[3]
    await t.close()


async def check_a_batch_fails_entry_by_entry(backend: TransportBackend) -> None:
    t = backend.transport()
    assert await add(backend, t, "b0", AddRequest(3, 1, KEY, body(3, 1))) is None
    conflicting = AddBatchRequest(3, KEY, [0, 1, 2],
                                  [body(3, 0), body(3, 1, b"other bytes"), body(3, 2)])
    outcome = await add(backend, t, "b0", conflicting)
    assert isinstance(outcome, list) and len(outcome) == 3, outcome
    assert outcome[0] is None and outcome[2] is None, outcome
    assert isinstance(outcome[1], EntryExistsError), outcome
    assert await stored(backend, t, "b0", 3, 0) == body(3, 0)
    assert await stored(backend, t, "b0", 3, 1) == body(3, 1)  # the original is intact
    assert await stored(backend, t, "b0", 3, 2) == body(3, 2)
    # the same batch again (identical bytes): a no-op that answers OK for those
    again = await add(backend, t, "b0", batch(3, [0, 2]))
    assert again is None, again
    await t.close()


async def check_a_refused_batch_fails_every_entry(backend: TransportBackend) -> None:
    t = backend.transport()
    assert await add(backend, t, "b2", batch(4, [0])) is None
    outcome = await add(backend, t, "b2", batch(4, [1, 2], key=b"wrong key"))
    assert _all_failed_with(outcome, UnauthorizedError, 2), outcome
    fence = await t.send("b2", FenceRequest(4, KEY), backend.bound)
    assert fence.status == Status.OK
    outcome = await add(backend, t, "b2", batch(4, [1, 2]))
    assert _all_failed_with(outcome, LedgerFencedError, 2), outcome
    assert await stored(backend, t, "b2", 4, 1) is None
    # a recovering client's write-back is taken on a fenced ledger
    assert await add(backend, t, "b2", batch(4, [1, 2], recovery=True)) is None
    assert await stored(backend, t, "b2", 4, 2) == body(4, 2)
    await t.close()


async def check_send_of_an_add_answers_a_response(backend: TransportBackend) -> None:
    t = backend.transport()
    resp = await t.send("b0", AddRequest(5, 0, KEY, body(5, 0)), backend.bound)
    assert resp == AddResponse(Status.OK, 5, 0), resp
    resp = await t.send("b0", AddRequest(5, 0, KEY, body(5, 0, b"x")), backend.bound)
    assert isinstance(resp, AddResponse) and resp.status == Status.ENTRY_EXISTS, resp
    await t.close()


async def check_batched_read(backend: TransportBackend) -> None:
    t = backend.transport()
    assert await add(backend, t, "b0", batch(11, list(range(10)))) is None
    resp = await t.send("b0", ReadBatchRequest(11, [0, 2, 5, 42, 7]), backend.bound)
    assert isinstance(resp, ReadBatchResponse) and resp.status == Status.OK, resp
    assert [e for e, _s, _b in resp.entries] == [0, 2, 5, 42, 7], resp.entries
    for eid, status, data in resp.entries:
        if eid == 42:
            assert (status, data) == (Status.NO_SUCH_ENTRY, None)
        else:
            assert (status, data) == (Status.OK, body(11, eid))
    assert resp.lac == 8  # the highest piggybacked LAC (entry 9 carries 8)
    missing = await t.send("b0", ReadBatchRequest(12, [0, 1]), backend.bound)
    assert isinstance(missing, ReadBatchResponse)
    assert missing.status == Status.NO_SUCH_LEDGER or [s for _e, s, _b in missing.entries] == [
        Status.NO_SUCH_LEDGER, Status.NO_SUCH_LEDGER], missing  # (an old peer: entry by entry)
    await t.close()


async def check_answers_match_their_requests(backend: TransportBackend) -> None:
    t = backend.transport()
    n = 60
    outcomes = await asyncio.gather(*(
        add(backend, t, BOOKIES[e % 3], batch(6, [e, e + n])) for e in range(n)))
    assert all(o is None for o in outcomes), outcomes
    reads = await asyncio.gather(*(
        t.send(BOOKIES[e % 3], ReadRequest(6, e + n * (e % 2)), backend.bound)
        for e in range(n)))
    for e, resp in enumerate(reads):
        assert isinstance(resp, ReadResponse) and resp.status == Status.OK
        assert resp.body == body(6, e + n * (e % 2)), f"entry {e} got another's answer"
    await t.close()


async def check_unreachable_bookies(backend: TransportBackend) -> None:
    t = backend.transport()
    outcome = await add(backend, t, "no-such-bookie", batch(7, [0]))
    assert _all_failed_with(outcome, BookieUnavailableError, 1), outcome
    await backend.crash("b1")
    outcome = await add(backend, t, "b1", batch(7, [0, 1]))
    assert _all_failed_with(outcome, BookieUnavailableError, 2), outcome
    try:
        await t.send("b1", ReadRequest(7, 0), backend.bound)
    except BookieUnavailableError:
        pass
    else:
        raise AssertionError("a read from a crashed bookie was answered")
    await t.close()


async def check_a_silent_bookie_times_out(backend: TransportBackend) -> None:
    t = backend.transport()
    assert await add(backend, t, "b2", batch(8, [0])) is None  # (connected first)
    await backend.silence("b2")
    outcome = await add(backend, t, "b2", batch(8, [1, 2]), timeout=0.2)
    assert _all_failed_with(outcome, TimeoutError, 2), outcome
    try:
        await t.send("b2", ReadRequest(8, 0), 0.2)
    except TimeoutError:
        pass
    else:
        raise AssertionError("a silent bookie answered a read")
    await t.close()


async def check_adds_in_flight_settle_once_when_a_bookie_dies(
        backend: TransportBackend) -> None:
    t = backend.transport()
    loop = asyncio.get_running_loop()
    calls: dict[int, list[AddOutcome]] = {}
    all_done = loop.create_future()

    def on_done(i: int) -> Callable[[AddOutcome], None]:
        def done(outcome: AddOutcome) -> None:
            calls.setdefault(i, []).append(outcome)
            if len(calls) == 40 and not all_done.done():
                all_done.set_result(None)
        return done

    for i in range(40):
        t.add("b0", batch(9, [2 * i, 2 * i + 1]), on_done(i), backend.bound)
        if i == 20:
            await backend.crash("b0")
    async with asyncio.timeout(backend.bound * 2):
        await all_done
    for _ in range(5):
        await asyncio.sleep(0)
    for i, outcomes in calls.items():
        assert len(outcomes) == 1, (i, outcomes)
        outcome = outcomes[0]
        assert outcome is None or _all_failed_with(outcome, BookieUnavailableError, 2) or (
            _all_failed_with(outcome, TimeoutError, 2)), (i, outcome)
    await t.close()


async def check_a_closed_transport_refuses(backend: TransportBackend) -> None:
    t = backend.transport()
    assert await add(backend, t, "b0", batch(10, [0])) is None
    await t.close()
    outcome = await add(backend, t, "b0", batch(10, [1]))
    assert _all_failed_with(outcome, BKError, 1), outcome
    try:
        await t.send("b0", ReadRequest(10, 0), backend.bound)
    except BKError:
        pass
    else:
        raise AssertionError("a closed transport sent a read")


CHECKS: list[Callable[[TransportBackend], Awaitable[None]]] = [
    check_single_add,
    check_batch_add,
    check_a_batch_fails_entry_by_entry,
    check_a_refused_batch_fails_every_entry,
    check_send_of_an_add_answers_a_response,
    check_batched_read,
    check_answers_match_their_requests,
    check_unreachable_bookies,
    check_a_silent_bookie_times_out,
    check_adds_in_flight_settle_once_when_a_bookie_dies,
    check_a_closed_transport_refuses,
]


# -- backends shipped with pybk ------------------------------------------------------------------


class _Silent:
    """A bookie that is there and never answers (what a frozen process looks like)."""

    state = "writable"

    async def handle(self, request: Any) -> Any:
        await asyncio.Event().wait()

    def add_request(self, request: Any, on_done: Any) -> None:
        pass


class LocalBackend(TransportBackend):
    """The in-process transport over real bookies on in-memory disks."""

    bound = 5.0

    def __init__(self) -> None:
        self.bookies: dict[str, Any] = {}

    def run(self, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return asyncio.run(main())

    async def start(self) -> None:
        from pybk.bookie import Bookie
        from pybk.storage.memfs import MemFileSystem

        for bid in BOOKIES:
            fs = MemFileSystem()
            self.bookies[bid] = Bookie(bid, "/b", fs=fs)
            await self.bookies[bid].start()

    def transport(self) -> Transport:
        from pybk.transport.local import LocalTransport

        return LocalTransport(self.bookies)

    async def crash(self, bookie_id: str) -> None:
        self.bookies[bookie_id].crash()

    async def silence(self, bookie_id: str) -> None:
        self.bookies[bookie_id].crash()
        self.bookies[bookie_id] = _Silent()

    async def stop(self) -> None:
        for bookie in self.bookies.values():
            if not isinstance(bookie, _Silent):
                bookie.crash()


class TcpBackend(TransportBackend):
    """The TCP transport to bookie servers on loopback (each a real Bookie on an in-memory
    disk behind a BookieServer driving its add path), in this process."""

    bound = 10.0

    def __init__(self) -> None:
        self.bookies: dict[str, Any] = {}
        self.servers: dict[str, Any] = {}
        self.silent: set[str] = set()

    def run(self, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return asyncio.run(main())

    async def start(self) -> None:
        from pybk.bookie import Bookie
        from pybk.storage.memfs import MemFileSystem
        from pybk.transport.server import BookieServer

        for bid in BOOKIES:
            bookie = self.bookies[bid] = Bookie(bid, "/b", fs=MemFileSystem())
            await bookie.start()
            self.servers[bid] = BookieServer(self._handler(bid), add=self._adder(bid))
            await self.servers[bid].start()

    def _handler(self, bid: str) -> Callable[[Any], Awaitable[Any]]:
        async def handle(request: Any) -> Any:
            if bid in self.silent:
                await asyncio.Event().wait()
            return await self.bookies[bid].handle(request)
        return handle

    def _adder(self, bid: str) -> Callable[[Any, Any], None]:
        def add_request(request: Any, on_done: Any) -> None:
            if bid not in self.silent:
                self.bookies[bid].add_request(request, on_done)
        return add_request

    def transport(self) -> Transport:
        from pybk.transport.tcp import TcpTransport

        async def resolve(bookie_id: str) -> str:
            server = self.servers.get(bookie_id)
            if server is None:
                raise BookieUnavailableError(f"bookie {bookie_id} is not registered")
            host, port = server.address
            return f"{host}:{port}"

        return TcpTransport(resolve, backoff_initial=0.01, backoff_max=0.05)

    async def crash(self, bookie_id: str) -> None:
        server = self.servers[bookie_id]
        for conn in list(server.connections):
            conn.abort()
        server.stop_accepting()  # no new connections: refused, like a dead process
        self.bookies[bookie_id].crash()

    async def silence(self, bookie_id: str) -> None:
        self.silent.add(bookie_id)

    async def stop(self) -> None:
        for bid, server in self.servers.items():
            await server.stop(grace=0.0)
            self.bookies[bid].crash()


class SimBackend(TransportBackend):
    """The simulated network (virtual time) to the simulator's bookies."""

    bound = 30.0
    batch_adds = True

    def __init__(self) -> None:
        self.cluster: Any = None
        self._clients = 0

    def run(self, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
        from pybk.sim.loop import SimLoop

        loop = SimLoop(max_time=3600.0)
        try:
            return loop.run_main(main())
        finally:
            loop.shutdown()

    async def start(self) -> None:
        from pybk.bookie import BookieConfig
        from pybk.sim.cluster import SimCluster

        # the checks add to ledgers no metadata holds, as the other backends' bookies (which
        # have no metadata store) take them: the simulator's bookies would refuse them
        self.cluster = SimCluster(0, len(BOOKIES),
                                  bookie_config=BookieConfig(check_unknown_ledgers=False))
        # the simulator names its bookies b0, b1, ...: the ids of BOOKIES
        await self.cluster.start()

    def transport(self) -> Transport:
        self._clients += 1
        transport: Transport = self.cluster.network.endpoint(f"conformance-{self._clients}",
                                                             batch_adds=self.batch_adds)
        return transport

    async def crash(self, bookie_id: str) -> None:
        await self.cluster.crash_bookie(bookie_id)

    async def silence(self, bookie_id: str) -> None:
        self.cluster.network.pause(bookie_id)

    async def stop(self) -> None:
        self.cluster.network.heal()
        await self.cluster.close()


class SimOldClientBackend(SimBackend):
    """The simulated network as an old client: each entry of a batch sent as a single add."""

    batch_adds = False


BACKENDS: list[type[TransportBackend]] = [LocalBackend, TcpBackend, SimBackend,
                                          SimOldClientBackend]
