"""Offloading in the simulator (pybk.sim.tier): the simulated object store and its faults (torn
uploads too), the seam's production side (pybk.logs.tier_access), TS1..TS4, and runs with and
without the offload_complete_before_upload switch and the orphan sweep's switches
(pybk.sim.tier_sweep)."""

from __future__ import annotations

import asyncio
import random
from array import array
from collections import Counter
from dataclasses import replace
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
OFFLOAD_AND_SWEEP = replace(OFFLOAD_ONLY, log_tier_sweep=True)
#: uploads cut short all three ways, an orphan swept and an abandoned upload aborted; the
#: sweep switches caught at 1 (TS3) and 59 (TS4) (29 Nov, since the offload service, the
#: tier read cache and the lone writer's LAC moved the traces)
SWEEP_SEED = 11


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


def test_uploads_cut_short_are_never_taken_for_complete() -> None:
    async def go() -> None:
        kinds: Counter[str] = Counter()
        store = SimObjectStore(random.Random(3), lambda k: kinds.update([k]), clock=lambda: 7.0,
                               torn=random.Random(4))
        store.error_rate = store.lost_answer_rate = store.list_lag = 0.0
        store.torn_rate = 1.0
        tier = await store.open("sim://t", {})
        frames = frame_entries([(0, b"x" * 40), (1, b"y" * 40)])
        data = b"".join(frames)
        for n in range(24):
            path = tier.base("ns", "lg", n, 7, "u")
            with pytest.raises(SimTierError):
                await tier.write_data(path, [frames])
            assert not store.verified(path, n, 7)
            found = store.objects.get(path + ".data")
            assert found is None or len(found[0]) < len(data)  # partial, or not there yet
        assert set(kinds) == {"tier_torn_partial", "tier_torn_abandoned", "tier_torn_late"}
        partial = [n for n in store.objects if len(store.objects[n][0]) < len(data)]
        assert len(partial) == kinds["tier_torn_partial"]
        assert len(store.uploads) == kinds["tier_torn_abandoned"]  # no listing shows them
        assert {n for n, _ in await tier.list_objects("ns", "lg")} >= set(partial)
        await asyncio.sleep(5.0)  # (virtual time) every late one has landed, whole
        listed = await tier.list_objects("ns", "lg")
        assert len(listed) == kinds["tier_torn_partial"] + kinds["tier_torn_late"]
        assert {t for _, t in listed} == {7.0}  # dated by the store's clock
        whole = [n for n, _ in listed if n not in partial]
        assert all(store.objects[n][0] == data for n in whole)
        index = _index(0, 7, data, [0, 52])
        store.torn_rate = 0.0
        await tier.write_index(tier.base("ns", "lg", 0, 7, "u"), index)
        if "ns/lg/0-7-u.data" in whole:  # (a late one, whole: with its index it verifies)
            assert store.verified(tier.base("ns", "lg", 0, 7, "u"), 0, 7)

    _on_virtual_time(go)


def test_a_store_without_torn_uploads_draws_nothing_more() -> None:
    a, b = random.Random(5), random.Random(5)
    SimObjectStore(a)
    SimObjectStore(b, torn=random.Random(6))
    assert a.random() == b.random()  # the store's own stream is untouched


def test_the_production_tier_lists_objects_with_their_times(tmp_path: Path) -> None:
    async def go() -> None:
        tier = await open_threaded_tier(f"file://{tmp_path}", {})
        path = tier.base("ns", "lg", 3, 9, "u")
        await tier.write_data(path, [frame_entries([(0, b"payload")])])
        (tmp_path / "ns" / "lg" / "notes.txt").write_text("not an offload object")
        listed = await tier.list_objects("ns", "lg")
        assert [n for n, _ in listed] == [path + ".data"]
        assert abs(listed[0][1] - (tmp_path / "ns" / "lg" / "3-9-u.data").stat().st_mtime) < 1
        assert await tier.list_objects("ns", "other") == []

    asyncio.run(go())


def test_a_log_offloading_beside_the_orphan_sweep_passes() -> None:
    r = run(SWEEP_SEED, duration=15.0, faults=Faults.all(), workload=OFFLOAD_AND_SWEEP)
    assert r.ok, r.report()
    cov = r.stats.coverage
    assert cov.get("workload_log_tier_sweep") == 1 and cov.get("tier_sweeps", 0) > 0
    assert cov.get("tier_orphans_swept", 0) > 0
    assert cov.get("tier_uploads_aborted", 0) > 0  # abandoned multipart uploads too (TS4)


@pytest.mark.parametrize(("switch", "invariant", "seed"), [
    ("sweep_ignores_attempts_in_progress", "TS3", 1), ("sweep_needs_index", "TS4", 59)])
def test_the_orphan_sweeps_switches_are_caught(switch: str, invariant: str, seed: int) -> None:
    r = run(seed, duration=15.0, faults=Faults.all(), workload=OFFLOAD_AND_SWEEP,
            mutations=(switch,))
    assert invariant in {v.invariant for v in r.violations}, r.report()


def test_a_dead_processs_tier_calls_stop_where_they_are() -> None:
    async def go() -> None:
        store = _quiet(random.Random(3))
        dead: set[str] = set()
        store.dead = dead.__contains__
        tier = await store.open("sim://tier", {}, owner="lw1")
        upload = asyncio.ensure_future(tier.write_data("ns/lg/1-1-u", [[b"data"]]))
        await asyncio.sleep(0)  # (the upload is under way, in its latency)
        dead.add("lw1")
        await asyncio.sleep(5.0)
        assert not upload.done() and store.objects == {}  # nothing landed, no answer
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(tier.list_objects("ns", "lg"), 5.0)
        other = await store.open("sim://tier", {}, owner="lw2")  # a live one is served
        await other.write_data("ns/lg/1-1-v", [[b"data"]])
        assert list(store.objects) == ["ns/lg/1-1-v.data"]
        upload.cancel()

    _on_virtual_time(go)
