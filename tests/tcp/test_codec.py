"""The sans-IO codec: round trips for every message type, strict rejection, fuzzing.

Properties: decode(encode(m)) == m for every request and response type, whatever the byte
boundaries the stream is cut at; random bytes and mutated valid frames never raise anything
but ProtocolError (or yield MessageRejected), and never make the decoder buffer past its cap.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pybk.errors import ProtocolError
from pybk.transport import codec, fastpath, messages, wireformat
from pybk.transport.codec import (
    Connection,
    MessageRejected,
    RequestReceived,
    ResponseReceived,
    encode_request,
    encode_response,
)
from pybk.wire import (
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    FenceRequest,
    FenceResponse,
    ForceRequest,
    ForceResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    Op,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
    WriteLacRequest,
    WriteLacResponse,
)

FAST = settings(
    derandomize=True, deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow]
)

i64 = st.integers(-(2**63), 2**63 - 1)
u64 = st.integers(0, 2**64 - 1)
blob = st.binary(max_size=300)
opt_blob = st.none() | blob
status = st.sampled_from(list(Status))
text = st.text(max_size=40)

requests = st.one_of(
    st.builds(AddRequest, i64, i64, blob, blob, st.booleans(), st.booleans()),
    st.builds(
        ReadRequest,
        i64,
        i64,
        fence=st.booleans(),
        master_key=blob,
        previous_lac=st.none() | i64,
        timeout=st.floats(0, codec.MAX_TIMEOUT),
    ),
    st.builds(ReadLacRequest, i64),
    st.builds(WriteLacRequest, i64, i64, blob, blob),
    st.builds(FenceRequest, i64, blob),
    st.builds(ForceRequest, i64, blob),
    st.builds(ListEntriesRequest, i64),
    st.builds(BookieInfoRequest, st.booleans()),
    st.builds(AuthRequest, blob),
    st.lists(st.tuples(i64, blob), min_size=1, max_size=6).flatmap(
        lambda entries: st.builds(
            AddBatchRequest, i64, blob, st.just([e for e, _ in entries]),
            st.just([b for _, b in entries]), st.booleans(), st.booleans())),
    st.builds(ReadBatchRequest, i64, st.lists(i64, min_size=1, max_size=8)),
)

ranges = st.lists(st.tuples(i64, i64).map(lambda t: (min(t), max(t))), max_size=20).map(tuple)
responses = st.one_of(
    st.builds(AddResponse, status, i64, i64, text),
    st.builds(ReadResponse, status, i64, i64, opt_blob, i64, text),
    st.builds(ReadLacResponse, status, i64, opt_blob, opt_blob, text),
    st.builds(WriteLacResponse, status, i64, text),
    st.builds(FenceResponse, status, i64, i64, text),
    st.builds(ForceResponse, status, i64, i64, text),
    st.builds(ListEntriesResponse, status, i64, ranges, text),
    st.builds(BookieInfoResponse, status, text, i64, i64, text, text, st.integers(0, 255)),
    st.builds(AuthResponse, status, text),
    st.integers(0, 8).flatmap(lambda n: st.builds(
        AddBatchResponse, status, i64, st.just(n),
        st.just(()) | st.lists(status, min_size=n, max_size=n).map(tuple), text)),
    st.builds(ReadBatchResponse, status, i64, i64,
              st.lists(st.tuples(i64, status, opt_blob), max_size=5).map(tuple), text),
)


def _feed(conn: Connection, data: bytes, cuts: list[int]) -> list[object]:
    """Feed ``data`` cut at ``cuts`` positions; collect every event."""
    events: list[object] = []
    prev = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        events.extend(conn.receive_data(data[prev:cut]))
        conn._check()
        prev = cut
    return events


@FAST
@given(st.lists(st.tuples(u64, requests), min_size=1, max_size=5), st.lists(st.integers(0, 10**6)))
def test_requests_round_trip_across_any_cut(msgs, cuts):
    wire = b"".join(encode_request(rid, m) for rid, m in msgs)
    server = Connection("server")
    events = _feed(server, wire, cuts)
    assert events == [RequestReceived(rid, m) for rid, m in msgs]
    assert server.buffered == 0


@FAST
@given(st.lists(st.tuples(u64, responses), min_size=1, max_size=5), st.lists(st.integers(0, 10**6)))
def test_responses_round_trip_across_any_cut(msgs, cuts):
    wire = b"".join(encode_response(rid, m) for rid, m in msgs)
    client = Connection("client")
    assert _feed(client, wire, cuts) == [ResponseReceived(rid, m) for rid, m in msgs]


def test_every_op_has_a_strategy():
    """The round-trip strategies cover every operation in pybk.wire.Op."""
    seen_req = {
        type(r).op
        for r in [
            AddRequest(1, 1, b"", b""),
            ReadRequest(1, 1),
            ReadLacRequest(1),
            WriteLacRequest(1, 1, b"", b""),
            FenceRequest(1, b""),
            ForceRequest(1, b""),
            ListEntriesRequest(1),
            BookieInfoRequest(),
            AuthRequest(b""),
            AddBatchRequest(1, b"", [1], [b""]),
            ReadBatchRequest(1, [1]),
        ]
    }
    assert seen_req == set(Op)
    for op in Op:
        resp = codec.error_response_for_op(op, Status.BAD_REQUEST, "x")
        assert resp.op is op
        frame = encode_response(7, resp)
        assert Connection("client").receive_data(frame) == [ResponseReceived(7, resp)]


@FAST
@given(st.binary(max_size=2000))
def test_random_bytes_only_raise_protocol_error(data):
    for role in ("client", "server"):
        conn = Connection(role, max_frame=1024)
        try:
            events = conn.receive_data(data)
        except ProtocolError:
            assert conn.broken is not None
            with pytest.raises(ProtocolError):
                conn.receive_data(b"more")
            continue
        assert all(
            isinstance(e, (RequestReceived, ResponseReceived, MessageRejected)) for e in events
        )
        assert conn.buffered <= 1024 + 4


def _refresh_crc(frame: bytearray) -> None:
    """Recompute the CRC so a mutation reaches the header/body decoder."""
    struct.pack_into(">I", frame, 4, crc32c.crc32c(bytes(frame[8:])))


@FAST
@given(
    st.one_of(
        requests.map(lambda r: ("server", encode_request(5, r))),
        responses.map(lambda r: ("client", encode_response(5, r))),
    ),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    st.booleans(),
    st.integers(-8, 8),
)
def test_mutated_frames_only_raise_protocol_error(pair, flips, fix_crc, resize):
    role, frame = pair
    data = bytearray(frame)
    for pos, value in flips:
        data[pos % len(data)] = value
    if resize > 0:
        data += bytes(resize)
    elif resize < 0:
        del data[resize:]
    if fix_crc and len(data) >= 8:
        struct.pack_into(">I", data, 0, len(data) - 4)
        _refresh_crc(data)
    conn = Connection(role)
    try:
        events = conn.receive_data(bytes(data))
    except ProtocolError:
        conn._check()
        return
    conn._check()
    for e in events:
        assert isinstance(e, (RequestReceived, ResponseReceived, MessageRejected))


# ----------------------------------------------------------------------- specific rejections


def _frame(
    op: int, flags: int, body: bytes, *, version: int = codec.PROTOCOL_VERSION, rid: int = 1
) -> bytes:
    header = struct.pack(">BBHQ", version, op, flags, rid) + body
    return struct.pack(">II", len(header) + 4, crc32c.crc32c(header)) + header


def test_oversized_length_prefix_rejected_before_buffering():
    conn = Connection("server", max_frame=codec.PRE_AUTH_MAX_FRAME)
    with pytest.raises(ProtocolError, match="exceeds the 4096-byte cap"):
        conn.receive_data(struct.pack(">I", 0xFFFFFFFF))
    assert conn.buffered == 0
    conn = Connection("server")
    with pytest.raises(ProtocolError, match="cap"):
        conn.receive_data(struct.pack(">I", codec.DEFAULT_MAX_FRAME + 1) + b"x" * 100)


def test_too_short_length_rejected():
    with pytest.raises(ProtocolError, match="below the minimum"):
        Connection("server").receive_data(struct.pack(">I", 3) + b"abc")


def test_bad_crc_rejected():
    frame = bytearray(encode_request(1, ReadLacRequest(3)))
    frame[-1] ^= 1
    with pytest.raises(ProtocolError, match="CRC"):
        Connection("server").receive_data(bytes(frame))


def test_unknown_version_and_op_rejected():
    with pytest.raises(ProtocolError, match="version 9"):
        Connection("server").receive_data(_frame(Op.READ_LAC, 0, bytes(8), version=9))
    with pytest.raises(ProtocolError, match="operation 99"):
        Connection("server").receive_data(_frame(99, 0, bytes(8)))


def test_wrong_direction_rejected():
    with pytest.raises(ProtocolError, match="unexpected response"):
        Connection("server").receive_data(encode_response(1, AuthResponse(Status.OK)))
    with pytest.raises(ProtocolError, match="unexpected request"):
        Connection("client").receive_data(encode_request(1, AuthRequest(b"t")))


def test_trailing_bytes_and_unknown_flags_are_message_rejections():
    conn = Connection("server")
    [ev] = conn.receive_data(_frame(Op.READ_LAC, 0, bytes(8) + b"\x00"))
    assert isinstance(ev, MessageRejected) and "trailing" in str(ev.error)
    [ev] = conn.receive_data(_frame(Op.READ_LAC, 0x40, bytes(8)))
    assert isinstance(ev, MessageRejected) and "flags" in str(ev.error)
    # the connection goes on after a rejected body
    assert conn.receive_data(encode_request(2, ReadLacRequest(4))) == [
        RequestReceived(2, ReadLacRequest(4))
    ]


def test_counts_exceeding_bytes_left_rejected():
    conn = Connection("server")
    # ADD with a master key claiming 1 GiB
    body = struct.pack(">qqI", 1, 2, 1 << 30) + b"k"
    [ev] = conn.receive_data(_frame(Op.ADD, 0, body))
    assert isinstance(ev, MessageRejected) and "exceeds" in str(ev.error)
    # LIST_ENTRIES response claiming 2**32-2 ranges
    client = Connection("client")
    body = struct.pack(">HI", 0, 0) + struct.pack(">qI", 1, 0xFFFFFFFE)
    [ev] = client.receive_data(_frame(Op.LIST_ENTRIES, codec.FLAG_RESPONSE, body))
    assert isinstance(ev, MessageRejected) and "range count" in str(ev.error)


def test_unknown_status_and_bad_utf8_rejected():
    client = Connection("client")
    [ev] = client.receive_data(_frame(Op.AUTH, codec.FLAG_RESPONSE, struct.pack(">HI", 999, 0)))
    assert isinstance(ev, MessageRejected) and "status" in str(ev.error)
    body = struct.pack(">HI", 0, 2) + b"\xff\xfe"
    [ev] = client.receive_data(_frame(Op.AUTH, codec.FLAG_RESPONSE, body))
    assert isinstance(ev, MessageRejected) and "UTF-8" in str(ev.error)


def test_bad_read_timeout_rejected_both_ways():
    with pytest.raises(ValueError, match="timeout"):
        encode_request(1, ReadRequest(1, 1, previous_lac=0, timeout=float("nan")))
    body = struct.pack(">qqqd", 1, 1, 0, float("inf")) + struct.pack(">I", 0)
    [ev] = Connection("server").receive_data(_frame(Op.READ, codec.FLAG_LONG_POLL, body))
    assert isinstance(ev, MessageRejected) and "timeout" in str(ev.error)


def test_encode_rejects_out_of_range_values():
    with pytest.raises(ValueError):
        encode_request(1, ReadLacRequest(2**63))
    with pytest.raises(ValueError):
        encode_request(-1, ReadLacRequest(1))
    with pytest.raises(TypeError):
        encode_request(1, "not a request")  # type: ignore[arg-type]


def test_max_frame_can_be_raised_after_auth():
    conn = Connection("server", max_frame=codec.PRE_AUTH_MAX_FRAME)
    big = encode_request(1, AddRequest(1, 0, b"k", b"x" * 10_000))
    with pytest.raises(ProtocolError):
        Connection("server", max_frame=codec.PRE_AUTH_MAX_FRAME).receive_data(big)
    conn.max_frame = codec.DEFAULT_MAX_FRAME
    [ev] = conn.receive_data(big)
    assert isinstance(ev, RequestReceived)


def test_hold_after_auth_leaves_following_frames_buffered():
    conn = Connection("server", max_frame=codec.PRE_AUTH_MAX_FRAME)
    conn.hold_after_auth = True
    auth = encode_request(1, AuthRequest(b"t"))
    big = encode_request(2, AddRequest(1, 0, b"k", b"x" * 10_000))
    assert conn.receive_data(auth + big) == [RequestReceived(1, AuthRequest(b"t"))]
    assert conn.buffered == len(big)
    conn.max_frame = codec.DEFAULT_MAX_FRAME
    conn.hold_after_auth = False
    [ev] = conn.receive_data(b"")
    assert isinstance(ev, RequestReceived) and ev.request_id == 2


# ----------------------------------------------------------- fast paths == generic paths


def _generic_request(rid: int, req) -> bytes:
    w = wireformat.BodyWriter()
    flags = messages._encode_request_body(req, w)
    return messages._frame(int(req.op), flags, rid, w.parts)


def _generic_response(rid: int, resp) -> bytes:
    w = wireformat.BodyWriter()
    messages._encode_response_body(resp, w)
    return messages._frame(int(resp.op), codec.FLAG_RESPONSE, rid, w.parts)


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except ProtocolError:
        return ("error", None)


@FAST
@given(u64, st.builds(AddRequest, i64, i64, blob, blob, st.booleans()),
       st.builds(AddResponse, status, i64, i64, st.text(max_size=40)))  # fmt: skip
def test_add_fast_encoders_match_generic(rid, req, resp):
    assert encode_request(rid, req) == _generic_request(rid, req)
    assert encode_response(rid, resp) == _generic_response(rid, resp)


@FAST
@given(
    st.sampled_from(["req", "resp"]),
    st.binary(max_size=80),
    st.integers(0, 3),
)
def test_add_fast_decoders_agree_with_generic_on_any_body(kind, body, flags):
    """Any ADD body: the fast decoder and the generic one accept/refuse alike."""
    if kind == "req":
        frame = bytes(4 + 12) + body
        fast = _outcome(fastpath.decode_add_request, frame, flags & codec.FLAG_RECOVERY)
        generic = _outcome(
            messages._decode_request, Op.ADD, flags & codec.FLAG_RECOVERY,
            wireformat.BodyReader(memoryview(body)),
        )  # fmt: skip
    else:
        frame = bytes(4 + 12) + body
        fast = _outcome(fastpath.decode_add_response, frame)
        generic = _outcome(messages._decode_response, Op.ADD,
                           wireformat.BodyReader(memoryview(body)))
    assert fast == generic


def test_add_fast_decoders_on_valid_prefixes():
    req = AddRequest(3, 4, b"key", b"body", recovery=True)
    body = _generic_request(1, req)[8 + 12 :]
    for cut in range(len(body) + 1):
        part = body[:cut]
        fast = _outcome(fastpath.decode_add_request, bytes(16) + part, codec.FLAG_RECOVERY)
        generic = _outcome(messages._decode_request, Op.ADD, codec.FLAG_RECOVERY,
                           wireformat.BodyReader(memoryview(part)))
        assert fast == generic
    resp = AddResponse(Status.FENCED, 3, 4, "fenced ✓")
    body = _generic_response(1, resp)[8 + 12 :]
    for cut in range(len(body) + 1):
        part = body[:cut]
        assert _outcome(fastpath.decode_add_response, bytes(16) + part) == _outcome(
            messages._decode_response, Op.ADD, wireformat.BodyReader(memoryview(part))
        )


def test_every_wire_status_maps_to_its_error_class_and_back():
    from pybk import errors

    for status_code in Status:
        if status_code is Status.OK:
            continue
        exc = errors.error_for_status(int(status_code), "m")
        assert isinstance(exc, errors.BKError)
        assert exc.status == int(status_code), (status_code, type(exc))
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.BKError)]  # fmt: skip
    assert {c.status for c in classes} <= {int(s) for s in Status}


@FAST
@given(u64, st.lists(st.tuples(i64, blob), min_size=1, max_size=6), i64, blob, st.booleans())
def test_batch_fast_encoder_matches_generic(rid, entries, ledger, key, recovery):
    req = AddBatchRequest(ledger, key, [e for e, _ in entries], [b for _, b in entries],
                          recovery)
    assert encode_request(rid, req) == _generic_request(rid, req)


@FAST
@given(st.binary(max_size=120), st.integers(0, 3))
def test_batch_fast_decoder_agrees_with_generic_on_any_body(body, flags):
    """Any ADD_BATCH body: the fast decoder and the generic one accept/refuse alike (and
    decode alike)."""
    fast = _outcome(fastpath.decode_batch_request, bytes(16) + body, flags & codec.FLAG_RECOVERY)
    generic = _outcome(messages._decode_request, Op.ADD_BATCH, flags & codec.FLAG_RECOVERY,
                       wireformat.BodyReader(memoryview(body)))
    assert fast == generic


def test_batch_fast_decoder_on_valid_prefixes():
    req = AddBatchRequest(3, b"key", [4, 6, 7], [b"a", b"", b"ccc"], recovery=True)
    body = _generic_request(1, req)[8 + 12 :]
    for cut in range(len(body) + 1):
        part = body[:cut]
        fast = _outcome(fastpath.decode_batch_request, bytes(16) + part, codec.FLAG_RECOVERY)
        generic = _outcome(messages._decode_request, Op.ADD_BATCH, codec.FLAG_RECOVERY,
                           wireformat.BodyReader(memoryview(part)))
        assert fast == generic
    assert _outcome(fastpath.decode_batch_request, bytes(16) + body, codec.FLAG_RECOVERY) == (
        "ok", req)
