"""Large ADD_BATCH frames on a server: the entry table is walked a step per loop turn, the
bodies left in the frame until a chunk is admitted (pybk.transport.batchbodies, issue 34); a
malformed table is still refused whole, as a body that does not parse is."""

from __future__ import annotations

import asyncio
import struct

import crc32c
import pytest

from pybk.bookie import Bookie
from pybk.errors import EntryExistsError, LedgerFencedError, ProtocolError
from pybk.storage import MemFileSystem
from pybk.transport import codec
from pybk.transport.batchbodies import LAZY_ENTRIES, WALK_STEP, BatchBodies, BatchIds
from pybk.transport.fastpath import encode_batch_request
from pybk.transport.server import BookieServer
from pybk.wire import (
    AddBatchRequest,
    AddBatchResponse,
    DigestManager,
    ReadLacRequest,
    ReadRequest,
    Status,
    add_outcome,
    add_response,
    batch_bytes,
    master_key,
)

KEY = master_key(b"")
N = 5000
pytestmark = pytest.mark.timeout(60)


def body(ledger: int, entry: int) -> bytes:
    return DigestManager(ledger).frame(entry, entry - 1, 0, b"e%d" % entry)


def _batch(ledger: int = 1, n: int = N) -> AddBatchRequest:
    ids = list(range(n))
    return AddBatchRequest(ledger, KEY, ids, [body(ledger, e) for e in ids])


def _reframed(frame: bytes, tail: bytes = b"", cut: int = 0) -> bytes:
    """``frame`` with ``tail`` added to (or ``cut`` bytes taken from) its body, its length
    and CRC made right again: damage to the entry table alone."""
    rest = frame[8 : len(frame) - cut] + tail
    return struct.pack(">II", 4 + len(rest), crc32c.crc32c(rest)) + rest


def _server_events(data: bytes) -> list[codec.Event]:
    conn = codec.Connection("server")
    conn.lazy_batches = True
    return conn.receive_data(data)


def test_a_large_batch_is_decoded_without_walking_its_entries() -> None:
    request = _batch()
    [event] = _server_events(codec.encode_request(7, request))
    assert isinstance(event, codec.RequestReceived)
    got = event.request
    assert isinstance(got, AddBatchRequest)
    bodies = got.bodies
    assert isinstance(bodies, BatchBodies) and isinstance(got.entry_ids, BatchIds)
    assert not bodies.walked and len(bodies) == N and len(got.entry_ids) == N
    assert bodies.nbytes == sum(map(len, request.bodies))
    steps = 0
    while not bodies.walk():
        steps += 1
        assert len(bodies.starts) == steps * WALK_STEP  # a bounded step each time
    assert list(got.entry_ids) == request.entry_ids and list(bodies) == request.bodies
    chunk = bodies[1000:1500]
    assert type(chunk) is list and chunk == request.bodies[1000:1500]
    assert got.entry_ids[1000:1500] == request.entry_ids[1000:1500]
    assert bodies[-1] == request.bodies[-1] and got.entry_ids[-1] == N - 1
    # a batch at or under LAZY_ENTRIES, and any batch on a connection that did not ask,
    # is decoded whole as before
    [small] = _server_events(codec.encode_request(8, _batch(n=LAZY_ENTRIES)))
    assert isinstance(small, codec.RequestReceived)
    assert type(small.request.bodies) is list  # type: ignore[union-attr]
    [eager] = codec.Connection("server").receive_data(codec.encode_request(9, request))
    assert isinstance(eager, codec.RequestReceived) and eager.request == request


@pytest.mark.parametrize("damage", ["trailing bytes", "last body cut short", "absent body"])
def test_a_malformed_table_is_found_by_the_walk_as_by_the_whole_decoder(damage: str) -> None:
    frame = encode_batch_request(5, _batch())
    if damage == "trailing bytes":
        frame = _reframed(frame, tail=b"xyz")
    elif damage == "last body cut short":
        frame = _reframed(frame, cut=3)
    else:  # the last entry's length says "absent"
        last = body(1, N - 1)
        frame = _reframed(frame, tail=struct.pack(">qI", N - 1, 0xFFFFFFFF), cut=12 + len(last))
    [eager] = codec.Connection("server").receive_data(frame)
    assert isinstance(eager, codec.MessageRejected), eager
    [lazy] = _server_events(frame)
    assert isinstance(lazy, codec.RequestReceived)
    bodies = lazy.request.bodies  # type: ignore[union-attr]
    assert isinstance(bodies, BatchBodies)
    with pytest.raises(ProtocolError, match=str(eager.error)[:20]):
        while not bodies.walk():
            pass
    with pytest.raises(ProtocolError):  # (using an unwalked batch walks it first)
        _server_events(frame)[0].request.bodies[0]  # type: ignore[union-attr]


def test_a_count_the_frame_cannot_hold_is_refused_before_anything_is_made() -> None:
    frame = encode_batch_request(5, _batch(n=LAZY_ENTRIES + 1))
    # the count field says 65,536 entries: 12 bytes each would not fit the frame
    key_at = 8 + 12 + 8 + 4 + len(KEY)
    forged = frame[8:key_at] + struct.pack(">I", 65536) + frame[key_at + 4 :]
    [event] = _server_events(struct.pack(">II", 4 + len(forged), crc32c.crc32c(forged))
                             + forged)
    assert isinstance(event, codec.MessageRejected)
    assert "65536 entries" in str(event.error)


async def _read_frames(reader: asyncio.StreamReader, n: int) -> list[codec.Event]:
    conn = codec.Connection("client")
    events: list[codec.Event] = []
    async with asyncio.timeout(20):
        while len(events) < n:
            data = await reader.read(1 << 20)
            assert data, "closed by the server"
            events += conn.receive_data(data)
    return events


async def test_a_server_walks_large_batches_in_steps_and_stores_them() -> None:
    bookie = Bookie("b1", "/b", fs=MemFileSystem())
    await bookie.start()
    seen: list[AddBatchRequest] = []

    def add(request: AddBatchRequest, on_done: object) -> None:
        seen.append(request)
        bookie.add_request(request, on_done)  # type: ignore[arg-type]

    try:
        async with BookieServer(bookie.handle, add=add) as server:  # type: ignore[arg-type]
            reader, writer = await asyncio.open_connection(*server.address)
            good, other = _batch(1), _batch(2)
            bad = _reframed(encode_batch_request(2, _batch(3)), tail=b"!")
            writer.write(encode_batch_request(1, good) + bad
                         + encode_batch_request(3, other)
                         + codec.encode_request(4, ReadLacRequest(2)))
            events = await _read_frames(reader, 4)
            by_id = {e.request_id: e.response for e in events}  # type: ignore[union-attr]
            assert by_id[1] == AddBatchResponse(Status.OK, 1, N)
            assert by_id[2].status == Status.PROTOCOL_ERROR  # refused whole, nothing stored
            assert "trailing" in by_id[2].message  # type: ignore[union-attr]
            assert by_id[3] == AddBatchResponse(Status.OK, 2, N)  # the connection goes on
            assert by_id[4].status == Status.OK
            assert server.stats["bad_message"] == 1
            # each was walked a step per turn before it started (N / WALK_STEP steps)
            assert server.walks.steps >= 2 * -(-N // WALK_STEP)
            assert all(isinstance(r.bodies, BatchBodies) and r.bodies.walked for r in seen)
            assert [r.ledger_id for r in seen] == [1, 2]
            for ledger in (1, 2):
                read = await bookie.handle(ReadRequest(ledger, N - 1))
                assert read.status == Status.OK and read.body == body(ledger, N - 1)
            assert (await bookie.handle(ReadRequest(3, 0))).status != Status.OK
            writer.close()
    finally:
        bookie.crash()


def test_a_batch_refused_by_one_shared_error_is_answered_without_a_status_per_entry() -> None:
    request = _batch()
    shared = EntryExistsError("held with other bytes")
    whole = add_response(request, [shared] * N)
    assert whole == AddBatchResponse(Status.ENTRY_EXISTS, 1, N, (), str(shared))
    assert add_outcome(whole, N) is not None  # (the client sees every entry refused)
    other = LedgerFencedError("fenced")
    mixed = add_response(request, [None] * 10 + [shared] * (N - 20) + [other] * 10)
    assert isinstance(mixed, AddBatchResponse) and mixed.status == Status.ENTRY_EXISTS
    assert mixed.statuses == ((Status.OK,) * 10 + (Status.ENTRY_EXISTS,) * (N - 20)
                              + (Status.FENCED,) * 10)
    # the bytes of bodies left in their frame are known without making them
    [event] = _server_events(codec.encode_request(7, request))
    lazy = event.request.bodies  # type: ignore[union-attr]
    assert not lazy.walked and batch_bytes(lazy) == batch_bytes(request.bodies) == sum(
        map(len, request.bodies))
