"""LocalTransport and its hooks, against real bookies."""

from __future__ import annotations

import asyncio
import builtins

import pytest

from pybk.errors import BookieUnavailableError, ClientClosedError, TimeoutError
from pybk.wire import (
    BookieInfoRequest,
    BookieInfoResponse,
    ListEntriesRequest,
    Op,
    ReadRequest,
    Request,
    Status,
)

from .conftest import mem_cluster

INFO = BookieInfoRequest()


async def test_delivers_and_maps_unreachable_bookies() -> None:
    async with mem_cluster(["b1", "b2"]) as cluster:
        t = cluster.local_transport()
        resp = await t.send("b1", INFO, 5)
        assert isinstance(resp, BookieInfoResponse) and resp.bookie_id == "b1"
        with pytest.raises(BookieUnavailableError, match="nope"):
            await t.send("nope", INFO, 5)
        await cluster.stop_bookie("b2")
        with pytest.raises(BookieUnavailableError, match="b2"):
            await t.send("b2", INFO, 5)
        await t.close()
        with pytest.raises(ClientClosedError):
            await t.send("b1", INFO, 5)


async def test_drop_times_out() -> None:
    async with mem_cluster(["b1"]) as cluster:
        t = cluster.local_transport()
        rule = t.hooks.drop("b1", op=Op.BOOKIE_INFO, times=1)
        with pytest.raises(TimeoutError, match=r"within 0\.05s") as info:
            await t.send("b1", INFO, 0.05)
        assert isinstance(info.value, builtins.TimeoutError)
        assert rule.matched == 1
        assert (await t.send("b1", INFO, 0.05)).status == Status.OK  # the rule retired


async def test_fail_with_status_unavailable_or_timeout() -> None:
    async with mem_cluster(["b1"]) as cluster:
        t = cluster.local_transport()
        t.hooks.fail("b1", status=Status.IO_ERROR, times=1)
        t.hooks.unavailable("b1", times=1)
        t.hooks.fail("b1", status=Status.TIMEOUT, times=1)
        resp = await t.send("b1", ListEntriesRequest(1), 5)
        assert resp.status == Status.IO_ERROR and "injected" in resp.message
        with pytest.raises(BookieUnavailableError):
            await t.send("b1", INFO, 5)
        with pytest.raises(TimeoutError):
            await t.send("b1", INFO, 5)
        assert (await t.send("b1", INFO, 5)).status == Status.OK


async def test_hold_release_fail_and_drop_held() -> None:
    async with mem_cluster(["b1"]) as cluster:
        t = cluster.local_transport()
        hold = t.hooks.hold("b1", op=Op.READ)
        futs = [t.send("b1", ReadRequest(9, e), 30 if e < 3 else 0.1) for e in range(4)]
        other = await t.send("b1", INFO, 5)  # not matched: delivered at once
        assert other.status == Status.OK
        await hold.wait_held(4)
        assert [h.request.entry_id for h in hold.held] == [0, 1, 2, 3]  # type: ignore[union-attr]
        assert hold.release(1) == 1
        assert (await futs[0]).status == Status.NO_SUCH_LEDGER
        assert hold.fail_held(Status.CORRUPT, n=1) == 1
        assert (await futs[1]).status == Status.CORRUPT
        assert hold.fail_held(None, n=1) == 1
        with pytest.raises(BookieUnavailableError):
            await futs[2]
        assert hold.drop_held() == 1
        with pytest.raises(TimeoutError):
            await futs[3]
        hold.remove()
        assert (await t.send("b1", ReadRequest(9, 0), 5)).status == Status.NO_SUCH_LEDGER


async def test_before_callback_runs_first() -> None:
    async with mem_cluster(["b1"]) as cluster:
        t = cluster.local_transport()
        gate = asyncio.Event()
        seen: list[tuple[str, Request]] = []

        async def wait_gate(bookie: str, req: Request) -> None:
            seen.append((bookie, req))
            await gate.wait()

        t.hooks.before("b1", wait_gate, op=Op.BOOKIE_INFO)
        fut = t.send("b1", INFO, 5)
        await asyncio.sleep(0)
        assert seen == [("b1", INFO)] and not fut.done()
        gate.set()
        assert (await fut).status == Status.OK

        async def broken(bookie: str, req: Request) -> None:
            raise RuntimeError("hook bug")

        t.hooks.clear()
        t.hooks.before("b1", broken)
        with pytest.raises(BookieUnavailableError, match="hook failed"):
            await t.send("b1", INFO, 5)


async def test_wait_matched_is_bounded() -> None:
    async with mem_cluster(["b1"]) as cluster:
        t = cluster.local_transport()
        rule = t.hooks.fail("b1", op=Op.ADD)
        with pytest.raises(builtins.TimeoutError):
            await rule.wait_matched(1, timeout=0.01)
