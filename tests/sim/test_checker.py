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


def _two_acked_by_qa() -> History:
    """Ledger 1 (E3/Qw3/Qa2) with entries 0-2 sent, 0 acknowledged to the writer, 0 and 1
    on two bookies (Qa), 2 on one only."""
    h, _ = make()
    h.create("w1", 1, "E=3 Qw=3 Qa=2", qa=2)
    for e in range(3):
        h.add_invoke("w1", 1, e, f"w1:1:{e}".encode())
    h.add_complete("w1", 1, 0, OK)
    for b in ("b0", "b1"):
        h.bookie_acked(b, 1, 0)
        h.bookie_acked(b, 1, 1)
    h.bookie_acked("b2", 1, 2)
    return h


def test_i3_exempts_only_what_a_recovery_can_still_change() -> None:
    """During a recovery a reader may see a LAC above the writer's acknowledgements, but
    never above what Qa bookies acknowledged (the entries the recovery can keep)."""
    h, _ = make()
    h.create("w1", 1, "E=3 Qw=3 Qa=2", qa=2)
    for e in range(3):
        h.add_invoke("w1", 1, e, f"w1:1:{e}".encode())
    h.add_complete("w1", 1, 0, OK)
    h.bookie_acked("b0", 1, 0)
    h.bookie_acked("b1", 1, 0)
    h.bookie_acked("b0", 1, 1)
    h.bookie_acked("b2", 1, 1)  # entry 1 on two bookies (Qa); entry 2 on one only
    h.bookie_acked("b2", 1, 2)
    h.close_invoke("rc1", 1, "recover")
    h.lac("r1", 1, 1)  # recovery may make entry 1 visible: allowed
    assert codes(h) == []
    h.lac("r1", 1, 2)  # entry 2 never reached Qa bookies: a dirty read
    assert codes(h) == ["I3"]
    # A recovery by auto-recovery's workers (seen as the ledger's metadata going into
    # recovery) is a recovery too: the same bound.
    h3 = _two_acked_by_qa()
    h3.lac("r1", 1, 1)  # before any recovery: above the writer's acknowledgements
    assert codes(h3) == ["I3"]
    h4 = _two_acked_by_qa()
    h4.metadata("ar0", 1, "IN_RECOVERY", -1)
    h4.lac("r1", 1, 1)
    assert codes(h4) == []
    h4.lac("r1", 1, 2)
    assert codes(h4) == ["I3"]
    # Without a recovery the writer's acknowledgements are the bound.
    h2, _ = make()
    h2.create("w1", 1, "E=3 Qw=3 Qa=2", qa=2)
    h2.add_invoke("w1", 1, 0, b"w1:1:0")
    h2.add_invoke("w1", 1, 1, b"w1:1:1")
    h2.add_complete("w1", 1, 0, OK)
    h2.bookie_acked("b0", 1, 1)
    h2.bookie_acked("b1", 1, 1)
    h2.close_invoke("w1", 1, "close")  # the writer's own close exempts nothing
    h2.lac("r1", 1, 1)
    assert codes(h2) == ["I3"]
    # A ledger written in batches: acknowledged per batch, so the Qa bound applies.
    h3, _ = make()
    h3.create("w1", 1, "E=3 Qw=3 Qa=2 batched", qa=2)
    h3.add_invoke("w1", 1, 0, b"w1:1:0")
    h3.bookie_acked("b0", 1, 0)
    h3.bookie_acked("b1", 1, 0)
    h3.lac("r1", 1, 0)
    assert codes(h3) == []


def test_x1_an_unexpected_exception_is_a_finding() -> None:
    h, trace = make()
    try:
        raise KeyError("lost")
    except KeyError as exc:
        h.exception("r1", "tail L3", exc, "Traceback: ...")
    violations = check(h)
    assert [v.invariant for v in violations] == ["X1"]
    assert "KeyError" in violations[0].render(trace)


def test_x1_expected_exceptions_are_not_findings() -> None:
    from pybk.errors import BookieUnavailableError, UnexpectedConditionError
    from pybk.sim.findings import is_expected

    assert is_expected(BookieUnavailableError("b1 down"))
    assert is_expected(TimeoutError())
    assert not is_expected(UnexpectedConditionError("an ensemble changed"))
    assert not is_expected(AssertionError())


# -- the log invariants (pybk.sim.logs.check_logs) ---------------------------------------------


def log_codes(h: History) -> list[str]:
    from pybk.sim.logs import check_logs

    return sorted(v.invariant for v in check_logs(h))


def appended(h: History, writer: str, epoch: int, records: list[tuple[bytes, tuple[int, int, int]]],
             ) -> None:
    h.log_writer_open(writer, "log", epoch, OK)
    for payload, pos in records:
        h.log_append(writer, "log", payload)
        h.log_append_done(writer, "log", payload, OK, pos)


def test_log_clean_history_passes() -> None:
    h, _ = make()
    appended(h, "lw1", 1, [(b"a", (1, 0, 0)), (b"b", (1, 0, 1)), (b"c", (1, 1, 0))])
    appended(h, "lw2", 2, [(b"d", (2, 0, 0))])
    h.log_reader_start("lr1", "log", 1, None)
    for payload, pos in ((b"a", (1, 0, 0)), (b"b", (1, 0, 1)), (b"c", (1, 1, 0))):
        h.log_read("lr1", "log", 1, pos, payload)
    h.log_reader_start("log-final-r", "log", 2, None)
    for payload, pos in ((b"a", (1, 0, 0)), (b"b", (1, 0, 1)), (b"c", (1, 1, 0)),
                         (b"d", (2, 0, 0))):
        h.log_read("log-final-r", "log", 2, pos, payload)
    assert log_codes(h) == []


def test_log_lg1_a_reader_skips_or_repeats_a_record() -> None:
    h, _ = make()
    appended(h, "lw1", 1, [(b"a", (1, 0, 0)), (b"b", (1, 1, 0)), (b"c", (1, 2, 0))])
    h.log_reader_start("lr1", "log", 1, None)
    h.log_read("lr1", "log", 1, (1, 0, 0), b"a")
    h.log_read("lr1", "log", 1, (1, 2, 0), b"c")  # b skipped
    assert log_codes(h) == ["LG1"]
    h2, _ = make()
    appended(h2, "lw1", 1, [(b"a", (1, 0, 0))])
    h2.log_reader_start("lr1", "log", 1, None)
    h2.log_read("lr1", "log", 1, (1, 0, 0), b"a")
    h2.log_read("lr1", "log", 1, (1, 0, 0), b"a")
    assert log_codes(h2) == ["LG1"]
    # The last reader must read everything acknowledged, even past where it stopped.
    h3, _ = make()
    appended(h3, "lw1", 1, [(b"a", (1, 0, 0)), (b"b", (1, 1, 0))])
    h3.log_reader_start("log-final-r", "log", 1, None)
    h3.log_read("log-final-r", "log", 1, (1, 0, 0), b"a")
    assert log_codes(h3) == ["LG1"]


def test_log_lg2_lg4_positions_and_takeover_order() -> None:
    h, _ = make()
    appended(h, "lw1", 1, [(b"a", (1, 1, 0)), (b"b", (1, 0, 0))])  # went back
    assert log_codes(h) == ["LG2"]
    h2, _ = make()
    appended(h2, "lw1", 1, [(b"a", (1, 0, 0)), (b"b", (1, 5, 0))])
    appended(h2, "lw2", 2, [(b"c", (1, 3, 0))])  # the new writer before the old one's ack
    assert log_codes(h2) == ["LG4"]


def test_log_lg3_lg5_truncation_and_phantoms() -> None:
    h, _ = make()
    appended(h, "lw1", 1, [(b"a", (1, 0, 0)), (b"b", (1, 1, 0))])
    h.log_truncate("meta", "log", (1, 1, 0), "stored")
    h.log_reader_start("lr1", "log", 1, None)
    h.log_read("lr1", "log", 1, (1, 0, 0), b"a")  # before the truncation point
    h.log_read("lr1", "log", 1, (1, 1, 0), b"b")
    assert log_codes(h) == ["LG3"]
    h2, _ = make()
    appended(h2, "lw1", 1, [(b"a", (1, 0, 0))])
    h2.log_reader_start("lr1", "log", 1, None)
    h2.log_read("lr1", "log", 1, (1, 0, 0), b"zzz")  # nobody appended it
    assert "LG5" in log_codes(h2)
    h3, _ = make()
    h3.log_writer_open("lw1", "log", 1, OK)
    h3.log_append("lw1", "log", b"a")
    h3.log_append_done("lw1", "log", b"a", FAIL, None, "RecordTooLargeError")
    h3.log_reader_start("lr1", "log", 1, None)
    h3.log_read("lr1", "log", 1, (1, 0, 0), b"a")  # an aborted read
    assert log_codes(h3) == ["LG5"]


def test_a_garbage_collector_deleting_a_ledger_the_metadata_has_is_i16() -> None:
    h, trace = make()
    written(h, 1, 3)
    written(h, 2, 3)
    h.delete("meta", 2, "applied")
    h.gc_collect("b0", 2)  # deleted in the metadata first: fine
    h.gc_collect("b1", 1)  # still live: the violation
    closed_and_read(h, 1, 2)
    h.liveness("new ledger", True)
    found = check(h)
    assert [(v.invariant, v.ledger) for v in found] == [("I16", 1)]
    assert "b1 gc collects L1" in trace[found[0].lines[0]]
    h2, _ = make()
    written(h2, 3, 1)
    h2.gc_collect("b0", 3)
    h2.delete("meta", 3, "applied")  # deleted only after the collection: still wrong
    assert "I16" in codes(h2)
