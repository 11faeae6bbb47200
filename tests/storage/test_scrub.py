"""The local scrubber (issue 34, item 8): damage to a sealed segment is found in the
background, without a reader, reported once per entry, and forgotten once repaired."""

from __future__ import annotations

import asyncio

from storage_kit import KEY, body, fill, open_store

from pybk.storage import MemFileSystem
from pybk.storage.scrub import Scrubber


async def test_a_flipped_bit_and_a_deleted_segment_are_found_without_a_reader() -> None:
    fs = MemFileSystem()
    s = await open_store(fs)
    await fill(s, 1, range(200))  # several 4 KiB segments
    seen: list[tuple[int, int]] = []
    scrubber = Scrubber(s, rate=1 << 30, slice_bytes=4096,
                        on_damage=lambda lid, eid, _what: seen.append((lid, eid)))
    assert await scrubber.run_once() == {} and scrubber.checked == 200
    loc = s.index.ledgers[1].location(7)
    assert loc is not None
    fs.flip_bit(s.journal_path(loc.seg), loc.offset + loc.size - 1)
    found = await scrubber.run_once()
    assert list(found) == [(1, 7)] and seen == [(1, 7)] and (1, 7) in s.damaged
    await scrubber.run_once()
    assert seen == [(1, 7)]  # reported once
    # a repair: the same bytes added again replace the damaged copy
    await s.add(1, 7, body(1, 7), KEY)
    assert await scrubber.run_once() == {} and not s.damaged
    # a sealed segment deleted under the running store: its entries are reported
    seg = s.index.ledgers[1].location(0)
    assert seg is not None
    fs.delete(s.journal_path(seg.seg))
    found = await scrubber.run_once()
    held_there = [e for e in range(200)
                  if (loc2 := s.index.ledgers[1].location(e)) and loc2.seg == seg.seg]
    assert sorted(e for _l, e in found) == held_there and held_there


async def test_the_rate_bounds_a_pass() -> None:
    s = await open_store(MemFileSystem())
    await fill(s, 1, range(100))
    total = sum(loc[2] for _e, loc in s.index.ledgers[1].entries.items())
    scrubber = Scrubber(s, rate=total * 4, slice_bytes=total // 4)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await scrubber.run_once()
    assert loop.time() - began >= 0.15  # ~3 slices waited out at 4x the bytes a second
