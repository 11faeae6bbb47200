"""Offloading in the simulator (pybk.sim.tier): the simulated object store and its faults, the
seam's production side (pybk.logs.tier_access), TS1/TS2, and runs with and without the
offload_complete_before_upload switch."""

from __future__ import annotations

import asyncio
import random
from array import array
from pathlib import Path

import pytest

from pybk.logs.tier_access import open_threaded_tier
from pybk.logs.tier_store import SegmentIndex, frame_entries
from pybk.sim import Faults, Workload, run
from pybk.sim.history import History
from pybk.sim.loop import SimLoop
from pybk.sim.tier import SimObjectStore, SimTierError, check_tier

OFFLOAD_ONLY = Workload(writers=0, readers=0, recoverers=0, deletes=False, autorecovery=False,
                        log_offload=True)


def _index(seq: int, ledger: int, data: bytes, offsets: list[int]) -> SegmentIndex:
    import crc32c

    return SegmentIndex(namespace="ns", log="lg", seq=seq, ledger=ledger,
                        last_entry=len(offsets) - 1, ledger_length=len(data),
                        data_length=len(data), data_crc32c=crc32c.crc32c(data),
                        offsets=array("Q", offsets), ledger_metadata={})


def _on_virtual_time(coro_fn):  # type: ignore[no-untyped-def]
    loop = SimLoop(max_time=1000.0, max_steps=100_000)
    try:
        return loop.run_main(coro_fn())
    finally:
        loop.shutdown()


def _quiet(rng: random.Random) -> SimObjectStore:
    store = SimObjectStore(rng)
    store.error_rate = store.lost_answer_rate = 0.0
    store.list_lag = 0.0
    return store


def test_the_simulated_store_round_trips_and_verifies() -> None:
    async def go() -> None:
        store = _quiet(random.Random(1))
        tier = await store.open("sim://t", {})
        path = tier.base("ns", "lg", 1, 7, "u")
        frames = frame_entries([(0, b"a" * 10), (1, b"b" * 5)])
        length, crc = await tier.write_data(path, [frames])
        index = _index(1, 7, b"".join(frames), [0, 22])
        assert index.data_length == length and index.data_crc32c == crc
        assert not store.verified(path, 1, 7)  # no index yet: never taken for complete
        await tier.write_index(path, index)
        assert store.verified(path, 1, 7) and not store.verified(path, 2, 7)
        assert (await tier.verify(path, 1, 7)).last_entry == 1
        assert await tier.read_range(path, 22, 39) == b"".join(frames)[22:39]
        assert await tier.list_segments("ns", "lg") == [path]
        await tier.delete(path)
        assert await tier.list_segments("ns", "lg") == []
        with pytest.raises(FileNotFoundError):
            await tier.read_index(path)

    _on_virtual_time(go)


def test_the_simulated_store_faults() -> None:
    async def go() -> None:
        store = _quiet(random.Random(2))
        store.lost_answer_rate = 1.0
        with pytest.raises(SimTierError):
            await store.put("x", b"1")
        assert "x" in store.objects  # the upload completed, its answer was lost
        store.lost_answer_rate, store.error_rate = 0.0, 1.0
        with pytest.raises(SimTierError):
            await store.put("y", b"2")
        assert "y" not in store.objects  # refused before anything happened
        store.error_rate, store.list_lag = 0.0, 5.0
        await asyncio.sleep(6.0)  # (virtual time)
        await store.put("z", b"3")
        assert await store.list("") == ["x"]  # the listing lags behind the upload
        store.disarm()
        store.error_rate = 1.0
        assert await store.list("") == ["x", "z"]  # faults stop in the liveness phase
        assert store.verified("nothing", 1, 1) is False

    _on_virtual_time(go)


def test_the_production_tier_runs_fsspec_in_threads(tmp_path: Path) -> None:
    async def go() -> None:
        tier = await open_threaded_tier(f"file://{tmp_path}", {})
        path = tier.base("ns", "lg", 3, 9, "u")
        frames = frame_entries([(0, b"payload")])
        await tier.write_data(path, [frames])
        await tier.write_index(path, _index(3, 9, b"".join(frames), [0]))
        assert (await tier.verify(path, 3, 9)).ledger == 9
        assert await tier.list_segments("ns", "lg") == [path]
        await tier.delete(path)
        assert await tier.list_segments("ns", "lg") == []

    asyncio.run(go())


def test_check_tier_reports_failed_checks() -> None:
    h = History()
    h.tier_check("TS1", True, "segment 1 fine")
    h.tier_check("TS1", False, "segment 2 ledger L5 bookie copy deleted, NOT verified")
    h.tier_check("TS2", False, "segment 3 in NO tier")
    assert [(v.invariant, v.message[:9]) for v in check_tier(h)] == [
        ("TS1", "segment 2"), ("TS2", "segment 3")]


def test_a_log_offloading_under_faults_passes() -> None:
    r = run(34, duration=15.0, faults=Faults.all(), workload=OFFLOAD_ONLY)
    assert r.ok, r.report()
    cov = r.stats.coverage
    assert cov.get("workload_log_offload") == 1 and cov.get("tier_objects_put", 0) > 0
    assert cov.get("tier_bookie_copies_deleted", 0) > 0


def test_an_offload_recorded_complete_before_its_upload_is_caught() -> None:
    r = run(34, duration=15.0, faults=Faults.all(), workload=OFFLOAD_ONLY,
            mutations=("offload_complete_before_upload",))
    assert {v.invariant for v in r.violations} & {"TS1", "TS2"}, r.report()
