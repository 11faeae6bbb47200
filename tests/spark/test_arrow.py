"""Arrow columns cut into envelopes and read back, and the data source's options, without
Spark: every shape of column (string, binary, large, sliced, null keys), envelope sizes, bad
values and options refused with the option named."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.logs import envelope
from pybk.spark.arrow import envelope_arrays, pack_batch, read_batch
from pybk.spark.options import OptionError, parse_options

rows = st.lists(st.tuples(st.binary(max_size=40), st.none() | st.binary(max_size=10)),
                min_size=1, max_size=60)


def _round_trip(batch: pa.RecordBatch, key: str | None, flush: int) -> list[tuple]:
    out = []
    for chunk in pack_batch(batch, "value", key, flush):
        env = envelope.encode_packed(chunk.count, chunk.lengths, chunk.data, 0, -1,
                                     key_lengths=chunk.key_lengths, key_data=chunk.key_data)
        packed = envelope.decode_packed(env)
        keys, values = envelope_arrays(packed, 0, packed.header.count)
        out.extend(zip(keys.to_pylist(), values.to_pylist(), strict=True))
    return out


@settings(max_examples=60, deadline=None)
@given(rows, st.sampled_from([pa.binary(), pa.large_binary()]), st.integers(8, 400),
       st.integers(0, 5))
def test_batches_round_trip_through_envelopes(items: list[tuple[bytes, bytes | None]],
                                              vtype: pa.DataType, flush: int,
                                              cut: int) -> None:
    values = pa.array([v for v, _ in items], vtype)
    keys = pa.array([k for _, k in items], pa.binary())
    batch = pa.RecordBatch.from_arrays([keys, values], names=["key", "value"])
    batch = batch.slice(min(cut, len(items) - 1))  # an offset into the buffers
    want = [(k, v) for v, k in items][min(cut, len(items) - 1):]
    assert _round_trip(batch, "key", flush) == want
    assert _round_trip(batch, None, flush) == [(None, v) for _, v in want]


def test_strings_envelope_sizes_and_nulls() -> None:
    batch = pa.RecordBatch.from_pydict({"value": [f"record-{i:05d}" for i in range(1000)],
                                        "key": [None] * 1000})
    chunks = list(pack_batch(batch, "value", "key", 1000))
    assert all(c.key_lengths is None for c in chunks)  # all keys null: a version 1 envelope
    assert sum(c.count for c in chunks) == 1000
    assert all(c.count * (12 + 4) <= 1000 for c in chunks)  # 12-byte records, 4 of framing
    assert _round_trip(batch, "key", 1000) == [(None, b"record-%05d" % i) for i in range(1000)]
    bad = pa.RecordBatch.from_pydict({"value": ["a", None, "c"]})
    with pytest.raises(ValueError, match="column 'value' is null in row 1 of partition 7"):
        list(pack_batch(bad, "value", None, 1000, where=" of partition 7"))


def test_read_batch_builds_the_read_columns() -> None:
    env = envelope.encode([b"a", b"bb", b"ccc"], None, 0, -1, keys=[b"k", None, b"kk"])
    packed = envelope.decode_packed(env)
    keys, values = envelope_arrays(packed, 1, 3)
    batch = read_batch("events", 4, [(9, 1, keys, values)])
    assert batch.to_pylist() == [
        {"key": None, "value": b"bb", "log": "events", "position": "4:9:1", "segment": 4,
         "entry": 9, "slot": 1},
        {"key": b"kk", "value": b"ccc", "log": "events", "position": "4:9:2", "segment": 4,
         "entry": 9, "slot": 2},
    ]


@pytest.mark.parametrize(("options", "mode", "option"), [
    ({}, "write", "metadata"),
    ({"metadata": "memory://"}, "read", "metadata"),
    ({"metadata": "sqlite://relative.db"}, "read", "metadata"),
    ({"metadata": "zk://host/root"}, "read", "metadata"),
    ({"metadata": "sqlite:///m.db"}, "read", "log"),
    ({"metadata": "sqlite:///m.db", "log": "bad name"}, "read", "log"),
    ({"metadata": "sqlite:///m.db", "log": "l", "namespace": "-x"}, "read", "namespace"),
    ({"metadata": "sqlite:///m.db", "log": "l", "createlog": "maybe"}, "write", "createLog"),
    ({"metadata": "sqlite:///m.db", "log": "l", "batchbytes": "8000000"}, "write",
     "batchBytes"),
    ({"metadata": "sqlite:///m.db", "log": "l", "batchbytes": "100",
      "maxinflightbytes": "10"}, "write", "maxInFlightBytes"),
    ({"metadata": "sqlite:///m.db", "log": "l", "createlog": "true", "writequorum": "5"},
     "write", "createLog"),
    ({"metadata": "sqlite:///m.db", "log": "l", "metadatatimeout": "-1"}, "read",
     "metadataTimeout"),
    ({"metadata": "sqlite:///m.db", "log": "l", "startingposition": "1:x:0"}, "read",
     "startingPosition"),
    ({"metadata": "sqlite:///m.db", "log": "l", "endingposition": "5:0:0"}, "stream-read",
     "endingPosition"),
    ({"metadata": "sqlite:///m.db", "log": "l", "maxrecordspertrigger": "0"}, "stream-read",
     "maxRecordsPerTrigger"),
    ({"metadata": "sqlite:///m.db", "log": "l"}, "stream-write", "sinkId"),
])
def test_bad_options_name_the_option(options: dict[str, str], mode: str, option: str) -> None:
    with pytest.raises(OptionError, match=f"option '{option}'") as info:
        parse_options(options, mode=mode)
    assert info.value.option == option


def test_good_options() -> None:
    opts = parse_options({"metadata": "zk://a:1,b:2/pybk", "path": "events",
                          "checkpointlocation": "rel/ck", "createlog": "TRUE",
                          "compression": "zstd"}, mode="stream-write")
    assert (opts.log, opts.namespace, opts.create_log) == ("events", "default", True)
    assert opts.log_config.compression == "zstd" and opts.sink_id.endswith("/rel/ck")
    assert opts.log_key == "logs/default/events"
    read = parse_options({"metadata": "sqlite:///m.db", "log": "l",
                          "startingposition": "3:4:5", "endingposition": "LATEST"}, mode="read")
    assert str(read.start()) == "3:4:5" and read.end() == "latest"


def test_null_keys_whose_slots_hold_bytes() -> None:
    import numpy as np

    # Arrow lets a null slot span bytes; those bytes must not become part of the next key
    offsets = pa.py_buffer(np.array([0, 2, 4, 6], dtype=np.int32).tobytes())
    validity = pa.py_buffer(bytes([0b101]))
    keys = pa.Array.from_buffers(pa.binary(), 3, [validity, offsets, pa.py_buffer(b"aabbcc")],
                                 null_count=1)
    batch = pa.RecordBatch.from_arrays([keys, pa.array([b"x", b"y", b"z"])],
                                       names=["key", "value"])
    assert _round_trip(batch, "key", 1000) == [(b"aa", b"x"), (None, b"y"), (b"cc", b"z")]
