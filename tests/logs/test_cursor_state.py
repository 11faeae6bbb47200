"""The cursor's acknowledgement state against a model (a set of acknowledged records): acks,
cumulative acks, restarts (only what is stored survives) in any order; the stored form round
trips and damage is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.errors import CorruptRecordError
from pybk.logs.cursor_state import AckState, decode_state, encode_state
from pybk.logs.position import Position

#: a log of 30 records in envelopes of uneven sizes
RECORDS = [Position(1 + i // 12, (i % 12) // 4, i % 4) for i in range(30)]

ops = st.lists(st.one_of(
    st.tuples(st.just("read"), st.integers(1, 5)),
    st.tuples(st.just("ack"), st.integers(0, 29)),
    st.tuples(st.just("cum"), st.integers(0, 29)),
    st.tuples(st.just("restart"), st.just(0)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_state_matches_a_model_across_restarts(script: list[tuple[str, int]]) -> None:
    state = AckState()
    acked: set[Position] = set()  # the model: what the consumer acknowledged
    cursor = 0  # index of the next record the reader would hand out (log order)
    handed: list[Position] = []
    for op, n in script:
        if op == "read":
            for _ in range(n):
                if cursor >= len(RECORDS):
                    break
                pos = RECORDS[cursor]
                cursor += 1
                if state.deliver(pos):
                    assert pos not in acked  # nothing acknowledged is handed out again
                    handed.append(pos)
                else:
                    assert pos in acked
        elif op == "ack" and handed:
            pos = handed[n % len(handed)]
            if not state.is_acked(pos):
                state.ack(pos)
            acked.add(pos)
        elif op == "cum" and handed:
            pos = handed[n % len(handed)]
            state.ack_cumulative(pos)
            acked.update(p for p in RECORDS if p <= pos)
        elif op == "restart":
            state = decode_state(encode_state(state))
            handed = []
            resume = state.resume_point()
            cursor = 0 if resume is None else sum(1 for p in RECORDS if p < resume)
        md = state.mark_delete
        # never ahead of what was acknowledged, and every record the state calls acked is
        for p in RECORDS:
            if state.is_acked(p):
                assert p in acked, (p, state)
        if md is not None:
            assert all(p in acked for p in RECORDS if p <= md)
        # ranges stay disjoint, ordered, above the mark-delete position
        for lo, hi in state.ranges:
            assert lo <= hi and (md is None or lo > md)
        for (_, hi), (lo, _) in zip(state.ranges, state.ranges[1:], strict=False):
            assert hi < lo


def test_damaged_state_is_refused() -> None:
    data = encode_state(AckState(Position(1, 2, 3), None, [(Position(2, 0, 0),
                                                              Position(2, 1, 0))]))
    assert decode_state(data).ranges == [(Position(2, 0, 0), Position(2, 1, 0))]
    with pytest.raises(CorruptRecordError):
        decode_state(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptRecordError):
        decode_state(b"xx")
    bad = encode_state(AckState(Position(3, 0, 0), None, [(Position(2, 0, 0),
                                                           Position(2, 1, 0))]))
    with pytest.raises(CorruptRecordError, match="out of order"):
        decode_state(bad)
