"""The ledger-mode invariants (pybk.sim.ledger_modes_checks) on hand-made records, and the
workload's draw (pybk.sim.workload.Workload.draw: its own streams)."""

from __future__ import annotations

from pybk.sim.cluster import derive_rng
from pybk.sim.history import Event
from pybk.sim.ledger_modes_checks import ModeLedger, check_modes
from pybk.sim.workload import Workload


def _adv(acked: list[int], seals: list[int], final: int | None = None) -> ModeLedger:
    lg = ModeLedger(7, "adv", 2, "aw1")
    for e in range(10):
        lg.payloads[e] = f"p{e}".encode()
    lg.acked = {e: 100 + e for e in acked}
    lg.seals = [("mrc1", s, 200) for s in seals]
    if final is not None:
        lg.final_last = final
        lg.reads = {e: (lg.payloads[e], 300) for e in range(final + 1)}
    return lg


def _codes(ledgers: list[ModeLedger], events: list[Event] | None = None) -> list[str]:
    return [v.invariant for v in check_modes({lg.lid: lg for lg in ledgers}, events or [])]


def test_an_acknowledged_adv_id_beyond_a_seal_is_av1() -> None:
    assert _codes([_adv([0, 1, 2], [2], final=2)]) == []
    assert _codes([_adv([0, 1, 2, 3], [2], final=2)]) == ["AV1"]


def test_an_acknowledged_adv_id_not_read_back_is_av1() -> None:
    lg = _adv([0, 1, 2], [], final=2)
    del lg.reads[1]
    assert _codes([lg]) == ["AV1"]
    lg = _adv([0, 1, 2], [], final=2)
    lg.reads[2] = (b"other", 300)
    assert _codes([lg]) == ["AV1"]


def _ack(i: int, bookie: str, entry: int, ledger: int = 7) -> Event:
    return Event(i, 0.0, "bookie_ack", bookie, ledger, entry)


def test_an_adv_lac_past_what_qa_bookies_hold_is_av2() -> None:
    events = [_ack(0, "b0", 0), _ack(1, "b1", 0), _ack(2, "b0", 1)]
    lg = _adv([0], [])
    lg.lacs = [((2, 1), 0, "mr1", 5, False)]  # after entry 0's two acks: fine
    assert _codes([lg], events) == []
    lg.lacs = [((3, 1), 1, "mr1", 5, False)]  # entry 1 has one ack of Qa 2
    assert _codes([lg], events) == ["AV2"]
    lg.lacs = [((1, 1), 0, "mr1", 5, False)]  # seen before entry 0's second ack
    assert _codes([lg], events) == ["AV2"]


def _deferred(forced: int, final: int, read: int) -> ModeLedger:
    lg = ModeLedger(9, "deferred", 2, "dw1")
    for e in range(10):
        lg.payloads[e] = f"d{e}".encode()
    lg.acked = {e: 100 + e for e in range(8)}  # acknowledged (written), not all forced
    if forced >= 0:
        lg.forces = [((10, 1), forced, 150)]
    lg.final_last = final
    lg.reads = {e: (lg.payloads[e], 300) for e in range(read + 1)}
    return lg


def test_unforced_deferred_entries_may_be_lost_forced_ones_not() -> None:
    assert _codes([_deferred(forced=3, final=3, read=3)]) == []  # 4..7 lost: allowed
    assert _codes([_deferred(forced=-1, final=-1, read=-1)]) == []
    assert _codes([_deferred(forced=5, final=3, read=3)]) == ["DS1"]
    assert _codes([_deferred(forced=3, final=3, read=2)]) == ["DS1"]
    lg = _deferred(forced=3, final=5, read=5)
    lg.seals = [("mrc1", 2, 250)]  # a recovery sealed short of the force
    assert _codes([lg]) == ["DS1"]


def test_a_deferred_lac_past_the_last_force_is_ds2_until_recovery() -> None:
    lg = _deferred(forced=3, final=7, read=7)
    lg.lacs = [((12, 2), 3, "mr1", 5, False)]
    assert _codes([lg]) == []
    lg.lacs = [((12, 2), 4, "mr1", 5, False)]
    assert _codes([lg]) == ["DS2"]
    lg.lacs = [((9, 0), 3, "mr1", 5, False)]  # before the force returned
    assert _codes([lg]) == ["DS2"]
    lg.exempt_at = (11, 1)  # a recovery began: it may seal at what was only written
    lg.lacs = [((12, 2), 7, "mr1", 5, False)]
    assert _codes([lg]) == []
    lg.exempt_at = None
    lg.lacs = [((12, 2), 7, "mr1", 5, True)]  # the reader's handle saw it closed
    assert _codes([lg]) == []


def test_the_new_writers_are_drawn_from_streams_of_their_own() -> None:
    drew = {"adv": 0, "deferred": 0}
    for seed in range(64):
        wl = Workload.draw(derive_rng(seed, "workload"), lambda n, s=seed: derive_rng(s, n))
        drew["adv"] += wl.adv_writers
        drew["deferred"] += wl.deferred_writers
        bare = Workload.draw(derive_rng(seed, "workload"),
                             lambda n, s=seed: derive_rng(s, n) if n in ("cursors", "offload")
                             else _never())
        assert (wl.add_rate, wl.log_writers, wl.table_clients, wl.tenancy_gate,
                wl.log_cursors, wl.log_offload) == (
                    bare.add_rate, bare.log_writers, bare.table_clients, bare.tenancy_gate,
                    bare.log_cursors, bare.log_offload)
    assert 2 <= drew["adv"] <= 20 and 2 <= drew["deferred"] <= 20, drew


class _Never:
    def random(self) -> float:
        return 1.0


def _never() -> _Never:
    return _Never()
