"""The bookies' tenancy gate in the simulator: the network asks it as the TCP server does (a
held request mutes its connection, not another's), simulated clients have principals, the
gate's promises hold under faults (T3-T5), and a gate that skips its quota is caught."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable

import pytest

from pybk import sim
from pybk.bookie.tenancy import TENANCY_QUOTA_UNCHECKED, TenancyEnforcer, TokenBucket
from pybk.sim import tenancy_gate
from pybk.sim.loop import run
from pybk.sim.net import SimNetwork
from pybk.sim.tenancy_checks import RateWindow
from pybk.sim.tenancy_gate import GatePolicies, principals
from pybk.transport.identity import CLUSTER
from pybk.wire import ReadRequest, Request, Response, Status, error_response

GATE = sim.Workload(tenancy_gate=True)
#: the seed whose drawn quota (2,000 bytes) a gate without its quota check breaks (T3)
QUOTA_SEED = 1
#: a seed that draws a write rate only (512 bytes a second)
RATE_SEED = 26
#: a seed that draws a read rate of records and no write rate (32 entries a second)
READ_RATE_SEED = 8
#: a seed that draws a read rate of bytes (4,096 a second) whose readers go past it
READ_BYTES_SEED = 10


class Recorder:
    """A bookie that answers reads OK and remembers which entries it started, when."""

    def __init__(self) -> None:
        self.started: list[tuple[str, int, float]] = []

    async def handle(self, request: Request) -> Response:
        assert isinstance(request, ReadRequest)
        self.started.append(("b0", request.entry_id, asyncio.get_running_loop().time()))
        return error_response(request, Status.OK)


class FakeGate:
    """Entry 0 waits a second, entry 1 is refused, the rest start at once."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        self.counted: list[int] = []

    def check(self, principal: str,
              request: Request) -> Response | Awaitable[Response | None] | None:
        assert isinstance(request, ReadRequest)
        self.asked.append((principal, request.entry_id))
        if request.entry_id == 0:
            return asyncio.sleep(1.0)
        if request.entry_id == 1:
            return error_response(request, Status.QUOTA_EXCEEDED, "no")
        return None

    def answered(self, principal: str, request: Request, response: Response) -> None:
        assert isinstance(request, ReadRequest)
        self.counted.append(request.entry_id)


def test_a_held_request_mutes_its_connection_only() -> None:
    bookie, gate = Recorder(), FakeGate()

    async def main() -> list[Status]:
        net = SimNetwork(random.Random(1))
        net.principal_of = lambda client: client.upper()
        net.set_bookie("b0", bookie.handle, gate=gate)
        noisy, calm = net.endpoint("c"), net.endpoint("d")
        futs = [noisy.send("b0", ReadRequest(7, i), 5.0) for i in range(3)]
        other = calm.send("b0", ReadRequest(7, 5), 5.0)
        answers = await asyncio.gather(*futs, other)
        return [a.status for a in answers]

    statuses = run(main())
    assert statuses == [Status.OK, Status.QUOTA_EXCEEDED, Status.OK, Status.OK]
    started = [(entry, at) for _b, entry, at in bookie.started]
    # the other connection's read is not behind the held one; the held connection's later
    # reads wait for its head (the refused one never reaches the bookie)
    assert [e for e, _ in started] == [5, 0, 2]
    assert started[1][1] >= 1.0 and started[0][1] < 1.0
    assert [e for p, e in gate.asked if p == "C"] == [0, 1, 2] and ("D", 5) in gate.asked
    assert sorted(gate.counted) == [0, 2, 5]  # (what each read's answer carried)


def test_a_reset_drops_what_its_connection_held() -> None:
    bookie, gate = Recorder(), FakeGate()

    async def main() -> None:
        net = SimNetwork(random.Random(1))
        net.set_bookie("b0", bookie.handle, gate=gate)
        t = net.endpoint("c")
        futs = [t.send("b0", ReadRequest(7, i), 5.0) for i in (0, 2)]
        await asyncio.sleep(0.5)
        net.set_bookie("b0", bookie.handle, gate=gate)  # (a restart: connections reset)
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert all(isinstance(r, Exception) for r in results), results
        await asyncio.sleep(2.0)

    run(main())
    assert bookie.started == []


def test_simulated_clients_have_principals_from_their_tokens() -> None:
    identities, principal_of = principals()
    assert identities.authenticates
    assert [principal_of(c) for c in ("w1", "r2", "rc1", "d1", "cw1", "calm-final")] == \
        ["sim", "sim", "sim", "sim", "calm", "calm"]
    assert {principal_of(c) for c in ("final", "ar-admin", "lw1", "tc1")} == {CLUSTER}


def test_limits_are_drawn_per_seed_from_a_stream_of_their_own() -> None:
    from pybk.sim.cluster import derive_rng

    drawn = [GatePolicies.draw(derive_rng(s, "tenancy-gate")) for s in range(40)]
    assert any(d.max_storage_bytes and not (d.write_bytes_per_s or d.write_records_per_s)
               for d in drawn)
    assert any(d.write_bytes_per_s for d in drawn) and any(d.write_records_per_s
                                                            for d in drawn)
    assert all(d.describe() for d in drawn)
    with_reads = [GatePolicies.draw(derive_rng(s, "tenancy-gate"),
                                    derive_rng(s, "tenancy-gate-reads")) for s in range(40)]
    for plain, both in zip(drawn, with_reads, strict=True):  # (the write limits stay put)
        assert (both.max_storage_bytes, both.write_bytes_per_s, both.write_records_per_s) \
            == (plain.max_storage_bytes, plain.write_bytes_per_s, plain.write_records_per_s)
    assert any(d.read_records_per_s for d in with_reads)
    assert any(d.read_bytes_per_s for d in with_reads)
    assert any(not (d.read_records_per_s or d.read_bytes_per_s) for d in with_reads)


def test_rate_window_holds_a_token_bucket_to_its_rate() -> None:
    ok = RateWindow(10)  # 10 a second, a burst of 1
    assert all(ok.admit(i / 10, i / 10, 1) <= 0 for i in range(50))
    late = RateWindow(10)  # asked early, started late (a stalled loop): still within
    assert late.admit(0.0, 0.5, 1) <= 0 and late.admit(0.05, 0.5, 1) <= 0
    fast = RateWindow(10)
    assert max(fast.admit(i / 100, i / 100, 1) for i in range(20)) > 0


def test_gate_promises_hold_under_faults() -> None:
    results = [sim.run(s, duration=12.0, workload=GATE) for s in (0, QUOTA_SEED, 3)]
    assert all(r.ok for r in results), [r.report() for r in results if not r.ok]
    coverage: dict[str, int] = {}
    for r in results:
        for k, v in r.stats.coverage.items():
            coverage[k] = coverage.get(k, 0) + v
    assert coverage["config_tenancy_gate"] == 3
    assert coverage.get("tenancy_quota_refused", 0) > 0  # (T3, T5 had refusals to judge)
    assert coverage.get("tenancy_gate_held", 0) > 0  # (rates and lookups held requests)
    assert any("tenancy gate: sim/gold limits" in line for r in results for line in r.trace)


def test_the_simulator_catches_a_gate_that_skips_its_quota() -> None:
    broken = sim.run(QUOTA_SEED, duration=12.0, workload=GATE,
                     mutations=(TENANCY_QUOTA_UNCHECKED,))
    assert {v.invariant for v in broken.violations} == {"T3"}, broken.report()
    clean = sim.run(QUOTA_SEED, duration=12.0, workload=GATE)
    assert clean.ok, clean.report()


def test_t4_catches_a_gate_that_never_delays(monkeypatch: pytest.MonkeyPatch) -> None:
    # a test-side broken gate: its buckets take tokens but never make a request wait
    take = TokenBucket.take
    monkeypatch.setattr(TokenBucket, "take", lambda self, n, now: take(self, n, now) * 0.0)
    r = sim.run(RATE_SEED, duration=10.0, workload=GATE)
    assert "T4" in {v.invariant for v in r.violations}, r.report()


def test_t5_catches_a_tenant_refused_for_another_tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    # a harness that gives the calm tenant's writer the noisy tenant's token: the bookies
    # refuse its namespace's adds (UNAUTHORIZED), which no limit explains
    monkeypatch.setattr(tenancy_gate, "_NOISY_CLIENTS", re.compile(r"(w|r|rc|d|cw)\d+"))
    r = sim.run(RATE_SEED, duration=10.0, workload=GATE)
    assert "T5" in {v.invariant for v in r.violations}, r.report()


def test_t4_catches_a_gate_that_never_delays_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # the seed's only rate is of read records; a test-side broken gate whose buckets take
    # tokens but never make a request wait lets reads through past it. The same seed passes
    # with the gate as it is.
    clean = sim.run(READ_RATE_SEED, duration=12.0, workload=GATE)
    assert clean.ok, clean.report()
    assert clean.stats.coverage.get("tenancy_read_rate_judged", 0) > 0
    take = TokenBucket.take
    monkeypatch.setattr(TokenBucket, "take", lambda self, n, now: take(self, n, now) * 0.0)
    r = sim.run(READ_RATE_SEED, duration=12.0, workload=GATE)
    assert {v.invariant for v in r.violations} == {"T4"}, r.report()
    assert all("started reads" in v.message for v in r.violations), r.report()


def test_t4_catches_a_gate_that_never_charges_read_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # read bytes are charged once a read is answered; a test-side broken gate that charges
    # nothing lets reads through past the seed's rate of read bytes. The same seed passes
    # with the gate as it is (reads let through on one bucket state counted as the slack).
    clean = sim.run(READ_BYTES_SEED, duration=12.0, workload=GATE)
    assert clean.ok, clean.report()
    assert clean.stats.coverage.get("tenancy_read_bytes_judged", 0) > 0
    monkeypatch.setattr(TenancyEnforcer, "answered", lambda self, principal, request,
                        response: None)
    r = sim.run(READ_BYTES_SEED, duration=12.0, workload=GATE)
    assert {v.invariant for v in r.violations} == {"T4"}, r.report()
    assert all("answered reads" in v.message for v in r.violations), r.report()
