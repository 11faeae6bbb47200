"""Long polls one bookie at a time (``ClientConfig.long_poll_parallel=False``, the default,
BookKeeper's ``parallel=false``) and to every bookie at once (``True``): which bookies are
asked, failover past a stopped, a silent or a lagging bookie, and bad arguments. In virtual
time (the ``sim_cluster`` fixture), so the requests sent can be counted exactly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pybk.client.context import ClientConfig
from pybk.wire import ReadRequest

PW = b"pw"


def _polls(cluster: Any, client: str) -> list[tuple[float, str, int]]:
    """(virtual time, bookie, timeout) of every long poll or LAC probe ``client`` sends."""
    seen: list[tuple[float, str, int]] = []
    loop = asyncio.get_running_loop()

    def watch(src: str, bookie: str, request: Any) -> None:
        if src == client and isinstance(request, ReadRequest) and request.previous_lac is not None:
            seen.append((loop.time(), bookie, request.timeout))

    cluster.network.send_observers.append(watch)
    return seen


async def _ledger(cluster: Any, entries: int, e: int = 3, qw: int = 2) -> Any:
    """A ledger whose bookies know the LAC only from the entries (no immediate LAC: the
    last entry stays unconfirmed on the bookies until the next add, as these polls need)."""
    writer = cluster.client("w", ClientConfig(immediate_lac=False))
    lh = await writer.create_ledger(e, qw, 2, password=PW)
    for i in range(entries):
        await lh.append(b"e%d" % i)
    return lh


def test_a_sequential_poll_asks_one_bookie_the_first_of_the_next_entrys_write_set(
        sim_cluster: Any) -> None:
    async def scenario(cluster: Any) -> None:
        lh = await _ledger(cluster, 2)  # LAC 0 on the bookies (entry 1 carried it)
        rh = await cluster.client("r", ClientConfig()).open_ledger(lh.id, password=PW,
                                                                   recovery=False)
        polls = _polls(cluster, "r")
        poll = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(1, timeout=5.0))
        await asyncio.sleep(0.1)
        assert not poll.done()
        await lh.append(b"e2")  # carries LAC 1
        entry = await asyncio.wait_for(poll, 5.0)
        assert entry is not None and (entry.entry_id, entry.data) == (1, b"e1")
        ensemble = lh.metadata.last_ensemble
        # one request, to the first bookie of entry 2's write set (it holds entry 1 too and
        # is among the first to hear that entry 1 is confirmed): the entry came in its answer
        assert [b for _t, b, _w in polls] == [ensemble[2 % 3]]
        await lh.close()

    sim_cluster.run(scenario)


def test_a_parallel_poll_asks_every_bookie_of_the_ensemble(sim_cluster: Any) -> None:
    async def scenario(cluster: Any) -> None:
        lh = await _ledger(cluster, 2)
        config = ClientConfig(long_poll_parallel=True)
        rh = await cluster.client("r", config).open_ledger(lh.id, password=PW, recovery=False)
        polls = _polls(cluster, "r")
        poll = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(1, timeout=5.0))
        await asyncio.sleep(0.1)
        await lh.append(b"e2")
        entry = await asyncio.wait_for(poll, 5.0)
        assert entry is not None and entry.data == b"e1"
        assert sorted(b for _t, b, _w in polls) == sorted(lh.metadata.last_ensemble)
        # the call's own choice wins over the configuration's
        polls.clear()
        poll = asyncio.ensure_future(
            rh.read_last_add_confirmed_and_entry(2, timeout=5.0, parallel=False))
        await asyncio.sleep(0.1)
        await lh.append(b"e3")
        assert (await asyncio.wait_for(poll, 5.0)).data == b"e2"  # type: ignore[union-attr]
        assert len(polls) == 1
        await lh.close()

    sim_cluster.run(scenario)


def test_a_sequential_poll_fails_over_past_a_stopped_bookie(sim_cluster: Any) -> None:
    async def scenario(cluster: Any) -> None:
        lh = await _ledger(cluster, 2, e=3, qw=3)
        rh = await cluster.client("r").open_ledger(lh.id, password=PW, recovery=False)
        ensemble = lh.metadata.last_ensemble
        first = ensemble[2 % 3]
        await cluster.crash_bookie(first)  # connection refused: the next bookie at once
        polls = _polls(cluster, "r")
        poll = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(1, timeout=5.0))
        await asyncio.sleep(0.1)
        assert [b for _t, b, _w in polls] == [first, ensemble[0]]
        assert not poll.done()
        await lh.append(b"e2")  # (on a new ensemble in place of the crashed bookie)
        entry = await asyncio.wait_for(poll, 5.0)
        assert entry is not None and entry.data == b"e1"

    sim_cluster.with_options(bookies=4).run(scenario)


def test_a_sequential_poll_speculates_past_a_silent_bookie(sim_cluster: Any) -> None:
    """A bookie that never answers (a partition that drops its traffic) is looked past
    ``speculative_read_delay`` after the poll's timeout: the next bookie is asked then (with
    no wait left: a probe answered at once), not after the transport's own read timeout."""

    async def scenario(cluster: Any) -> None:
        lh = await _ledger(cluster, 3, e=3, qw=3)  # LAC 1 on the bookies
        config = ClientConfig(speculative_read_delay=0.5, read_timeout=30.0)
        rh = await cluster.client("r", config).open_ledger(lh.id, password=PW,
                                                           recovery=False)
        await rh.read(0, 1)
        ensemble = lh.metadata.last_ensemble
        first = ensemble[3 % 3]
        cluster.network.block(first, "r")  # its answers never come back
        polls = _polls(cluster, "r")
        loop = asyncio.get_running_loop()
        started = loop.time()
        # entry 2 is written but not yet known confirmed: a later add makes it so
        poll = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(2, timeout=2.0))
        await asyncio.sleep(0.1)
        await lh.append(b"e3")  # carries LAC 2
        entry = await asyncio.wait_for(poll, 10.0)
        assert entry is not None and entry.data == b"e2"
        assert [b for _t, b, _w in polls] == [first, ensemble[1]]
        asked_again = polls[1][0] - started
        assert 2.5 <= asked_again < 2.6, asked_again  # timeout + speculative delay
        assert polls[1][2] == 0  # a probe: the poll's time is up
        await lh.close()

    sim_cluster.with_options(bookies=3).run(scenario)


def test_a_sequential_poll_that_times_out_moves_its_next_poll_on(sim_cluster: Any) -> None:
    """A poll answered empty at its timeout returns None after one request; the handle's next
    poll starts at the next bookie, so one bookie whose LAC lags (here: the writer's LAC
    writes to it are lost) cannot hold a tailing reader back while the others know more."""

    async def scenario(cluster: Any) -> None:
        lh = await _ledger(cluster, 3, e=3, qw=3)
        config = ClientConfig(speculative_read_delay=0)
        rh = await cluster.client("r", config).open_ledger(lh.id, password=PW,
                                                           recovery=False)
        polls = _polls(cluster, "r")
        assert await rh.read_last_add_confirmed_and_entry(5, timeout=1.0) is None
        assert await rh.read_last_add_confirmed_and_entry(5, timeout=1.0) is None
        assert await rh.read_last_add_confirmed_and_entry(5, timeout=1.0) is None
        ensemble = lh.metadata.last_ensemble
        # one request per poll, each to another bookie, each waiting its whole timeout
        assert [(b, w) for _t, b, w in polls] == [
            (ensemble[0], 1.0), (ensemble[1], 1.0), (ensemble[2], 1.0)]
        await lh.close()

    sim_cluster.with_options(bookies=3).run(scenario)


def test_tail_follows_a_writer_with_sequential_polls_one_request_per_entry(
        sim_cluster: Any) -> None:
    """A tailing reader following a steady writer sends about one long poll per entry one
    bookie at a time, against one per bookie of the ensemble in parallel, and both read
    every entry in order."""

    async def follow(cluster: Any, parallel: bool, name: str) -> tuple[list[bytes], int]:
        lh = await cluster.client(f"w{name}").create_ledger(5, 3, 2, password=PW)
        config = ClientConfig(long_poll_parallel=parallel, long_poll_timeout=1.0)
        rh = await cluster.client(name, config).open_ledger(lh.id, password=PW,
                                                            recovery=False)
        polls = _polls(cluster, name)
        got: list[bytes] = []

        async def tail() -> None:
            async for entry in rh.tail(0):
                got.append(entry.data)

        follower = asyncio.ensure_future(tail())
        for i in range(40):
            await lh.append(b"t%d" % i)
            await asyncio.sleep(0.05)
        await lh.close()
        await asyncio.wait_for(follower, 10.0)
        return got, len(polls)

    async def scenario(cluster: Any) -> None:
        want = [b"t%d" % i for i in range(40)]
        got_seq, sequential = await follow(cluster, False, "rs")
        got_par, parallel = await follow(cluster, True, "rp")
        assert got_seq == want and got_par == want
        assert sequential <= 50, sequential
        assert parallel >= 4 * sequential, (parallel, sequential)

    sim_cluster.with_options(bookies=5).run(scenario)


def test_bad_long_poll_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="long_poll_parallel must be a bool"):
        ClientConfig(long_poll_parallel="yes")  # type: ignore[arg-type]


def test_a_bad_parallel_argument_is_refused_before_anything_is_sent(sim_cluster: Any) -> None:
    async def scenario(cluster: Any) -> None:
        lh = await _ledger(cluster, 1)
        rh = await cluster.client("r").open_ledger(lh.id, password=PW, recovery=False)
        polls = _polls(cluster, "r")
        with pytest.raises(TypeError, match="parallel must be a bool or None"):
            await rh.read_last_add_confirmed_and_entry(1, 1.0, parallel="all")  # type: ignore[arg-type]
        assert polls == []
        await lh.close()

    sim_cluster.run(scenario)
