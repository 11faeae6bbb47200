"""The raw-disk ceiling of a durable log: CRC-framed records, one write + fdatasync per group.

A ceiling is only a ceiling if the product cannot beat it by getting a better deal from the
disk, so the file gets the same treatment as the bookie's journal segments:

* ``preallocate=False``: the file is appended to and grows (every fdatasync also commits
  the file's new size and blocks: what a bookie with ``journal_preallocate=False``, the
  in-process default, pays);
* ``preallocate=True``: the file is first filled with ``prealloc_size`` zero bytes and synced
  (untimed), then written in place with ``pwrite``, wrapping to the start at its end, so each
  fdatasync flushes data only (what ``pybk bookie``'s preallocated segments get; a bookie
  also pays for making the next segment while it writes, this loop never does).

Records are framed as a journal's simplest ceiling: a 4-byte big-endian length, a
4-byte CRC32C of the payload, the payload.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import time
from typing import Final

import crc32c

__all__ = [
    "PREALLOC_SIZE",
    "GroupCommitFile",
    "RecordFile",
    "frame_records",
    "fsync_latencies",
    "plain_group_commit",
    "replica_sync_floor",
]

#: the ceiling's record header: length, crc32c of the payload
RECORD_HEADER: Final = struct.Struct(">II")
#: a preallocated ceiling file's size: a bookie's default journal segment
PREALLOC_SIZE: Final = 64 << 20
_ZEROS: Final = bytes(1 << 20)


def frame_records(payload: bytes, count: int) -> list[bytes]:
    """``count`` CRC-framed records of ``payload``, as parts to join (header, payload, ...)."""
    parts: list[bytes] = []
    pack, crc = RECORD_HEADER.pack, crc32c.crc32c
    for _ in range(count):
        parts.append(pack(len(payload), crc(payload)))
        parts.append(payload)
    return parts


class RecordFile:
    """One file the ceiling writes batches to, appended or preallocated (module doc)."""

    def __init__(self, path: str, *, preallocate: bool,
                 prealloc_size: int = PREALLOC_SIZE) -> None:
        if prealloc_size < len(_ZEROS):
            raise ValueError(f"prealloc_size must be >= {len(_ZEROS)}, got {prealloc_size}")
        self.path = path
        self.preallocate = preallocate
        self.size = prealloc_size
        self.offset = 0
        self.written = 0
        if preallocate:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                for _ in range(prealloc_size // len(_ZEROS)):
                    os.write(self.fd, _ZEROS)
                os.fsync(self.fd)
            except BaseException:
                os.close(self.fd)
                raise
            self.size = prealloc_size // len(_ZEROS) * len(_ZEROS)
        else:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC
                              | os.O_CLOEXEC, 0o644)

    def write(self, data: bytes) -> None:
        """One batch: a write at the end (appended) or in place (preallocated; a batch that
        would cross the end goes to the start instead)."""
        if self.preallocate:
            if self.offset + len(data) > self.size:
                self.offset = 0
            os.pwrite(self.fd, data, self.offset)
            self.offset += len(data)
        else:
            os.write(self.fd, data)
        self.written += len(data)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def close(self, *, remove: bool = True) -> None:
        os.close(self.fd)
        if remove:
            os.unlink(self.path)

    def describe(self) -> str:
        if self.preallocate:
            return (f"preallocated ({self.size >> 20} MiB of synced zeros, written in place "
                    "with pwrite)")
        return "appended (the file grows)"


def _open(target: str | RecordFile, preallocate: bool | None) -> tuple[RecordFile, bool]:
    """(the file, whether the caller made it here and must close it)."""
    if isinstance(target, RecordFile):
        if preallocate is not None and preallocate != target.preallocate:
            raise ValueError(f"{target.path} is {target.describe()}, not as asked")
        return target, False
    if preallocate is None:
        raise TypeError("a path needs preallocate=True or False")
    return RecordFile(target, preallocate=preallocate), True


def plain_group_commit(target: str | RecordFile, size: int, group: int, duration: float, *,
                       preallocate: bool | None = None) -> tuple[float, list[float]]:
    """A plain loop (no asyncio): ``group`` records framed, one write, one fdatasync, for
    ``duration`` seconds. (records/s, one latency per group in seconds).

    ``target``: a path (a file made for this run, preallocated or not, removed after) or an
    open :class:`RecordFile` to reuse (making a preallocated file writes and syncs 64 MiB,
    which loads the disk for a while after: reuse one across measurements)."""
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    f, own = _open(target, preallocate)
    payload = os.urandom(size)
    lat: list[float] = []
    count = 0
    clock = time.perf_counter
    start = clock()
    try:
        while clock() - start < duration:
            t0 = clock()
            f.write(b"".join(frame_records(payload, group)))
            f.sync()
            lat.append(clock() - t0)
            count += group
    finally:
        if own:
            f.close()
    return count / (clock() - start), lat


def fsync_latencies(target: str | RecordFile, size: int = 100, duration: float = 0.5, *,
                    preallocate: bool | None = None) -> list[float]:
    """The latency of one ``size``-byte record written and fdatasync'ed, repeated for
    ``duration`` seconds: the unit a lone writer's latency is compared with."""
    return plain_group_commit(target, size, 1, duration, preallocate=preallocate)[1]


def replica_sync_floor(targets: list[str | RecordFile], size: int = 100,
                       duration: float = 0.5, *, preallocate: bool | None = None,
                       ) -> tuple[list[float], list[float]]:
    """What an acknowledgement from ``len(targets)`` replicas on this disk costs at least:
    one ``size``-byte record written and fdatasync'ed on each of the files (one file per
    replica, as each bookie has its own journal), repeated for ``duration`` seconds, done
    two ways: one file after the other on this thread, and all at once from one thread per
    file (each round released together, timed until the last sync returns, so the threads'
    wake-ups are in it, as a sync thread's are). (serial latencies, concurrent latencies).

    Why: a lone append of a ledger with ack quorum Qa waits for Qa journals' syncs. Where the
    replicas sit on different disks those syncs overlap and cost about one fsync; where they
    share one device that serializes cache flushes (this VM's virtio disk: two fdatasyncs
    issued at once take about twice one), the floor is Qa fsyncs, whatever the product does.
    Both ways are printed so the reader sees which case the machine is in."""
    if not targets:
        raise ValueError("replica_sync_floor needs at least one file")
    opened = [_open(t, preallocate) for t in targets]
    files = [f for f, _ in opened]
    record = b"".join(frame_records(os.urandom(size), 1))
    clock = time.perf_counter
    serial: list[float] = []
    concurrent: list[float] = []
    try:
        start = clock()
        while clock() - start < duration / 2:
            t0 = clock()
            for f in files:
                f.write(record)
                f.sync()
            serial.append(clock() - t0)
        go = threading.Barrier(len(files) + 1)
        done = threading.Barrier(len(files) + 1)
        stop = False

        def replica(f: RecordFile) -> None:
            while True:
                go.wait()
                if stop:
                    return
                f.write(record)
                f.sync()
                done.wait()

        threads = [threading.Thread(target=replica, args=(f,), daemon=True) for f in files]
        for t in threads:
            t.start()
        try:
            start = clock()
            while clock() - start < duration / 2:
                t0 = clock()
                go.wait()
                done.wait()
                concurrent.append(clock() - t0)
        finally:
            stop = True
            go.wait()
            for t in threads:
                t.join()
    finally:
        for f, own in opened:
            if own:
                f.close()
    return serial, concurrent


class GroupCommitFile:
    """The single-file group-commit ceiling: one asyncio writer task over one file.

    ``append`` CRC-frames the record at once and returns a future; the writer task takes
    whatever accumulated while it last wrote and synced, writes it with one write and one
    fdatasync (on the loop's thread, as a one-task writer does), then resolves those futures
    with the record's offset. ``target``: a path (a file made here, removed on close) or an
    open :class:`RecordFile` to reuse (left open)."""

    def __init__(self, target: str | RecordFile, *, preallocate: bool | None = None) -> None:
        self.file, self._own_file = _open(target, preallocate)
        self.parts: list[bytes] = []
        self.waiters: list[asyncio.Future[int]] = []
        self.wake = asyncio.Event()
        self.syncs = 0
        self.records = 0
        self.task = asyncio.ensure_future(self._run())

    def append(self, payload: bytes) -> asyncio.Future[int]:
        fut = asyncio.get_running_loop().create_future()
        self.parts.append(RECORD_HEADER.pack(len(payload), crc32c.crc32c(payload)))
        self.parts.append(payload)
        self.waiters.append(fut)
        self.wake.set()
        return fut

    def append_many(self, payloads: list[bytes]) -> asyncio.Future[int]:
        """Several records, one future (resolved with the batch's offset)."""
        fut = asyncio.get_running_loop().create_future()
        pack, crc, parts = RECORD_HEADER.pack, crc32c.crc32c, self.parts
        for payload in payloads:
            parts.append(pack(len(payload), crc(payload)))
            parts.append(payload)
        self.waiters.append(fut)
        self.wake.set()
        return fut

    async def _run(self) -> None:
        waiters: list[asyncio.Future[int]] = []
        try:
            while True:
                await self.wake.wait()
                self.wake.clear()
                parts, waiters = self.parts, self.waiters
                self.parts, self.waiters = [], []
                offset = self.file.written
                self.file.write(b"".join(parts))
                self.file.sync()
                self.syncs += 1
                self.records += len(parts) // 2
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(offset)
                waiters = []
        except BaseException as exc:  # a failed write or sync fails every waiter
            for fut in [*waiters, *self.waiters]:
                if not fut.done():
                    if isinstance(exc, asyncio.CancelledError):
                        fut.cancel()
                    else:
                        fut.set_exception(exc)
            raise

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        for fut in self.waiters:  # (appended before the task first ran)
            fut.cancel()
        if self._own_file:
            self.file.close()
