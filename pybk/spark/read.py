"""Reading a log in parallel: position ranges cut into one partition per segment (big segments
into entry ranges), each read by a task straight from its ledger.

A range is ``[start, end)`` in positions. For the segments it covers, a partition is a run of
entries of one segment's ledger plus the bounds that apply inside it; the task opens the
ledger without recovery (it never disturbs a writer), reads ``read_ahead`` entries at a time
and turns each envelope into Arrow arrays (:mod:`pybk.spark.arrow`). Entries of the
in-progress segment are read only up to what was acknowledged when the range was planned.
Records before the log's truncation point are never returned; a segment deleted by truncation
or retention before its partition is read fails the task with AlreadyTruncatedError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition

from pybk.errors import AlreadyTruncatedError, NoSuchLedgerError
from pybk.logs import envelope
from pybk.logs.meta import TRUNCATED, LogMetadata, SegmentInfo
from pybk.logs.position import Position
from pybk.spark import runtime
from pybk.spark.arrow import envelope_arrays, read_batch
from pybk.spark.options import SourceOptions

if TYPE_CHECKING:
    from pybk.client import Client
    from pybk.client.reader import ReadHandle

__all__ = ["FIRST", "SegmentRange", "TailFinder", "plan_ranges", "read_partition", "read_range"]

FIRST = Position(1, 0, 0)
#: entries read per request
READ_AHEAD = 16
#: the size assumed for an entry of a segment whose size is not known yet (in progress)
_UNKNOWN_ENTRY_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class SegmentRange(InputPartition):
    """One partition: entries ``first_entry..last_entry`` of segment ``seq`` (ledger
    ``ledger_id``), records at or after ``lower`` and before ``upper`` (positions as tuples,
    or None for no bound)."""

    log: str
    seq: int
    ledger_id: int
    first_entry: int
    last_entry: int
    lower: tuple[int, int, int] | None
    upper: tuple[int, int, int] | None


def plan_ranges(md: LogMetadata, start: Position, end: Position, tail_entry: int,
                max_partition_bytes: int) -> list[SegmentRange]:
    """Partitions for the records in ``[start, end)``. ``tail_entry`` is the last entry of
    the in-progress segment known acknowledged (-1: none)."""
    tb = md.truncated_before
    if tb is not None and start < tb:
        start = tb
    out: list[SegmentRange] = []
    if end <= start:
        return out
    for seg in md.segments:
        if seg.state == TRUNCATED or seg.seq < start.segment or seg.seq > end.segment:
            continue
        last = seg.last_entry if seg.is_completed else tail_entry
        if seg.seq == end.segment:
            last = min(last, end.entry if end.slot > 0 else end.entry - 1)
        first = start.entry if seg.seq == start.segment else 0
        if last < first:
            continue
        per = max(1, max_partition_bytes // _entry_bytes(seg))
        lower = tuple(start) if seg.seq == start.segment else None
        upper = tuple(end) if seg.seq == end.segment else None
        a = first
        while a <= last:
            b = min(last, a + per - 1)
            out.append(SegmentRange(md.name, seg.seq, seg.ledger_id, a, b, lower, upper))  # type: ignore[arg-type]
            a = b + 1
    return out


def _entry_bytes(seg: SegmentInfo) -> int:
    if seg.is_completed and seg.last_entry >= 0 and seg.bytes > 0:
        return max(1, seg.bytes // (seg.last_entry + 1))
    return _UNKNOWN_ENTRY_BYTES


class TailFinder:
    """Where a log ends now: the position just after its last acknowledged record, and the
    in-progress segment's last acknowledged entry. Keeps the in-progress segment's ledger
    open (without recovery) between calls and remembers envelope headers it read."""

    def __init__(self) -> None:
        self._rh: ReadHandle | None = None
        self._headers: dict[tuple[int, int], envelope.EnvelopeHeader] = {}

    async def header(self, client: Client, ledger_id: int, entry: int,
                     rh: ReadHandle | None = None) -> envelope.EnvelopeHeader:
        key = (ledger_id, entry)
        h = self._headers.get(key)
        if h is None:
            own = rh is None
            if rh is None:
                rh = await client.open_ledger(ledger_id, recovery=False)
            try:
                (e,) = await _read(rh, entry, entry)
            finally:
                if own:
                    await rh.close()
            h = envelope.decode_header(e.data)
            if len(self._headers) > 4096:
                self._headers.clear()
            self._headers[key] = h
        return h

    async def in_progress_lac(self, client: Client, seg: SegmentInfo) -> int:
        rh = self._rh
        if rh is None or rh.id != seg.ledger_id:
            await self.close()
            try:
                rh = self._rh = await client.open_ledger(seg.ledger_id, recovery=False)
            except NoSuchLedgerError:
                return -1
        else:
            await rh.read_last_add_confirmed()
        return rh.last_add_confirmed

    async def tail(self, client: Client, md: LogMetadata) -> tuple[Position | None, int]:
        """(the position after the last record, or None for an empty log; the in-progress
        segment's last acknowledged entry, -1 when none)."""
        tail_entry = -1
        for seg in reversed(md.segments):
            if seg.state == TRUNCATED:
                break
            if seg.in_progress:
                lac = await self.in_progress_lac(client, seg)
                tail_entry = lac
                if lac < 0:
                    continue
                h = await self.header(client, seg.ledger_id, lac, self._rh)
                return Position(seg.seq, lac, h.count), tail_entry
            pos = seg.last_position
            if pos is not None:
                return Position(pos.segment, pos.entry, pos.slot + 1), tail_entry
        return None, tail_entry

    async def index(self, client: Client, seg: SegmentInfo, pos: Position) -> int:
        """How many records of segment ``seg`` come before ``pos`` (a position in it)."""
        if seg.is_completed and (seg.last_entry < 0 or pos >= Position(
                seg.seq, seg.last_entry, seg.last_slot + 1)):
            return seg.records
        if pos.entry == 0 and pos.slot == 0:
            return 0
        h = await self.header(client, seg.ledger_id, pos.entry,
                              self._rh if self._rh is not None and self._rh.id == seg.ledger_id
                              else None)
        return h.first_index + min(pos.slot, h.count)

    async def position_of(self, client: Client, seg: SegmentInfo, index: int, lo: int,
                          hi: int) -> Position:
        """The position of record number ``index`` of ``seg`` (entries ``lo..hi`` hold it):
        a binary search on the envelopes' first indexes."""
        rh = self._rh if self._rh is not None and self._rh.id == seg.ledger_id else None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            h = await self.header(client, seg.ledger_id, mid, rh)
            if h.first_index <= index:
                lo = mid
            else:
                hi = mid - 1
        h = await self.header(client, seg.ledger_id, lo, rh)
        return Position(seg.seq, lo, index - h.first_index)

    async def close(self) -> None:
        rh, self._rh = self._rh, None
        if rh is not None:
            await rh.close()


async def _read(rh: ReadHandle, first: int, last: int) -> list[Any]:
    if last <= rh.last_add_confirmed:
        return await rh.read(first, last)
    return await rh.read_unconfirmed(first, last)  # planned from an acknowledged position


async def _open(opts: SourceOptions, part: SegmentRange) -> tuple[ReadHandle, Position | None]:
    client = await runtime.aclient(opts.metadata)
    md = await client.namespace(opts.namespace).open_log(opts.log)
    meta = await md.metadata()
    seg = meta.segment(part.seq)
    if seg is None or seg.state == TRUNCATED or seg.ledger_id != part.ledger_id:
        raise AlreadyTruncatedError(
            f"log {opts.log!r}: segment {part.seq} was truncated (or deleted) before this "
            "partition read it"
        )
    try:
        rh = await client.open_ledger(part.ledger_id, recovery=False)
    except NoSuchLedgerError:
        raise AlreadyTruncatedError(
            f"log {opts.log!r}: segment {part.seq}'s ledger {part.ledger_id} was deleted "
            "before this partition read it"
        ) from None
    return rh, meta.truncated_before


def read_partition(opts: SourceOptions, partition: object) -> Iterator[Any]:
    """A reader's ``read`` (batch and streaming): a planned range's records; nothing for the
    one placeholder partition Spark hands an empty read; a clear error for anything else."""
    if not isinstance(partition, SegmentRange):
        if getattr(partition, "value", None) is None:
            return iter(())
        raise TypeError(f"not a pybk partition: {partition!r}")
    return read_range(opts, partition)


def read_range(opts: SourceOptions, part: SegmentRange) -> Iterator[Any]:
    """In a task: the partition's records as Arrow record batches (pybk.spark.arrow
    READ_SCHEMA)."""
    rh, tb = runtime.run(_open(opts, part))
    lower = Position(*part.lower) if part.lower is not None else None
    if tb is not None and (lower is None or lower < tb):
        lower = tb
    upper = Position(*part.upper) if part.upper is not None else None
    try:
        entry = part.first_entry
        while entry <= part.last_entry:
            hi = min(part.last_entry, entry + READ_AHEAD - 1)
            entries = runtime.run(_read(rh, entry, hi))
            pieces = []
            for e in entries:
                packed = envelope.decode_packed(e.data)
                lo_slot, hi_slot = 0, packed.header.count
                here = Position(part.seq, e.entry_id, 0)
                if lower is not None and (lower.segment, lower.entry) == (part.seq, e.entry_id):
                    lo_slot = min(lower.slot, hi_slot)
                elif lower is not None and here < lower:
                    continue
                if upper is not None and (upper.segment, upper.entry) == (part.seq, e.entry_id):
                    hi_slot = min(upper.slot, hi_slot)
                elif upper is not None and here > upper:
                    continue
                if hi_slot <= lo_slot:
                    continue
                keys, values = envelope_arrays(packed, lo_slot, hi_slot)
                pieces.append((e.entry_id, lo_slot, keys, values))
            if pieces:
                yield read_batch(opts.log, part.seq, pieces)
            entry = hi + 1
    finally:
        runtime.run(rh.close())
