"""An in-memory FileSystem that models what a crash does to files.

Used by the storage tests (crash-point enumeration, stateful tests) and by the simulator. It
follows the persistence model of the ALICE and LazyFS work (OSDI 2014; LazyFS, 2023) (listed in
docs/internals.md, "pybk/storage/memfs.py").
"""

from __future__ import annotations

import asyncio
import copy
import errno
import functools
import posixpath
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pybk.storage.fs import FileHandle, FileSystem

T = TypeVar("T")

__all__ = [
    "CRASH_MODES",
    "MemFileSystem",
]

CRASH_MODES = ("drop", "torn", "reorder")

#: a capacity this large cannot be reached by files held in memory
_NO_LIMIT = 1 << 40

@functools.lru_cache(maxsize=4096)
def _normpath(path: str) -> str:
    """A path's normal form (a bookie names the same few files again and again)."""
    return posixpath.normpath(path)


@dataclass
class _Inode:
    current: bytearray = field(default_factory=bytearray)
    durable: bytearray = field(default_factory=bytearray)
    #: Byte ranges [start, end) whose unsynced data was lost by a failed fsync: they never
    #: become durable (a later successful sync persists zeros there).
    lost: list[tuple[int, int]] = field(default_factory=list)
    #: Latent sector errors: ranges whose reads fail with EIO.
    bad_reads: list[tuple[int, int]] = field(default_factory=list)
    #: Misdirected reads: (start, end, shift): bytes of [start, end) are read from
    #: [start + shift, end + shift) instead (zeros past the file's end).
    misreads: list[tuple[int, int, int]] = field(default_factory=list)
    #: cut below its durable length since the last sync (see the module docstring)
    truncated: bool = False
    #: [dirty_lo, dirty_hi): where the current bytes were written since the last sync
    #: (-1: nowhere). Every difference from the durable bytes lies in it or past the durable
    #: length, so a sync copies that range, not the file, and ``changed`` compares it alone
    #: (a journal segment grows to megabytes and is synced after every batch).
    dirty_lo: int = -1
    dirty_hi: int = -1

    def mark(self, lo: int, hi: int) -> None:
        """Bytes [lo, hi) of the current content were written."""
        if lo >= hi:
            return
        if self.dirty_lo < 0:
            self.dirty_lo, self.dirty_hi = lo, hi
        else:
            self.dirty_lo = min(self.dirty_lo, lo)
            self.dirty_hi = max(self.dirty_hi, hi)

    def changed(self) -> tuple[int, int]:
        """[start, end) of the current bytes that differ from the durable ones (start == end:
        none): an append starts at the durable length, an in-place write earlier."""
        cur, dur = memoryview(self.current), memoryview(self.durable)
        n = min(len(cur), len(dur))
        lo, hi = self.dirty_lo, min(self.dirty_hi, n)
        if lo < 0 or lo >= hi or cur[lo:hi] == dur[lo:hi]:
            return n, max(n, len(cur))
        start = lo + _first_difference(cur[lo:hi], dur[lo:hi], hi - lo)
        end = (len(cur) if len(cur) > len(dur)
               else lo + _last_difference(cur[lo:hi], dur[lo:hi], hi - lo) + 1)
        return start, end

    def synced(self) -> None:
        """The current bytes are durable now (a sync returned, or a crash happened)."""
        cur, dur = self.current, self.durable
        if len(dur) > len(cur):
            del dur[len(cur):]
        lo, hi = self.dirty_lo, min(self.dirty_hi, len(dur))
        if 0 <= lo < hi:
            dur[lo:hi] = memoryview(cur)[lo:hi]
        if len(dur) < len(cur):
            dur += memoryview(cur)[len(dur):]
        self.dirty_lo = self.dirty_hi = -1


def _first_difference(a: memoryview, b: memoryview, n: int, step: int = 4096) -> int:
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        if a[lo:hi] != b[lo:hi]:
            return next(i for i in range(lo, hi) if a[i] != b[i])
    return n


def _last_difference(a: memoryview, b: memoryview, n: int, step: int = 4096) -> int:
    for hi in range(n, 0, -step):
        lo = max(0, hi - step)
        if a[lo:hi] != b[lo:hi]:
            return next(i for i in range(hi - 1, lo - 1, -1) if a[i] != b[i])
    return -1


@dataclass
class _DirOp:
    op: str  # "link" (create or rename target) or "unlink"
    name: str
    inode: _Inode | None


class _MemFileHandle(FileHandle):
    def __init__(self, fs: MemFileSystem, path: str, inode: _Inode,
                 offset: int | None = None) -> None:
        """An append handle (``offset`` None) or a rewrite handle writing from ``offset``."""
        self.path = path
        self._fs = fs
        self._inode = inode
        self._generation = fs._generation
        self._closed = False
        self._pos = offset

    def _check_open(self) -> None:
        if self._closed or self._generation != self._fs._generation:
            raise OSError(errno.EBADF, f"{self.path}: handle invalid (closed or crashed)")

    def _check_room(self, growth: int) -> None:
        """ENOSPC if the file system cannot grow by ``growth`` bytes (<= 0: no growth)."""
        capacity = self._fs.capacity
        # (a terabyte or more cannot fill up in memory: no need to add up every file's size
        # at every write)
        if growth > 0 and capacity < _NO_LIMIT and self._fs._used() + growth > capacity:
            raise OSError(errno.ENOSPC, f"{self.path}: no space left on device")

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._check_open()
        self._fs._hook("write", self.path)
        size = len(data)
        current = self._inode.current
        pos = len(current) if self._pos is None else self._pos
        self._check_room(pos + size - len(current))
        if self._pos is None:
            current += data
        else:
            if pos > len(current):  # the file was cut below this handle's offset: a hole
                self._inode.mark(len(current), pos)
                current.extend(bytes(pos - len(current)))
            current[pos : pos + size] = data
            self._pos = pos + size
        self._inode.mark(pos, pos + size)
        self._fs.counters["write"] += 1

    async def sync(self) -> None:
        self._check_open()
        fs = self._fs
        fs._hook("sync", self.path)
        await fs.wait(fs.sync_delay)
        self._finish_sync()

    def sync_now(self) -> None:
        """The sync of work run through :meth:`MemFileSystem.offload`: at once (the offload
        as a whole waits out the disk's time)."""
        self._check_open()
        self._fs._hook("sync", self.path)
        self._finish_sync()

    def sync_inline(self) -> bool:
        """The same sync without the yield: the caller's thread blocks for ``sync_delay``.
        A sync that takes time is modelled only when the file system was given a way to
        block (``stall``: the simulator's loop lets virtual time pass with nothing else
        running); otherwise, with a delay set, this declines and callers ``await sync()``."""
        fs = self._fs
        if fs.sync_delay > 0 and fs.stall is None:
            return False
        self._check_open()
        fs._hook("sync", self.path)
        if fs.sync_delay > 0 and fs.stall is not None:
            fs.stall(fs.sync_delay)
        self._finish_sync()
        return True

    def _finish_sync(self) -> None:
        self._check_open()  # a crash may have happened while the sync was "in flight"
        self._fs.counters["sync"] += 1
        inode = self._inode
        failure = self._fs._take_fsync_failure(self.path)
        if failure is not None:
            start, end = inode.changed()
            if end > start:
                inode.lost.append((start, end))
            raise OSError(failure, f"{self.path}: fsync failed")
        inode.truncated = False
        inode.synced()
        for start, end in inode.lost:
            end = min(end, len(inode.durable))
            if start < end:
                inode.durable[start:end] = bytes(end - start)

    def allocate(self, size: int) -> None:
        self._check_open()
        self._fs._hook("write", self.path)
        current = self._inode.current
        if size > len(current):
            self._check_room(size - len(current))
            self._inode.mark(len(current), size)
            current.extend(bytes(size - len(current)))
        self._fs.counters["write"] += 1

    def size(self) -> int:
        return len(self._inode.current) if self._pos is None else self._pos

    def close(self) -> None:
        self._closed = True


class MemFileSystem(FileSystem):
    """Files in memory with synced and unsynced state kept apart. See the module docstring."""

    def __init__(self, *, capacity: int = 1 << 40, sector_size: int = 512) -> None:
        self.capacity = capacity
        self.sector_size = sector_size
        self.sync_delay = 0.0
        #: How a sync made inline (``FileHandle.sync_inline``) blocks its caller for
        #: ``sync_delay``: ``stall(seconds)`` (the simulator passes its loop's ``stall``).
        #: None: inline syncs are declined while ``sync_delay`` is set.
        self.stall: Callable[[float], None] | None = None
        #: How a sync waits out ``sync_delay`` on the loop: ``wait(seconds)`` returns what to
        #: await (the simulator passes a bare timer future on its virtual clock).
        self.wait: Callable[[float], Awaitable[None]] = asyncio.sleep
        #: Called as ``fault_hook(op, path)`` before every mutating operation.
        self.fault_hook: Callable[[str, str], None] | None = None
        self.counters: dict[str, int] = {
            k: 0 for k in ("create", "write", "sync", "rename", "delete", "truncate", "fsync_dir")
        }
        self._files: dict[str, _Inode] = {}  # the current namespace
        self._durable_files: dict[str, _Inode] = {}  # the namespace as of the last dir fsyncs
        self._pending: dict[str, list[_DirOp]] = {}  # per directory, since its last fsync_dir
        self._dirs: set[str] = {"/", "."}
        self._generation = 0
        self._fsync_failures: list[tuple[int, str | None]] = []

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _norm(path: str) -> str:
        return _normpath(path)

    def _hook(self, op: str, path: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(op, path)

    def _used(self) -> int:
        return sum(len(i.current) for i in self._files.values())

    def _inode(self, path: str) -> _Inode:
        try:
            return self._files[self._norm(path)]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "no such file", path) from None

    def _dir_op(self, path: str, op: str, inode: _Inode | None) -> None:
        directory, name = posixpath.split(path)
        self._pending.setdefault(directory or ".", []).append(_DirOp(op, name, inode))

    def _take_fsync_failure(self, path: str) -> int | None:
        for i, (err, prefix) in enumerate(self._fsync_failures):
            if prefix is None or path.startswith(prefix):
                del self._fsync_failures[i]
                return err
        return None

    # -- FileSystem: reads -----------------------------------------------------------------------

    def pread(self, path: str, offset: int, size: int) -> bytes:
        inode = self._inode(path)
        end = offset + size
        for start, stop in inode.bad_reads:
            if start < end and offset < stop:
                raise OSError(errno.EIO, f"{path}: read error at offset {offset}")
        data = bytes(inode.current[offset:end])
        if not inode.misreads:
            return data
        out = bytearray(data)
        for start, stop, shift in inode.misreads:
            lo, hi = max(start, offset), min(stop, offset + len(out))
            if lo < hi:  # (the block layer read another place: zeros past the file's end)
                wrong = bytes(inode.current[max(0, lo + shift) : max(0, hi + shift)])
                out[lo - offset : hi - offset] = wrong.ljust(hi - lo, b"\0")
        return bytes(out)

    def read_file(self, path: str) -> bytes:
        return self.pread(path, 0, len(self._inode(path).current))

    def file_size(self, path: str) -> int:
        return len(self._inode(path).current)

    def exists(self, path: str) -> bool:
        p = self._norm(path)
        return p in self._files or p in self._dirs

    def listdir(self, path: str) -> list[str]:
        d = self._norm(path)
        if d not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        names = {posixpath.basename(p) for p in self._files if posixpath.dirname(p) == d}
        names |= {posixpath.basename(p) for p in self._dirs if posixpath.dirname(p) == d and p != d}
        return sorted(names)

    def disk_usage(self, path: str) -> tuple[int, int]:
        return max(0, self.capacity - self._used()), self.capacity

    # -- FileSystem: changes ---------------------------------------------------------------------

    def open_append(self, path: str, *, bulk: bool = False) -> FileHandle:
        p = self._norm(path)
        if posixpath.dirname(p) not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", posixpath.dirname(p))
        inode = self._files.get(p)
        if inode is None:
            self._hook("create", p)
            inode = _Inode()
            self._files[p] = inode
            self._dir_op(p, "link", inode)
            self.counters["create"] += 1
        return _MemFileHandle(self, p, inode)

    def open_rewrite(self, path: str, offset: int) -> FileHandle:
        p = self._norm(path)
        inode = self._inode(p)
        if not 0 <= offset <= len(inode.current):
            raise ValueError(f"{p}: offset {offset} outside the file "
                             f"({len(inode.current)} bytes)")
        return _MemFileHandle(self, p, inode, offset)

    def makedirs(self, path: str) -> None:
        # Directories are modelled as always durable: pybk creates them once, at set-up.
        p = self._norm(path)
        while p not in self._dirs:
            self._dirs.add(p)
            p = posixpath.dirname(p)

    def rename(self, src: str, dst: str) -> None:
        s, d = self._norm(src), self._norm(dst)
        self._hook("rename", s)
        inode = self._inode(s)
        del self._files[s]
        self._files[d] = inode
        self._dir_op(s, "unlink", None)
        self._dir_op(d, "link", inode)
        self.counters["rename"] += 1

    def delete(self, path: str) -> None:
        p = self._norm(path)
        self._hook("delete", p)
        self._inode(p)
        del self._files[p]
        self._dir_op(p, "unlink", None)
        self.counters["delete"] += 1

    def truncate(self, path: str, size: int) -> None:
        p = self._norm(path)
        self._hook("truncate", p)
        inode = self._inode(p)
        del inode.current[size:]
        inode.dirty_hi = min(inode.dirty_hi, size)
        if inode.dirty_lo >= inode.dirty_hi:
            inode.dirty_lo = inode.dirty_hi = -1
        if size < len(inode.durable):
            inode.truncated = True
        self.counters["truncate"] += 1

    async def offload(self, work: Callable[[], T]) -> T:
        """Deterministic: ``work`` runs at once on the loop, then its result arrives
        ``sync_delay`` later (virtual time in the simulator), the time a flush thread would
        take: the caller's flush is in flight over that window, adds go on, and a crash can
        come in it (the work's files written and synced, the caller not yet told)."""
        result = work()
        await self.wait(self.sync_delay)
        return result

    async def fsync_dir(self, path: str) -> None:
        d = self._norm(path)
        self._hook("fsync_dir", d)
        await self.wait(self.sync_delay)
        self.counters["fsync_dir"] += 1
        for op in self._pending.pop(d, []):
            self._apply(self._durable_files, d, op)

    @staticmethod
    def _apply(namespace: dict[str, _Inode], directory: str, op: _DirOp) -> None:
        path = posixpath.join(directory, op.name) if directory != "." else op.name
        path = posixpath.normpath(path)
        if op.op == "link":
            assert op.inode is not None
            namespace[path] = op.inode
        else:
            namespace.pop(path, None)

    # -- fault injection ---------------------------------------------------------------------------

    def crash(self, mode: str = "drop", rng: random.Random | None = None) -> None:
        """Simulate a power cut: see the module docstring for what each ``mode`` keeps."""
        if mode not in CRASH_MODES:
            raise ValueError(f"crash mode must be one of {CRASH_MODES}, not {mode!r}")
        rng = rng or random.Random(0)
        self._generation += 1
        # Directory entries: durable ones plus a random prefix of each dir's pending changes.
        namespace = dict(self._durable_files)
        for directory in sorted(self._pending):
            ops = self._pending[directory]
            keep = 0 if mode == "drop" else rng.randint(0, len(ops))
            for op in ops[:keep]:
                self._apply(namespace, directory, op)
        self._pending.clear()
        self._files = namespace
        self._durable_files = dict(namespace)
        # File contents.
        for path in sorted(self._files):
            self._crash_inode(self._files[path], mode, rng)

    def _crash_inode(self, inode: _Inode, mode: str, rng: random.Random) -> None:
        durable = inode.durable
        base, end = inode.changed()
        if mode == "drop" or inode.truncated or base == end:
            inode.current = bytearray(durable)
        else:
            change = bytearray(inode.current[base:end])
            for start, stop in inode.lost:  # data lost by a failed fsync never comes back
                s, e = max(start - base, 0), min(stop - base, len(change))
                if s < e:
                    change[s:e] = bytes(e - s)
            kept: list[tuple[int, int]] = []  # ranges of ``change`` that reach the disk
            if mode == "torn":
                kept.append((0, rng.randint(0, len(change))))
            else:  # reorder: each sector of the change survives independently
                pos = 0
                while pos < len(change):
                    sector_end = min(len(change), ((base + pos) // self.sector_size + 1)
                                     * self.sector_size - base)
                    if rng.random() < 0.5:
                        kept.append((pos, sector_end))
                    pos = sector_end
            out = bytearray(durable)
            for s, e in kept:
                if base + e > len(out):  # past the durable end: the gap before reads as zeros
                    out.extend(bytes(base + e - len(out)))
                out[base + s : base + e] = change[s:e]
            inode.current = out
        inode.durable = bytearray(inode.current)
        inode.dirty_lo = inode.dirty_hi = -1
        inode.lost = []
        inode.truncated = False

    def fail_next_fsync(self, err: int = errno.EIO, path_prefix: str | None = None) -> None:
        """Make the next sync of a file under ``path_prefix`` (any file if None) fail."""
        self._fsync_failures.append((err, path_prefix))

    def set_capacity(self, capacity: int) -> None:
        self.capacity = capacity

    def flip_bit(self, path: str, offset: int, bit: int = 0) -> None:
        """Corrupt one bit of a file, in its current and (if present there) durable bytes."""
        inode = self._inode(path)
        if not 0 <= offset < len(inode.current):
            raise ValueError(f"offset {offset} outside {path} ({len(inode.current)} bytes)")
        inode.current[offset] ^= 1 << bit
        if offset < len(inode.durable):
            inode.durable[offset] ^= 1 << bit

    def fail_reads(self, path: str, offset: int, length: int) -> None:
        """A latent sector error: preads overlapping [offset, offset+length) raise EIO."""
        self._inode(path).bad_reads.append((offset, offset + length))

    def misdirect_reads(self, path: str, offset: int, length: int, shift: int) -> None:
        """Misdirected reads: bytes of [offset, offset+length) read back from ``shift``
        bytes away (the block layer reads another place; no error is raised)."""
        if length <= 0 or shift == 0:
            raise ValueError(f"a misdirected read needs a length > 0 and a shift, got "
                             f"{length} and {shift}")
        self._inode(path).misreads.append((offset, offset + length, shift))

    def misdirect_write(self, path: str, offset: int, length: int, landed: int) -> None:
        """A write of [offset, offset+length) that landed at ``landed`` instead, after the
        fact: the bytes meant for ``offset`` overwrite those at ``landed`` (extending the
        file with zeros if need be) and ``offset``'s range holds zeros (never written), in
        the current and the durable bytes alike (the write was synced)."""
        inode = self._inode(path)
        if not 0 <= offset < offset + length <= len(inode.current) or landed < 0:
            raise ValueError(f"{path}: cannot misdirect [{offset}, {offset + length}) to "
                             f"{landed} ({len(inode.current)} bytes)")
        meant = bytes(inode.current[offset : offset + length])
        inode.mark(offset, offset + length)  # (harmless where the durable bytes change too)
        inode.mark(landed, landed + length)
        for buf in (inode.current, inode.durable):
            if offset + length > len(buf):
                continue  # (not synced yet: only the current bytes hold it)
            if landed + length > len(buf):
                buf.extend(bytes(landed + length - len(buf)))
            buf[offset : offset + length] = bytes(length)
            buf[landed : landed + length] = meant

    def unsynced_bytes(self) -> int:
        """How many bytes a crash in ``drop`` mode would lose right now (tests, stats)."""
        total = 0
        for inode in self._files.values():
            if inode.lost:  # what a failed fsync lost differs from the disk but is gone already
                total += max(0, len(inode.current) - len(inode.durable))
            else:
                start, end = inode.changed()
                total += end - start
        return total

    def _check(self) -> None:
        """Assert the model's invariants (stateful tests, the simulator's audits): paths are
        normalized and live in known directories; an inode's damage ranges are well formed;
        a failed sync's losses never lie past the bytes written; pending directory changes
        are links with an inode or unlinks without one, in known directories."""
        assert "/" in self._dirs and "." in self._dirs
        for d in self._dirs:
            assert d == self._norm(d), d
            parent = posixpath.dirname(d)
            assert d in ("/", ".") or parent in self._dirs or parent == "", d
        for namespace in (self._files, self._durable_files):
            for path, inode in namespace.items():
                assert path == self._norm(path), path
                for start, end in inode.lost + inode.bad_reads:
                    assert 0 <= start < end, (path, start, end)
                for start, end, shift in inode.misreads:
                    assert 0 <= start < end and shift != 0, (path, start, end, shift)
                if inode.dirty_lo < 0 and not inode.lost:  # nothing written since the sync
                    n = min(len(inode.current), len(inode.durable))
                    assert inode.current[:n] == inode.durable[:n], path
                else:
                    assert 0 <= inode.dirty_lo < inode.dirty_hi <= len(inode.current), path
        for path in self._files:
            assert posixpath.dirname(path) in self._dirs, path
        for directory, ops in self._pending.items():
            assert directory in self._dirs, directory
            for op in ops:
                assert op.op in ("link", "unlink"), op.op
                assert (op.inode is not None) == (op.op == "link"), op
                assert op.name and "/" not in op.name, op.name
        for name, count in self.counters.items():
            assert count >= 0, (name, count)
        assert all(prefix is None or isinstance(prefix, str)
                   for _err, prefix in self._fsync_failures)

    def clone(self) -> MemFileSystem:
        """A deep copy of the durable and unsynced state (open handles are not carried over)."""
        other = MemFileSystem(capacity=self.capacity, sector_size=self.sector_size)
        memo: dict[int, object] = {}
        other._files = copy.deepcopy(self._files, memo)
        other._durable_files = copy.deepcopy(self._durable_files, memo)
        other._pending = copy.deepcopy(self._pending, memo)
        other._dirs = set(self._dirs)
        other.sync_delay = self.sync_delay
        other.stall = self.stall
        other.wait = self.wait
        return other
