"""The client's cache of offloaded data (pybk.logs.tier_cache): spans assembled from aligned
blocks, one ranged read per block however many readers ask at once, bounded in bytes (least
recently used first), failures not cached, a cancelled fetch taken over; and two readers of
an offloaded log reading each block from the tier once."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from logs_kit import mem_cluster

from pybk.logs.tier_cache import TierReadCache

pytestmark = pytest.mark.timeout(60)

DATA = bytes(random.Random(5).randbytes(10_000))


class Tier:
    """A tier holding one object; counts its ranged reads, can fail or hold them."""

    url = "test://tier"

    def __init__(self) -> None:
        self.reads: list[tuple[int, int]] = []
        self.fail: Exception | None = None
        self.gate: asyncio.Event | None = None

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        self.reads.append((start, end))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return DATA[start:end]


async def test_spans_come_from_aligned_blocks_each_read_once() -> None:
    tier, cache = Tier(), TierReadCache(capacity=10_000, block=1000)
    for start, end in [(0, 10), (990, 2010), (5, 999), (9_990, 10_000), (0, 10_000)]:
        assert await cache.read(tier, "p", start, end, len(DATA)) == DATA[start:end]
    assert sorted(tier.reads) == [(b * 1000, b * 1000 + 1000) for b in range(10)]
    assert cache.fetches == 10 and cache.bytes == 10_000
    assert await cache.read(tier, "p", 10, 10, len(DATA)) == b""
    with pytest.raises(ValueError, match="bad span"):
        await cache.read(tier, "p", 10, 10_001, len(DATA))


async def test_readers_asking_at_once_share_one_read() -> None:
    tier, cache = Tier(), TierReadCache(block=4096)
    tier.gate = asyncio.Event()
    readers = [asyncio.ensure_future(cache.read(tier, "p", i, i + 100, len(DATA)))
               for i in range(0, 4000, 400)]
    await asyncio.sleep(0)
    tier.gate.set()
    got = await asyncio.gather(*readers)
    assert got == [DATA[i:i + 100] for i in range(0, 4000, 400)]
    assert tier.reads == [(0, 4096)]


async def test_the_cache_is_bounded_least_recently_used_first() -> None:
    tier, cache = Tier(), TierReadCache(capacity=2000, block=1000)
    for b in (0, 1, 0, 2):  # 0 used again: 1 is the least recently used when 2 comes
        await cache.read(tier, "p", b * 1000, b * 1000 + 1, len(DATA))
    assert cache.bytes <= 2000
    tier.reads.clear()
    await cache.read(tier, "p", 0, 1, len(DATA))
    await cache.read(tier, "p", 1000, 1001, len(DATA))
    assert tier.reads == [(1000, 2000)]  # 0 stayed, 1 went


async def test_a_failed_read_reaches_every_waiter_and_is_not_kept() -> None:
    tier, cache = Tier(), TierReadCache(block=1000)
    tier.gate, tier.fail = asyncio.Event(), FileNotFoundError("p")
    readers = [asyncio.ensure_future(cache.read(tier, "p", 0, 10, len(DATA))) for _ in range(3)]
    await asyncio.sleep(0)
    tier.gate.set()
    got = await asyncio.gather(*readers, return_exceptions=True)
    assert all(isinstance(e, FileNotFoundError) for e in got)
    tier.fail = None
    assert await cache.read(tier, "p", 0, 10, len(DATA)) == DATA[:10]
    assert len(tier.reads) == 2


async def test_a_cancelled_fetch_is_taken_over_by_a_waiting_reader() -> None:
    tier, cache = Tier(), TierReadCache(block=1000)
    tier.gate = asyncio.Event()
    first = asyncio.ensure_future(cache.read(tier, "p", 0, 10, len(DATA)))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(cache.read(tier, "p", 5, 15, len(DATA)))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    tier.gate.set()
    assert await asyncio.wait_for(second, 5) == DATA[5:15]
    assert len(tier.reads) == 2


async def test_two_readers_of_an_offloaded_log_read_each_block_once(tmp_path: Path) -> None:
    from pybk.logs.tier_access import open_threaded_tier

    reads: list[tuple[int, int]] = []

    class Counting:
        def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
            self.inner = inner

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self.inner, name)

        async def read_range(self, path: str, start: int, end: int) -> bytes:
            reads.append((start, end))
            return await self.inner.read_range(path, start, end)

    async def opener(url, options):  # type: ignore[no-untyped-def]
        return Counting(await open_threaded_tier(url, options))

    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace(tiers=opener).create_log("l")
        async with await log.writer() as w:
            last = (await w.append_many([b"x" * 1000 for _ in range(3000)]))[-1]
        await log.set_offload(f"file://{tmp_path}", deletion_lag=0)
        assert await log.offload() == [1]

        async def read_all() -> int:
            async with log.reader(stop_at=last) as r:
                return sum([1 async for _ in r])

        assert await asyncio.gather(read_all(), read_all()) == [3000, 3000]
        blocks = sorted(set(reads))
        assert len(reads) == len(blocks) >= 3  # ~3 MB: each 1 MiB block read once
        assert TierReadCache.of(client).bytes <= TierReadCache.of(client).capacity
