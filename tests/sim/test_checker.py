"""The checker on hand-made histories: a clean history passes, each broken one names its
invariant, ledger and entry, and quotes the trace lines that matter."""

from __future__ import annotations

from pybk.sim.checker import check
from pybk.sim.history import FAIL, INFO, OK, History


def make() -> tuple[History, list[str]]:
    trace: list[str] = []

    def log(line: str) -> int:
        trace.append(line)
        return len(trace) - 1

    return History(log=log), trace


def written(h: History, ledger: int, n: int, *, acked: int | None = None) -> None:
    """Writer appends n entries; the first ``acked`` (default all) are acknowledged in order."""
    acked = n if acked is None else acked
    h.create("w1", ledger)
    for e in range(n):
        h.add_invoke("w1", ledger, e, f"w1:{ledger}:{e}".encode())
    for e in range(n):
        h.add_complete("w1", ledger, e, OK if e < acked else INFO)


def closed_and_read(h: History, ledger: int, last: int, *, how: str = "final") -> None:
    h.close_invoke("final", ledger, how)
    h.close_complete("final", ledger, how, OK, last)
    for e in range(last + 1):
        h.read("final", ledger, e, f"w1:{ledger}:{e}".encode(), last, recovery=True, final=True)


def codes(h: History, **kw: bool) -> list[str]:
    return [v.invariant for v in check(h, **kw)]


def test_clean_history_passes() -> None:
    h, _ = make()
    written(h, 1, 5, acked=3)
    h.lac("r1", 1, 1)
    h.read("r1", 1, 0, b"w1:1:0", 1, recovery=False)
    h.lac("r1", 1, 2)
    h.bookie_acked("b0", 1, 0)
    h.bookie_served("b0", 1, 0, b"w1:1:0")
    closed_and_read(h, 1, 3)  # an unacknowledged entry (3) may be recovered: allowed
    h.liveness("new ledger", True)
    assert check(h) == []


def test_l1_closed_short_names_ledger_entry_and_lines() -> None:
    h, trace = make()
    written(h, 7, 4)
    closed_and_read(h, 7, 2, how="recover")
    violations = check(h)
    assert [(v.invariant, v.ledger, v.entry) for v in violations] == [("L1", 7, 3)]
    text = violations[0].render(trace)
    assert "ledger 7 entry 3" in text and "add L7:3 -> ok" in text and "last=2" in text


def test_l1_acked_entry_not_read_back() -> None:
    h, _ = make()
    written(h, 1, 3)
    h.close_invoke("final", 1, "final")
    h.close_complete("final", 1, "final", OK, 2)
    h.read("final", 1, 0, b"w1:1:0", 2, recovery=True, final=True)
    h.read_error("final", 1, 1, "BookieUnavailableError", final=True)
    assert set(codes(h)) == {"L1"}
    # Beyond tolerance a clean error is acceptable; a short close still is not.
    assert codes(h, beyond_tolerance=True) == []


def test_l2_phantom_and_aborted_reads() -> None:
    h, _ = make()
    written(h, 1, 2)
    h.read("r1", 1, 0, b"nobody-wrote-this", 1, recovery=False)
    assert codes(h) == ["L3"]  # a wrong payload for an entry the writer did write
    h2, _ = make()
    h2.read("r1", 9, 0, b"nobody-wrote-this", 0, recovery=False)
    assert codes(h2) == ["L2"]
    h3, _ = make()
    h3.add_invoke("w1", 1, 0, b"p0")
    h3.add_complete("w1", 1, 0, FAIL)
    h3.read("r1", 1, 0, b"p0", 0, recovery=False)
    assert codes(h3) == ["L2"]


def test_l5_dirty_read_above_lac() -> None:
    h, _ = make()
    written(h, 1, 3)
    h.read("r1", 1, 2, b"w1:1:2", 1, recovery=False)
    assert codes(h) == ["L5"]


def test_l6_out_of_order_ack() -> None:
    h, _ = make()
    h.add_invoke("w1", 1, 0, b"a")
    h.add_invoke("w1", 1, 1, b"b")
    h.add_complete("w1", 1, 1, OK)
    h.add_complete("w1", 1, 0, OK)
    assert codes(h) == ["L6"]


def test_l7_lac_goes_back_and_i3_lac_ahead_of_acks() -> None:
    h, _ = make()
    written(h, 1, 3)
    h.lac("r1", 1, 2)
    h.lac("r1", 1, 1)
    assert codes(h) == ["L7"]
    h3, _ = make()
    written(h3, 1, 3)
    h3.lac("r1", 1, 2, handle=1)
    h3.lac("r1", 1, 1, handle=2)  # a handle opened later may start lower (seed 911)
    h3.lac("r1", 1, 2, handle=2)
    assert codes(h3) == []
    h3.lac("r1", 1, 1, handle=2)  # ... but never goes back itself
    assert codes(h3) == ["L7"]
    h2, _ = make()
    h2.add_invoke("w1", 1, 0, b"a")
    h2.lac("r1", 1, 0)  # seen before the writer had its ack, with no close under way
    h2.add_complete("w1", 1, 0, OK)
    assert codes(h2) == ["I3"]


def test_i7_closed_ledger_changes() -> None:
    h, _ = make()
    written(h, 1, 3)
    h.close_complete("rc1", 1, "recover", OK, 2)
    h.metadata("r1", 1, "CLOSED", 1)
    assert "I7" in codes(h)


def test_l8_old_writer_acked_after_recovery_closed() -> None:
    h, _ = make()
    h.add_invoke("w1", 1, 0, b"a")
    h.add_invoke("w1", 1, 1, b"b")
    h.add_complete("w1", 1, 0, OK)
    h.close_invoke("rc1", 1, "recover")
    h.close_complete("rc1", 1, "recover", OK, 0)
    h.add_complete("w1", 1, 1, OK)
    assert codes(h) == ["L8"]


def test_l9_payload_read_in_another_ledger() -> None:
    h, _ = make()
    written(h, 1, 1)
    written(h, 2, 1)
    h.read("r1", 2, 0, b"w1:1:0", 0, recovery=False)
    assert codes(h) == ["L9"]


def test_bookie_honesty_i9_i10_i11() -> None:
    h, _ = make()
    h.bookie_acked("b0", 1, 4)
    h.bookie_absent("b0", 1, 4, "read NO_SUCH_ENTRY")
    assert codes(h) == ["I9"]
    h2, _ = make()
    h2.bookie_acked("b1", 1, 4)
    h2.bookie_absent("b1", 1, 4, "restart audit list")
    assert codes(h2) == ["I10"]
    h3, _ = make()
    h3.bookie_acked("b1", 1, 4)
    h3.fault("b1", "fsync_eio")
    h3.bookie_absent("b1", 1, 4, "restart audit list")
    assert codes(h3) == ["I11"]
    h4, _ = make()
    h4.bookie_served("b2", 1, 0, None)
    assert codes(h4) == ["I10"]
    # Absence after a delete, or of an entry the bookie never acknowledged, is fine.
    h5, _ = make()
    h5.bookie_acked("b0", 1, 4)
    h5.delete("d1", 1, "invoke")
    h5.bookie_absent("b0", 1, 4, "read NO_SUCH_LEDGER")
    h5.bookie_absent("b0", 1, 5, "read NO_SUCH_ENTRY")
    assert codes(h5) == []


def test_i12_liveness_failure_and_beyond_tolerance() -> None:
    h, _ = make()
    h.liveness("recover L3", False, "recovery did not complete")
    assert codes(h) == ["I12"]
    assert codes(h, beyond_tolerance=True) == []
