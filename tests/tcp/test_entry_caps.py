"""The server's entry caps on their own (pybk.transport.server_budgets): a request starts
only when its entries fit its connection's cap and the bookie's (or its fair share past
the bookie's), a blocked connection is read no further once its read-ahead is full, and
everything held is given back. The add path here holds every add until the test ends it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pybk.transport import codec
from pybk.transport.fastpath import encode_batch_request
from pybk.transport.limits import ServerConfig
from pybk.transport.server import BookieServer
from pybk.wire import AddBatchRequest, AddBatchResponse, Status, master_key

KEY = master_key(b"k")
pytestmark = pytest.mark.timeout(60)


def _batch(request_id: int, n: int, ledger_id: int = 1) -> bytes:
    return encode_batch_request(request_id, AddBatchRequest(
        ledger_id, KEY, list(range(n)), [b"e" * 36] * n))


async def _until(cond: Any, what: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not cond():
        assert loop.time() < deadline, what() if callable(what) else what
        await asyncio.sleep(0.005)


class _Peer:
    """A raw connection: sends frames, collects answers."""

    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.answers: dict[int, Any] = {}

    async def open(self) -> _Peer:
        self.reader, self.writer = await asyncio.open_connection(*self.server.address)
        self._task = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        conn = codec.Connection("client")
        while data := await self.reader.read(1 << 16):
            for event in conn.receive_data(data):
                self.answers[event.request_id] = event.response  # type: ignore[union-attr]

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    def close(self) -> None:
        self._task.cancel()
        self.writer.close()


async def test_entries_in_flight_are_capped_per_connection_and_per_bookie() -> None:
    held: list[tuple[AddBatchRequest, Any]] = []

    def add(request: AddBatchRequest, on_done: Any) -> None:
        held.append((request, on_done))

    async def handler(request: Any) -> Any:
        raise AssertionError(request)

    cfg = ServerConfig(max_entries_in_flight=100, bookie_entries_in_flight=150,
                       max_queued_bytes=4096)
    async with BookieServer(handler, add=add, config=cfg) as server:  # type: ignore[arg-type]
        a, b, c, d = [await _Peer(server).open() for _ in range(4)]
        try:
            # a: five batches of 60; one runs (a second would hold 120 > 100)
            a.send(*(_batch(i, 60) for i in range(1, 6)))
            await _until(lambda: len(held) == 1 and server.entries == 60, "a's first")
            [conn_a] = [x for x in server.connections if x.entries]
            await _until(lambda: conn_a.read_paused, "a not read once its read-ahead is full")
            assert conn_a.blocked == "connection_entries"
            # b: one batch of 60 fits the bookie (120 <= 150)
            b.send(_batch(1, 60, ledger_id=2))
            await _until(lambda: len(held) == 2, "b's batch")
            # c: 60 more would pass the bookie's 150 and its share (150 / 3 = 50): waits
            c.send(_batch(1, 60, ledger_id=3))
            await _until(lambda: server.stats["bookie_entries_full"] == 1, "c blocked")
            assert list(server.entry_waiters.values()) == [60] and len(held) == 2
            # d: 10 fits its share and leaves c's 60 free within twice the cap: starts
            d.send(_batch(1, 10, ledger_id=4))
            await _until(lambda: len(held) == 3, "d's batch")
            assert server.entries == 130 and server.entry_holders == 3
            assert server.peak_connection_entries == 60
            # answering a's batch: a's next one waits in line behind c; c, first in line,
            # starts (70 held: at most the cap), then a's, first in turn (130)
            held.pop(0)[1](None)
            await _until(lambda: len(held) == 4 and 1 in a.answers, "c's and a's second")
            assert [r.ledger_id for r, _ in held] == [2, 4, 3, 1] and server.entries == 190
            assert not server.entry_waiters

            def answer_all() -> bool:  # (answer what runs; done once every answer is in)
                while held:
                    held.pop(0)[1](None)
                return len(a.answers) == 5 and 1 in c.answers

            await _until(answer_all, "the rest answered")
            await _until(lambda: server.entries == 0 and not held, "all given back")
            assert server.entry_holders == 0 and not conn_a.read_paused
            assert all(r == AddBatchResponse(Status.OK, 1, 60) for r in a.answers.values())
        finally:
            for peer in (a, b, c, d):
                peer.close()


async def test_a_request_larger_than_the_cap_still_starts_on_an_idle_connection() -> None:
    held: list[Any] = []
    cfg = ServerConfig(max_entries_in_flight=10, bookie_entries_in_flight=10)

    async def handler(request: Any) -> Any:
        raise AssertionError(request)

    async with BookieServer(handler, add=lambda r, done: held.append(done),  # type: ignore[arg-type]
                            config=cfg) as server:
        peer = await _Peer(server).open()
        try:
            peer.send(_batch(1, 50), _batch(2, 50))
            await _until(lambda: len(held) == 1, "the first")
            assert server.entries == 50  # (alone on the connection and the bookie)
            held.pop()(None)
            await _until(lambda: len(held) == 1 and 1 in peer.answers, "the second")
            held.pop()(None)
            await _until(lambda: 2 in peer.answers and server.entries == 0, "both answered")
        finally:
            peer.close()


def test_what_a_request_counts() -> None:
    from pybk.transport.server_parts import request_entries
    from pybk.wire import AddRequest, ReadBatchRequest, ReadRequest

    assert request_entries(AddBatchRequest(1, KEY, [0, 1, 2], [b"e" * 36] * 3)) == 3
    assert request_entries(ReadBatchRequest(1, list(range(100)))) == 100
    assert request_entries(AddRequest(1, 0, KEY, b"e" * 36)) == 1
    assert request_entries(ReadRequest(1, 0)) == 1
    # a long poll only waits (max_long_polls bounds those): it holds no entries
    assert request_entries(ReadRequest(1, 5, previous_lac=4, timeout=10.0)) == 0


async def test_small_requests_do_not_keep_a_larger_one_waiting() -> None:
    """Four connections keep 10-entry batches coming, each at its cap of 30; a fifth asks for
    60, more than its share (100 / 5). Once it waits, the others' next batches wait behind it
    (its 60 are kept free): it starts after a few of theirs end, not never."""
    held: list[tuple[AddBatchRequest, Any]] = []

    async def handler(request: Any) -> Any:
        raise AssertionError(request)

    cfg = ServerConfig(max_entries_in_flight=30, bookie_entries_in_flight=100)
    async with BookieServer(handler, add=lambda r, done: held.append((r, done)),  # type: ignore[arg-type]
                            config=cfg) as server:
        small = [await _Peer(server).open() for _ in range(4)]
        big = await _Peer(server).open()

        def big_waits() -> bool:
            return any(c.queue and c.blocked == "bookie_entries" and not c.entries
                       and c.queue[0].request.ledger_id == 1  # type: ignore[union-attr]
                       for c in server.connections)

        try:
            for i, peer in enumerate(small):
                peer.send(*(_batch(k, 10, ledger_id=10 + i) for k in range(1, 200)))
            await _until(lambda: server.stats["bookie_entries_full"], "the bookie full")
            big.send(_batch(1, 60, ledger_id=1))
            await _until(lambda: big_waits(), "the large one waits")
            for _ in range(12):  # end the oldest small batches, one at a time
                if any(r.ledger_id == 1 for r, _ in held):
                    break
                held.pop(0)[1](None)
                await asyncio.sleep(0.01)
            assert any(r.ledger_id == 1 for r, _ in held), server.entries
            assert server.entries <= 2 * 100
        finally:
            for peer in (*small, big):
                peer.close()
