"""Index checkpoints whose checksum is right but whose payload is not what the encoder writes.

The CRC catches damage; these files pass it (a bug in an encoder, a file written by hand or by
a tool, a damaged file whose checksum was recomputed). Loading one must either give an index
that keeps the index's invariants or raise CorruptRecordError, the error on which the store
rebuilds the index from the segments. Anything else (IndexError, OverflowError, MemoryError,
an AssertionError from the index) would stop the bookie from starting over a file it can do
without."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_kit import KEY, body, fill, open_store

from pybk.errors import CorruptRecordError
from pybk.storage import MemFileSystem
from pybk.storage.checkpoint import (
    _COUNT,
    _HEAD,
    _HEADER,
    _META,
    _RANGE,
    BASE,
    CHECKPOINT_FILE,
    CHECKPOINT_MAGIC,
    CHECKPOINT_VERSION,
    CheckpointEncoder,
    CheckpointFile,
    _checksum,
    decode_checkpoint,
    encode_checkpoint,
)
from pybk.storage.index import Index, Position
from pybk.storage.store import StoreConfig

#: bases only, so the file rewritten below is the whole chain
BASES = StoreConfig(segment_size=4096, checkpoint_max_deltas=0)


def sample_index() -> Index:
    """Every shape a checkpoint holds: a dense run with holes, sparse ids, a key, a fence, an
    explicit LAC, an empty ledger, deleted ledgers."""
    idx = Index()
    for eid in range(6):
        if eid != 3:  # a hole
            idx.put_entry(1, eid, (0, 40 + 60 * eid, 50), eid - 1)
    idx.put_entry(1, 500, (1, 40, 70), 4)  # far past the run: sparse
    idx.put_entry(2, 7, (1, 110, 30), -1)
    st2 = idx.ledger(2)
    st2.master_key, st2.fenced, st2.explicit_lac, st2.explicit_lac_body = b"key", True, 7, b"b"
    idx.ledger(3)  # held, no entries
    for lid in (9, 10, 11, 20):
        idx.ledger(lid)
        idx.delete_ledger(lid)
    return idx


def reframed(payload: bytes) -> bytes:
    """``payload`` under a header with its true length and checksum."""
    crc = _checksum(CHECKPOINT_VERSION, len(payload), payload)
    return _HEADER.pack(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, crc, len(payload)) + payload


def check_invariants(index: Index) -> None:
    """The index's structural invariants (what ``Index._check`` asserts but the live bytes:
    a file's own live-byte counts are checked by ``pybk bookie inspect``, not at load)."""
    for lid, state in index.ledgers.items():
        assert lid not in index.deleted and not state.deleted
        state.entries._check()
        for eid, (_seg, offset, size) in state.entries.items():
            assert eid >= 0 and offset >= 0 and size > 0, (lid, eid)


def load(data: bytes) -> CheckpointFile:
    """What start-up does with a base: decode, then build the index."""
    cp = decode_checkpoint(data, "index.ckpt")
    if cp.kind == BASE:
        check_invariants(cp.build_index())
    else:
        index = Index()
        try:
            cp.apply_to(index)
        except ValueError:
            return cp  # (load_checkpoint_chain turns this into CorruptRecordError)
        check_invariants(index)
    return cp


BASE_FILE = encode_checkpoint(sample_index(), Position(1, 150, 3), dead=[0])
PAYLOAD = BASE_FILE[_HEADER.size :]

edits = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, len(PAYLOAD) - 1), st.integers(0, 255)),
        st.tuples(st.just("cut"), st.integers(0, len(PAYLOAD)), st.just(0)),
        st.tuples(st.just("insert"), st.integers(0, len(PAYLOAD)), st.integers(0, 255)),
        st.tuples(st.just("max"), st.integers(0, len(PAYLOAD) - 4), st.sampled_from([4, 8])),
    ),
    min_size=1, max_size=4,
)


def apply_edits(payload: bytes, todo: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(payload)
    for kind, at, value in todo:
        at = min(at, len(out))
        if kind == "set" and at < len(out):
            out[at] = value
        elif kind == "cut":
            del out[at:]
        elif kind == "insert":
            out[at:at] = bytes([value])
        elif kind == "max" and at + value <= len(out):
            # a count or length field at its largest: the allocations it could ask for
            out[at : at + value] = b"\xff" * value
            out[at] &= 0x7F if value == 8 else 0xFF
    return bytes(out)


def test_the_sample_checkpoint_loads_whole():
    cp = load(BASE_FILE)
    index = cp.build_index()
    index._check()
    assert index.ledgers[1].entries.get(500) == (1, 40, 70)
    assert 3 not in index.ledgers[1].entries and index.ledgers[2].fenced
    assert all(index.is_deleted(lid) for lid in (9, 10, 11, 20))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(todo=edits)
def test_a_checksummed_malformed_base_loads_consistently_or_is_corruption(todo):
    data = reframed(apply_edits(PAYLOAD, todo))
    try:
        load(data)
    except CorruptRecordError as exc:
        assert "index.ckpt" in str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(todo=edits)
def test_a_checksummed_malformed_delta_applies_consistently_or_is_corruption(todo):
    index = sample_index()
    encoder = CheckpointEncoder(index, Position(1, 150, 3))
    encoder.result()
    index.put_entry(1, 6, (2, 40, 50), 5)
    index.put_entry(4, 0, (2, 90, 20), -1)
    index.delete_ledger(3)
    delta = CheckpointEncoder(index, Position(2, 110, 4), seq=1, written=encoder.metas)
    payload = delta.result()[_HEADER.size :]
    data = reframed(apply_edits(payload, todo))
    try:
        load(data)
    except CorruptRecordError as exc:
        assert "index.ckpt" in str(exc)


def test_a_delta_deleting_billions_of_ids_loads_at_once():
    """A checksummed delta whose deleted range spans 2**62 ids (one range field at a huge
    value, as a flipped byte can make it): applied range by range, at once. Taken id by id,
    loading ran for minutes at full CPU and held every id in memory (found by the fuzz test
    above)."""
    index = sample_index()
    base = CheckpointEncoder(index, Position(1, 150, 3))
    base.result()
    index.delete_ledger(3)
    delta = CheckpointEncoder(index, Position(2, 110, 4), seq=1, written=base.metas)
    payload = bytearray(delta.result()[_HEADER.size :])
    # the delta's tail: ledger rows, then u32 count 1 and the range (3, 3), then live bytes
    at = bytes(payload).index(_COUNT.pack(1) + _RANGE.pack(3, 3))
    payload[at + _COUNT.size:at + _COUNT.size + _RANGE.size] = _RANGE.pack(3, 2**62)
    cp = decode_checkpoint(reframed(bytes(payload)), "index.ckpt")
    loaded = Index()
    loaded.put_entry(7, 0, (1, 0, 10), -1)  # held, and inside the range: deleted by it
    loaded.put_entry(2, 0, (1, 10, 10), -1)  # held, below it: kept
    cp.apply_to(loaded)
    assert loaded.deleted.ranges() == [(3, 2**62)] and loaded.take_deleted() == []
    assert 7 not in loaded.ledgers and loaded.is_deleted(7) and 2 in loaded.ledgers


def test_every_byte_at_its_extremes_loads_consistently_or_is_corruption():
    """Each byte of the payload set to 0x00, 0x7F and 0xFF in turn, and each 4-byte field to
    2**32 - 1 (a count asking for gigabytes: checked against the bytes that are there before
    anything is allocated). Some of these files still describe an index (a key byte, a LAC, an
    offset changed), most do not: both kinds occur, so the load path is exercised."""
    loaded = refused = 0
    variants = [PAYLOAD[:at] + bytes([v]) + PAYLOAD[at + 1 :]
                for at in range(len(PAYLOAD)) for v in (0x00, 0x7F, 0xFF)]
    variants += [PAYLOAD[:at] + struct.pack(">I", 0xFFFFFFFF) + PAYLOAD[at + 4 :]
                 for at in range(len(PAYLOAD) - 3)]
    for payload in variants:
        try:
            load(reframed(payload))
            loaded += 1
        except CorruptRecordError:
            refused += 1
    assert loaded > 100 and refused > 100, (loaded, refused)


async def test_a_store_rebuilds_from_the_segments_over_a_checksummed_malformed_base():
    """End to end: the store's start-up takes the rebuild path and loses nothing."""
    fs = MemFileSystem()
    s = await open_store(fs, BASES)
    await fill(s, 1, range(40))
    await s.close()
    path = f"/data/{CHECKPOINT_FILE}"
    payload = fs.read_file(path)[_HEADER.size :]
    cp = decode_checkpoint(fs.read_file(path), path)
    assert [lid for lid, *_ in cp.ledgers] == [1]
    # ledger 1's dense run starts at entry 0: make it start at -2**32 (the CRC recomputed)
    at = _HEAD.size + 8 * len(cp.dead) + _META.size + len(KEY)  # (no LAC body)
    assert struct.unpack_from(">qI", payload, at) == (0, 40)
    bad = payload[:at] + struct.pack(">q", -(2**32)) + payload[at + 8 :]
    await fs.write_file_atomic(path, reframed(bad))
    s = await open_store(fs, BASES)
    assert "dense run" in (s.report.checkpoint_error or "")
    assert [s.read(1, eid) for eid in range(40)] == [body(1, eid) for eid in range(40)]
    await s.close()


def test_a_row_whose_segment_does_not_fit_the_index_is_corruption():
    """A row may land in the dense run (here: in its hole), whose segment column is 32-bit; a
    larger segment there raised OverflowError while building the index."""
    index = Index()
    index.put_entry(1, 0, (0, 40, 50), -1)
    index.put_entry(1, 2, (0, 140, 50), -1)  # (entry 1: a hole)
    index.put_entry(1, 300, (2**33, 40, 50), -1)  # a row (sparse), its segment past 2**32
    payload = bytearray(encode_checkpoint(index, Position(0, 200, 1))[_HEADER.size :])
    at = payload.index(struct.pack(">q", 300))
    payload[at : at + 8] = struct.pack(">q", 1)  # the row now names the hole
    try:
        load(reframed(bytes(payload)))
    except CorruptRecordError as exc:
        assert "segment 8589934592" in str(exc)
    else:
        raise AssertionError("a row with a 33-bit segment in the dense run loaded")
