"""Index checkpoint files: a full *base*, then *deltas* that hold only what changed.

Why deltas: a checkpoint that rewrites the whole index costs CPU and disk in proportion to every
entry the bookie holds (per million entries about 50 ms of the loop's time and 17 MB written;
0.3 s and 28 MB when entries were rows), at every checkpoint, however little had changed.
A delta holds the ledgers whose state changed and only their added or moved entries, so a
checkpoint costs what changed since the last one (plus one small header per held ledger
compared); a new base is written once the deltas add up to a fraction of the base
(``StoreConfig.checkpoint_delta_ratio``), which keeps the full rewrites' cost proportional to
the changes too.

Design notes: docs/internals.md, "pybk/storage/checkpoint.py".
"""

from __future__ import annotations

import gc
import posixpath
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

import crc32c

from pybk.errors import CorruptRecordError
from pybk.storage.entryindex import EntryColumns, EntryIndex, Loc, empty_columns
from pybk.storage.fs import FileSystem
from pybk.storage.idranges import IdRanges
from pybk.storage.index import Index, LedgerState, Position

__all__ = [
    "BASE",
    "CHECKPOINT_FILE",
    "CHECKPOINT_MAGIC",
    "CHECKPOINT_VERSION",
    "DELTA",
    "READABLE_VERSIONS",
    "CheckpointChain",
    "CheckpointEncoder",
    "CheckpointFile",
    "decode_checkpoint",
    "delta_checkpoint_name",
    "delta_checkpoints",
    "encode_checkpoint",
    "ledger_metas",
    "load_checkpoint_chain",
    "parse_delta_checkpoint_name",
    "stale_checkpoint_files",
]

#: the base checkpoint's file name in a data directory; its deltas are
#: ``index.ckpt.<generation>.<seq>`` (hex) beside it
CHECKPOINT_FILE: Final = "index.ckpt"
_TMP_SUFFIX: Final = ".tmp"  # (FileSystem.write_file_atomic's temporary file)

CHECKPOINT_MAGIC: Final = b"PYBKIDX\x00"
CHECKPOINT_VERSION: Final = 3
#: the versions this pybk reads (2: tombstones as flagged ledgers, upgraded on load)
READABLE_VERSIONS: Final = (2, 3)
BASE: Final = 0
DELTA: Final = 1

_HEADER = struct.Struct(">8sHIQ")  # magic, version, crc, payload length
_HEADER_CHECKED = struct.Struct(">8sHQ")  # what of the header the CRC covers (version >= 3)
_HEAD = struct.Struct(">BQIQQQII")  # kind, generation, seq, position (3), ndead, nledgers
_META = struct.Struct(">qBqqHI")  # id, flags, piggybacked lac, explicit lac, keylen, laclen
_COUNT = struct.Struct(">I")
_RANGE = struct.Struct(">qq")
_FENCED, _DELETED, _HAS_KEY, _HAS_LAC = 1, 2, 4, 8  # (_DELETED: version 2 only)
_ENTRY_FMT: Final = "qQQI"  # id, segment, offset, size
_ENTRY_SIZE: Final = struct.calcsize(">" + _ENTRY_FMT)
_DENSE = struct.Struct(">qI")  # first id, slot count
_LIVE = struct.Struct(">QQ")  # segment, live bytes
_SWAP: Final = sys.byteorder == "little"  # columns are written big-endian like the rest
_MAX_SEGMENT: Final = 0xFFFFFFFF  # (EntryIndex keeps segments in an array of u32)
assert array("I").itemsize == 4 and array("Q").itemsize == 8


def _column_bytes(col: array[int]) -> bytes:
    """A column's big-endian bytes (``col`` is the encoder's own copy: swapped in place)."""
    if _SWAP:
        col.byteswap()
    return col.tobytes()


def _read_column(payload: bytes, pos: int, typecode: str, n: int) -> array[int]:
    col = array(typecode)
    end = pos + col.itemsize * n
    if end > len(payload):
        raise ValueError("a column runs past the end")
    col.frombytes(payload[pos:end])
    if _SWAP:
        col.byteswap()
    return col


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a synchronous bulk step.

    Why: decoding or encoding rows (version 2 files, a delta's changed entries) makes a tuple
    (or more) per entry, and the collections those allocations trigger walk the whole young
    heap and, every so often, the whole index: measured here, 80% of decoding a
    2-million-entry version 2 checkpoint (1.6 s vs 0.3 s) and 70% of encoding one. Nothing
    made in these steps forms a cycle, so nothing is lost by not collecting during them; the
    previous setting is restored at once (never across an await)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _ledger_meta(lid: int, st: LedgerState) -> bytes:
    """What a checkpoint says about a ledger besides its entries (compared between
    checkpoints: a delta holds a ledger whose meta changed even if no entry did)."""
    flags = (
        (_FENCED if st.fenced else 0)
        | (_HAS_KEY if st.master_key is not None else 0)
        | (_HAS_LAC if st.explicit_lac_body is not None else 0)
    )
    key = st.master_key or b""
    lac_body = st.explicit_lac_body or b""
    return _META.pack(lid, flags, st.max_piggyback_lac, st.explicit_lac, len(key),
                      len(lac_body)) + key + lac_body


def ledger_metas(index: Index) -> dict[int, bytes]:
    """Every held ledger's meta as a checkpoint of ``index`` writes it (what a delta compares
    with): for a store that loaded a checkpoint chain, so its next checkpoint can be a delta."""
    return {lid: _ledger_meta(lid, st) for lid, st in index.ledgers.items()}


class CheckpointEncoder:
    """Encodes one checkpoint file in steps, from a snapshot taken when it is created.

    Why steps: encoding costs in proportion to the entries the file holds (about 0.2 s per
    million here), and a bookie that encoded a big base in one go stopped serving for that
    long.
    Creating the encoder copies what the file needs with C-level copies (each ledger's ordered
    ids and location dict for a base, the changed entries for a delta), so the file is exactly
    the index at ``pos`` however the index changes afterwards; :meth:`steps` then encodes a
    bounded number of entries per step and the caller may serve between steps.

    ``seq == 0``: a base (every ledger, every entry, every deleted id). ``seq > 0``: a delta
    on the checkpoint whose ledger metas were ``written`` (:attr:`metas` of the previous
    encoder): the ledgers whose meta differs or that have added or moved entries, with only
    those entries, and the ledgers deleted since. Either way the index's changes count as
    checkpointed from here on (``EntryIndex.take_changes``, ``Index.take_deleted``): if this
    file is not written, the caller's next checkpoint must be a base."""

    def __init__(self, index: Index, pos: Position, *, generation: int = 0, seq: int = 0,
                 dead: Iterable[int] = (), written: dict[int, bytes] | None = None,
                 skip_state_only: bool = False) -> None:
        if seq and written is None:
            raise ValueError("a delta checkpoint needs the ledger metas it follows")
        #: every ledger's meta as of this checkpoint (what the next delta compares with)
        self.metas: dict[int, bytes] = {}
        self._ledgers: list[tuple[bytes, EntryColumns, dict[int, Loc]]] = []
        #: mutation switch DELTA_SKIPS_LEDGER_STATE (a broken build, for checker tests)
        self._skip_state_only = skip_state_only
        with _gc_paused():
            self._snapshot(index, seq, written)
        deleted = self._deleted.ranges()
        live = sorted(index.seg_live.items())
        dead = list(dead)
        self._tail = (_COUNT.pack(len(deleted)) + b"".join(_RANGE.pack(*r) for r in deleted)
                      + _COUNT.pack(len(live)) + b"".join(_LIVE.pack(*x) for x in live))
        self._parts: list[bytes] = [
            _HEAD.pack(DELTA if seq else BASE, generation, seq, pos.seg, pos.offset,
                       pos.batch_seq, len(dead), len(self._ledgers)),
            struct.pack(f">{len(dead)}Q", *dead),
        ]
        self._done = False

    def _snapshot(self, index: Index, seq: int, written: dict[int, bytes] | None) -> None:
        """Copy what the file will hold (synchronously: the index as it is now)."""
        since = index.take_deleted()
        self._deleted = index.deleted if not seq else IdRanges(since)
        for lid in sorted(index.ledgers):
            st = index.ledgers[lid]
            meta = self.metas[lid] = _ledger_meta(lid, st)
            if not seq:
                cols, rows = st.entries.snapshot()
                st.entries.mark_checkpointed()
                self._ledgers.append((meta, cols, rows))
                continue
            cols, rows = st.entries.take_changes()
            if len(cols.sizes) or rows or (
                    written.get(lid) != meta  # type: ignore[union-attr]
                    and not self._skip_state_only):
                self._ledgers.append((meta, cols, rows))

    def steps(self, entries_per_step: int = 16384) -> Iterator[None]:
        """Encode, pausing (yielding) after about ``entries_per_step`` entries' worth of
        work each time. What costs is Python work per ledger and per row; dense columns are
        copied at C speed, so a ledger counts as 32 entries, a row as 8, 64 slots as one."""
        parts = self._parts
        since = 0
        for meta, cols, rows in self._ledgers:
            n = len(cols.sizes)
            parts.append(meta + _DENSE.pack(cols.first, n))
            parts += (_column_bytes(cols.segs), _column_bytes(cols.offs),
                      _column_bytes(cols.sizes), _COUNT.pack(len(rows)))
            if rows:
                with _gc_paused():
                    flat: list[int] = []
                    for eid in sorted(rows):
                        flat.append(eid)
                        flat.extend(rows[eid])
                    parts.append(struct.pack(">" + _ENTRY_FMT * len(rows), *flat))
            since += 32 + 8 * len(rows) + n // 64
            if since >= entries_per_step:
                since = 0
                yield
        self._ledgers = []
        parts.append(self._tail)
        self._done = True

    def result(self) -> bytes:
        """The file's bytes (after :meth:`steps` has run to its end)."""
        if not self._done:
            for _ in self.steps():
                pass
        payload = b"".join(self._parts)
        crc = _checksum(CHECKPOINT_VERSION, len(payload), payload)
        return _HEADER.pack(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, crc, len(payload)) + payload


def _checksum(version: int, length: int, payload: bytes) -> int:
    """The file's CRC32C: from version 3 over the header's magic, version and length too (a
    flipped version byte is a checksum mismatch, not a misread payload); version 2: the
    payload only."""
    if version < 3:
        return crc32c.crc32c(payload)
    return crc32c.crc32c(payload, crc32c.crc32c(_HEADER_CHECKED.pack(CHECKPOINT_MAGIC, version,
                                                                     length)))


def encode_checkpoint(index: Index, pos: Position, *, generation: int = 0,
                      dead: Iterable[int] = ()) -> bytes:
    """A base checkpoint of ``index`` at ``pos`` in one go (see :class:`CheckpointEncoder`)."""
    return CheckpointEncoder(index, pos, generation=generation, dead=dead).result()


@dataclass
class CheckpointFile:
    """A decoded checkpoint file: a base (``seq == 0``) or a delta on base ``generation``."""

    kind: int
    generation: int
    seq: int
    position: Position
    dead: list[int]
    #: (ledger id, its state without entries, its dense run's columns, its rows)
    ledgers: list[tuple[int, LedgerState, EntryColumns, list[tuple[int, Loc]]]] = field(
        repr=False)
    #: a base: every deleted ledger; a delta: those deleted since the file before it
    deleted: IdRanges = field(default_factory=IdRanges)
    #: live bytes per segment at this file's position (None: a version 2 file, summed instead)
    seg_live: dict[int, int] | None = None

    def build_index(self) -> Index:
        """The index a base describes."""
        if self.kind != BASE:
            raise ValueError("only a base checkpoint describes a whole index")
        with _gc_paused():
            return self._build_index()

    def _build_index(self) -> Index:
        index = Index()
        index.deleted = self.deleted
        for lid, st, cols, rows in self.ledgers:
            st.entries = EntryIndex.from_columns(cols, rows)
            index.ledgers[lid] = st
        self._set_live(index)
        return index

    def _set_live(self, index: Index) -> None:
        """The live bytes as of this file (entries loaded from it did not count them)."""
        index.seg_live = (dict(self.seg_live) if self.seg_live is not None
                          else index.live_from_entries())  # (version 2: summed)

    def apply_to(self, index: Index) -> None:
        """Bring ``index`` (as of the previous file of the chain) up to this delta.
        ValueError if the delta names a ledger as held that the index has deleted (a delta
        that does not follow this index).
        """
        if self.kind != DELTA:
            raise ValueError("only a delta checkpoint applies to an index")
        index.load_deleted(self.deleted)
        index.take_deleted()  # what was just loaded is on disk already
        for lid, new, cols, rows in self.ledgers:
            st = index.ledger(lid)
            st.master_key, st.fenced = new.master_key, new.fenced
            st.explicit_lac, st.explicit_lac_body = new.explicit_lac, new.explicit_lac_body
            st.max_piggyback_lac = new.max_piggyback_lac
            st.entries.add_columns(cols)
            for eid, loc in rows:
                st.entries.put(eid, loc)
            st.entries.mark_checkpointed()  # what was just loaded is on disk already
        self._set_live(index)


def decode_checkpoint(data: bytes, path: str) -> CheckpointFile:
    """Parse a checkpoint file; CorruptRecordError on any damage or unknown version."""
    if len(data) < _HEADER.size:
        raise CorruptRecordError(f"{path}: index checkpoint is truncated", path=path, offset=0)
    magic, version, crc, length = _HEADER.unpack_from(data)
    if magic != CHECKPOINT_MAGIC:
        raise CorruptRecordError(f"{path}: not a pybk index checkpoint", path=path, offset=0)
    if version not in READABLE_VERSIONS:
        raise CorruptRecordError(
            f"{path}: unknown index checkpoint version {version} (this pybk reads "
            f"{', '.join(map(str, READABLE_VERSIONS))})", path=path, offset=0)
    payload = data[_HEADER.size :]
    if len(payload) != length or _checksum(version, length, payload) != crc:
        raise CorruptRecordError(f"{path}: index checkpoint checksum mismatch", path=path,
                                 offset=0)
    try:
        with _gc_paused():
            return _decode_payload(payload, version)
    except (struct.error, ValueError) as exc:
        raise CorruptRecordError(f"{path}: malformed index checkpoint ({exc})", path=path,
                                 offset=0) from None


def _decode_payload(payload: bytes, version: int) -> CheckpointFile:
    kind, generation, seq, seg, offset, batch_seq, ndead, count = _HEAD.unpack_from(payload)
    if kind not in (BASE, DELTA) or (kind == BASE) != (seq == 0):
        raise ValueError(f"kind {kind} with sequence number {seq}")
    pos = _HEAD.size
    dead = list(struct.unpack_from(f">{ndead}Q", payload, pos))
    pos += 8 * ndead
    ledgers = []
    deleted = IdRanges()
    last_lid: int | None = None
    for _ in range(count):
        lid, flags, piggy, elac, keylen, laclen = _META.unpack_from(payload, pos)
        pos += _META.size
        if last_lid is not None and lid <= last_lid:  # (written ascending, each once)
            raise ValueError(f"ledger {lid} after ledger {last_lid}")
        last_lid = lid
        if piggy < -1 or elac < -1:
            raise ValueError(f"ledger {lid}: LAC {min(piggy, elac)}")
        key = payload[pos : pos + keylen]
        pos += keylen
        lac_body = payload[pos : pos + laclen]
        pos += laclen
        cols = empty_columns()
        if version >= 3:
            first, n = _DENSE.unpack_from(payload, pos)
            pos += _DENSE.size
            cols = EntryColumns(first, _read_column(payload, pos, "I", n),
                                _read_column(payload, pos + 4 * n, "Q", n),
                                _read_column(payload, pos + 12 * n, "I", n))
            pos += 16 * n
            if n and (first < 0 or not cols.sizes[-1]):
                raise ValueError(f"ledger {lid}: a dense run from entry {first} that ends in "
                                 f"{'a hole' if not cols.sizes[-1] else 'an entry'}")
        (nrows,) = _COUNT.unpack_from(payload, pos)
        pos += _COUNT.size
        if flags & _DELETED:
            if version >= 3:
                raise ValueError(f"ledger {lid} flagged deleted (version {version} keeps ids)")
            deleted.add(lid)  # version 2's tombstone: its entries were dropped already
            pos += _ENTRY_SIZE * nrows
            continue
        if pos + _ENTRY_SIZE * nrows > len(payload):
            raise ValueError(f"ledger {lid}: {nrows} rows run past the end")
        st = LedgerState(
            master_key=key if flags & _HAS_KEY else None,
            fenced=bool(flags & _FENCED),
            explicit_lac=elac,
            explicit_lac_body=lac_body if flags & _HAS_LAC else None,
            max_piggyback_lac=piggy,
        )
        rows: list[tuple[int, Loc]] = []
        if nrows:
            flat = struct.unpack_from(">" + _ENTRY_FMT * nrows, payload, pos)
            pos += _ENTRY_SIZE * nrows
            rows = [(flat[i], (flat[i + 1], flat[i + 2], flat[i + 3]))
                    for i in range(0, 4 * nrows, 4)]
            _check_rows(lid, rows, cols, kind)
        ledgers.append((lid, st, cols, rows))
    seg_live = None
    if version >= 3:
        (nranges,) = _COUNT.unpack_from(payload, pos)
        pos += _COUNT.size
        deleted = IdRanges.from_ranges(_RANGE.unpack_from(payload, pos + i * _RANGE.size)
                                       for i in range(nranges))
        pos += _RANGE.size * nranges
        (nlive,) = _COUNT.unpack_from(payload, pos)
        pos += _COUNT.size
        seg_live = dict(_LIVE.unpack_from(payload, pos + i * _LIVE.size) for i in range(nlive))
        pos += _LIVE.size * nlive
    held_and_deleted = [lid for lid, *_ in ledgers if lid in deleted]
    if held_and_deleted:
        raise ValueError(f"ledger {held_and_deleted[0]} both held and deleted")
    if pos != len(payload):
        raise ValueError(f"{len(payload) - pos} trailing bytes")
    return CheckpointFile(kind, generation, seq, Position(seg, offset, batch_seq), dead,
                          ledgers, deleted, seg_live)


def _check_rows(lid: int, rows: list[tuple[int, Loc]], cols: EntryColumns, kind: int) -> None:
    """Rows are written in ascending id order, each once, with a size and a segment that fits
    the index's 32-bit segment column (a row may land in the dense run); a base's rows are the
    entries outside its dense run's held slots (a delta's may move entries of that run)."""
    last = -1
    first, n, sizes = cols.first, len(cols.sizes), cols.sizes
    for eid, (seg, _offset, size) in rows:
        if eid <= last or not size or seg > _MAX_SEGMENT:
            raise ValueError(f"ledger {lid}: row of entry {eid} (segment {seg}, size {size}) "
                             f"after entry {last}")
        last = eid
        if kind == BASE and 0 <= eid - first < n and sizes[eid - first]:
            raise ValueError(f"ledger {lid}: entry {eid} both in the dense run and a row")


# --------------------------------------------------------------------------- files of a chain


def delta_checkpoint_name(generation: int, seq: int) -> str:
    return f"{CHECKPOINT_FILE}.{generation:016x}.{seq:08x}"


def parse_delta_checkpoint_name(name: str) -> tuple[int, int] | None:
    """(generation, seq) of a delta checkpoint's file name, else None."""
    parts = name.split(".")
    if (len(parts) != 4 or ".".join(parts[:2]) != CHECKPOINT_FILE or len(parts[2]) != 16
            or len(parts[3]) != 8):
        return None
    try:
        return int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None


def delta_checkpoints(fs: FileSystem, data_dir: str) -> list[tuple[int, int]]:
    """(generation, seq) of every delta file in ``data_dir``, sorted."""
    return sorted(d for d in map(parse_delta_checkpoint_name, fs.listdir(data_dir))
                  if d is not None)


def stale_checkpoint_files(fs: FileSystem, data_dir: str, generation: int) -> list[str]:
    """Names of the delta files that are not part of base ``generation``'s chain: deltas of
    other generations and half-written (``.tmp``) ones."""
    stale = []
    for name in fs.listdir(data_dir):
        tmp = name.endswith(_TMP_SUFFIX)
        found = parse_delta_checkpoint_name(name[: -len(_TMP_SUFFIX)] if tmp else name)
        if found is not None and (tmp or found[0] != generation):
            stale.append(name)
    return sorted(stale)


@dataclass
class CheckpointChain:
    """A base checkpoint and the deltas applied on it, as loaded from a data directory."""

    index: Index
    base: CheckpointFile
    #: the chain's last file (the base when it has no deltas): its position and dead list
    last: CheckpointFile
    deltas: int
    base_bytes: int
    delta_bytes: int


def load_checkpoint_chain(fs: FileSystem, data_dir: str) -> CheckpointChain:
    """Read ``data_dir``'s base checkpoint and apply its deltas in sequence (deltas of other
    generations are skipped). Reads only. A damaged file, a gap in the chain or a file that
    is not what its name says raises CorruptRecordError; a missing base, FileNotFoundError."""
    path = posixpath.join(data_dir, CHECKPOINT_FILE)
    data = fs.read_file(path)
    base = decode_checkpoint(data, path)
    if base.kind != BASE:
        raise CorruptRecordError(f"{path}: a delta checkpoint where the base belongs",
                                 path=path, offset=0)
    chain = CheckpointChain(base.build_index(), base, base, 0, len(data), 0)
    for gen, seq in delta_checkpoints(fs, data_dir):
        if gen != base.generation:
            continue  # left by an older base
        path = posixpath.join(data_dir, delta_checkpoint_name(gen, seq))
        if seq != chain.last.seq + 1:
            raise CorruptRecordError(
                f"{path}: delta checkpoint {chain.last.seq + 1} of generation {gen} is "
                "missing", path=path, offset=0)
        data = fs.read_file(path)
        delta = decode_checkpoint(data, path)
        if (delta.kind, delta.generation, delta.seq) != (DELTA, gen, seq):
            raise CorruptRecordError(
                f"{path}: holds delta {delta.seq} of generation {delta.generation}, not what "
                "its name says", path=path, offset=0)
        try:
            delta.apply_to(chain.index)
        except ValueError as exc:
            raise CorruptRecordError(f"{path}: does not follow its chain ({exc})", path=path,
                                     offset=0) from None
        chain.last = delta
        chain.deltas += 1
        chain.delta_bytes += len(data)
    return chain
