"""Sticky reads (``ClientConfig(sticky_reads=True)``, BookKeeper's ``stickyReadsEnabled``):
with ensemble size == write quorum a reader reads from one bookie while it answers, moves to
the next one when it dies, and spreads its reads as before when the knob is off or E > Qw."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from pybk.client.context import ClientConfig
from pybk.wire import ReadBatchRequest, ReadRequest, Request

from .conftest import FAST, mem_cluster

pytestmark = pytest.mark.timeout(60)

STICKY = dataclasses.replace(FAST, sticky_reads=True)


def _count_reads(cluster, ledger_id: int) -> Counter[str]:  # type: ignore[no-untyped-def]
    seen: Counter[str] = Counter()

    async def count(bookie: str, request: Request) -> None:
        seen[bookie] += 1

    def is_read(bookie: str, request: Request) -> bool:
        return (isinstance(request, ReadRequest | ReadBatchRequest)
                and request.ledger_id == ledger_id and not getattr(request, "fence", False))

    cluster.transport.hooks.before(None, count, predicate=is_read)
    return seen


async def _ledger(cluster, e: int, qw: int, n: int = 40) -> int:  # type: ignore[no-untyped-def]
    lh = await cluster.client().create_ledger(e, qw, 2)
    await lh.append_many([b"e%d" % i for i in range(n)])
    await lh.close()
    return lh.id


async def test_reads_stick_to_one_bookie_and_move_on_when_it_dies() -> None:
    async with mem_cluster(3) as cluster:
        ledger_id = await _ledger(cluster, 3, 3)
        rh = await cluster.client(config=STICKY).open_ledger(ledger_id)
        assert rh.sticky is not None
        seen = _count_reads(cluster, ledger_id)
        for first in range(0, 40, 10):
            got = await rh.read(first, first + 9)
            assert [e.data for e in got] == [b"e%d" % i for i in range(first, first + 10)]
        assert len(seen) == 1 and sum(seen.values()) == 40, seen
        (sticky,) = seen
        await cluster.stop_bookie(sticky)
        seen.clear()
        for first in range(0, 40, 10):
            got = await rh.read(first, first + 9)
            assert [e.data for e in got] == [b"e%d" % i for i in range(first, first + 10)]
        assert rh.sticky.switches == 1
        survivors = {b: n for b, n in seen.items() if b != sticky}
        assert len(survivors) == 1, seen  # after the failed ones, one bookie again
        ensemble = rh.metadata.ensembles[0]
        assert list(survivors) == [ensemble[(ensemble.index(sticky) + 1) % 3]]
        assert seen[sticky] <= 10  # only the first read after the death went there


async def test_without_the_knob_or_with_e_above_qw_reads_spread() -> None:
    async with mem_cluster(3) as cluster:
        ledger_id = await _ledger(cluster, 3, 3)
        rh = await cluster.client().open_ledger(ledger_id)
        assert rh.sticky is None
        seen = _count_reads(cluster, ledger_id)
        await rh.read(0, 39)
        assert len(seen) == 3, seen
        striped = await _ledger(cluster, 3, 2)
        rh2 = await cluster.client(config=STICKY).open_ledger(striped)
        assert rh2.sticky is None  # not every bookie holds every entry
        assert len(await rh2.read(0, 39)) == 40


def test_the_knob_takes_a_bool() -> None:
    with pytest.raises(TypeError, match="sticky_reads must be a bool"):
        ClientConfig(sticky_reads="yes")  # type: ignore[arg-type]
