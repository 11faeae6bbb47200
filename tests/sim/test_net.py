"""SimNetwork: each fault shows up to the caller exactly as the Transport contract says."""

from __future__ import annotations

import asyncio
import random

import pytest

from pybk.errors import BookieUnavailableError
from pybk.errors import TimeoutError as BKTimeoutError
from pybk.sim.loop import run
from pybk.sim.net import NetConfig, SimNetwork
from pybk.wire import ReadRequest, Request, Response, Status, error_response


class EchoBookie:
    """Answers every request OK after ``delay`` and remembers what it received."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.received: list[int] = []

    async def handle(self, req: Request) -> Response:
        assert isinstance(req, ReadRequest)
        self.received.append(req.entry_id)
        if self.delay:
            await asyncio.sleep(self.delay)
        return error_response(req, Status.OK)


def net_with(bookie: EchoBookie, **cfg: float) -> SimNetwork:
    counts: dict[str, int] = {}
    net = SimNetwork(random.Random(1), NetConfig(**cfg),
                     count=lambda k: counts.__setitem__(k, counts.get(k, 0) + 1))
    net.counts = counts  # type: ignore[attr-defined]
    net.set_bookie("b0", bookie.handle)
    return net


def test_requests_are_answered_in_order_with_latency() -> None:
    async def main() -> list[int]:
        bookie = EchoBookie()
        net = net_with(bookie)
        t = net.endpoint("c")
        futs = [t.send("b0", ReadRequest(1, i), 1.0) for i in range(20)]
        resps = await asyncio.gather(*futs)
        assert all(r.status == Status.OK for r in resps)
        assert asyncio.get_running_loop().time() > 0
        return bookie.received

    assert run(main()) == list(range(20))


def test_dropped_request_is_a_timeout() -> None:
    async def main() -> None:
        net = net_with(EchoBookie(), drop=1.0)
        with pytest.raises(BKTimeoutError):
            await net.endpoint("c").send("b0", ReadRequest(1, 0), 0.5)
        assert asyncio.get_running_loop().time() == pytest.approx(0.5)
        assert net.counts["drop"] == 1  # type: ignore[attr-defined]

    run(main())


def test_corrupt_frame_resets_the_connection() -> None:
    async def main() -> None:
        net = net_with(EchoBookie(), corrupt=1.0)
        with pytest.raises(BookieUnavailableError, match="corrupt"):
            await net.endpoint("c").send("b0", ReadRequest(1, 0), 5.0)

    run(main())


def test_reset_fails_every_pending_request_on_the_connection() -> None:
    async def main() -> None:
        net = net_with(EchoBookie(delay=1.0))
        t = net.endpoint("c")
        futs = [t.send("b0", ReadRequest(1, i), 5.0) for i in range(3)]
        await asyncio.sleep(0.1)
        net.set_bookie("b0", None)  # the bookie process dies
        for f in futs:
            with pytest.raises(BookieUnavailableError):
                await f
        with pytest.raises(BookieUnavailableError, match="refused"):
            await t.send("b0", ReadRequest(1, 9), 5.0)

    run(main())


def test_partition_drops_and_heal_restores() -> None:
    async def main() -> None:
        net = net_with(EchoBookie())
        t = net.endpoint("c")
        net.block("b0", "c")  # asymmetric: requests arrive, answers do not
        with pytest.raises(BKTimeoutError):
            await t.send("b0", ReadRequest(1, 0), 0.5)
        net.heal()
        resp = await t.send("b0", ReadRequest(1, 1), 0.5)
        assert resp.status == Status.OK

    run(main())


def test_duplicate_delivers_twice_but_answers_once() -> None:
    async def main() -> list[int]:
        bookie = EchoBookie()
        net = net_with(bookie, duplicate=1.0)
        resp = await net.endpoint("c").send("b0", ReadRequest(1, 7), 5.0)
        assert resp.status == Status.OK
        await asyncio.sleep(1.0)
        return bookie.received

    assert run(main()) == [7, 7]


def test_pause_holds_traffic_until_resume() -> None:
    async def main() -> None:
        bookie = EchoBookie()
        net = net_with(bookie)
        t = net.endpoint("w")
        net.pause("w")
        fut = t.send("b0", ReadRequest(1, 0), 10.0)
        await asyncio.sleep(3.0)
        assert bookie.received == [] and not fut.done()
        net.resume("w")
        assert (await fut).status == Status.OK

    run(main())


def test_dead_client_never_hears_back() -> None:
    async def main() -> None:
        net = net_with(EchoBookie())
        t = net.endpoint("w")
        net.kill_client("w")
        fut = t.send("b0", ReadRequest(1, 0), 1.0)
        await asyncio.sleep(5.0)
        assert not fut.done()
        fut.cancel()

    run(main())


def test_lost_fence_only_loses_fencing_requests() -> None:
    async def main() -> None:
        net = net_with(EchoBookie())
        net.lose_next_fence["b0"] = 1
        t = net.endpoint("c")
        assert (await t.send("b0", ReadRequest(1, 0), 1.0)).status == Status.OK
        with pytest.raises(BKTimeoutError):
            await t.send("b0", ReadRequest(1, -1, fence=True, master_key=b"k"), 1.0)
        resp = await t.send("b0", ReadRequest(1, -1, fence=True, master_key=b"k"), 1.0)
        assert resp.status == Status.OK

    run(main())
