"""Bytes on the simulated wire: messages cross the simulated network through the production
codec, so a codec bug becomes a violation and a corrupted frame is caught by its CRC."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

import pybk.transport.messages as messages
from pybk import sim
from pybk.errors import ProtocolError
from pybk.sim.net import NetConfig
from pybk.sim.wire import WireRejected, damage, decode_request, decode_response
from pybk.wire import AddBatchRequest, AddResponse, ReadRequest, Status


def test_a_request_and_an_answer_cross_as_frames() -> None:
    req = AddBatchRequest(7, b"k" * 20, [0, 1], [b"a", b"bc"], recovery=True)
    frame = messages.encode_request(41, req)
    assert isinstance(frame, bytes)
    got = decode_request(frame, 41)
    assert isinstance(got, AddBatchRequest)
    assert (got.ledger_id, list(got.entry_ids), list(got.bodies), got.recovery) == (
        7, [0, 1], [b"a", b"bc"], True)
    answer = decode_response(messages.encode_response(41, AddResponse(Status.OK, 7, 3)), 41)
    assert answer == AddResponse(Status.OK, 7, 3)


def test_a_flipped_bit_is_caught_by_the_crc_and_a_misaddressed_frame_is_a_finding() -> None:
    frame = messages.encode_request(5, ReadRequest(1, 2))
    rng = random.Random(1)
    for _ in range(50):
        with pytest.raises(ProtocolError):
            decode_request(damage(frame, rng), 5)
    with pytest.raises(WireRejected):
        decode_request(frame, 6)  # decoded whole, but not as what was sent


def test_every_message_of_a_run_goes_through_the_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, int] = {"server": 0, "client": 0}
    decode = messages.decode_frame

    def counting(frame: Any, role: str) -> Any:
        seen[role] += 1
        return decode(frame, role)

    monkeypatch.setattr("pybk.sim.wire.decode_frame", counting)
    result = sim.run(1, duration=5.0, faults=sim.Faults.none())
    assert result.ok, result.violations
    assert seen["server"] > 100 and seen["client"] > 100
    assert NetConfig().wire and NetConfig().quiet().wire


def test_a_batch_decoder_that_drops_the_recovery_flag_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug of a fast ADD_BATCH decoder that loses the flag recovery writes carry: with
    message objects handed over, no seed saw it; through the codec, recovery cannot write
    back to the fenced bookies and the run makes no progress."""
    original = messages.decode_batch_request

    def broken(frame: Any, flags: int) -> AddBatchRequest:
        return dataclasses.replace(original(frame, flags), recovery=False)

    monkeypatch.setattr(messages, "decode_batch_request", broken)
    caught = [s for s in range(8)
              if not sim.run(s, duration=30.0, faults=sim.Faults.all()).ok]
    assert len(caught) >= 3, caught
