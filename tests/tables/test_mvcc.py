"""The MVCC store of one range: commands applied at revisions, checked against a dict model;
replay over a checkpoint changes nothing (idempotent by revision)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.tables.command import check_command, decode, encode
from pybk.tables.errors import TableBadRequestError
from pybk.tables.hashing import key_hash, range_for, split_ranges
from pybk.tables.mvcc import MVCCStore


def test_put_get_versions_and_revisions() -> None:
    s = MVCCStore()
    assert s.apply(1, ("put", b"k", b"a")) == 1
    kv = s.get(b"k")
    assert kv is not None and (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (
        b"a", 0, 1, 1)
    s.apply(2, ("put", b"k", b"b"))
    kv = s.get(b"k")
    assert kv is not None and (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (
        b"b", 1, 1, 2)
    assert s.apply(3, ("delete", b"k")) is True
    assert s.apply(4, ("delete", b"k")) is False
    assert s.get(b"k") is None and s.revision == 4


def test_counter_and_bytes_do_not_mix_and_change_nothing() -> None:
    s = MVCCStore()
    assert s.apply(1, ("incr", b"c", 5)) == 5
    assert s.apply(2, ("incr", b"c", -7)) == -2
    with pytest.raises(TableBadRequestError):
        s.apply(3, ("put", b"c", b"x"))
    s.apply(4, ("put", b"b", b"x"))
    with pytest.raises(TableBadRequestError):
        s.apply(5, ("incr", b"b", 1))
    with pytest.raises(TableBadRequestError):
        s.apply(6, ("incr", b"c", (1 << 63) - 1 + 3))  # past int64 (check_command refuses it too)
    c = s.get(b"c")
    assert c is not None and c.value == -2 and c.version == 1 and s.revision == 6


def test_a_revision_at_or_below_the_last_is_skipped() -> None:
    s = MVCCStore()
    s.apply(5, ("put", b"k", b"a"))
    assert s.apply(5, ("put", b"k", b"b")) is None
    assert s.apply(3, ("put", b"k", b"c")) is None
    kv = s.get(b"k")
    assert kv is not None and kv.value == b"a"


def test_txn_compares_and_is_atomic() -> None:
    s = MVCCStore()
    assert s.apply(1, ("txn", ((b"k", "version", "==", -1),), (("put", b"k", b"v"),), ())) is True
    assert s.apply(2, ("txn", ((b"k", "version", "==", -1),), (("put", b"k", b"w"),),
                       (("put", b"other", b"f"),))) is False
    kv = s.get(b"k")
    assert kv is not None and kv.value == b"v" and s.get(b"other") is not None
    # a failing operation inside undoes the ones before it
    s.apply(3, ("incr", b"n", 1))
    with pytest.raises(TableBadRequestError):
        s.apply(4, ("txn", (), (("put", b"x", b"1"), ("put", b"n", b"boom")), ()))
    assert s.get(b"x") is None
    assert s.apply(5, ("txn", ((b"k", "value", "==", b"v"), (b"k", "mod_revision", "<", 5)),
                       (("delete", b"k"),), ())) is True


def test_scan_is_ordered_and_limited() -> None:
    s = MVCCStore()
    for i, k in enumerate([b"b", b"a", b"d", b"c"], start=1):
        s.apply(i, ("put", k, k))
    assert [kv.key for kv in s.scan(None, None, None)] == [b"a", b"b", b"c", b"d"]
    assert [kv.key for kv in s.scan(b"b", b"d", None)] == [b"b", b"c"]
    assert [kv.key for kv in s.scan(None, None, 2)] == [b"a", b"b"]


@pytest.mark.parametrize("bad, exc", [
    (("put", 5, b"v"), TypeError),
    (("put", b"", b"v"), TableBadRequestError),
    (("put", b"k", b"v" * (600 << 10)), TableBadRequestError),
    (("incr", b"k", "1"), TypeError),
    (("incr", b"k", 1 << 64), TableBadRequestError),
    (("frob", b"k"), TableBadRequestError),
    (("txn", [(b"k", "colour", "==", 1)], [], []), TableBadRequestError),
    (("txn", [(b"k", "version", "~", 1)], [], []), TableBadRequestError),
    (("txn", [(b"k", "version")], [], []), TypeError),
])
def test_bad_commands_are_refused_before_the_log(bad: tuple, exc: type) -> None:
    with pytest.raises(exc):
        check_command(bad)


def test_command_records_round_trip_and_garbage_is_refused() -> None:
    cmd = check_command(("txn", [(b"k", "value", "==", b"\x00\xff")],
                         [("put", b"k", b"v"), ("incr", "n", 3)], [("delete", b"k")]))
    assert decode(encode(cmd)) == cmd
    with pytest.raises(ValueError):
        decode(b"\x00not json")


def test_routing_hash_is_bookkeepers() -> None:
    assert key_hash(b"foo") == -2336792112830167536  # BookKeeper's Murmur3 (seed 383242705)
    ranges = split_ranges(4)
    assert [r.range_id for r in ranges] == [1024, 1025, 1026, 1027]
    assert ranges[0].start == -(1 << 63) and ranges[-1].end == 1 << 63
    for key in (b"a", b"foo", b"\xff" * 40):
        r = range_for(ranges, key)
        assert r.start <= key_hash(key) < r.end
    with pytest.raises(ValueError):
        split_ranges(0)


keys = st.sampled_from([b"a", b"b", b"c", b"d"])
commands = st.one_of(
    st.tuples(st.just("put"), keys, st.binary(max_size=4)),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("incr"), keys, st.integers(-5, 5)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(commands, max_size=40), st.integers(0, 40))
def test_store_matches_a_dict_and_replay_over_a_checkpoint_is_idempotent(
        cmds: list[tuple], cut: int) -> None:
    s = MVCCStore()
    model: dict[bytes, tuple[bytes | int, int, int, int]] = {}  # value, version, crev, mrev
    checkpoint = None
    for rev, cmd in enumerate(cmds, start=1):
        kind, key = cmd[0], cmd[1]
        cur = model.get(key)
        try:
            s.apply(rev, cmd)
        except TableBadRequestError:
            assert cur is not None and isinstance(cur[0], int) == (kind == "put")
        else:
            if kind == "delete":
                model.pop(key, None)
            else:
                new: bytes | int = cmd[2] if kind == "put" else (
                    cmd[2] + (cur[0] if cur else 0))  # type: ignore[operator]
                model[key] = (new, 0, rev, rev) if cur is None else (new, cur[1] + 1, cur[2], rev)
        if rev == cut:
            checkpoint = (s.revision, list(s.rows()))
        got = {kv.key: (kv.value, kv.version, kv.create_revision, kv.mod_revision)
               for kv in s.scan(None, None, None)}
        assert got == model
    # recovery: the checkpoint, then the whole log replayed over it
    r = MVCCStore()
    if checkpoint is not None:
        r.restore(*checkpoint)
    for rev, cmd in enumerate(cmds, start=1):
        try:
            r.apply(rev, cmd)
        except TableBadRequestError:
            pass
    assert list(r.rows()) == list(s.rows()) and r.revision == s.revision
