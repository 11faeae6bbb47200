"""The read path: failover past bad replicas, speculative reads, LAC reads, long polls,
tailing, explicit LAC, and bad arguments."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

import pybk
from pybk.client.context import ClientConfig
from pybk.errors import BookieUnavailableError, DigestMismatchError, NoSuchEntryError
from pybk.wire import AddRequest, DigestManager, Op, ReadBatchRequest, Status, master_key

from .conftest import mem_cluster, until


async def seed(cluster: Any, bookie: str, ledger_id: int, entry_id: int, body: bytes) -> None:
    request = AddRequest(ledger_id, entry_id, master_key(b""), body)
    resp = await cluster.bookie(bookie).handle(request)
    assert resp.status == Status.OK, resp


async def closed_ledger_with_bodies(cluster: Any, bodies: dict[str, bytes]) -> Any:
    """A closed E=Qw=3 ledger with one entry whose replicas are ``bodies[bookie]``."""
    lh = await cluster.client().create_ledger(3, 3, 2)
    order = tuple(bodies)
    md = await cluster.store.read_ledger(lh.id)
    await cluster.store.write_ledger(
        md.with_changes(ensembles={0: order}, state="CLOSED", last_entry_id=0, length=5),
        md.version,
    )
    for bookie, body in bodies.items():
        await seed(cluster, bookie, lh.id, 0, body)
    return lh


async def test_corrupted_replica_is_skipped() -> None:
    async with mem_cluster(["b1", "b2", "b3"]) as cluster:
        good = DigestManager(0).frame(0, -1, 5, b"hello")
        bad = bytearray(good)
        bad[-1] ^= 0x01  # one flipped bit in the payload
        await closed_ledger_with_bodies(cluster, {"b1": bytes(bad), "b2": good, "b3": good})
        rh = await cluster.client().open_ledger(0)
        assert [e.data for e in await rh.read(0, 0)] == [b"hello"]  # b1 is asked first


async def test_all_replicas_corrupted_raises_digest_mismatch() -> None:
    async with mem_cluster(["b1", "b2", "b3"]) as cluster:
        good = DigestManager(0).frame(0, -1, 5, b"hello")
        bad = good[:-1] + bytes([good[-1] ^ 0xFF])
        await closed_ledger_with_bodies(cluster, {"b1": bad, "b2": bad, "b3": bad})
        rh = await cluster.client().open_ledger(0)
        with pytest.raises(DigestMismatchError, match="no replica returned a valid copy"):
            await rh.read(0, 0)


async def test_failover_on_errors_and_missing_replicas() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 3, 2)
        await lh.append_many([b"a", b"b", b"c"])
        await lh.close()
        t = cluster.local_transport()
        b = lh.metadata.ensembles[0]
        t.hooks.unavailable(b[0], op=Op.READ)
        t.hooks.fail(b[1], op=Op.READ, status=Status.IO_ERROR)
        rh = await cluster.client(transport=t).open_ledger(lh.id, recovery=False)
        assert [e.data for e in await rh.read(0, 2)] == [b"a", b"b", b"c"]
        t.hooks.fail(b[2], op=Op.READ, status=Status.NO_SUCH_ENTRY)
        with pytest.raises(BookieUnavailableError, match="every replica failed"):
            await rh.read(0, 0)


async def test_no_replica_has_entry() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        await lh.append(b"a")
        rh = await cluster.client().open_ledger(lh.id, recovery=False)
        with pytest.raises(NoSuchEntryError, match="no replica holds it"):
            await rh.read_unconfirmed(5, 5)
        await lh.close()


async def test_speculative_read_goes_to_next_replica() -> None:
    config = ClientConfig(read_timeout=30, speculative_read_delay=0.02)
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 3, 2)
        await lh.append_many([b"a", b"b"])
        await lh.close()
        t = cluster.local_transport()
        slow = t.hooks.hold(lh.metadata.ensembles[0][0], op=Op.READ)
        rh = await cluster.client(transport=t, config=config).open_ledger(lh.id)
        assert [e.data for e in await rh.read(0, 0)] == [b"a"]
        assert slow.matched == 1  # the slow replica was asked first, then skipped
        t.hooks.clear(release=False)


async def test_read_arguments_are_checked() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger()
        await lh.append_many([b"a", b"b"])
        await lh.close()
        rh = await cluster.client().open_ledger(lh.id)
        with pytest.raises(ValueError, match="first must be >= 0"):
            await rh.read(-1, 0)
        with pytest.raises(ValueError, match=r"last \(0\) must be >= first \(1\)"):
            await rh.read(1, 0)
        # past the LAC: a pybk error (still a ValueError, as before it had a class)
        with pytest.raises(pybk.EntryNotConfirmedError, match="last add confirmed is 1"):
            await rh.read(0, 2)
        with pytest.raises(pybk.NoSuchEntryError, match="closed at entry 1"):
            await rh.read_unconfirmed(0, 2)
        assert issubclass(pybk.EntryNotConfirmedError, ValueError)
        with pytest.raises(TypeError, match="first"):
            await rh.read("0", 1)  # type: ignore[arg-type]


async def test_lac_read_needs_coverage() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        await lh.append(b"a")
        t = cluster.local_transport()
        b = lh.metadata.ensembles[0]
        t.hooks.unavailable(b[0])
        t.hooks.unavailable(b[1])
        with pytest.raises(BookieUnavailableError, match="cannot read the LAC"):
            await cluster.client(transport=t).open_ledger(lh.id, recovery=False)
        await lh.close()


async def test_long_poll_returns_entry_once_confirmed() -> None:
    async with mem_cluster(3) as cluster:  # (the LAC carried by adds alone)
        lh = await cluster.client(config=ClientConfig(immediate_lac=False)).create_ledger(3, 2, 2)
        await lh.append(b"e0")
        await lh.append(b"e1")
        rh = await cluster.client().open_ledger(lh.id, recovery=False)
        assert rh.last_add_confirmed == 0
        assert (await rh.read_last_add_confirmed_and_entry(0, timeout=0.01)).data == b"e0"  # type: ignore[union-attr]
        poll = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(1, timeout=30))
        await asyncio.sleep(0)
        assert not poll.done()
        await lh.append(b"e2")  # carries LAC 1: the bookies' LAC passes 0
        entry = await asyncio.wait_for(poll, 10)
        assert entry is not None and (entry.entry_id, entry.data) == (1, b"e1")
        assert rh.last_add_confirmed >= 1
        assert await rh.read_last_add_confirmed_and_entry(5, timeout=0.05) is None
        await lh.close()


async def test_tail_follows_writer_until_close() -> None:
    config = ClientConfig(read_timeout=5, speculative_read_delay=0, long_poll_timeout=5)
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        rh = await cluster.client(config=config).open_ledger(lh.id, recovery=False)
        got: list[bytes] = []

        async def follow() -> None:
            async for entry in rh.tail(0):
                got.append(entry.data)

        follower = asyncio.ensure_future(follow())
        for i in range(6):
            await lh.append(b"t%d" % i)
        await until(lambda: len(got) >= 5)  # entry 5 is not confirmed until close
        await lh.close()
        await asyncio.wait_for(follower, 10)  # ends when the ledger is closed
        assert got == [b"t%d" % i for i in range(6)]


async def test_explicit_lac_lets_reader_see_last_entry() -> None:
    config = ClientConfig(explicit_lac_interval=0.01, speculative_read_delay=0)
    async with mem_cluster(3) as cluster:
        lh = await cluster.client(config=config).create_ledger(3, 2, 2)
        for i in range(3):
            await lh.append(b"x%d" % i)
        rh = await cluster.client().open_ledger(lh.id, recovery=False)

        async def lac() -> int:
            return await rh.read_last_add_confirmed()

        deadline = asyncio.get_running_loop().time() + 5
        while await lac() < 2:
            assert asyncio.get_running_loop().time() < deadline, "explicit LAC never arrived"
            await asyncio.sleep(0.01)
        assert [e.data for e in await rh.read(0, 2)] == [b"x0", b"x1", b"x2"]
        await lh.close()


async def test_reader_follows_ensemble_change_after_open() -> None:
    async with mem_cluster(4) as cluster:  # (the LAC carried by adds alone: it lags one)
        writer = cluster.client(config=ClientConfig(immediate_lac=False))
        lh = await writer.create_ledger(3, 1, 1)  # one replica: no failover
        for i in range(3):
            await lh.append(b"e%d" % i)
        rh = await cluster.client().open_ledger(lh.id, recovery=False)
        victim = lh.metadata.ensembles[0][0]
        await cluster.stop_bookie(victim)
        for i in range(3, 8):
            await lh.append(b"e%d" % i)
        assert len(lh.metadata.ensembles) == 2
        assert len(rh.metadata.ensembles) == 1  # stale view: entry 3 is not where it says
        assert [e.data for e in await rh.read_unconfirmed(3, 7)] == [
            b"e%d" % i for i in range(3, 8)
        ]
        assert len(rh.metadata.ensembles) == 2  # refreshed on the failed read
        assert await rh.read_last_add_confirmed() == 6
        await lh.close()


class _Misnumbering:
    """A transport whose ``liar`` bookie answers batched reads with its entries' ids out of
    place (what a buggy or hostile bookie might send): the bodies are genuine, the ids
    they are answered for are not the ones asked."""

    def __init__(self, inner: Any, liar: str) -> None:
        self.inner = inner
        self.liar = liar
        self.lied = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def send(self, bookie_id: str, request: Any, timeout: float | None = None) -> Any:
        fut = self.inner.send(bookie_id, request, timeout)
        if bookie_id != self.liar or not isinstance(request, ReadBatchRequest):
            return fut
        out: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def swap(done: asyncio.Future[Any]) -> None:
            resp = done.result()
            ids = [e for e, _s, _b in resp.entries]
            self.lied += 1
            out.set_result(dataclasses.replace(resp, entries=tuple(
                (e, s, b) for e, (_e, s, b) in zip(ids[1:] + ids[:1], resp.entries,
                                                   strict=True))))

        fut.add_done_callback(swap)
        return out


async def test_a_batched_answer_with_misplaced_ids_is_not_believed() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        data = [b"e%d" % i for i in range(30)]
        await lh.append_many(data)
        await lh.close()
        t = _Misnumbering(cluster.local_transport(), lh.metadata.ensembles[0][0])
        rh = await cluster.client(transport=t).open_ledger(lh.id, recovery=False)
        got = await rh.read(0, 29)
        assert [e.data for e in got] == data and [e.entry_id for e in got] == list(range(30))
        assert t.lied >= 1  # its entries came from their second replicas


def test_tail_backs_off_while_its_ledger_is_fenced_but_not_closed(sim_cluster: Any) -> None:
    """A recovery that fenced the ledger and has not closed it yet: every long poll is
    answered at once, without the entry. tail() then polls less and less often (up to the
    long-poll timeout) instead of as fast as the round trips allow, and still ends with the
    ledger once it is closed. (Virtual time: the count of polls over 20 s is exact.)"""
    from pybk.wire import FenceRequest, ReadRequest

    async def scenario(cluster: Any) -> tuple[int, list[bytes]]:
        config = ClientConfig(long_poll_timeout=1.0, speculative_read_delay=0)
        lh = await cluster.client("w").create_ledger(3, 3, 2, password=b"pw")
        for i in range(3):
            await lh.append(b"e%d" % i)
        rh = await cluster.client("r", config).open_ledger(lh.id, password=b"pw",
                                                           recovery=False)
        polls = 0

        def count(client: str, bookie: str, request: Any) -> None:
            nonlocal polls
            if client == "r" and isinstance(request, ReadRequest) and request.timeout > 0:
                polls += 1

        cluster.network.send_observers.append(count)
        got: list[bytes] = []

        async def follow() -> None:
            async for entry in rh.tail(0):
                got.append(entry.data)

        follower = asyncio.ensure_future(follow())
        await asyncio.sleep(1.0)  # caught up: polling for entry 2 (1 is the LAC)
        fencer = cluster.client("f").transport
        for bookie in lh.metadata.last_ensemble:
            reply = await fencer.send(bookie, FenceRequest(lh.id, master_key(b"pw")), 5.0)
            assert reply.status == Status.OK
        polls = 0
        await asyncio.sleep(20.0)  # fenced, open: every poll comes back at once, empty
        fenced_polls = polls
        assert not follower.done()
        # a recovery closes the ledger: the tail sees the end and stops
        await cluster.client("rc").open_ledger(lh.id, password=b"pw")
        await asyncio.wait_for(follower, 30.0)
        return fenced_polls, got

    polls, got = sim_cluster.run(scenario)
    assert got == [b"e0", b"e1", b"e2"]
    # rounds of 3 polls, 0.01 s apart doubling to 1 s: about 25 rounds in 20 s (without the
    # backoff: thousands, one per round trip)
    assert 3 <= polls <= 3 * 30, polls


def test_explicit_lac_is_not_sent_while_adds_carry_the_lac_on(sim_cluster: Any) -> None:
    """BookKeeper's explicit-LAC policy: a writer adding more often than the interval sends
    no WriteLac (each add brings the bookies the LAC piggybacked); once it stops, its last
    LAC goes to the bookies within two intervals and a reader sees its last entry."""
    from pybk.wire import WriteLacRequest

    async def scenario(cluster: Any) -> None:
        config = ClientConfig(explicit_lac_interval=0.2, immediate_lac=False)
        lh = await cluster.client("w", config).create_ledger(3, 3, 2, password=b"pw")
        loop = asyncio.get_running_loop()
        sent: list[tuple[float, int]] = []

        def watch(client: str, bookie: str, request: Any) -> None:
            if client == "w" and isinstance(request, WriteLacRequest):
                sent.append((loop.time(), request.lac))

        cluster.network.send_observers.append(watch)
        for i in range(40):  # 4 virtual seconds, an add every 0.1 s
            await lh.append(b"e%d" % i)
            await asyncio.sleep(0.1)
        assert sent == []
        stopped = loop.time()
        await asyncio.sleep(1.0)
        # the last LAC, to each bookie of the ensemble, within two intervals of the stop
        assert [lac for _t, lac in sent] == [39, 39, 39]
        assert all(t - stopped <= 0.4 + 0.01 for t, _lac in sent), sent
        rh = await cluster.client("r").open_ledger(lh.id, password=b"pw", recovery=False)
        assert await rh.read_last_add_confirmed() == 39
        await asyncio.sleep(1.0)
        assert len(sent) == 3  # nothing new to send: nothing sent again
        await lh.close()

    sim_cluster.run(scenario)
