"""Journal framing: segment headers, records, batches; index checkpoint files."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.errors import CorruptRecordError
from pybk.storage.checkpoint import decode_checkpoint, encode_checkpoint
from pybk.storage.index import Index, Location, Position
from pybk.storage.records import (
    BATCH_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    RecordType,
    batch_at,
    decode_entry_at,
    decode_segment_header,
    encode_batch,
    encode_checkpoint_mark,
    encode_delete,
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_master_key,
    encode_record,
    encode_segment_header,
    find_valid_batch_after,
    iter_records,
)
from pybk.wire import DigestManager

IID = str(uuid.UUID(int=12345, version=4))


def test_segment_header_round_trip():
    data = encode_segment_header(7, IID)
    assert len(data) == SEGMENT_HEADER_SIZE
    h = decode_segment_header(data, "x.seg")
    assert (h.seq, h.instance_id) == (7, IID)


def test_segment_header_unknown_version_is_refused_clearly():
    data = bytearray(encode_segment_header(7, IID))
    struct.pack_into(">H", data, 8, 99)
    with pytest.raises(CorruptRecordError, match="unknown journal format version 99"):
        decode_segment_header(bytes(data), "x.seg")


@pytest.mark.parametrize("damage", ["magic", "crc", "short"])
def test_segment_header_damage(damage):
    data = bytearray(encode_segment_header(7, IID))
    if damage == "magic":
        data[0] ^= 1
    elif damage == "crc":
        data[20] ^= 1
    else:
        data = data[:10]
    with pytest.raises(CorruptRecordError) as info:
        decode_segment_header(bytes(data), "x.seg")
    assert info.value.path == "x.seg" and info.value.offset == 0


def _body(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    """A framed entry body as a client sends it (the ENTRY record carries it whole)."""
    return DigestManager(ledger_id).frame(entry_id, entry_id - 1, len(payload), payload)


def test_entry_record_too_short_for_its_ids_is_corruption():
    rec = encode_record(RecordType.ENTRY, b"short")
    with pytest.raises(CorruptRecordError, match="malformed ENTRY"):
        list(iter_records(rec, 0, "p"))


def test_every_record_type_round_trips():
    recs = [
        encode_entry(_body(1, 2, b"body")),
        encode_master_key(1, b"k" * 32),
        encode_fence(1),
        encode_explicit_lac(1, 5, b"lacbody"),
        encode_delete(1),
        encode_checkpoint_mark(3, 4096),
    ]
    payload = b"".join(recs)
    out = list(iter_records(payload, 100, "p"))
    assert [r.rtype for r in out] == [RecordType.ENTRY, RecordType.MASTER_KEY, RecordType.FENCE,
                                      RecordType.EXPLICIT_LAC, RecordType.DELETE_LEDGER,
                                      RecordType.CHECKPOINT]
    assert (out[0].ledger_id, out[0].entry_id, out[0].data) == (1, 2, _body(1, 2, b"body"))
    assert out[1].data == b"k" * 32
    assert (out[3].lac, out[3].data) == (5, b"lacbody")
    assert out[0].offset == 100 and out[1].offset == 100 + len(recs[0])
    assert sum(r.size for r in out) == len(payload)


@settings(derandomize=True, deadline=None, max_examples=100)
@given(body=st.binary(max_size=300), flip=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_any_single_bit_flip_in_an_entry_record_is_detected(body, flip, bit):
    body = _body(3, 9, body)
    rec = bytearray(encode_entry(body))
    assert decode_entry_at(bytes(rec), "p", 0, 3, 9) == body
    rec[flip % len(rec)] ^= 1 << bit
    with pytest.raises(CorruptRecordError):
        decode_entry_at(bytes(rec), "p", 0, 3, 9)


def test_entry_record_for_another_id_is_corruption_not_absence():
    rec = encode_entry(_body(3, 9, b"x"))
    with pytest.raises(CorruptRecordError, match="not entry"):
        decode_entry_at(rec, "p", 0, 3, 10)


def test_batches_valid_torn_and_found_after_garbage():
    b0 = encode_batch(0, encode_fence(1))
    b1 = encode_batch(1, encode_fence(2))
    data = b0 + b1
    assert batch_at(data, 0) == (0, len(b0) - BATCH_HEADER_SIZE)
    assert batch_at(data, len(b0)) == (1, len(b1) - BATCH_HEADER_SIZE)
    assert batch_at(data[:-1], len(b0)) is None  # torn
    damaged = bytearray(data)
    damaged[BATCH_HEADER_SIZE + 2] ^= 4
    assert batch_at(bytes(damaged), 0) is None
    assert find_valid_batch_after(bytes(damaged), 0, 0) == len(b0)
    assert find_valid_batch_after(bytes(damaged), 0, 2) is None  # seq too low to count
    assert find_valid_batch_after(b0 + bytes(100), len(b0), 1) is None


def test_index_checkpoint_round_trip_and_damage():
    idx = Index()
    idx.put_entry(1, 0, Location(0, 40, 60), -1)
    idx.put_entry(1, 1, Location(1, 40, 70), 0)
    st = idx.ledger(2)
    st.master_key, st.fenced, st.explicit_lac, st.explicit_lac_body = b"k", True, 4, b"lb"
    idx.ledger(3)
    idx.delete_ledger(3)
    idx._check()
    data = encode_checkpoint(idx, Position(1, 110, 2))
    cp = decode_checkpoint(data, "cp")
    back, pos = cp.build_index(), cp.position
    back._check()
    assert pos == Position(1, 110, 2)
    assert back.ledgers[1].entries.items() == idx.ledgers[1].entries.items()
    assert back.ledgers[1].max_piggyback_lac == 0
    b2 = back.ledgers[2]
    assert (b2.master_key, b2.fenced, b2.explicit_lac, b2.explicit_lac_body) == (b"k", True, 4,
                                                                                 b"lb")
    assert back.is_deleted(3) and 3 not in back.ledgers and back.seg_live == {0: 60, 1: 70}
    for i in (0, 9, 30, len(data) - 1):
        bad = bytearray(data)
        bad[i] ^= 1
        with pytest.raises(CorruptRecordError):
            decode_checkpoint(bytes(bad), "cp")
    bad = bytearray(data)
    bad[9] ^= 1  # version 3 -> 2: the checksum covers the header's version too
    with pytest.raises(CorruptRecordError, match="checksum mismatch"):
        decode_checkpoint(bytes(bad), "cp")
    bad = bytearray(data)
    struct.pack_into(">H", bad, 8, 1)  # (version 1: no deltas, read by older pybk only)
    with pytest.raises(CorruptRecordError, match="unknown index checkpoint version 1"):
        decode_checkpoint(bytes(bad), "cp")


def test_index_check_catches_broken_live_accounting():
    idx = Index()
    idx.put_entry(1, 0, Location(0, 40, 60), -1)
    idx.seg_live[0] = 1
    with pytest.raises(AssertionError):
        idx._check()
