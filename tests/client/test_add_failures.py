"""No failure on the add path leaves an append or ``close()`` hanging (issue: a writer stuck by
one oversized entry).

* An entry over ``ClientConfig.max_entry_size`` is refused with EntryTooLargeError (also a
  ValueError) *before* an entry id is taken: the next append gets the id it would have had,
  and the ledger closes. The limit is the same in process and over TCP (the default fits one
  default-sized frame) and configurable.
* A property test injects one failure at each point of the add path (the transport refusing
  or raising, a bookie that never answers, a bookie raising, an fsync failure, a bookie
  crash, the metadata store failing the ensemble change, no spare bookie, a fence, a bug in
  the reply handling) with appends before and after it: every future settles, within a
  bound, and ``close()`` returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pybk.client.context import DEFAULT_MAX_ENTRY_SIZE, ClientConfig
from pybk.errors import (
    BKError,
    EntryTooLargeError,
    IOBookieError,
    MetadataStoreError,
)
from pybk.metadata.memory import MemoryMetadataStore
from pybk.transport.base import Transport
from pybk.wire import AddCallback, AddLike, FenceRequest, Request, Response, master_key

from .conftest import FAST, mem_cluster

pytestmark = pytest.mark.timeout(120)


async def test_an_oversized_entry_is_refused_before_its_id_is_taken() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        assert await lh.append(b"a") == 0
        with pytest.raises(EntryTooLargeError, match="max_entry_size") as info:
            lh.append(b"x" * (DEFAULT_MAX_ENTRY_SIZE + 1))
        assert isinstance(info.value, ValueError)
        assert lh.last_add_pushed == 0  # no id taken
        with pytest.raises(EntryTooLargeError):
            await lh.append_many([b"ok", b"x" * (DEFAULT_MAX_ENTRY_SIZE + 1)])
        assert lh.last_add_pushed == 0  # not even the good one before it
        assert await lh.append(b"b") == 1
        assert await lh.append(b"x" * DEFAULT_MAX_ENTRY_SIZE) == 2  # the limit itself fits
        await asyncio.wait_for(lh.close(), 10)
        assert (await cluster.client().ledger_metadata(lh.id)).last_entry_id == 2


async def test_the_limit_is_configurable() -> None:
    async with mem_cluster(3) as cluster:
        small = dataclasses.replace(FAST, max_entry_size=1000)
        lh = await cluster.client(config=small).create_ledger(3, 3, 2)
        assert await lh.append(b"x" * 1000) == 0
        with pytest.raises(EntryTooLargeError, match="1000"):
            lh.append(b"x" * 1001)
        assert await lh.append(b"y") == 1
        await lh.close()
    with pytest.raises(ValueError, match="max_entry_size"):
        ClientConfig(max_entry_size=0)


async def test_over_tcp_the_same_limit_and_a_smaller_frame_cap_never_hangs() -> None:
    """Over TCP the default limit fits the default frame; a transport whose frame cap is
    below the client's limit fails the writer at once (the entry's id was taken), never
    hangs it."""
    from pybk.bookie import Bookie
    from pybk.client import Client
    from pybk.metadata.base import BookieRegistration
    from pybk.storage.memfs import MemFileSystem
    from pybk.transport.server import BookieServer
    from pybk.transport.tcp import TcpTransport

    store = MemoryMetadataStore()
    servers: dict[str, BookieServer] = {}
    bookies = []
    for i in range(3):
        bookie = Bookie(f"b{i}", "/b", fs=MemFileSystem())
        await bookie.start()
        bookies.append(bookie)
        server = servers[f"b{i}"] = BookieServer(bookie.handle, add=bookie.add_request)
        await server.start()
        await store.register_bookie(BookieRegistration(f"b{i}", ""))

    async def resolve(bookie_id: str) -> str:
        host, port = servers[bookie_id].address
        return f"{host}:{port}"

    try:
        tcp = TcpTransport(resolve)
        client = Client(store, transport=tcp, config=FAST)
        lh = await client.create_ledger(3, 2, 2)
        big = b"x" * DEFAULT_MAX_ENTRY_SIZE
        assert await asyncio.wait_for(lh.append(big), 30) == 0
        with pytest.raises(EntryTooLargeError):
            lh.append(big + b"!")
        assert lh.last_add_pushed == 0
        await asyncio.wait_for(lh.close(), 30)
        await tcp.close()

        small_frames = TcpTransport(resolve, max_frame=64 * 1024)
        client = Client(store, transport=small_frames, config=FAST)
        lh = await client.create_ledger(3, 2, 2)
        assert await lh.append(b"fits") == 0
        fut = lh.append(b"x" * 100_000)  # under max_entry_size, over this transport's frames
        with pytest.raises(EntryTooLargeError):
            await asyncio.wait_for(fut, 10)
        with pytest.raises(EntryTooLargeError):
            lh.append(b"later")  # the writer failed: it says so at once
        await asyncio.wait_for(lh.close(), 10)
        await small_frames.close()
    finally:
        for server in servers.values():
            await server.stop(grace=0)
        for bookie in bookies:
            bookie.crash()


# ------------------------------------------------------------------ one failure, any point

POINTS = [
    "transport_refuses",  # add answers BookieUnavailableError at once
    "transport_raises_bkerror",  # add raises (a transport breaking its contract)
    "transport_raises_bug",  # add raises something nobody expected
    "never_answers",  # the request is lost: the transport's timeout answers
    "bookie_raises",  # the bookie's add path raises
    "fsync_fails",  # the journal's fsync fails on one bookie
    "bookie_crashes",  # a bookie dies with adds in flight
    "change_store_fails",  # the ensemble change's metadata write fails
    "no_spare",  # no bookie left to replace a failed one
    "fenced",  # another client fences the ledger
    "reply_bug",  # handling a reply raises (a bug in the client)
]


class FaultyTransport(Transport):
    """Wraps a transport; ``arm(point)`` makes the next add to ``victim`` fail that way."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.point: str | None = None
        self.victim: str | None = None

    def send(self, bookie_id: str, request: Request,
             timeout: float | None = None) -> asyncio.Future[Response]:
        return self.inner.send(bookie_id, request, timeout)

    def add(self, bookie_id: str, request: AddLike, on_done: AddCallback,
            timeout: float | None = None) -> None:
        point = self.point
        if point is not None and bookie_id == self.victim:
            self.point = None
            if point == "transport_refuses":
                from pybk.errors import BookieUnavailableError

                on_done(BookieUnavailableError("refused (injected)"))
                return
            if point == "transport_raises_bkerror":
                raise IOBookieError("raised (injected)")
            if point == "transport_raises_bug":
                raise RuntimeError("a bug (injected)")
            if point == "never_answers":
                self.inner.add(bookie_id, request, lambda outcome: None, None)
                loop = asyncio.get_running_loop()
                from pybk.errors import TimeoutError

                loop.call_later(timeout or 1.0, on_done, TimeoutError("lost (injected)"))
                return
        self.inner.add(bookie_id, request, on_done, timeout)

    async def close(self) -> None:
        await self.inner.close()


async def _scenario(point: str, before: int, after: int, many: bool, quorum: tuple[int, ...],
                    spares: int) -> None:
    store = MemoryMetadataStore()
    config = dataclasses.replace(FAST, add_timeout=0.5)
    async with mem_cluster(["b0", "b1", "b2", "b3", "b4"][:3 + spares], metadata=store,
                           client_config=config) as cluster:
        faulty = FaultyTransport(cluster.transport)
        client = cluster.client(transport=faulty)
        lh = await client.create_ledger(*quorum)
        victim = lh.metadata.ensembles[0][0]
        futures: list[asyncio.Future[Any]] = []

        def push(n: int) -> None:
            for i in range(n):
                try:
                    if many and i % 2:
                        futures.append(lh.append_many_nowait([b"m%d" % i, b"n%d" % i]))
                    else:
                        futures.append(lh.append(b"e%d" % i))
                except BKError:
                    return  # the writer failed: refused at once, nothing taken

        push(before)
        await asyncio.sleep(0)
        bookie = cluster.bookie(victim)
        if point in ("transport_refuses", "transport_raises_bkerror", "transport_raises_bug",
                     "never_answers"):
            faulty.point, faulty.victim = point, victim
        elif point == "bookie_raises":
            def boom(request: object, on_done: object) -> None:
                raise RuntimeError("the bookie's add path raised (injected)")
            bookie.add_request = boom  # type: ignore[method-assign]
        elif point == "fsync_fails":
            cluster._fs.fail_next_fsync()  # type: ignore[union-attr]
        elif point == "bookie_crashes":
            bookie.fs.sync_delay = 0.01
        elif point == "change_store_fails":
            async def fail_writes(op: str, key: object) -> None:
                if op == "write_ledger":
                    raise MetadataStoreError("the store failed (injected)")
            store.before_op = fail_writes
            faulty.point, faulty.victim = "transport_refuses", victim
        elif point == "no_spare":
            for spare in cluster.bookie_ids:
                if spare not in lh.metadata.ensembles[0]:
                    await cluster.stop_bookie(spare)
            faulty.point, faulty.victim = "transport_refuses", victim
        elif point == "fenced":
            fence = await faulty.send(victim, FenceRequest(lh.id, master_key(b"")), 5)
            assert fence.status == 0
        elif point == "reply_bug":
            core = lh._pipeline.core
            real = core.on_reply
            calls = [0]

            def buggy(send: Any, outcome: Any) -> None:
                calls[0] += 1
                if calls[0] == 1:
                    raise RuntimeError("a bug handling a reply (injected)")
                real(send, outcome)
            core.on_reply = buggy  # type: ignore[method-assign]
        push(after)
        if point == "bookie_crashes":
            await asyncio.sleep(0.002)
            await cluster.stop_bookie(victim)
        done, pending = await asyncio.wait(futures, timeout=20) if futures else ((), ())
        assert not pending, f"{point}: {len(pending)} appends left hanging"
        for fut in done:
            fut.exception()  # every future settled (with its id or an error)
        try:
            await asyncio.wait_for(lh.close(), 20)  # returns (or says why it cannot close)
        except BKError:
            assert point == "change_store_fails", point  # (the store still fails)
        lh._check()


@given(point=st.sampled_from(POINTS), before=st.integers(0, 5), after=st.integers(1, 6),
       many=st.booleans(), quorum=st.sampled_from([(3, 2, 2), (3, 3, 2), (3, 3, 3)]),
       spares=st.integers(0, 1))
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_a_failure_at_any_point_of_the_add_path_settles_every_future(
        point: str, before: int, after: int, many: bool, quorum: tuple[int, ...],
        spares: int) -> None:
    asyncio.run(_scenario(point, before, after, many, quorum, spares))
