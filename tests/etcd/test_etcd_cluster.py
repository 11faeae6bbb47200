"""A three-member etcd whose leader is killed under writers (issue 40).

* compare-and-set writers on several stores: every acknowledged update is in the final
  metadata, updates whose outcome was unknown count at most once, and a watch set before
  the kill fires for a change made after it;
* bookie processes and a client writing a ledger on ``etcd://`` with all three members: the
  leader is SIGKILLed mid-stream, then a bookie (its ensemble change goes through the new
  leader); a second client recovers the ledger and reads back everything acknowledged.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pybk import BKError, LedgerFencedError
from pybk.cli import spawn_bookie, wait_ready
from pybk.client import Client
from pybk.client.context import ClientConfig
from pybk.errors import MetadataStoreError
from pybk.metadata import open_store
from pybk.metadata.base import BookieRegistration
from pybk.testing.etcd import EtcdCluster
from pybk.testing.metadata_helpers import sample_metadata, wait_until

pytestmark = pytest.mark.integration

BOUND = 30.0
_roots = itertools.count()


@pytest.fixture(scope="module")
def etcd3() -> Iterator[EtcdCluster]:
    with EtcdCluster(3) as cluster:
        yield cluster


async def _until(cond: object, what: str) -> None:
    """Poll a plain condition (bounded)."""
    deadline = time.monotonic() + BOUND
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out after {BOUND}s waiting for {what}"
        await asyncio.sleep(0.02)


def _kill_leader(cluster: EtcdCluster) -> int:
    deadline = time.monotonic() + BOUND
    while (leader := cluster.leader()) is None:
        assert time.monotonic() < deadline, "no etcd leader"
        time.sleep(0.05)
    cluster.kill(leader)
    return leader


def _at_least(get: object, n: int) -> object:
    async def check() -> bool:
        return get() >= n  # type: ignore[operator]

    return check


async def test_cas_writers_lose_nothing_acknowledged_when_the_leader_dies(
    etcd3: EtcdCluster,
) -> None:
    uri = etcd3.uri(f"/cas-{next(_roots)}")
    writers = [open_store(uri, op_timeout=5.0) for _ in range(2)]
    watcher = open_store(uri)
    await writers[0].register_bookie(BookieRegistration("bk-1", "h:1"))
    lid = await writers[0].allocate_ledger_id()
    await writers[0].create_ledger(sample_metadata(lid))
    await watcher.read_ledger(lid)
    acked = unknown = 0
    stop = asyncio.Event()

    async def keep_updating(store: object) -> None:
        nonlocal acked, unknown
        while not stop.is_set():
            try:
                await store.update_ledger(  # type: ignore[attr-defined]
                    lid, lambda m: m.with_changes(length=m.length + 1))
                acked += 1
            except MetadataStoreError:
                unknown += 1
                await asyncio.sleep(0.02)

    tasks = [asyncio.create_task(keep_updating(w)) for w in writers]
    await wait_until(_at_least(lambda: acked, 30), BOUND, "writes before the kill")
    fired = asyncio.Event()
    watcher.watch_ledger(lid, lambda _l: fired.set())
    assert await watcher.sync_watches()
    killed = await asyncio.to_thread(_kill_leader, etcd3)
    before = acked
    fired.clear()
    await wait_until(_at_least(lambda: acked, before + 30), BOUND, "writes after the kill")
    await asyncio.wait_for(fired.wait(), BOUND)  # the watch lived through the kill
    stop.set()
    await asyncio.gather(*tasks)
    final = (await watcher.read_ledger(lid)).length
    assert acked <= final <= acked + unknown, (acked, unknown, final)
    assert await watcher.writable_bookies() == ["bk-1"]  # the lease outlived the election
    for s in (*writers, watcher):
        await s.close()
    await asyncio.to_thread(etcd3.start, killed)


class Bookies:
    """Bookie processes sharing one etcd root; stopped by PID."""

    def __init__(self, root: Path, metadata: str, count: int) -> None:
        self.root = root
        self.metadata = metadata
        self.ids = [f"etb-{i}" for i in range(count)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    async def start(self) -> None:
        for b in self.ids:
            self.procs[b] = spawn_bookie(self.root, b, self.metadata)
        for b in self.ids:
            await asyncio.to_thread(wait_ready, self.root, b, self.procs[b], 60)

    def kill9(self, bookie_id: str) -> None:
        proc = self.procs[bookie_id]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


async def test_processes_on_etcd_lose_nothing_when_the_etcd_leader_is_killed(
    etcd3: EtcdCluster, tmp_path: Path
) -> None:
    bookies = Bookies(tmp_path, etcd3.uri(f"/procs-{next(_roots)}"), count=4)
    killed: int | None = None
    try:
        await bookies.start()
        acked: dict[int, bytes] = {}
        failures: list[BaseException] = []
        async with Client(bookies.metadata, config=ClientConfig(add_timeout=5.0)) as client:
            lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
            victim = lh.metadata.ensembles[0][0]
            stop = asyncio.Event()

            async def writer() -> None:
                i = 0
                while not stop.is_set():
                    batch = [b"e-%06d" % n for n in range(i, i + 20)]
                    i += 20
                    results = await asyncio.gather(*(lh.append(d) for d in batch),
                                                   return_exceptions=True)
                    for d, r in zip(batch, results, strict=True):
                        if isinstance(r, BaseException):
                            failures.append(r)
                        else:
                            acked[r] = d

            task = asyncio.create_task(writer())
            await _until(lambda: len(acked) >= 100, "appends before the kill")
            killed = await asyncio.to_thread(_kill_leader, etcd3)
            before = len(acked)
            await _until(lambda: len(acked) >= before + 100, "appends after it")
            bookies.kill9(victim)  # an ensemble change, through the new etcd leader
            before = len(acked)
            await _until(lambda: len(acked) >= before + 100, "appends after both")
            stop.set()
            await asyncio.wait_for(task, BOUND)
            assert failures == [], failures[:3]
            await lh.close()
            md = await client.ledger_metadata(lh.id)
            assert md.state == "CLOSED" and md.last_entry_id == max(acked)
            assert len(md.ensembles) >= 2 and victim not in md.last_ensemble, md.ensembles
        async with Client(bookies.metadata) as reader:
            rh = await reader.open_ledger(lh.id, recovery=True)
            assert rh.last_add_confirmed == max(acked)
            data = {e.entry_id: e.data for e in await rh.read(0, rh.last_add_confirmed)}
        assert all(data[e] == v for e, v in acked.items())
        with pytest.raises((LedgerFencedError, BKError)):
            await lh.append(b"after close")
    finally:
        bookies.stop_all()
        if killed is not None:
            await asyncio.to_thread(etcd3.start, killed)
