"""Position: ordered like the log, hashable, str()/parse() and bytes round trips, bad input."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pybk import Position

INT64 = 2**63 - 1
positions = st.builds(Position, st.integers(1, INT64), st.integers(0, INT64),
                      st.integers(0, INT64))


@given(positions)
def test_str_and_bytes_round_trip(p: Position) -> None:
    assert Position.parse(str(p)) == p
    assert Position.from_bytes(bytes(p)) == p
    assert len(bytes(p)) == 25
    assert pickle.loads(pickle.dumps(p)) == p and copy.copy(p) == p
    assert eval(repr(p)) == p


@given(positions, positions)
def test_order_is_segment_then_entry_then_slot(a: Position, b: Position) -> None:
    assert (a < b) == ((a.segment, a.entry, a.slot) < (b.segment, b.entry, b.slot))
    assert (a == b) == (hash(a) == hash(b) and tuple(a) == tuple(b))
    assert a < a.next_slot() and (b <= a or a.next_slot() <= b)


def test_fields_and_text() -> None:
    p = Position(3, 17, 42)
    assert (p.segment, p.entry, p.slot) == (3, 17, 42)
    assert str(p) == "3:17:42"
    assert {p: 1}[Position.parse(" 3:17:42 ")] == 1
    assert sorted([Position(2, 0, 0), Position(1, 9, 9), Position(1, 10, 0)]) == [
        Position(1, 9, 9), Position(1, 10, 0), Position(2, 0, 0)]


@pytest.mark.parametrize("text", ["", "1:2", "1:2:3:4", "a:b:c", "1:-2:3", "0x1:2:3", "1:2:3.0",
                                  "\uff11:2:3", "0:0:0"])
def test_parse_refuses_what_is_not_a_position(text: str) -> None:
    with pytest.raises(ValueError, match=r"position|Position"):
        Position.parse(text)


@pytest.mark.parametrize("args", [(0, 0, 0), (1, -1, 0), (1, 0, -1), (2**63, 0, 0)])
def test_constructor_refuses_out_of_range(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="Position"):
        Position(*args)


def test_constructor_and_parsers_refuse_wrong_types() -> None:
    with pytest.raises(TypeError):
        Position(1, "2", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Position(True, 0, 0)
    with pytest.raises(TypeError):
        Position.parse(b"1:2:3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="25 bytes"):
        Position.from_bytes(b"\x01" * 24)
    with pytest.raises(ValueError, match="version"):
        Position.from_bytes(b"\x02" + bytes(Position(1, 2, 3))[1:])
