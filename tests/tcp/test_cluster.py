"""Three bookie *processes* on loopback, reached by pybk.Client over the TCP transport.

* ``kill -9`` one bookie of a ledger's ensemble while appends are in flight: the writer
  replaces it (ensemble change, exactly as in-process); the bookie is restarted on its data
  directory; a second client recovers the ledger; every acknowledged entry reads back
  byte-identical and the ledger does not end before the last acknowledged entry.
* SIGTERM every bookie after acknowledged appends: each exits 0 and deregisters; restarted,
  they serve every acknowledged entry.
"""

from __future__ import annotations

import asyncio

import pytest

from pybk.client import Client
from pybk.client.context import ClientConfig
from pybk.errors import BKError, BookieUnavailableError
from pybk.metadata import open_store
from pybk.wire import BookieInfoRequest, Status

from .conftest import wait_until, wait_until_async
from .proc_cluster import ProcCluster

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(tmp_path):
    c = ProcCluster(tmp_path / "cluster", 3)
    await c.start()
    yield c
    c.stop_all()


async def _verify(cluster: ProcCluster, ledger_id: int, acked: dict[int, bytes]) -> int:
    """Recover the ledger from a fresh client; check every acknowledged entry."""
    async with Client(cluster.metadata) as client:
        rh = await client.open_ledger(ledger_id, recovery=True)
        last = rh.last_add_confirmed
        assert last >= max(acked), f"ledger closed at {last}, before acked {max(acked)}"
        entries = await rh.read(0, last)
        got = {e.entry_id: e.data for e in entries}
        assert [e.entry_id for e in entries] == list(range(last + 1))
        missing = [i for i in acked if got.get(i) != acked[i]]
        assert missing == [], f"acknowledged entries lost or changed: {missing[:10]}"
        md = await client.ledger_metadata(ledger_id)
        assert md.state == "CLOSED" and md.last_entry_id == last
        return int(last)


async def test_kill9_a_bookie_while_writing_then_restart_and_recover(cluster):
    acked: dict[int, bytes] = {}
    failures: list[BaseException] = []
    config = ClientConfig(add_timeout=3.0)
    async with Client(cluster.metadata, config=config) as client:
        lh = await client.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2)
        victim = lh.metadata.ensembles[0][0]

        async def append(i: int) -> None:
            data = b"entry-%06d" % i
            try:
                entry_id = await lh.append(data)
            except BKError as exc:
                failures.append(exc)
                return
            acked[entry_id] = data

        async def writer() -> None:
            for start in range(0, 1200, 40):  # pipelined windows of 40 appends
                await asyncio.gather(*(append(i) for i in range(start, start + 40)))

        task = asyncio.create_task(writer())
        await wait_until(lambda: len(acked) >= 200, 30, "first acknowledged appends")
        cluster.kill9(victim)  # mid-stream: appends are in flight to it right now
        await asyncio.wait_for(task, 120)
        md = await client.ledger_metadata(lh.id)
        assert len(md.ensembles) >= 2, "the writer should have replaced the killed bookie"
        assert victim not in md.last_ensemble
        ledger_id = lh.id
        assert failures == [], failures[:3]
        assert len(acked) == 1200

        # read failover: the first fragment's entries come from the surviving replica
        rh = await client.open_ledger(ledger_id, recovery=False)
        first = await rh.read(0, 199)
        assert [e.data for e in first] == [acked[i] for i in range(200)]

        await cluster.start(victim)  # back on the same data directory, on a new port

        async def victim_answers() -> bool:
            # the same transport re-resolves the victim's new address through the registry
            try:
                resp = await client.transport.send(victim, BookieInfoRequest(), 5.0)
            except BookieUnavailableError:
                return False
            return resp.status == Status.OK

        await wait_until_async(victim_answers, 30, "restarted bookie reachable again")

    last = await _verify(cluster, ledger_id, acked)
    assert last == 1199


async def test_sigterm_shutdown_loses_nothing_acknowledged(cluster):
    acked: dict[int, bytes] = {}
    async with Client(cluster.metadata) as client:
        lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        for start in range(0, 600, 100):
            ids = await asyncio.gather(*(lh.append(b"v%d" % i) for i in range(start, start + 100)))
            acked.update(
                {eid: b"v%d" % i for eid, i in zip(ids, range(start, start + 100), strict=True)}
            )
        ledger_id = lh.id
        # SIGTERM every bookie while the writer still holds the ledger open
        for bookie_id in cluster.ids:
            cluster.sigterm(bookie_id)
        codes = [await cluster.wait_exit(b) for b in cluster.ids]
    assert codes == [0, 0, 0]
    for bookie_id in cluster.ids:
        assert "stopped" in cluster.log(bookie_id)
    store = open_store(cluster.metadata)
    try:
        assert await store.list_bookies() == []  # each one deregistered itself
    finally:
        await store.close()

    await cluster.start()
    assert await _verify(cluster, ledger_id, acked) == 599


async def test_sigterm_a_bookie_mid_write(cluster):
    """SIGTERM a bookie while appends are in flight to it: requests already inside finish,
    the rest fail over (ensemble change); the bookie exits 0; nothing acknowledged is lost."""
    acked: dict[int, bytes] = {}
    async with Client(cluster.metadata, config=ClientConfig(add_timeout=3.0)) as client:
        lh = await client.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2)
        victim = lh.metadata.ensembles[0][1]

        async def writer() -> None:
            for start in range(0, 1000, 50):
                ids = await asyncio.gather(
                    *(lh.append(b"w%d" % i) for i in range(start, start + 50))
                )
                acked.update(
                    {e: b"w%d" % i for e, i in zip(ids, range(start, start + 50), strict=True)}
                )

        task = asyncio.create_task(writer())
        await wait_until(lambda: len(acked) >= 150, 30, "first acknowledged appends")
        cluster.sigterm(victim)
        await asyncio.wait_for(task, 120)
        assert await cluster.wait_exit(victim) == 0
        md = await client.ledger_metadata(lh.id)
        assert victim not in md.last_ensemble
        ledger_id = lh.id
    assert len(acked) == 1000
    await cluster.start(victim)
    assert await _verify(cluster, ledger_id, acked) == 999
