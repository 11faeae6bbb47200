"""The record envelope: round trips (with and without txids, raw and zstd), and every kind of
damage is CorruptRecordError, never wrong records."""

from __future__ import annotations

import json
import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pybk.errors import CorruptRecordError
from pybk.logs import envelope
from pybk.logs.envelope import CODEC_NONE, CODEC_ZSTD, HEADER_SIZE, decode, decode_header, encode

records = st.lists(st.binary(max_size=300), min_size=1, max_size=40)


@given(records, st.booleans(), st.sampled_from([CODEC_NONE, CODEC_ZSTD]),
       st.integers(0, 2**40), st.integers(-1, 2**40))
def test_round_trip(recs: list[bytes], with_txids: bool, codec: int, first: int,
                    max_txid: int) -> None:
    txids = [i * 3 if i % 2 else -1 for i in range(len(recs))] if with_txids else None
    data = encode(recs, txids, first, max_txid, codec)
    env = decode(data)
    assert env.records == recs
    assert env.count == len(recs)
    assert env.header.first_index == first and env.header.max_txid == max_txid
    if txids is None:
        assert env.txids is None
    else:
        assert env.txids == [None if t < 0 else t for t in txids]
    assert decode_header(data) == env.header


def test_zstd_compresses_json_like_records_and_is_kept_only_when_smaller() -> None:
    rng = random.Random(3)
    recs = [json.dumps({"id": i, "user": f"user-{rng.randrange(1000)}", "action": "click",
                        "page": f"/products/{rng.randrange(50)}", "ts": 1_700_000_000 + i})
            .encode() for i in range(500)]
    raw = encode(recs, None, 0, -1, CODEC_NONE)
    packed = encode(recs, None, 0, -1, CODEC_ZSTD)
    assert len(packed) * 3 < len(raw), (len(packed), len(raw))
    assert decode(packed).records == recs and decode_header(packed).codec == CODEC_ZSTD
    noise = [rng.randbytes(2000)]  # incompressible: stored raw
    stored = encode(noise, None, 0, -1, CODEC_ZSTD)
    assert decode_header(stored).codec == CODEC_NONE
    assert decode(stored).records == noise


@given(st.data())
def test_any_flipped_bit_is_detected(data: st.DataObject) -> None:
    recs = data.draw(records)
    codec = data.draw(st.sampled_from([CODEC_NONE, CODEC_ZSTD]))
    good = bytearray(encode(recs, None, 5, 7, codec))
    bit = data.draw(st.integers(0, len(good) * 8 - 1))
    good[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptRecordError):
        decode(bytes(good))


@pytest.mark.parametrize("cut", [0, 1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 3])
def test_truncated_envelope_is_corrupt(cut: int) -> None:
    data = encode([b"hello", b"world"], None, 0, -1)
    with pytest.raises(CorruptRecordError):
        decode(data[:cut])


def _recrc(head: bytes, body: bytes) -> bytes:
    import crc32c

    crc = crc32c.crc32c(body, crc32c.crc32c(head))
    return head + struct.pack(">I", crc) + body


def test_checksummed_but_inconsistent_envelopes_are_corrupt() -> None:
    good = encode([b"abc", b"de"], None, 0, -1)
    head, body = bytearray(good[:28]), good[32:]
    unknown_version = bytearray(head)
    unknown_version[2] = 9
    with pytest.raises(CorruptRecordError, match="unknown format version 9"):
        decode(_recrc(bytes(unknown_version), body))
    unknown_flag = bytearray(head)
    unknown_flag[3] = 0x40
    with pytest.raises(CorruptRecordError, match="flags"):
        decode(_recrc(bytes(unknown_flag), body))
    bad_magic = b"XX" + bytes(head[2:])
    with pytest.raises(CorruptRecordError, match="magic"):
        decode(_recrc(bad_magic, body))
    too_many = bytearray(head)
    too_many[4:8] = struct.pack(">I", 1000)
    with pytest.raises(CorruptRecordError):
        decode(_recrc(bytes(too_many), body))
    zero = bytearray(head)
    zero[4:8] = struct.pack(">I", 0)
    with pytest.raises(CorruptRecordError, match="impossible"):
        decode(_recrc(bytes(zero), body))
    lengths_lie = struct.pack("<II", 3, 9) + body[8:]
    with pytest.raises(CorruptRecordError, match="lengths"):
        decode(_recrc(bytes(head), lengths_lie))
    raw_lies = bytearray(head)
    raw_lies[24:28] = struct.pack(">I", len(body) + 1)
    with pytest.raises(CorruptRecordError, match="body"):
        decode(_recrc(bytes(raw_lies), body))
    huge = bytearray(head)
    huge[24:28] = struct.pack(">I", envelope.MAX_RAW_SIZE + 1)
    with pytest.raises(CorruptRecordError, match="impossible"):
        decode(_recrc(bytes(huge), body))


def test_garbage_zstd_payload_is_corrupt() -> None:
    head = bytearray(encode([b"x" * 100] * 10, None, 0, -1, CODEC_ZSTD)[:28])
    assert head[3] & 0x07 == CODEC_ZSTD
    with pytest.raises(CorruptRecordError, match=r"zstd|body"):
        decode(_recrc(bytes(head), b"\x28\xb5\x2f\xfd" + b"garbage" * 5))


keyed = st.lists(st.tuples(st.binary(max_size=200), st.none() | st.binary(max_size=50)),
                 min_size=1, max_size=40)


@given(keyed, st.booleans(), st.sampled_from([CODEC_NONE, CODEC_ZSTD]))
def test_keys_round_trip_in_version_2(items: list[tuple[bytes, bytes | None]], with_txids: bool,
                                      codec: int) -> None:
    recs = [r for r, _ in items]
    keys = [k for _, k in items]
    txids = list(range(len(recs))) if with_txids else None
    data = encode(recs, txids, 4, 9, codec, keys=keys)
    env = decode(data)
    assert env.records == recs
    if any(k is not None for k in keys):
        assert data[2] == envelope.VERSION_KEYS and env.header.has_keys
        assert env.keys == keys
    else:  # no key at all: a version 1 envelope, readable by every version 1 reader
        assert data[2] == envelope.VERSION and env.keys is None
    assert (env.txids is None) == (txids is None)
    packed = envelope.decode_packed(data)
    assert list(packed.lengths()) == [len(r) for r in recs]


def test_envelopes_without_keys_are_byte_for_byte_version_1() -> None:
    # the layout the version 1 reader knows, built by hand
    recs = [b"abc", b"de"]
    body = struct.pack("<II", 3, 2) + b"abcde"
    head = struct.pack(">2sBBIQqI", b"PE", 1, 0, 2, 0, -1, len(body))
    assert encode(recs, None, 0, -1) == _recrc(head, body)
    assert encode(recs, None, 0, -1, keys=[None, None]) == _recrc(head, body)


def test_key_flag_needs_version_2_and_key_tables_must_add_up() -> None:
    good = encode([b"abc", b"de"], None, 0, -1, keys=[b"k", None])
    head, body = bytearray(good[:28]), good[32:]
    as_v1 = bytearray(head)
    as_v1[2] = 1
    with pytest.raises(CorruptRecordError, match="flags"):
        decode(_recrc(bytes(as_v1), body))
    # body: lengths (3, 2), key lengths (1, -1), b"k", b"abcde"
    assert body == struct.pack("<IIii", 3, 2, 1, -1) + b"k" + b"abcde"
    key_lies = struct.pack("<IIii", 3, 2, 2, -1) + b"k" + b"abcde"
    with pytest.raises(CorruptRecordError, match="add up"):
        decode(_recrc(bytes(head), key_lies))
    below = struct.pack("<IIii", 3, 2, 1, -5) + b"k" + b"abcde"
    with pytest.raises(CorruptRecordError, match="below -1"):
        decode(_recrc(bytes(head), below))
    with pytest.raises(ValueError, match="keys"):
        encode([b"a"], None, 0, -1, keys=[b"k", b"l"])
