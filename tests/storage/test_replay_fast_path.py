"""Replay's fast path (``records.batch_items``, ``scan_segment(put_entry=...)``) against the
record-by-record path it stands in for: the same records in the same order, the same errors
for damaged bytes, the same index after a whole segment."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.errors import CorruptRecordError
from pybk.storage.index import Index
from pybk.storage.memfs import MemFileSystem
from pybk.storage.records import (
    Record,
    RecordType,
    batch_items,
    encode_batch,
    encode_checkpoint_mark,
    encode_delete,
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_master_key,
    encode_record,
    encode_segment_header,
    iter_records,
)
from pybk.storage.replay import apply_record, piggyback_lac, scan_segment
from pybk.wire import DigestManager

IID = str(uuid.UUID(int=777, version=4))


def _entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    body = DigestManager(ledger_id).frame(entry_id, entry_id - 1, len(payload), payload)
    return encode_entry(body)


# a record of each kind, entries most often (as in a journal); short ENTRY payloads too:
# under the 16 bytes of its ids (malformed), and under a 32-byte header (no piggybacked LAC)
_records = st.one_of(
    st.builds(_entry, st.integers(0, 3), st.integers(0, 50), st.binary(max_size=40)),
    st.builds(_entry, st.integers(0, 3), st.integers(0, 50), st.binary(max_size=40)),
    st.builds(lambda n: encode_record(RecordType.ENTRY, bytes(range(n))), st.integers(0, 31)),
    st.builds(encode_master_key, st.integers(0, 3), st.binary(min_size=1, max_size=8)),
    st.builds(encode_fence, st.integers(0, 3)),
    st.builds(encode_explicit_lac, st.integers(0, 3), st.integers(-1, 50), st.binary(max_size=8)),
    st.builds(encode_delete, st.integers(0, 3)),
    st.builds(encode_checkpoint_mark, st.integers(0, 5), st.integers(0, 1 << 20)),
)


def _slow(data: bytes, pos: int, end: int, seg: int) -> list[Any]:
    """What the record-by-record path makes of the same bytes, in batch_items' terms."""
    out: list[Any] = []
    for rec in list(iter_records(memoryview(data)[pos:end], pos, "p")):
        if rec.rtype is RecordType.ENTRY:
            out.append((rec.ledger_id, rec.entry_id, (seg, rec.offset, rec.size),
                        piggyback_lac(rec.data)))
        else:
            out.append(rec)
    return out


def _outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except CorruptRecordError as exc:
        return ("error", str(exc), exc.offset)


@settings(derandomize=True, deadline=None, max_examples=300)
@given(records=st.lists(_records, min_size=1, max_size=8), lead=st.integers(0, 40),
       damage=st.none() | st.tuples(st.integers(0, 10_000), st.integers(0, 7)),
       cut=st.integers(0, 6))
def test_batch_items_is_the_record_by_record_decoding(records, lead, damage, cut):
    """Every batch, intact or with a bit flipped or bytes cut off its end: the same records,
    or the same CorruptRecordError at the same offset."""
    payload = bytearray(b"".join(records))
    if damage is not None:
        payload[damage[0] % len(payload)] ^= 1 << damage[1]
    data = bytes(lead) + bytes(payload) + b"\xff" * 3  # (bytes past the batch are not read)
    end = lead + len(payload) - (cut if cut < len(payload) else 0)
    assert _outcome(lambda: batch_items(data, lead, end, 4, "p")) == \
        _outcome(lambda: _slow(data, lead, end, 4))


def test_batch_items_makes_no_record_for_an_entry():
    data = _entry(1, 0, b"x" * 20) + encode_fence(1) + _entry(1, 1, b"y")
    items = batch_items(data, 0, len(data), 9, "p")
    assert [type(i) for i in items] == [tuple, Record, tuple]
    assert items[0][:2] == (1, 0) and items[0][2] == (9, 0, len(_entry(1, 0, b"x" * 20)))
    assert items[0][3] == -1  # (entry 0's body piggybacks LAC -1)
    assert items[2][3] == 0


def _segment(batches: list[bytes]) -> bytes:
    return encode_segment_header(0, IID) + b"".join(
        encode_batch(i, payload) for i, payload in enumerate(batches))


def _state(index: Index) -> Any:
    return (
        sorted(index.deleted), sorted(index.seg_live.items()),
        {lid: (st.entries.items(), st.fenced, st.master_key, st.explicit_lac,
               st.explicit_lac_body, st.max_piggyback_lac)
         for lid, st in sorted(index.ledgers.items())},
    )


def _replay(data: bytes, fast: bool) -> Any:
    fs = MemFileSystem()
    fs.makedirs("/j")
    fs.open_append("/j/0.seg").write(data)  # (read back unsynced: nothing crashes here)
    index = Index()
    applied: list[Any] = []

    def apply(rec: Record, seg: int) -> None:
        applied.append(rec.rtype)
        apply_record(index, rec, seg)

    def outcome() -> Any:
        scan = scan_segment(fs, "/j/0.seg", 0, IID, start=None, batch_seq=0, is_last=True,
                            allow_suspect=False, apply=apply,
                            put_entry=index.put_entry if fast else None)
        return (scan.end, scan.batches, scan.records, scan.torn_bytes)

    return _outcome(outcome), _state(index), [t for t in applied if t is not RecordType.ENTRY]


@settings(derandomize=True, deadline=None, max_examples=150)
@given(batches=st.lists(st.lists(_records.filter(lambda r: r[8] != RecordType.ENTRY or
                                                 len(r) >= 25), min_size=1, max_size=6),
                        min_size=1, max_size=5))
def test_a_segment_replays_to_the_same_index_either_way(batches):
    """Whole segments (entries overwritten, ledgers fenced, deleted and written again, LACs,
    checkpoint marks): the fast path leaves the index the record-by-record path leaves."""
    data = _segment([b"".join(b) for b in batches])
    slow, fast = _replay(data, False), _replay(data, True)
    assert fast == slow
    assert slow[0][0] == "ok"


def test_a_corrupt_record_inside_an_intact_batch_is_refused_before_any_of_it_is_applied():
    """A record whose own checksum fails inside a batch whose checksum holds (written so):
    the batch is refused whole by both paths, at that record's offset."""
    bad = bytearray(_entry(2, 1, b"zz"))
    bad[-1] ^= 1
    data = _segment([_entry(1, 0, b"a"), _entry(2, 0, b"b") + bytes(bad)])
    slow, fast = _replay(data, False), _replay(data, True)
    assert fast == slow
    assert slow[0][0] == "error" and "checksum mismatch" in slow[0][1]
    assert set(slow[1][2]) == {1}  # ledger 1's batch applied; nothing of the bad batch


@pytest.mark.parametrize("fast", [False, True])
def test_records_replayed_are_counted_on_both_paths(fast):
    data = _segment([_entry(1, 0, b"a") + encode_fence(1), _entry(1, 1, b"b")])
    outcome, _, applied = _replay(data, fast)
    assert outcome == ("ok", (len(data), 2, 3, 0))
    assert applied == [RecordType.FENCE]
