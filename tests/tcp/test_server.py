"""BookieServer + TcpTransport over real loopback sockets with a stub handler.

Shows: pipelining with out-of-order completion, coalesced writes, per-connection backpressure,
timeouts and connection loss mapped to the Transport contract, and a server that keeps serving
a well-behaved client while other connections send garbage, oversized length prefixes,
byte-at-a-time headers, idle connections and floods.
"""

from __future__ import annotations

import asyncio
import os
import struct

import pytest
from prometheus_client import generate_latest

from pybk.errors import BookieUnavailableError, TimeoutError
from pybk.transport import codec
from pybk.transport.server import BookieServer, ServerConfig
from pybk.transport.tcp import TcpTransport, parse_address
from pybk.wire import AddRequest, AddResponse, ReadLacRequest, ReadRequest, Status

from .conftest import StubBookie, wait_until


def _resolver(server: BookieServer):
    """Resolves "b1" to the server's address as of now (a bookie keeps its port on restart)."""
    host, port = server.address

    async def resolve(bookie_id: str) -> str:
        if bookie_id != "b1":
            raise BookieUnavailableError(f"unknown bookie {bookie_id}")
        return f"{host}:{port}"

    return resolve


def _server(stub: StubBookie, **cfg) -> BookieServer:
    return BookieServer(stub.handle, config=ServerConfig(**cfg))


async def _served(stub: StubBookie, **cfg) -> BookieServer:
    server = _server(stub, **cfg)
    await server.start()
    return server


async def _good_client_round_trip(server: BookieServer, n: int = 20) -> None:
    """A fresh, well-behaved client can add and read back ``n`` entries."""
    transport = TcpTransport(_resolver(server))
    try:
        futs = [transport.send("b1", AddRequest(9, i, b"k", b"v%d" % i), 5.0) for i in range(n)]
        assert [(await f).status for f in futs] == [Status.OK] * n
        resp = await transport.send("b1", ReadRequest(9, n - 1), 5.0)
        assert resp.status == Status.OK and resp.body == b"v%d" % (n - 1)
    finally:
        await transport.close()


async def test_pipelined_requests_round_trip_with_coalesced_writes(stub):
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server))
        futs = [transport.send("b1", AddRequest(1, i, b"k", bytes(100)), 5.0) for i in range(2000)]
        responses = await asyncio.gather(*futs)
        assert [(r.ledger_id, r.entry_id, r.status) for r in responses] == [
            (1, i, Status.OK) for i in range(2000)
        ]
        assert server.stats["requests"] == 2000
        # responses ready in one loop iteration share a write()
        assert server.stats["writes"] < 2000
        await transport.close()


async def test_out_of_order_responses_matched_by_request_id(stub):
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server))
        stub.hold = True
        slow = transport.send("b1", AddRequest(1, 0, b"k", b"slow"), 5.0)
        await wait_until(lambda: stub.active == 1)
        stub.hold = False
        fast = transport.send("b1", ReadRequest(1, 0), 5.0)
        fast_resp = await fast  # answered while the add is still parked
        assert fast_resp.status == Status.NO_SUCH_ENTRY and not slow.done()
        stub.release_all()
        assert (await slow).entry_id == 0
        await transport.close()


async def test_backpressure_bounds_in_flight_requests_per_connection(stub):
    async with _server(stub, max_in_flight=4) as server:
        transport = TcpTransport(_resolver(server))
        stub.hold = True
        futs = [transport.send("b1", AddRequest(1, i, b"k", b"x"), 10.0) for i in range(50)]
        await wait_until(lambda: stub.active == 4)
        await wait_until(lambda: server.stats["in_flight_full"] >= 1)
        assert stub.max_active == 4
        stub.release_all()
        responses = await asyncio.wait_for(asyncio.gather(*futs), 10)
        assert all(r.status == Status.OK for r in responses)
        assert stub.max_active == 4
        await transport.close()


async def test_timeout_then_connection_still_usable(stub):
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server))
        stub.hold = True
        with pytest.raises(TimeoutError):
            await transport.send("b1", AddRequest(1, 0, b"k", b"x"), 0.2)
        stub.release_all()
        resp = await transport.send("b1", ReadRequest(1, 0), 5.0)
        assert resp.status == Status.OK  # the late add landed; the late answer was ignored
        await transport.close()


async def test_dropped_connection_fails_pending_with_unavailable(stub):
    server = await _served(stub, stop_grace=0.1)
    transport = TcpTransport(_resolver(server), backoff_initial=0.05)
    stub.hold = True
    pending = transport.send("b1", AddRequest(1, 0, b"k", b"x"), 30.0)
    await wait_until(lambda: stub.active == 1)
    await server.stop()  # grace expires: the in-flight request is failed
    with pytest.raises(BookieUnavailableError):
        await pending
    # nothing listens now: connect fails, then the backoff window fails fast
    with pytest.raises(BookieUnavailableError):
        await transport.send("b1", ReadLacRequest(1), 5.0)
    with pytest.raises(BookieUnavailableError, match="backing off"):
        await transport.send("b1", ReadLacRequest(1), 5.0)
    with pytest.raises(BookieUnavailableError, match="unknown bookie"):
        await transport.send("nope", ReadLacRequest(1), 5.0)
    await transport.close()
    stub.release_all()


async def test_reconnects_after_server_restart_on_same_port(stub):
    server = await _served(stub)
    port = server.address[1]
    transport = TcpTransport(_resolver(server), backoff_initial=0.01, backoff_max=0.05)
    assert (await transport.send("b1", AddRequest(1, 0, b"k", b"a"), 5.0)).status == Status.OK
    await server.stop()
    server2 = BookieServer(stub.handle, port=port)
    await server2.start()

    async def eventually_ok() -> None:
        while True:
            try:
                resp = await transport.send("b1", ReadRequest(1, 0), 5.0)
                assert resp.body == b"a"
                return
            except BookieUnavailableError:
                await asyncio.sleep(0.02)

    await asyncio.wait_for(eventually_ok(), 10)
    await transport.close()
    await server2.stop()


async def test_request_that_cannot_be_encoded_is_a_caller_error(stub):
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server))
        with pytest.raises(ValueError):
            transport.send("b1", ReadLacRequest(2**70), 5.0)
        await transport.close()


def test_parse_address():
    assert parse_address("127.0.0.1:3181") == ("127.0.0.1", 3181)
    assert parse_address("[::1]:3181") == ("::1", 3181)
    for bad in ("nohost", "h:", "h:0", "h:99999", ":80"):
        with pytest.raises(ValueError, match="host:port"):
            parse_address(bad)


# ------------------------------------------------------------------------ hostile peers


async def _raw(server: BookieServer, local: str | None = None):
    host, port = server.address
    return await asyncio.open_connection(host, port, local_addr=(local, 0) if local else None)


async def _closed_by_server(reader: asyncio.StreamReader, timeout: float = 10.0) -> bool:
    """True once the server closed the connection (EOF or reset) within ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(65536):
                pass
    except ConnectionError:
        pass
    return True


async def test_garbage_closes_only_that_connection(stub):
    async with BookieServer(stub.handle) as server:
        bad = []
        for i in range(5):
            reader, writer = await _raw(server)
            writer.write(os.urandom(64) + bytes([i]))
            bad.append((reader, writer))
        for reader, writer in bad:
            assert await _closed_by_server(reader)
            writer.close()
        assert sum(server.stats.counts.values()) > 0
        assert stub.calls == []
        await _good_client_round_trip(server)


async def test_oversized_length_prefix_closes_before_allocating(stub):
    async with BookieServer(stub.handle) as server:
        reader, writer = await _raw(server)
        writer.write(struct.pack(">I", 0xFFFFFFF0))
        assert await _closed_by_server(reader)
        assert server.stats["frame_too_large"] == 1
        metrics = generate_latest(server.registry).decode()
        assert 'pybk_server_events_total{event="frame_too_large"} 1.0' in metrics
        writer.close()
        await _good_client_round_trip(server)


async def test_malformed_body_answered_with_protocol_error_and_connection_continues(stub):
    async with BookieServer(stub.handle) as server:
        reader, writer = await _raw(server)
        header = struct.pack(">BBHQ", codec.PROTOCOL_VERSION, 3, 0, 77) + b"\x00" * 9  # 1 extra
        writer.write(struct.pack(">II", len(header) + 4, __import__("crc32c").crc32c(header)))
        writer.write(header + codec.encode_request(78, ReadLacRequest(5)))
        conn = codec.Connection("client")
        events: list = []
        async with asyncio.timeout(5):
            while len(events) < 2:
                events += conn.receive_data(await reader.read(65536))
        assert events[0].request_id == 77
        assert events[0].response.status == Status.PROTOCOL_ERROR
        assert events[1].request_id == 78  # same connection still served
        assert server.stats["bad_message"] == 1
        writer.close()


async def test_slowloris_byte_at_a_time_is_cut_off(stub):
    async with _server(stub, frame_timeout=0.3) as server:
        reader, writer = await _raw(server)
        frame = codec.encode_request(1, AddRequest(1, 0, b"k", bytes(200)))

        async def dribble() -> None:
            for byte in frame:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)  # the attack itself: one byte every 50 ms

        attack = asyncio.create_task(dribble())
        await _good_client_round_trip(server)  # served while the attack runs
        assert await _closed_by_server(reader)
        assert server.stats["frame_timeout"] == 1
        attack.cancel()
        writer.close()
        assert stub.calls == [c for c in stub.calls if c.ledger_id == 9]


async def test_idle_connections_are_closed(stub):
    async with _server(stub, idle_timeout=0.2) as server:
        reader, writer = await _raw(server)
        assert await _closed_by_server(reader)
        assert server.stats["idle_timeout"] == 1
        writer.close()


async def test_connection_flood_is_capped_and_good_client_still_served(stub):
    async with _server(stub, max_connections_per_ip=20) as server:
        flood = [await _raw(server) for _ in range(60)]
        await wait_until(lambda: server.stats["refused_per_ip_cap"] == 40)
        assert len(server.connections) == 20
        # a well-behaved client from another address is served despite the flood
        reader, writer = await _raw(server, local="127.0.0.2")
        writer.write(codec.encode_request(1, AddRequest(3, 0, b"k", b"ok")))
        conn = codec.Connection("client")
        events: list = []
        async with asyncio.timeout(5):
            while not events:
                events += conn.receive_data(await reader.read(65536))
        assert events[0].response.status == Status.OK
        writer.close()
        for _, w in flood:
            w.close()
        await wait_until(lambda: len(server.connections) == 0)
        await _good_client_round_trip(server)


async def test_stop_finishes_in_flight_requests_within_grace(stub):
    server = await _served(stub, stop_grace=5.0)
    transport = TcpTransport(_resolver(server))
    stub.hold = True
    futs = [transport.send("b1", AddRequest(1, i, b"k", b"x"), 10.0) for i in range(10)]
    await wait_until(lambda: stub.active == 10)
    stop = asyncio.create_task(server.stop())
    await wait_until(lambda: server.stopping)
    stub.release_all()
    await stop
    assert [(await f).status for f in futs] == [Status.OK] * 10
    await transport.close()


async def test_peer_that_never_reads_responses_is_cut_off(stub):
    """A client pipelining reads of a big entry but never reading the answers: the server
    starts reads only while their answers fit the connection's byte budget (the stub gives
    no size hint, so each read is charged a whole frame), so what it holds stays bounded;
    with no progress on the socket for write_timeout, it closes the connection."""
    stub.entries[(1, 0)] = bytes(256 * 1024)
    budget = 8 << 20
    async with _server(stub, write_timeout=0.5, connection_budget=budget) as server:
        _reader, writer = await _raw(server)
        frames = b"".join(codec.encode_request(i, ReadRequest(1, 0)) for i in range(2000))
        writer.write(frames)
        await wait_until(lambda: server.stats["connection_budget_full"] >= 1, 30, "budget full")
        conn = server.connections[0]
        peak = 0

        def gone() -> bool:
            nonlocal peak
            peak = max(peak, server.held)
            return server.stats["write_timeout"] == 1

        await wait_until(gone, 30, "write timeout")
        # answers held in memory stay within the budget (plus the one read that may start
        # on an idle connection): not one answer per pipelined request
        assert peak <= budget + codec.DEFAULT_MAX_FRAME + 4096, peak
        assert len(stub.calls) < 2000
        await wait_until(lambda: len(server.connections) == 0, 10, "connection dropped")
        assert conn.released and server.held == 0
        writer.transport.abort()
        await _good_client_round_trip(server)


async def test_mixed_timeouts_expire_in_deadline_order(stub):
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server))
        stub.hold = True
        slow_ok = transport.send("b1", AddRequest(1, 0, b"k", b"a"), 30.0)
        fast_timeout = transport.send("b1", AddRequest(1, 1, b"k", b"b"), 0.2)
        with pytest.raises(TimeoutError):
            await fast_timeout
        assert not slow_ok.done()
        stub.release_all()
        assert (await slow_ok).status == Status.OK
        # answered requests' deadlines do not pile up: the heap is compacted
        for _ in range(5):
            await asyncio.gather(
                *(transport.send("b1", ReadLacRequest(1), 30.0) for _ in range(1000))
            )
        [conn] = transport._conns.values()
        assert len(conn.deadlines) <= 2 * len(conn.pending) + 1024 + 1000
        await transport.close()


async def test_client_closes_its_idle_connections_before_the_server_does(stub):
    async with _server(stub, idle_timeout=5.0) as server:
        transport = TcpTransport(_resolver(server), idle_timeout=0.2)
        assert (await transport.send("b1", ReadLacRequest(1), 5.0)).status == Status.BAD_REQUEST
        assert transport.connected_bookies() == ["b1"]
        await wait_until(lambda: transport.connected_bookies() == [], 10, "client idle close")
        await wait_until(lambda: server.connections == [], 10, "server saw the close")
        assert server.stats["idle_timeout"] == 0
        # the next request simply opens a new connection
        assert (await transport.send("b1", ReadLacRequest(1), 5.0)).status == Status.BAD_REQUEST
        await transport.close()


async def test_pending_long_request_keeps_the_client_connection_open(stub):
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server), idle_timeout=0.1)
        stub.hold = True
        parked = transport.send("b1", AddRequest(1, 0, b"k", b"x"), 10.0)
        await wait_until(lambda: stub.active == 1)
        await asyncio.sleep(0.3)  # three idle periods pass while the request is pending
        assert transport.connected_bookies() == ["b1"]
        stub.release_all()
        assert (await parked).status == Status.OK
        await transport.close()


async def test_stop_does_not_wait_for_long_polls(stub):
    """A long poll in flight is dropped at once on stop (it changes nothing); an add in
    flight is still waited for."""
    server = await _served(stub, stop_grace=30.0)
    transport = TcpTransport(_resolver(server))
    stub.hold = True
    poll = transport.send("b1", ReadRequest(1, 0, previous_lac=5, timeout=60.0), 90.0)
    add = transport.send("b1", AddRequest(1, 0, b"k", b"x"), 90.0)
    await wait_until(lambda: stub.active == 2)
    stop = asyncio.create_task(server.stop())
    resp = await asyncio.wait_for(poll, 10)
    assert resp.status == Status.UNAVAILABLE
    assert not stop.done()  # still waiting for the add
    stub.release_all()
    await asyncio.wait_for(stop, 10)
    assert (await add).status == Status.OK
    await transport.close()


async def test_global_connection_cap(stub):
    async with _server(stub, max_connections=10, idle_timeout=0.5) as server:
        flood = [await _raw(server) for _ in range(30)]
        # at the cap, each newcomer takes the place of the oldest connection that has sent
        # nothing (a flood cannot lock the next good client out): 20 made room, 10 stay
        await wait_until(lambda: server.stats["displaced"]
                         + server.stats["refused_connection_cap"] == 20)
        assert len(server.connections) == 10
        # the flood's idle connections are reaped, then a good client gets in
        await wait_until(lambda: len(server.connections) == 0, 10, "idle flood reaped")
        await _good_client_round_trip(server)
        for _, w in flood:
            w.close()


async def test_connection_dropped_before_any_answer_backs_off(stub):
    """A bookie that accepts and drops at once (here: a full per-IP cap) is backed off like
    one that refuses, instead of being reconnected to on every request."""
    async with _server(stub, max_connections_per_ip=0) as server:
        transport = TcpTransport(_resolver(server), backoff_initial=5.0)
        with pytest.raises(BookieUnavailableError, match="lost"):
            await transport.send("b1", ReadLacRequest(1), 5.0)
        with pytest.raises(BookieUnavailableError, match="backing off"):
            await transport.send("b1", ReadLacRequest(1), 5.0)
        assert server.stats["refused_per_ip_cap"] == 1
        await transport.close()


async def test_oversized_request_refused_locally_without_hurting_the_connection(stub):
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server))
        pending = transport.send("b1", AddRequest(1, 0, b"k", b"ok"), 5.0)
        with pytest.raises(ValueError, match="frame cap"):
            transport.send("b1", AddRequest(1, 1, b"k", bytes(codec.DEFAULT_MAX_FRAME)), 5.0)
        assert (await pending).status == Status.OK
        assert server.stats["frame_too_large"] == 0
        await transport.close()


async def test_backpressure_is_not_mistaken_for_slowloris(stub):
    """While the server itself stops reading (in-flight cap reached, bookie slow), a partial
    frame in its buffer must not trip the per-frame deadline."""
    async with _server(stub, max_in_flight=2, frame_timeout=0.2) as server:
        reader, writer = await _raw(server)
        stub.hold = True
        frames = b"".join(codec.encode_request(i, AddRequest(1, i, b"k", b"x")) for i in range(5))
        sixth = codec.encode_request(9, AddRequest(1, 9, b"k", b"y"))
        writer.write(frames + sixth[:10])  # 5 whole frames and the start of another
        await wait_until(lambda: stub.active == 2 and server.stats["in_flight_full"] >= 1)
        conn = server.connections[0]
        loop = asyncio.get_running_loop()
        paused_at = loop.time()
        # let three frame deadlines pass while paused (an absence can only be shown over time)
        await wait_until(lambda: loop.time() - paused_at > 0.6, 5, "three frame deadlines")
        assert server.stats["frame_timeout"] == 0 and server.connections == [conn]
        stub.release_all()
        writer.write(sixth[10:])  # finish the sixth frame
        client = codec.Connection("client")
        events: list = []
        async with asyncio.timeout(10):
            while len(events) < 6:
                events += client.receive_data(await reader.read(65536))
        assert sorted(e.request_id for e in events) == [0, 1, 2, 3, 4, 9]
        writer.close()


async def test_largest_entry_round_trips_through_every_response_type():
    """An entry as large as the request cap allows still fits in READ and READ_LAC answers."""
    from pybk.wire import ReadLacResponse, ReadResponse

    key = bytes(32)
    overhead = len(codec.encode_request(1, AddRequest(1, 0, key, b""))) - 4
    body = bytes(codec.DEFAULT_MAX_FRAME - overhead)
    assert len(codec.encode_request(1, AddRequest(1, 0, key, body))) - 4 == codec.DEFAULT_MAX_FRAME

    async def handler(request):
        if isinstance(request, AddRequest):
            return AddResponse(Status.OK, 1, 0)
        if isinstance(request, ReadRequest):
            return ReadResponse(Status.OK, 1, 0, body, 0)
        return ReadLacResponse(Status.OK, 1, bytes(48), body)

    async with BookieServer(handler) as server:
        transport = TcpTransport(_resolver(server))
        assert (await transport.send("b1", AddRequest(1, 0, key, body), 10.0)).status == Status.OK
        assert (await transport.send("b1", ReadRequest(1, 0), 10.0)).body == body
        lac = await transport.send("b1", ReadLacRequest(1), 10.0)
        assert lac.last_entry_body == body
        await transport.close()


async def test_a_lone_request_goes_out_at_once_and_a_busy_pass_shares_one_write(stub):
    """Nothing else outstanding (a lone writer): the request is written in the call that
    sends it, not a loop pass later (it saves a pass of latency on each lone append, and
    the bookie answers a lone request at once the same way). Several sent in one pass: the
    first at once, the others together in one write at the next pass."""
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server))
        try:
            first = await transport.send("b1", AddRequest(1, 0, b"k", b"x"), 5.0)
            assert first.status == Status.OK
            conn = transport._connection("b1", 1)
            writes: list[int] = []
            real_write = conn.transport.write

            def spy(data: bytes) -> None:
                writes.append(len(data))
                real_write(data)

            conn.transport.write = spy
            lone = transport.send("b1", AddRequest(1, 1, b"k", b"x"), 5.0)
            assert len(writes) == 1  # before any loop pass
            assert (await lone).status == Status.OK
            writes.clear()
            busy = [transport.send("b1", AddRequest(1, i, b"k", b"x"), 5.0) for i in range(2, 12)]
            assert len(writes) == 1
            await asyncio.sleep(0)  # one pass: the other nine in one write
            assert len(writes) == 2 and writes[1] == 9 * writes[0]
            assert all(r.status == Status.OK for r in await asyncio.gather(*busy))
            # each lone request was answered by a write of its own, the busy ones shared
            assert server.stats["requests"] == 12
        finally:
            await transport.close()
