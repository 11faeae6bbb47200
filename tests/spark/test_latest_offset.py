"""The streaming source's latest offset (``TailFinder.tail``, what ``latestOffset`` asks)
moves past a quiet writer's last record at once: the immediate LAC, not the periodic tick
(set out of reach here). No Spark session: the offset is computed on the driver."""

from __future__ import annotations

import asyncio

from logs_kit import mem_cluster

from pybk.client.context import ClientConfig
from pybk.logs import Position
from pybk.spark.read import TailFinder

SLOW_TICK = ClientConfig(explicit_lac_interval=60.0, speculative_read_delay=0.0,
                         add_timeout=2.0, read_timeout=2.0)


async def _tail_after(immediate: bool, wait: float) -> tuple[Position | None, Position]:
    config = ClientConfig(**{**SLOW_TICK.__dict__, "immediate_lac": immediate})
    async with mem_cluster(3, config=config) as cluster:
        writer, reader = cluster.client(), cluster.client()
        log = await writer.namespace().create_log("s")
        async with await log.writer() as w:
            await w.append(b"first")
            last = await w.append(b"quiet after this one")
            md = await (await reader.namespace().open_log("s")).metadata()
            finder = TailFinder()
            try:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + wait
                while True:  # bounded: the bookies learn the LAC a round trip later
                    tail, _ = await finder.tail(reader, md)
                    if (tail is not None and tail > last) or loop.time() > deadline:
                        return tail, last
                    await asyncio.sleep(0.001)
            finally:
                await finder.close()


async def test_the_latest_offset_covers_a_quiet_writers_last_record() -> None:
    tail, last = await _tail_after(immediate=True, wait=5.0)
    assert tail == Position(last.segment, last.entry, last.slot + 1)


async def test_without_the_immediate_lac_it_waits_for_the_tick() -> None:
    tail, last = await _tail_after(immediate=False, wait=0.5)
    assert tail is not None and tail <= last  # the last record is not visible yet
