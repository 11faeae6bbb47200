"""Entry framing, digests and the status <-> error mapping shared by every layer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pybk
from pybk import errors
from pybk.wire import (
    DIGEST_TYPES,
    AddRequest,
    DigestManager,
    Status,
    error_response,
    master_key,
    parse_entry_header,
    password_hash,
)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    digest=st.sampled_from(DIGEST_TYPES),
    ledger=st.integers(0, 2**63 - 1),
    entry=st.integers(0, 2**63 - 1),
    lac=st.integers(-1, 2**62),
    length=st.integers(0, 2**62),
    payload=st.binary(max_size=2048),
    password=st.binary(max_size=16),
)
def test_frame_verify_round_trip(digest, ledger, entry, lac, length, payload, password) -> None:  # type: ignore[no-untyped-def]
    dm = DigestManager(ledger, digest, password)
    body = dm.frame(entry, lac, length, payload)
    decoded = dm.verify(body, entry)
    assert (decoded.ledger_id, decoded.entry_id, decoded.lac, decoded.length) == (
        ledger, entry, lac, length)
    assert decoded.payload == payload
    assert parse_entry_header(body) == (ledger, entry, lac, length)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    digest=st.sampled_from(["CRC32C", "MAC"]),
    payload=st.binary(min_size=1, max_size=256),
    data=st.data(),
)
def test_any_single_bit_flip_is_detected(digest, payload, data) -> None:  # type: ignore[no-untyped-def]
    dm = DigestManager(7, digest, b"pw")
    body = bytearray(dm.frame(3, 2, 100, payload))
    pos = data.draw(st.integers(0, len(body) - 1))
    body[pos] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(errors.DigestMismatchError):
        dm.verify(bytes(body), 3)


def test_crc32c_frame_is_header_crc_payload_on_the_wire() -> None:
    """The inlined CRC32C framing writes exactly the documented layout (docs/protocol.md):
    header, CRC32C over header+payload, payload."""
    import struct

    import crc32c

    payload = b"payload bytes"
    body = DigestManager(7).frame(3, 2, len(payload), payload)
    header = struct.pack(">qqqq", 7, 3, 2, len(payload))
    assert body == header + struct.pack(">I", crc32c.crc32c(header + payload)) + payload


def test_embedded_ids_must_match() -> None:
    dm = DigestManager(7)
    body = dm.frame(3, 2, 10, b"x")
    with pytest.raises(errors.DigestMismatchError, match="expected 4"):
        dm.verify(body, 4)
    with pytest.raises(errors.DigestMismatchError, match="expected ledger 8"):
        DigestManager(8).verify(body, 3)
    assert dm.verify(body, None).entry_id == 3  # LAC reads skip the entry id check


def test_mac_with_wrong_password_fails_and_truncated_bodies_are_rejected() -> None:
    body = DigestManager(1, "MAC", b"right").frame(0, -1, 1, b"x")
    with pytest.raises(errors.DigestMismatchError):
        DigestManager(1, "MAC", b"wrong").verify(body, 0)
    with pytest.raises(errors.DigestMismatchError, match="shorter"):
        DigestManager(1, "MAC", b"right").verify(body[:40], 0)
    with pytest.raises(ValueError, match="shorter than the 32-byte header"):
        parse_entry_header(b"short")


def test_unknown_digest_type_is_named() -> None:
    with pytest.raises(ValueError, match="'SHA1'"):
        DigestManager(1, "SHA1")


def test_explicit_lac_bodies() -> None:
    dm = DigestManager(5, "CRC32C")
    assert dm.verify_lac(dm.frame_lac(42)) == 42
    bad = bytearray(dm.frame_lac(42))
    bad[3] ^= 1
    with pytest.raises(errors.DigestMismatchError):
        dm.verify_lac(bytes(bad))
    with pytest.raises(errors.DigestMismatchError):
        DigestManager(6).verify_lac(dm.frame_lac(42))


def test_keys_differ_by_purpose_and_password() -> None:
    assert master_key(b"a") != master_key(b"b")
    assert master_key(b"a") != password_hash(b"a")


def test_every_status_maps_to_an_error_class_and_back() -> None:
    for status in Status:
        if status is Status.OK:
            continue
        exc = errors.error_for_status(status, "why")
        assert isinstance(exc, pybk.BKError)
        assert exc.status == status, (status, type(exc))
        assert "why" in str(exc)
    assert isinstance(errors.error_for_status(Status.TIMEOUT), TimeoutError)
    assert isinstance(errors.error_for_status(9999), pybk.BKError)


def test_error_response_matches_request_type() -> None:
    req = AddRequest(1, 2, b"k", b"body")
    resp = error_response(req, Status.FENCED, "fenced")
    assert (resp.op, resp.status, resp.message) == (req.op, Status.FENCED, "fenced")
