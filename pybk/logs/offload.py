"""Tiered storage: offloading a log's closed segments to object storage, and reading them back.

Per segment, in order (Pulsar's managed-ledger offload, made durable the same way) (listed in
docs/internals.md, "pybk/logs/offload.py").
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from typing import TYPE_CHECKING, Any, Final

from pybk.client.reader import LedgerEntry
from pybk.errors import (
    BKError,
    CorruptRecordError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from pybk.logs.meta import COMPLETED, LogMetadata, OffloadInfo, SegmentInfo
from pybk.logs.position import Position
from pybk.logs.tier_access import TierAccess
from pybk.logs.tier_cache import TierReadCache
from pybk.logs.tier_store import SegmentIndex, attempt_base, frame_entries, parse_frames

if TYPE_CHECKING:
    import random

    from pybk.logs.catalog import LogCatalog

__all__ = ["OFFLOAD_COMPLETE_BEFORE_UPLOAD", "OFFLOAD_DELETES_BEFORE_REPLACING",
           "SWEEP_IGNORES_ATTEMPTS_IN_PROGRESS",
           "SWEEP_NEEDS_INDEX", "OffloadedHandle", "delete_bookie_copies", "delete_objects",
           "offload_segments", "sweep_orphans"]

log = logging.getLogger(__name__)

#: mutation switch (a name in ``ClientConfig.mutations``; registry: ``pybk.testing.mutations``):
#: an offload attempt is recorded complete when it starts, before its objects are uploaded
#: and verified, so the bookies' copy may go first (the simulator's TS1 catches it)
OFFLOAD_COMPLETE_BEFORE_UPLOAD: Final = "offload_complete_before_upload"

#: mutation switch: an offload deletes the objects of an earlier attempt it found incomplete
#: before it replaces that attempt by compare-and-set, so when another offloader completes
#: the attempt in between, the completed offload's objects are gone (and then the bookies'
#: copy: the simulator's TS1 catches it, with the offload service beside the writer)
OFFLOAD_DELETES_BEFORE_REPLACING: Final = "offload_deletes_before_replacing"

#: mutation switch: the orphan sweep keeps only the objects of offloads recorded complete, so
#: it deletes those of an attempt still uploading, or of a failed one still recorded (the
#: simulator's TS3 catches it)
SWEEP_IGNORES_ATTEMPTS_IN_PROGRESS: Final = "sweep_ignores_attempts_in_progress"
#: mutation switch: the orphan sweep finds attempts by their index objects, so a data object
#: whose index never landed (an upload cut short, then replaced) stays for good (TS4)
SWEEP_NEEDS_INDEX: Final = "sweep_needs_index"

_BATCH = 100  # entries read from the bookies per request (Pulsar's offloader: 100)


async def _store(cat: LogCatalog, url: str, md: LogMetadata) -> TierAccess:
    return await cat.open_tier(url, md.config.offload_options)


async def offload_segments(
    cat: LogCatalog, rng: random.Random, *, before: Position | None = None,
    take_over_after: float | None = None,
) -> list[int]:
    """Offload every completed segment (wholly before ``before``, when given) not offloaded
    yet, oldest first; the sequence numbers offloaded. ValueError when the log has no
    ``offload_url``. An attempt another offloader started and has not completed is taken
    over (replaced, its objects deleted), unless ``take_over_after`` is given and it
    started less than that many seconds ago: then that segment is left to it."""
    md = await cat.read()
    if md.config.offload_url is None:
        raise ValueError(f"log {cat.name!r} has no offload_url (Log.set_offload)")
    done: list[int] = []
    for seg in md.live_segments:
        if seg.state != COMPLETED or seg.last_entry < 0 or seg.tier != "bookies":
            continue
        last = seg.last_position
        if before is not None and last is not None and last >= before:
            break
        if await _offload_one(cat, seg.seq, f"{rng.getrandbits(64):016x}", take_over_after):
            done.append(seg.seq)
    md = await cat.read()
    if md.config.offload_deletion_lag == 0:
        await delete_bookie_copies(cat)
    return done


async def _offload_one(cat: LogCatalog, seq: int, uid: str,
                       take_over_after: float | None) -> bool:
    """Offload segment ``seq``; False when it was left to another offloader's recent
    attempt (``take_over_after``)."""
    md = await cat.read()
    url = md.config.offload_url
    assert url is not None
    store = await _store(cat, url, md)
    seg = md.segment(seq)
    if seg is None or seg.tier != "bookies":
        return True
    now = cat.now_ms()

    def left_to_another(s: SegmentInfo) -> bool:
        o = s.offload
        return (take_over_after is not None and o is not None and not o.complete
                and now - o.ms < take_over_after * 1000)

    if left_to_another(seg):
        return False
    if seg.offload is not None and OFFLOAD_DELETES_BEFORE_REPLACING in cat.client.config.mutations:
        await delete_objects(cat, md, [seg])
    attempt = OffloadInfo(uid=uid, url=url, ms=now)
    if OFFLOAD_COMPLETE_BEFORE_UPLOAD in cat.client.config.mutations:
        attempt = OffloadInfo(uid=uid, url=url, complete=True, ms=now)
    replaced: list[OffloadInfo | None] = [None]
    deferred = [False]

    def start(cur: LogMetadata) -> LogMetadata | None:
        s = cur.segment(seq)
        if s is None or s.state != COMPLETED or s.tier != "bookies":
            return None
        deferred[0] = left_to_another(s)
        if deferred[0]:
            return None
        replaced[0] = s.offload
        return cur.replace_segment(s.with_changes(offload=attempt))

    md = await cat.update(start)
    if deferred[0]:
        return False
    seg2 = md.segment(seq)
    if seg2 is None or seg2.offload != attempt:
        return True  # truncated or offloaded meanwhile
    old = replaced[0]
    if old is not None:
        # an earlier attempt that had not completed when this one replaced it, by CAS: it can
        # no longer complete (its completion checks its uid), so its objects are deleted
        # now, never before (another offloader may have been about to complete it)
        old_store = await _store(cat, old.url, md)
        await old_store.delete(old_store.base(cat.namespace, cat.name, seq, seg.ledger_id,
                                              old.uid))
    path = store.base(cat.namespace, cat.name, seq, seg.ledger_id, uid)
    try:
        await _upload(cat, store, path, seg, md.config.offload_bytes_per_s)
        await store.verify(path, seq, seg.ledger_id)
    except BaseException:
        await store.delete(path)
        raise
    now = cat.now_ms()

    def complete(cur: LogMetadata) -> LogMetadata | None:
        s = cur.segment(seq)
        if s is None or s.offload is None or s.offload.uid != uid:
            raise MetadataVersionError(f"log {cat.name!r} segment {seq}: another offload "
                                       "attempt replaced this one")
        return cur.replace_segment(s.with_changes(
            offload=OffloadInfo(uid=uid, url=url, complete=True, ms=now)))

    try:
        await cat.update(complete)
    except MetadataVersionError:
        await store.delete(path)
        raise
    return True


class _Pace:
    """Reads at most ``rate`` bytes a second on average (None: unpaced), by the loop's
    clock: before each read, wait until the bytes read so far were due."""

    def __init__(self, rate: int | None) -> None:
        self.rate = rate
        self.read = 0
        self.start: float | None = None

    async def wait(self) -> None:
        if self.rate is None:
            return
        now = asyncio.get_running_loop().time()
        if self.start is None:
            self.start = now
        due = self.start + self.read / self.rate
        if due > now:
            await asyncio.sleep(due - now)

    def took(self, n: int) -> None:
        self.read += n


async def _upload(cat: LogCatalog, store: TierAccess, path: str, seg: SegmentInfo,
                  rate: int | None) -> None:
    rh = await cat.client.open_ledger(seg.ledger_id, recovery=False)
    try:
        if rh.last_add_confirmed < seg.last_entry:
            await rh.read_last_add_confirmed()
        offsets: list[int] = []
        chunks: list[list[bytes]] = []
        pos = 0
        pace = _Pace(rate)
        for first in range(0, seg.last_entry + 1, _BATCH):
            last = min(seg.last_entry, first + _BATCH - 1)
            await pace.wait()
            entries = await rh.read(first, last)
            pace.took(sum(len(e.data) for e in entries))
            frames = frame_entries((e.entry_id, e.data) for e in entries)
            for e in entries:
                offsets.append(pos)
                pos += 12 + len(e.data)
            chunks.append(frames)
        lmd = rh.metadata
        length, crc = await store.write_data(path, chunks)
        index = SegmentIndex(
            namespace=cat.namespace, log=cat.name, seq=seg.seq, ledger=seg.ledger_id,
            last_entry=seg.last_entry, ledger_length=seg.bytes, data_length=length,
            data_crc32c=crc, offsets=array("Q", offsets),
            ledger_metadata={"ensemble_size": lmd.ensemble_size,
                             "write_quorum": lmd.write_quorum, "ack_quorum": lmd.ack_quorum,
                             "digest_type": lmd.digest_type,
                             "ensembles": {str(k): list(v) for k, v in lmd.ensembles.items()}},
        )
        await store.write_index(path, index)
    finally:
        await rh.close()


async def delete_bookie_copies(cat: LogCatalog, *, epoch: int | None = None) -> LogMetadata:
    """Delete the ledgers of segments offloaded (complete) longer ago than the deletion
    lag: mark ``bk_deleted`` first, then delete (a crash in between is finished next time)."""
    md = await cat.read()
    lag_ms = int(md.config.offload_deletion_lag * 1000)
    now = cat.now_ms()
    due = [s.seq for s in md.live_segments if s.offload is not None and s.offload.complete
           and not s.offload.bk_deleted and now - s.offload.ms >= lag_ms]
    if due:
        def mark(cur: LogMetadata) -> LogMetadata | None:
            changed = cur
            for seq in due:
                s = changed.segment(seq)
                if s is not None and s.offload is not None and s.offload.complete:
                    o = s.offload
                    changed = changed.replace_segment(s.with_changes(offload=OffloadInfo(
                        o.uid, o.url, True, True, o.ms)))
            return changed

        md = await cat.update(mark, epoch=epoch)
    for s in md.live_segments:
        if s.offload is not None and s.offload.bk_deleted:
            await cat.delete_ledger(s.ledger_id)  # idempotent
    return md


async def delete_objects(cat: LogCatalog, md: LogMetadata, segments: list[SegmentInfo]) -> None:
    """Delete the tier objects of ``segments`` (retention, log deletion)."""
    for s in segments:
        o = s.offload
        if o is None:
            continue
        store = await _store(cat, o.url, md)
        await store.delete(store.base(cat.namespace, cat.name, s.seq,
                                                         s.ledger_id, o.uid))


async def sweep_orphans(cat: LogCatalog, grace: float) -> list[str]:
    """Delete the objects under the log's tier folder that no segment's recorded attempt
    names and that are older than ``grace`` seconds (by their modification time and the
    log's clock), and abort such attempts' unfinished multipart uploads (by when they
    began); the attempts (object bases) swept. Pulsar has no such sweep.

    The listing comes first, the metadata after it: an offload records its attempt before
    it uploads anything, so every object listed belongs to an attempt the metadata read
    afterwards still names, or to one no longer recorded, which will never be again. The
    grace spares what is younger still (a stale metadata replica, clocks apart)."""
    if not (isinstance(grace, (int, float)) and 0 <= grace < float("inf")):
        raise ValueError(f"grace must be a finite number of seconds >= 0, not {grace!r}")
    md = await cat.read()
    url = md.config.offload_url
    if url is None:
        return []
    store = await _store(cat, url, md)
    objects = await store.list_objects(cat.namespace, cat.name)
    uploads = await store.list_uploads(cat.namespace, cat.name)
    md = await cat.read()
    mutations = cat.client.config.mutations
    known = {store.base(cat.namespace, cat.name, s.seq, s.ledger_id, s.offload.uid)
             for s in md.segments if s.offload is not None
             and (s.offload.complete or SWEEP_IGNORES_ATTEMPTS_IN_PROGRESS not in mutations)}
    newest: dict[str, float] = {}
    for name, mtime in objects:
        base = attempt_base(name)
        if base is not None:
            newest[base] = max(mtime, newest.get(base, mtime))
    if SWEEP_NEEDS_INDEX in mutations:
        indexed = {attempt_base(n) for n, _ in objects if n.endswith(".index")}
        newest = {b: t for b, t in newest.items() if b in indexed}
    cutoff = cat.now_ms() / 1000 - grace
    gone = sorted(b for b, t in newest.items() if b not in known and t <= cutoff)
    for b in gone:
        await store.delete(b)
    stale = [(n, u) for n, u, t in uploads if attempt_base(n) not in known and t <= cutoff]
    for name, upload in stale:
        await store.abort_upload(name, upload)
    aborted = {attempt_base(name) for name, _ in stale}
    return sorted(set(gone).union(a for a in aborted if a is not None))


def _gone(ledger: int, path: str) -> NoSuchLedgerError:
    """An offloaded segment's objects deleted (its truncation) under a reader: as for a
    deleted ledger, the reader looks at the log again (AlreadyTruncatedError, or this)."""
    return NoSuchLedgerError(f"offloaded ledger {ledger}: its objects are gone ({path})")


class OffloadedHandle:
    """A read handle on an offloaded segment (what :class:`pybk.logs.LogReader` uses of a
    ledger's ReadHandle): its entries' spans of the data object, read through the client's
    :class:`pybk.logs.tier_cache.TierReadCache` (aligned 1 MiB blocks, shared by the client's
    readers, bounded in bytes)."""

    def __init__(self, store: TierAccess, path: str, index: SegmentIndex,
                 cache: TierReadCache | None = None) -> None:
        self._store = store
        self._path = path
        self._index = index
        self._cache = cache if cache is not None else TierReadCache()

    @classmethod
    async def open(cls, cat: LogCatalog, md: LogMetadata, seg: SegmentInfo) -> OffloadedHandle:
        o = seg.offload
        if o is None or not o.complete:
            raise NoSuchLedgerError(f"segment {seg.seq} of log {cat.name!r} is not offloaded")
        store = await _store(cat, o.url, md)
        path = store.base(cat.namespace, cat.name, seg.seq, seg.ledger_id, o.uid)
        try:
            index = await store.read_index(path)
        except FileNotFoundError as exc:
            raise _gone(seg.ledger_id, path) from exc
        return cls(store, path, index, TierReadCache.of(cat.client))

    @property
    def id(self) -> int:
        return self._index.ledger

    @property
    def last_add_confirmed(self) -> int:
        return self._index.last_entry

    @property
    def is_closed(self) -> bool:
        return True

    async def read_last_add_confirmed(self) -> int:
        return self._index.last_entry

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        if first < 0 or last > self._index.last_entry or first > last:
            raise ValueError(f"offloaded ledger {self.id}: bad range {first}..{last}")
        start, end = self._index.span(first, last)
        try:
            view = await self._cache.read(self._store, self._path, start, end,
                                          self._index.data_length)
        except FileNotFoundError as exc:
            raise _gone(self.id, self._path) from exc
        if len(view) < end - start:
            raise CorruptRecordError(f"offloaded ledger {self.id}: data object too short")
        lid = self._index.ledger
        return [LedgerEntry(lid, eid, data) for eid, data in parse_frames(view, first, last)]

    read_unconfirmed = read

    async def read_last_add_confirmed_and_entry(self, entry: int, timeout: float) -> Any:
        raise BKError(f"offloaded ledger {self.id} is closed at {self._index.last_entry}")

    async def close(self) -> None:
        pass  # (its blocks stay in the client's cache for other readers)
