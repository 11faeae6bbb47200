"""Entry logs: where the db engine (:mod:`pybk.storage.dbstore`) keeps entries after a flush.

Each flush writes one log: ``NNN.log`` holds the flushed entries sorted by (ledger, entry),
so one ledger's entries sit together, and ``NNN.idx`` their locations as fixed rows
``(ledger, entry, offset, size, body CRC32C, row CRC32C)`` in the same order: the on-disk
entry-location index. Every row and body read is checked against them, so damage on disk is
an error (CorruptRecordError), never a wrong body or a false "absent". In
memory each log keeps only a summary per ledger (its rows, first and last entry id, bytes),
never a row per entry; a lookup reads one row (a dense run) or bisects the ledger's rows with
``pread``. A read that misses fills a read-ahead cache, bounded in bytes, with the entries
that follow in the same log (the next reads of a catch-up reader).

All I/O goes through the FileSystem seam. A log is written and synced before the checkpoint
that names it; one the checkpoint does not name is a leftover of a crash and is deleted.
"""

from __future__ import annotations

import posixpath
import struct
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import add, itemgetter

from crc32c import crc32c

from pybk.errors import CorruptRecordError, IOBookieError
from pybk.storage.fs import FileSystem

__all__ = ["ROW", "EntryLogs", "LedgerRun", "LogInfo", "ReadAheadCache", "Run"]

#: one location row: ledger, entry, offset in the .log, size, the body's CRC32C, then (4
#: bytes, unpacked as padding) the CRC32C of the 32 bytes before it, little-endian, seeded
#: with the row's place (:func:`row_seed`): an intact row read from where it was written
#: checks to :data:`ROW_RESIDUE`; one read from elsewhere (misdirected I/O) does not
ROW = struct.Struct(">qqQIIxxxx")
_ROW_HEAD = struct.Struct(">qqQII")
_ROW_CRC = struct.Struct("<I")
_ROW_BYTES = struct.Struct(f"{ROW.size}s")
#: CRC32C of any bytes followed by their own CRC32C, little-endian
ROW_RESIDUE = 0x48674BC7
#: spreads the seeds of different logs' rows far apart
_LOG_SEED_STEP = 0x9E3779B1
#: the entry logs' format, in the checkpoint (1: rows without checksums)
LOG_FORMAT = 2

#: what an entry log is written of, per ledger: (ledger, entry ids, bodies)
Run = tuple[int, Sequence[int], Sequence[bytes]]


@dataclass
class LedgerRun:
    """One ledger's rows in one log: rows [lo, hi), entry ids first..last, ``nbytes``."""

    lo: int
    hi: int
    first: int
    last: int
    nbytes: int

    @property
    def dense(self) -> bool:
        return self.last - self.first + 1 == self.hi - self.lo


@dataclass
class LogInfo:
    """One entry log's summary (kept in memory and in the checkpoint)."""

    log_id: int
    size: int
    ledgers: dict[int, LedgerRun] = field(default_factory=dict)

    @property
    def live(self) -> int:
        return sum(run.nbytes for run in self.ledgers.values())


class ReadAheadCache:
    """(ledger, entry) -> body, least recently used first out, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: tuple[int, int]) -> bytes | None:
        body = self._items.get(key)
        if body is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return body

    def put(self, key: tuple[int, int], body: bytes) -> None:
        if len(body) > self.max_bytes or key in self._items:
            return
        self._items[key] = body
        self.nbytes += len(body)
        while self.nbytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.nbytes -= len(old)

    def drop_ledger(self, ledger_id: int) -> None:
        for key in [k for k in self._items if k[0] == ledger_id]:
            self.nbytes -= len(self._items.pop(key))

    def drop_all(self) -> None:
        self._items.clear()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)


class EntryLogs:
    """The entry logs under ``directory`` (see the module docstring)."""

    def __init__(self, fs: FileSystem, directory: str, read_ahead_bytes: int = 4 << 20,
                 read_ahead_entries: int = 64, *, skip_sync: bool = False,
                 unchecked: bool = False) -> None:
        self.fs = fs
        self.dir = directory
        self.logs: dict[int, LogInfo] = {}
        self.cache = ReadAheadCache(read_ahead_bytes)
        self.read_ahead_entries = read_ahead_entries
        #: a mutation switch (pybk.storage.dbstore.DB_LOG_UNSYNCED): logs are never synced
        self.skip_sync = skip_sync
        #: a mutation switch (pybk.storage.dbstore.DB_READS_UNCHECKED): reads trust rows and
        #: bodies without their checksums
        self.unchecked = unchecked

    def path(self, log_id: int, ext: str) -> str:
        return posixpath.join(self.dir, f"{log_id:016d}.{ext}")

    def remove_unnamed(self) -> list[str]:
        """Delete files of logs no checkpoint names (a crash during a flush)."""
        self.fs.makedirs(self.dir)
        gone = []
        for name in self.fs.listdir(self.dir):
            stem = name.split(".")[0]
            if not stem.isdigit() or int(stem) not in self.logs:
                self.fs.delete(posixpath.join(self.dir, name))
                gone.append(name)
        return gone

    async def write(self, log_id: int, runs: Iterable[Run]) -> LogInfo:
        """Write log ``log_id`` of ``runs`` and sync it: the writes and syncs off the event
        loop (:meth:`FileSystem.offload`), so ``runs`` must not change meanwhile; then the
        directory's fsync."""
        self.fs.makedirs(self.dir)
        info = await self.fs.offload(lambda: self.write_now(log_id, runs))
        await self.fs.fsync_dir(self.dir)
        return info

    def write_now(self, log_id: int, runs: Iterable[Run]) -> LogInfo:
        """:meth:`write`'s file work, blocking (no directory fsync): the log and its index
        written and synced (``FileHandle.sync_now``). ``runs``: (ledger, entry ids, bodies)
        in ascending ledger order, each ledger once, its ids ascending. Touches nothing of
        ``self`` but the two new files, so it may run on another thread. Per ledger, not
        per entry, in Python: a row of each entry is packed by ``map`` in C."""
        data = self.fs.open_append(self.path(log_id, "log"), bulk=True)
        idx = self.fs.open_append(self.path(log_id, "idx"), bulk=True)
        info = LogInfo(log_id, 0)
        rows: list[bytes] = []
        chunk: list[bytes] = []
        pending = offset = n = 0
        pack = _ROW_HEAD.pack
        try:
            for lid, eids, bodies in runs:
                if not eids:
                    continue
                sizes = list(map(len, bodies))
                nbytes = sum(sizes)
                info.ledgers[lid] = LedgerRun(n, n + len(eids), eids[0], eids[-1], nbytes)
                n += len(eids)
                heads = list(map(pack, repeat(lid), eids, accumulate(sizes, initial=offset),
                                 sizes, map(crc32c, bodies)))
                seeds = range(row_seed(log_id, n - len(eids)), row_seed(log_id, n))
                rows.append(b"".join(map(add, heads, map(_ROW_CRC.pack,
                                                         map(crc32c, heads, seeds)))))
                chunk.extend(bodies)
                offset += nbytes
                pending += nbytes
                if pending >= 1 << 20:  # (written in chunks: one call per MiB or so)
                    data.write(b"".join(chunk))
                    idx.write(b"".join(rows))
                    chunk, rows, pending = [], [], 0
            data.write(b"".join(chunk))
            idx.write(b"".join(rows))
            if not self.skip_sync:
                data.sync_now()
                idx.sync_now()
        finally:
            data.close()
            idx.close()
        info.size = offset
        return info

    def add(self, info: LogInfo) -> None:
        self.logs[info.log_id] = info

    def _rows(self, log_id: int, row: int, count: int, *, check: bool = True) -> bytes:
        """``count`` location rows from ``row`` on; IOBookieError when the index is short
        (a log named by the checkpoint lost its bytes: damage, never a silent miss);
        CorruptRecordError when one fails its checksum (unless ``check`` is false: then the
        caller uses :func:`good_rows`)."""
        path = self.path(log_id, "idx")
        try:
            raw = self.fs.pread(path, row * ROW.size, count * ROW.size)
        except OSError as exc:
            raise IOBookieError(f"reading {path}: {exc}") from None
        if len(raw) != count * ROW.size:
            raise IOBookieError(f"{path}: location index is short (rows {row}..{row + count}"
                                f" of a log the checkpoint names)")
        if check and not self.unchecked and good_rows(raw, log_id, row) < count:
            bad = row + good_rows(raw, log_id, row)
            raise CorruptRecordError(f"{path}: location row {bad} fails its checksum",
                                     path=path, offset=bad * ROW.size)
        return raw

    def _row(self, log_id: int, row: int) -> tuple[int, int, int, int, int]:
        lid, eid, off, size, crc = ROW.unpack(self._rows(log_id, row, 1))
        return lid, eid, off, size, crc

    def _damaged(self, log_id: int, ledger_id: int, entry_id: int, off: int,
                 what: str) -> CorruptRecordError:
        path = self.path(log_id, "log")
        return CorruptRecordError(f"{path}: ledger {ledger_id} entry {entry_id} at offset "
                                  f"{off} {what}", path=path, offset=off)

    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int, int] | None:
        """(log id, row, offset, size) of a flushed entry, newest log first; None if absent.
        Every row it reads is checked (a damaged one raises, never reads as a miss)."""
        for log_id in sorted(self.logs, reverse=True):
            run = self.logs[log_id].ledgers.get(ledger_id)
            if run is None or not run.first <= entry_id <= run.last:
                continue
            if run.dense:
                row = run.lo + entry_id - run.first
                lid, eid, off, size, _ = self._row(log_id, row)
                if (lid, eid) != (ledger_id, entry_id):
                    raise self._damaged(log_id, ledger_id, entry_id, off,
                                        f"is named ({lid}, {eid}) by row {row}")
                return log_id, row, off, size
            lo, hi = run.lo, run.hi
            while lo < hi:
                mid = (lo + hi) // 2
                _, eid, off, size, _ = self._row(log_id, mid)
                if eid == entry_id:
                    return log_id, mid, off, size
                lo, hi = (mid + 1, hi) if eid < entry_id else (lo, mid)
        return None

    def read(self, ledger_id: int, entry_id: int) -> bytes | None:
        """A flushed entry's body (through the read-ahead cache), None when not flushed."""
        key = (ledger_id, entry_id)
        body = self.cache.get(key)
        if body is not None:
            return body
        where = self.locate(ledger_id, entry_id)
        if where is None:
            return None
        log_id, row, _, _ = where
        run = self.logs[log_id].ledgers[ledger_id]
        upto = min(run.hi, row + max(1, self.read_ahead_entries))
        raw = self._rows(log_id, row, upto - row, check=False)
        good = upto - row if self.unchecked else good_rows(raw, log_id, row)
        locs = list(ROW.iter_unpack(raw[:good * ROW.size]))
        if not locs or locs[0][:2] != (ledger_id, entry_id):  # (changed since located)
            raise self._damaged(log_id, ledger_id, entry_id, where[2],
                                f"is not where row {row} said when read again")
        start = locs[0][2]
        end = locs[-1][2] + locs[-1][3]
        try:
            span = self.fs.pread(self.path(log_id, "log"), start, end - start)
        except OSError as exc:
            raise IOBookieError(f"reading ledger {ledger_id} entry {entry_id} from entry "
                                f"log {log_id}: {exc}") from None
        if len(span) != end - start:
            raise IOBookieError(f"entry log {log_id} is short: ledger {ledger_id} entry "
                                f"{entry_id} cut off")
        for lid, eid, off, size, crc in locs[1:]:  # (read ahead: only what checks)
            body = span[off - start:off - start + size]
            if self.unchecked or crc32c(body) == crc:
                self.cache.put((lid, eid), body)
        _, _, off, size, crc = locs[0]
        body = span[off - start:off - start + size]
        if not self.unchecked and crc32c(body) != crc:
            raise self._damaged(log_id, ledger_id, entry_id, off, "fails its checksum")
        return body

    def read_run(self, ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        """Bodies of entries ``first``, ``first + 1``, ... of a ledger as long as they sit
        consecutively in one log (at most ``count``, stopping once ``max_bytes`` are
        reached): one ``pread`` of their rows and one of their bytes. Empty when ``first``
        is not flushed. The batched read's path, past the read-ahead cache."""
        where = self.locate(ledger_id, first)
        if where is None:
            return []
        log_id, row, _, _ = where
        run = self.logs[log_id].ledgers[ledger_id]
        upto = min(run.hi, row + count)
        raw = self._rows(log_id, row, upto - row, check=False)
        locs = []
        total = 0
        # each row must name the ledger's next entry, and its body's CRC32C (below) vouches
        # for the rest of it (a damaged offset or size reads bytes that fail it), so the rows'
        # own checksums are left to lookups, which trust a row without reading its body
        for i, (lid, eid, off, size, crc) in enumerate(ROW.iter_unpack(raw)):
            if eid != first + i or lid != ledger_id:
                break
            locs.append((off, size, crc))
            total += size
            if total >= max_bytes:
                break
        if not locs:
            return []  # (the first row is damaged: the caller's read of it says so)
        start = locs[0][0]
        span = self.fs.pread(self.path(log_id, "log"), start,
                             locs[-1][0] + locs[-1][1] - start)
        if len(span) != locs[-1][0] + locs[-1][1] - start:
            raise IOBookieError(f"entry log {log_id} is short: ledger {ledger_id} entries "
                                f"from {first} cut off")
        bodies = [span[off - start:off - start + size] for off, size, _ in locs]
        crcs = list(map(crc32c, bodies))
        want = [crc for _, _, crc in locs]
        if crcs != want and not self.unchecked:  # up to the first damaged body only
            bodies = bodies[:next(i for i, (c, w) in enumerate(zip(crcs, want, strict=True))
                                  if c != w)]
        return bodies

    def entry_ids(self, ledger_id: int) -> Iterator[int]:
        """Every flushed entry id of the ledger (ascending per log; logs oldest first)."""
        for log_id in sorted(self.logs):
            run = self.logs[log_id].ledgers.get(ledger_id)
            if run is None:
                continue
            if run.dense:
                yield from range(run.first, run.last + 1)
                continue
            raw = self._rows(log_id, run.lo, run.hi - run.lo)
            yield from map(itemgetter(1), ROW.iter_unpack(raw))

    def size_of(self, ledger_id: int, entry_id: int) -> int | None:
        where = self.locate(ledger_id, entry_id)
        return None if where is None else where[3]

    def last_entry(self, ledger_id: int) -> int:
        runs = [info.ledgers[ledger_id].last for info in self.logs.values()
                if ledger_id in info.ledgers]
        return max(runs, default=-1)

    def drop_ledger(self, ledger_id: int) -> list[int]:
        """Forget a deleted ledger; returns the logs left with nothing live (to delete)."""
        self.cache.drop_ledger(ledger_id)
        empty = []
        for info in self.logs.values():
            if info.ledgers.pop(ledger_id, None) is not None and not info.ledgers:
                empty.append(info.log_id)
        return empty

    def delete(self, log_id: int) -> None:
        """Forget log ``log_id`` and delete its files (once no checkpoint names it)."""
        self.logs.pop(log_id, None)
        for ext in ("log", "idx"):
            if self.fs.exists(self.path(log_id, ext)):
                self.fs.delete(self.path(log_id, ext))

    def live_items(self, log_id: int) -> Iterator[tuple[int, int, bytes]]:
        """(ledger, entry, body) of the live entries of one log, in its order, each checked:
        a damaged entry whose repair sits in a newer log is left out (superseded); any other
        damage raises CorruptRecordError (compaction must not copy it under a fresh CRC)."""
        info = self.logs[log_id]
        for lid in sorted(info.ledgers):
            run = info.ledgers[lid]
            raw = self._rows(log_id, run.lo, run.hi - run.lo, check=False)
            good = good_rows(raw, log_id, run.lo)
            for i, (_, eid, off, size, crc) in enumerate(ROW.iter_unpack(raw)):
                if i >= good and not row_ok(raw, i, log_id, run.lo):
                    self._bad_row(log_id, run, i)  # (raises unless superseded)
                    continue
                body = self.fs.pread(self.path(log_id, "log"), off, size)
                if crc32c(body) == crc:
                    yield lid, eid, body
                elif not self.superseded(log_id, lid, eid):
                    raise self._damaged(log_id, lid, eid, off, "fails its checksum")

    def _bad_row(self, log_id: int, run: LedgerRun, i: int) -> tuple[int, int]:
        """Row ``i`` of ``run`` failed its checksum: fine only if a newer log holds a repair
        of its entry (named by the run's summary: a dense run's; a sparse run's row names
        an entry it cannot be trusted for), else CorruptRecordError."""
        lid = next(lid for lid, r in self.logs[log_id].ledgers.items() if r is run)
        eid = run.first + i if run.dense else -1
        if eid < 0 or not self.superseded(log_id, lid, eid):
            path = self.path(log_id, "idx")
            raise CorruptRecordError(f"{path}: location row {run.lo + i} (ledger {lid}) "
                                     "fails its checksum", path=path,
                                     offset=(run.lo + i) * ROW.size)
        return lid, eid

    def superseded(self, log_id: int, ledger_id: int, entry_id: int) -> bool:
        """Whether a log newer than ``log_id`` holds the entry (a repair's copy)."""
        where = self.locate(ledger_id, entry_id)
        return where is not None and where[0] > log_id

    def scrub_rows(self, log_id: int) -> Iterator[tuple[int, int, int, int]]:
        """(ledger, entry, bytes, row) of every row of a log (the scrubber's walk), a
        ledger's rows read when it comes to them; a row that fails its checksum is named by
        its ledger's summary (its entry too, in a dense run; else -1)."""
        info = self.logs.get(log_id)
        for lid, run in sorted(info.ledgers.items()) if info is not None else ():
            if log_id not in self.logs:
                return  # (compacted or deleted meanwhile)
            raw = self._rows(log_id, run.lo, run.hi - run.lo, check=False)
            good = good_rows(raw, log_id, run.lo)
            for i, (_, eid, _, size, _) in enumerate(ROW.iter_unpack(raw)):
                if i >= good and not row_ok(raw, i, log_id, run.lo):
                    eid, size = (run.first + i if run.dense else -1), 0
                yield lid, eid, ROW.size + size, run.lo + i

    def check_entry(self, log_id: int, row: int) -> tuple[int, int, int] | None:
        """Verify one row and its body (the scrubber): (ledger, entry, bytes read), or None
        when the log is gone (compacted or deleted since). Damage raises
        CorruptRecordError, unless a newer log holds a repair of the entry."""
        info = self.logs.get(log_id)
        if info is None:
            return None
        raw = self._rows(log_id, row, 1, check=False)
        lid, eid, off, size, crc = ROW.unpack(raw)
        if not row_ok(raw, 0, log_id, row):
            run = next((r for r in info.ledgers.values() if r.lo <= row < r.hi), None)
            if run is None:
                return None  # (its ledger was deleted since)
            return (*self._bad_row(log_id, run, row - run.lo), ROW.size)
        try:
            body = self.fs.pread(self.path(log_id, "log"), off, size)
        except OSError as exc:
            raise IOBookieError(f"reading entry log {log_id}: {exc}") from None
        if crc32c(body) != crc and not self.superseded(log_id, lid, eid):
            raise self._damaged(log_id, lid, eid, off, "fails its checksum")
        return lid, eid, ROW.size + size


def row_seed(log_id: int, row: int) -> int:
    """The seed of row ``row`` of log ``log_id``'s CRC32C (any int: CRC32C takes its low
    32 bits)."""
    return log_id * _LOG_SEED_STEP + row


def row_ok(raw: bytes, i: int, log_id: int, row: int) -> bool:
    """Whether row ``i`` of ``raw``, read from row ``row`` of log ``log_id`` on, checks."""
    return bool(crc32c(raw[i * ROW.size:(i + 1) * ROW.size], row_seed(log_id, row + i))
                == ROW_RESIDUE)


def good_rows(raw: bytes, log_id: int, row: int) -> int:
    """How many rows of ``raw`` (whole rows, read from row ``row`` of log ``log_id`` on)
    pass their checksum before the first that fails: one C-level pass when none fails."""
    n = len(raw) // ROW.size
    seed = row_seed(log_id, row)
    checks = list(map(crc32c, map(itemgetter(0), _ROW_BYTES.iter_unpack(raw)),
                      range(seed, seed + n)))
    if checks.count(ROW_RESIDUE) == len(checks):
        return len(checks)
    return next(i for i, c in enumerate(checks) if c != ROW_RESIDUE)


def summary_to_json(info: LogInfo) -> dict[str, object]:
    return {"size": info.size,
            "ledgers": {str(lid): [r.lo, r.hi, r.first, r.last, r.nbytes]
                        for lid, r in info.ledgers.items()}}


def summary_from_json(log_id: int, doc: dict[str, object]) -> LogInfo:
    ledgers = doc["ledgers"]
    size = doc["size"]
    assert isinstance(ledgers, dict) and isinstance(size, int)
    return LogInfo(log_id, size, {int(lid): LedgerRun(*vals) for lid, vals in ledgers.items()})
