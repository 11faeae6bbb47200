"""Protocol version 2 over real sockets: batches to bookies that take them, single requests to
those that do not, frames cut at the cap (docs/protocol.md, "Batched adds").

The version-1 bookie here is what one is on the wire: it serves ADD and READ with a real
Bookie, closes the connection on a frame of another version (as an old bookie does), and
refuses an unknown BOOKIE_INFO flag with a PROTOCOL_ERROR answer while the connection goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import pytest

from pybk.bookie import Bookie
from pybk.errors import BKError, ProtocolError
from pybk.storage import MemFileSystem
from pybk.transport import messages
from pybk.transport.codec import Connection, RequestReceived
from pybk.transport.server import BookieServer
from pybk.transport.tcp import TcpTransport
from pybk.wire import (
    AddBatchRequest,
    AddOutcome,
    AddRequest,
    BookieInfoRequest,
    DigestManager,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    Status,
    master_key,
)

KEY = master_key(b"")
pytestmark = pytest.mark.timeout(60)


def body(ledger: int, entry: int, size: int = 10) -> bytes:
    return DigestManager(ledger).frame(entry, entry - 1, 0, (b"%d." % entry * size)[:size])


async def _bookie() -> Bookie:
    bookie = Bookie("b1", "/b", fs=MemFileSystem())
    await bookie.start()
    return bookie


class VersionOneBookie:
    """An old bookie on the wire (see the module docstring); it counts what it saw."""

    def __init__(self, bookie: Bookie) -> None:
        self.bookie = bookie
        self.frames: list[tuple[int, int, int]] = []  # (version, op, flags)
        self.refused_flags = 0
        self.closed_for_version = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection("server")
        try:
            while True:
                head = await reader.readexactly(4)
                (length,) = struct.unpack(">I", head)
                frame = await reader.readexactly(length)
                version, op, flags, rid = struct.unpack_from(">BBHQ", frame, 4)
                self.frames.append((version, op, flags))
                if version != 1:
                    self.closed_for_version += 1
                    return  # an old bookie closes: it never guesses
                if (op == 7 and flags) or (op == 1 and flags & ~0x0001):
                    # BOOKIE_INFO or ADD with a flag it does not know (VERSIONS, DEFERRED_SYNC)
                    self.refused_flags += 1
                    answer = messages.error_response_for_op(
                        messages.Op(op), Status.PROTOCOL_ERROR, "unknown flags")
                    writer.write(messages.encode_response(rid, answer))
                    continue
                [event] = conn.receive_data(head + frame)
                assert isinstance(event, RequestReceived)
                response = await self.bookie.handle(event.request)
                writer.write(messages.encode_response(rid, response))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def _add(t: TcpTransport, request: object) -> AddOutcome:
    fut: asyncio.Future[AddOutcome] = asyncio.get_running_loop().create_future()
    t.add("b1", request, fut.set_result, 10.0)  # type: ignore[arg-type]
    return await asyncio.wait_for(fut, 20)


async def test_an_old_bookie_gets_single_adds_and_reads_and_keeps_its_connection() -> None:
    bookie = await _bookie()
    old = VersionOneBookie(bookie)
    address = await old.start()

    async def resolve(_: str) -> str:
        return address

    t = TcpTransport(resolve)
    try:
        ids = list(range(20))
        for _ in range(3):  # the first batch asks; the answer says "version 1": singles go on
            start = ids[0]
            outcome = await _add(t, AddBatchRequest(1, KEY, ids, [body(1, e) for e in ids]))
            assert outcome is None
            ids = [e + 20 for e in ids]
            assert start >= 0
        resp = await t.send("b1", ReadBatchRequest(1, [0, 5, 59, 99]), 10.0)
        assert isinstance(resp, ReadBatchResponse) and resp.status == Status.OK
        assert [(e, s) for e, s, _b in resp.entries] == [
            (0, Status.OK), (5, Status.OK), (59, Status.OK), (99, Status.NO_SUCH_ENTRY)]
        assert resp.entries[1][2] == body(1, 5)
        assert old.closed_for_version == 0, "a version-2 frame reached a version-1 bookie"
        assert old.refused_flags == 1, "the client asked more than once per connection"
        assert all(v == 1 for v, _op, _f in old.frames)
        ops = {op for _v, op, _f in old.frames}
        assert ops == {1, 2, 7}  # ADD, READ and the one BOOKIE_INFO question
        assert len(t.connected_bookies()) == 1
    finally:
        await t.close()
        await old.stop()
        bookie.crash()


@contextlib.asynccontextmanager
async def _watched_bookie() -> AsyncIterator[tuple[TcpTransport, list[str]]]:
    """A bookie behind a real server, the kinds of add request it got (in order), and a
    transport to it (closed after)."""
    bookie = await _bookie()
    seen: list[str] = []

    def add_request(request: object, on_done: object) -> None:
        seen.append(type(request).__name__)
        bookie.add_request(request, on_done)  # type: ignore[arg-type]

    try:
        async with BookieServer(bookie.handle, add=add_request) as server:
            host, port = server.address

            async def resolve(_: str) -> str:
                return f"{host}:{port}"

            t = TcpTransport(resolve)
            try:
                yield t, seen
            finally:
                await t.close()
    finally:
        bookie.crash()


async def test_a_new_bookie_gets_batches_after_the_first_question() -> None:
    async with _watched_bookie() as (t, seen):
        ids = list(range(10))
        assert await _add(t, AddBatchRequest(2, KEY, ids, [body(2, e) for e in ids])) is None
        assert seen == ["AddRequest"] * 10  # before the answer: single adds
        seen.clear()
        more = list(range(10, 30))
        assert await _add(t, AddBatchRequest(2, KEY, more, [body(2, e) for e in more])) is None
        assert seen == ["AddBatchRequest"]  # one request, 20 entries
        assert t._conns[("b1", 0)].peer_version == messages.PROTOCOL_VERSION
        resp = await t.send("b1", ReadBatchRequest(2, list(range(30))), 10.0)
        assert isinstance(resp, ReadBatchResponse)
        assert [b for _e, _s, b in resp.entries] == [body(2, e) for e in range(30)]


async def test_a_one_entry_batch_goes_as_one_single_add_with_its_outcome() -> None:
    """A lone writer's batches hold one entry: each goes as a plain ADD (nothing to split,
    no version question), and a refusal comes back as that entry's error."""
    async with _watched_bookie() as (t, seen):
        for e in range(3):
            assert await _add(t, AddBatchRequest(4, KEY, [e], [body(4, e)])) is None
        assert seen == ["AddRequest"] * 3
        assert not t._conns[("b1", 0)].asked_versions
        refused = await _add(t, AddBatchRequest(4, KEY, [3], [body(5, 3)]))  # names ledger 5
        assert isinstance(refused, BKError), refused
        read = await t.send("b1", ReadRequest(4, 2), 10.0)
        assert read.status == Status.OK and read.body == body(4, 2)


async def test_batches_are_cut_at_the_frame_cap_and_an_entry_over_it_is_refused() -> None:
    bookie = await _bookie()
    seen: list[int] = []

    def add_request(request: object, on_done: object) -> None:
        if isinstance(request, AddBatchRequest):
            seen.append(len(request.bodies))
        bookie.add_request(request, on_done)  # type: ignore[arg-type]

    async with BookieServer(bookie.handle, add=add_request) as server:
        host, port = server.address

        async def resolve(_: str) -> str:
            return f"{host}:{port}"

        t = TcpTransport(resolve, max_frame=64 * 1024)
        t._conns.clear()
        await t.send("b1", BookieInfoRequest(), 10.0)  # connect
        t._conns[("b1", 0)].peer_version = 2  # (as if it had asked)
        ids = list(range(30))
        bodies = [body(3, e, size=4000) for e in ids]  # 4 KB each: 30 do not fit 64 KiB
        assert await _add(t, AddBatchRequest(3, KEY, ids, bodies)) is None
        assert sum(seen) == 30 and len(seen) >= 2, seen
        read = await t.send("b1", ReadRequest(3, 29), 10.0)
        assert read.status == Status.OK
        huge = AddBatchRequest(3, KEY, [30, 31], [body(3, 30), body(3, 31, size=70_000)])
        outcome = await _add(t, huge)
        assert isinstance(outcome, list) and outcome[0] is None
        assert outcome[1] is not None and "frame" in str(outcome[1])
        await t.close()
    bookie.crash()


def test_a_version_one_frame_cannot_carry_a_batch() -> None:
    frame = bytearray(messages.encode_request(1, AddBatchRequest(1, KEY, [0], [body(1, 0)])))
    frame[8] = 1  # version 1 does not define ADD_BATCH: fatal, never guessed
    import crc32c

    struct.pack_into(">I", frame, 4, crc32c.crc32c(bytes(frame[8:])))
    with pytest.raises(ProtocolError, match="unknown operation 9 in protocol version 1"):
        Connection("server").receive_data(bytes(frame))
    single = messages.encode_request(1, AddRequest(1, 0, KEY, body(1, 0)))
    assert single[8] == 1  # what every version-1 peer understands keeps version 1


async def test_a_batch_without_the_token_is_refused_as_unauthorized() -> None:
    """A token bookie answers the versions question UNAUTHORIZED (nothing before AUTH) and
    closes: every add on the connection is refused UnauthorizedError, not "unreachable" (the
    writer must fail, not replace the bookie)."""
    from pybk.errors import UnauthorizedError

    bookie = await _bookie()
    async with BookieServer(bookie.handle, add=bookie.add_request,
                            auth_token=b"s3cret") as server:
        host, port = server.address

        async def resolve(_: str) -> str:
            return f"{host}:{port}"

        t = TcpTransport(resolve)
        ids = list(range(8))
        outcome = await _add(t, AddBatchRequest(4, KEY, ids, [body(4, e) for e in ids]))
        assert isinstance(outcome, list) and all(isinstance(o, UnauthorizedError)
                                                 for o in outcome), outcome
        await t.close()
        good = TcpTransport(resolve, auth_token=b"s3cret")
        assert await _add(good, AddBatchRequest(4, KEY, ids, [body(4, e) for e in ids])) is None
        await good.close()
    bookie.crash()


async def test_a_deferred_sync_add_to_an_old_bookie_is_refused_and_the_connection_kept() -> None:
    bookie = await _bookie()
    old = VersionOneBookie(bookie)
    address = await old.start()

    async def resolve(_: str) -> str:
        return address

    t = TcpTransport(resolve)
    try:
        deferred = AddBatchRequest(1, KEY, [0], [body(1, 0)], deferred_sync=True)
        outcome = await _add(t, deferred)
        assert isinstance(outcome, BKError) and outcome.status == Status.PROTOCOL_ERROR
        assert await _add(t, AddBatchRequest(1, KEY, [0], [body(1, 0)])) is None  # it goes on
        assert old.closed_for_version == 0 and len(t.connected_bookies()) == 1
    finally:
        await t.close()
        await old.stop()
        await bookie.stop()

