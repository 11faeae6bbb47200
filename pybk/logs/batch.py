"""The writer's records in flight: sealed batches and the futures their acknowledgements resolve.

A record appended alone has its own future; the records of one ``append_many`` call share one
:class:`Group`. A :class:`Batch` is the records sealed into one envelope (one ledger entry),
with one sink (future or group) per record. They live apart from :mod:`pybk.logs.writer` so
the writer's appending side (:mod:`pybk.logs.appends`) and its failure paths share them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from itertools import repeat
from typing import Any

from pybk.errors import fresh_copy
from pybk.logs.position import Position

__all__ = ["Batch", "Group", "Sink", "fail_sinks"]

_new_tuple = tuple.__new__


class Group:
    """The one future of an ``append_many`` call: collects its records' positions in order
    (envelopes are acknowledged in order, and records in slot order within one).

    Its records sit in an envelope as one run of consecutive slots (more than one run only
    when another call's records came in between, through the checked path), so the writer
    resolves a run at once: :meth:`resolve` makes the run's positions in C (no Python step
    per record), and the future is set when the last run is in."""

    __slots__ = ("count", "fut", "positions")

    def __init__(self, fut: asyncio.Future[list[Position]], count: int) -> None:
        self.fut = fut
        self.positions: list[Position] = []
        self.count = count

    def resolve(self, seq: int, eid: int, start: int, stop: int) -> None:
        """Slots ``start..stop-1`` of entry ``eid`` of segment ``seq`` are this call's next
        records (acknowledged)."""
        n = stop - start
        parts = zip(repeat(seq, n), repeat(eid, n), range(start, stop), strict=True)
        self.positions.extend(map(_new_tuple, repeat(Position, n), parts))
        if len(self.positions) >= self.count and not self.fut.done():
            self.fut.set_result(self.positions)

    def done(self) -> bool:
        return self.fut.done()

    def fail(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(fresh_copy(exc))


Sink = Any  # asyncio.Future[Position] | Group (checked by class in the hot loop)


class Batch:
    """Records sealed together: one envelope, one entry.

    ``sinks`` has one item per record: the record's future (``append``) or its call's
    :class:`Group` (``append_many``); ``runs`` lists each group's runs of consecutive slots,
    ``[group, start, stop]``, which is how groups are resolved (the per-record items are only
    for failing them)."""

    __slots__ = ("max_txid", "nbytes", "records", "runs", "serial", "sinks", "txids")

    def __init__(self, records: list[bytes], txids: list[int] | None, sinks: list[Sink],
                 runs: list[list[Any]], nbytes: int, max_txid: int, serial: int) -> None:
        self.records = records
        self.txids = txids
        self.sinks = sinks
        self.runs = runs
        self.nbytes = nbytes
        self.max_txid = max_txid
        self.serial = serial

    def fail(self, exc: BaseException) -> None:
        for sink in self.sinks:
            if sink.__class__ is Group:
                sink.fail(exc)
            elif not sink.done():
                sink.set_exception(fresh_copy(exc))


def fail_sinks(sinks: Sequence[Sink], exc: BaseException) -> None:
    """Fail each record's future (or its call's group) with a copy of ``exc``."""
    for sink in sinks:
        if sink.__class__ is Group:
            sink.fail(exc)
        elif not sink.done():
            sink.set_exception(fresh_copy(exc))

