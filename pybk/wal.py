"""The WAL facade: a log for applications, embedded by default.

``pybk.WAL(path)`` needs nothing else: it runs the bookies in this process (a
:class:`pybk.LocalCluster` under ``path``, SQLite metadata at ``path/metadata.db``; 3 bookies,
each record on all 3 and acknowledged by 2: E=3, Qw=3, Qa=2) and opens the log ``name`` of
namespace ``wal`` as its single writer. The next ``pybk.WAL(path)`` (after a clean close or a
``kill -9``) restarts the same bookies on the same files, fences and recovers what the last
writer left, and replays everything that was acknowledged. A second process opening the same
path while the first holds it gets LockedError naming the holder's pid: the lock is an
``flock`` on ``path/LOCK``, which the kernel releases when its holder dies, however it dies.

``follow(start, timeout)`` and a follower in another process (:class:`WALFollower`,
:class:`AsyncWALFollower`: never fences the writer; ``promote()`` takes over).

Design notes: docs/internals.md, "pybk/wal.py".
"""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from pybk.client import Client
from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.errors import LogExistsError, LogNotFoundError
from pybk.logs import Log, LogWriter, Position, ReaderOptions, WriterOptions
from pybk.logs.follow import follow_batches, pairs
from pybk.runtime.dirlock import DirectoryLock
from pybk.sync.runner import LoopThread

__all__ = ["WAL", "AsyncWAL", "AsyncWALFollower", "WALFollower"]


#: a lone bookie's journal syncs batches of up to this many records on the loop's thread
#: (a lone writer's entry and the LAC record riding with it): nothing else could overlap them
LONE_INLINE_SYNC_MAX = 8
#: seconds the synchronous facade's writer waits for the caller's next append to carry its
#: LAC before sending it on its own (the caller comes back from another thread)
SYNC_LAC_DELAY = 0.0005


def embedded_bookie_config(bookies: int = 3) -> Any:
    """The embedded WAL's bookies (a ``pybk.bookie.BookieConfig``): journal segments made
    ahead and written in place (each fdatasync then flushes data only: about a fifth more
    appends per second here, and what ``pybk bookie`` does), up to 4 MiB each: they start
    at 128 KiB and double with use (a WAL of one record takes under 1 MB). Each bookie's
    garbage collector gives back what truncation deleted every 5 s (the metadata is a local
    SQLite file: listing it is cheap), so a WAL that truncates stays within a bound
    (docs/operations.md, benchmarks/gc_soak.py). One bookie alone syncs a small batch on
    the loop's thread (no hand-off to its sync helper: no other journal's sync to overlap)."""
    from pybk.bookie import BookieConfig

    return BookieConfig(journal_preallocate=True, segment_size=4 << 20, gc_interval=5.0,
                        gc_min_ledger_age=5.0,
                        journal_inline_sync_max=LONE_INLINE_SYNC_MAX if bookies == 1 else 0)


class AsyncWAL:
    """The WAL on the caller's event loop (``async with pybk.AsyncWAL(path) as wal:``)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        name: str = "wal",
        metadata: str | None = None,
        client: Client | None = None,
        namespace: str = "wal",
        bookies: int = 3,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        compression: str = "none",
        roll_bytes: int | None = 64 << 20,
        client_config: ClientConfig | None = None,
        writer_options: WriterOptions | None = None,
        reader_options: ReaderOptions | None = None,
        cluster_options: dict[str, Any] | None = None,
        replica_dirs: Sequence[str | os.PathLike[str]] | None = None,
    ) -> None:
        given = sum(x is not None for x in (path, metadata, client))
        if given == 0:
            raise TypeError("WAL needs a directory (embedded) or metadata=URI (remote bookies)")
        if given > 1:
            raise TypeError("give one of a directory (embedded), metadata=URI (remote) or "
                            "client=, not both")
        if not isinstance(bookies, int) or bookies < ensemble_size:
            raise ValueError(
                f"bookies ({bookies!r}) must be an int >= ensemble_size ({ensemble_size})"
            )
        self.path = pathlib.Path(path) if path is not None else None
        if replica_dirs is not None and self.path is None:
            raise TypeError("replica_dirs places embedded bookies: give a directory, not metadata")
        #: each in-process bookie's data directory (None: all under ``path/bookies``)
        self.replica_dirs = (check_replica_dirs(self.path, replica_dirs, bookies)
                             if replica_dirs is not None and self.path is not None else None)
        self.name = name
        self._metadata = metadata
        self._namespace = namespace
        self._bookies = bookies
        self._log_knobs: dict[str, Any] = {
            "ensemble_size": ensemble_size, "write_quorum": write_quorum,
            "ack_quorum": ack_quorum, "compression": compression, "roll_bytes": roll_bytes,
        }
        # check the knobs now, not after the bookies started
        from pybk.logs.config import LogConfig

        LogConfig(**self._log_knobs)
        self._client_config = client_config
        self._writer_options = writer_options
        self._reader_options = reader_options
        self._cluster_options = dict(cluster_options or {})
        self._lock: DirectoryLock | None = None
        self._replica_locks: list[DirectoryLock] = []
        self._cluster: LocalCluster | None = None
        self._client: Client | None = client
        self._own_client = False
        self._log: Log | None = None
        self._writer: LogWriter | None = None
        #: ``await wal.append(data)``: the record's position once it is durable. A future,
        #: not a coroutine, so many appends can be in flight without a task each; the open
        #: writer's own method (no wrapper: it runs once per record)
        self.append: Callable[[bytes], asyncio.Future[Position]] = self._append_closed
        #: the synchronous facade's: the record sent at once when nothing else is in flight
        self._append_now: Callable[[bytes], asyncio.Future[Position]] = self._append_closed

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> AsyncWAL:
        """Start (embedded) or connect (remote), open the log, recover, take the writer."""
        try:
            if self.path is not None:
                self.path.mkdir(parents=True, exist_ok=True)
                self._lock = DirectoryLock(self.path, "WAL directory")
                self._lock.acquire()
                options = dict(self._cluster_options)
                options.setdefault("bookie_config", embedded_bookie_config(self._bookies))
                dirs = settle_replica_dirs(self.path, self.replica_dirs, self._bookies)
                if dirs is not None:
                    self.replica_dirs = dirs
                    for d in dirs:
                        lock = DirectoryLock(d, "WAL replica directory")
                        lock.acquire()
                        self._replica_locks.append(lock)
                    options["bookie_dirs"] = dirs
                # (its metadata is its own: no tenant's namespace to enforce)
                options.setdefault("tenancy", False)
                self._cluster = LocalCluster(
                    self.path, self._bookies, client_config=self._client_config, **options
                )
                await self._cluster.start()
                self._client = self._cluster.client()
            elif self._client is None:
                assert self._metadata is not None
                self._client = Client(self._metadata, config=self._client_config)
                self._own_client = True
                await self._client.start()
            ns = self._client.namespace(self._namespace)
            try:
                self._log = await ns.open_log(self.name)
            except LogNotFoundError:
                try:
                    self._log = await ns.create_log(self.name, **self._log_knobs)
                except LogExistsError:
                    self._log = await ns.open_log(self.name)
            self._writer = await self._log.writer(
                self._writer_options, label=f"pid {os.getpid()}"
            )
            self.append = self._writer.append
            self._append_now = self._writer.append_now
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def close(self) -> None:
        """Complete the log's segment, stop the bookies (embedded), release the lock."""
        writer, self._writer = self._writer, None
        self.append = self._append_now = self._append_closed
        try:
            if writer is not None:
                await writer.close()
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        try:
            if self._own_client and self._client is not None:
                await self._client.close()
            if self._cluster is not None:
                await self._cluster.close()
        finally:
            if self._own_client or self._cluster is not None:
                self._client = None
            self._cluster = None
            for lock in self._replica_locks:
                lock.release()
            self._replica_locks.clear()
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    async def __aenter__(self) -> AsyncWAL:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _w(self) -> LogWriter:
        if self._writer is None:
            raise RuntimeError("the WAL is not open (use it in an async with block)")
        return self._writer

    # -- the log -----------------------------------------------------------------------------

    @property
    def log(self) -> Log:
        """The underlying :class:`pybk.Log` (readers, segments, metadata)."""
        if self._log is None:
            raise RuntimeError("the WAL is not open")
        return self._log

    @property
    def cluster(self) -> LocalCluster | None:
        """The embedded cluster (None for a remote WAL)."""
        return self._cluster

    @property
    def last_position(self) -> Position | None:
        """The position of the last record acknowledged (None when the WAL holds none)."""
        return self._w().last_position

    def _append_closed(self, data: bytes) -> asyncio.Future[Position]:
        raise RuntimeError("the WAL is not open (use it in an async with block)")

    def append_many(self, items: Sequence[bytes]) -> asyncio.Future[list[Position]]:
        """Append several records: ``await wal.append_many(items)`` is their positions once
        all are durable. A future, as for :attr:`append`: many calls can be in flight without
        a task each, and a program with records to write in bulk pays one future per call,
        not one per record (``benchmarks/wal_append.py``'s ``64/call`` shape)."""
        return self._w().append_many(items)

    async def truncate(self, before: Position) -> None:
        """Drop every record before ``before`` (at most just past the last one)."""
        await self._w().truncate(before)

    async def replay(self, start: Position | None = None) -> AsyncIterator[tuple[Position, bytes]]:
        """``(position, data)`` of every record from ``start`` (default: the oldest kept) up to
        the last one acknowledged now, streamed (a bounded number of entries in memory)."""
        async for rec in self._replay(start):
            yield rec

    def _replay(self, start: Position | None) -> AsyncIterator[tuple[Position, bytes]]:
        last = self._w().last_position
        return pairs(self.log, start, last, self._reader_options)

    async def follow(self, start: Position | None = None, timeout: float | None = None,
                     ) -> AsyncIterator[tuple[Position, bytes]]:
        """``(position, data)`` from ``start`` (default: the oldest kept) on, then each new
        record as it is acknowledged; ends once ``timeout`` seconds pass with nothing new
        (None: never)."""
        async for batch in follow_batches(self.log, start, timeout, self._reader_options):
            for rec in batch:
                yield rec


#: file under an embedded WAL's directory naming its replicas' directories, one a line
REPLICAS_FILE = "REPLICAS"


def check_replica_dirs(path: pathlib.Path, dirs: Sequence[str | os.PathLike[str]],
                       bookies: int) -> list[pathlib.Path]:
    """``dirs`` made absolute, or ValueError: one per bookie, distinct, none inside another or
    holding the WAL's own directory, none an existing non-directory."""
    if isinstance(dirs, (str, bytes, os.PathLike)):
        raise ValueError("replica_dirs must be a list of directories, not one path")
    out = [pathlib.Path(d).expanduser().resolve() for d in dirs]
    if len(out) != bookies:
        raise ValueError(f"replica_dirs has {len(out)} directories for {bookies} bookies "
                         "(one each; set bookies= to match)")
    root = path.expanduser().resolve()
    for i, d in enumerate(out):
        if d.exists() and not d.is_dir():
            raise ValueError(f"replica directory {d} exists and is not a directory")
        if d == root or root.is_relative_to(d):
            raise ValueError(f"replica directory {d} holds the WAL directory {root}")
        if d.is_relative_to(root / "bookies"):
            raise ValueError(f"replica directory {d} is inside {root / 'bookies'}, where the "
                             "WAL keeps replicas without replica_dirs")
        for e in out[:i]:
            if d == e:
                raise ValueError(f"replica directory {d} is given twice")
            if d.is_relative_to(e) or e.is_relative_to(d):
                raise ValueError(f"replica directories {e} and {d} are nested")
    return out


def settle_replica_dirs(path: pathlib.Path, dirs: list[pathlib.Path] | None,
                        bookies: int) -> list[pathlib.Path] | None:
    """The replica directories this WAL uses (under its lock): the ones it recorded at its
    first open when ``dirs`` is None, else ``dirs``, which must match that record; a WAL made
    without replica_dirs keeps its replicas under ``path/bookies``. Creates them."""
    record = path / REPLICAS_FILE
    recorded = ([pathlib.Path(line) for line in record.read_text().splitlines() if line]
                if record.exists() else None)
    if dirs is None:
        if recorded is not None and len(recorded) != bookies:
            raise ValueError(f"{path} has {len(recorded)} replicas ({record}), not {bookies}")
        dirs = recorded
    elif recorded is not None and recorded != dirs:
        raise ValueError(f"{path} keeps its replicas in {[str(d) for d in recorded]} "
                         f"({record}), not {[str(d) for d in dirs]}")
    elif recorded is None and (path / "bookies").exists():
        raise ValueError(f"{path} already keeps its replicas under {path / 'bookies'}; "
                         "replica_dirs applies to a new WAL")
    if dirs is None:
        return None
    for d in dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create replica directory {d}: {e}") from None
    if recorded is None:
        tmp = record.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write("".join(f"{d}\n" for d in dirs))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, record)
    return dirs


class AsyncWALFollower:
    """Follows a WAL written elsewhere (another process, through the same metadata; or a
    ``client`` of the same bookies) without ever fencing its writer; :meth:`promote` takes
    over. ``async with pybk.AsyncWALFollower(name="app", metadata=URI) as f:``."""

    def __init__(self, *, name: str = "wal", metadata: str | None = None,
                 client: Client | None = None, namespace: str = "wal",
                 client_config: ClientConfig | None = None,
                 reader_options: ReaderOptions | None = None) -> None:
        if (metadata is None) == (client is None):
            raise TypeError("a WAL follower needs metadata=URI or client=, exactly one")
        self.name = name
        self._metadata = metadata
        self._client = client
        self._own_client = False
        self._namespace = namespace
        self._client_config = client_config
        self._reader_options = reader_options
        self._log: Log | None = None

    async def open(self) -> AsyncWALFollower:
        """Connect and open the log (LogNotFoundError until its writer created it)."""
        if self._client is None:
            assert self._metadata is not None
            self._client = Client(self._metadata, config=self._client_config)
            self._own_client = True
            await self._client.start()
        try:
            self._log = await self._client.namespace(self._namespace).open_log(self.name)
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        self._log = None
        if self._own_client and self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def __aenter__(self) -> AsyncWALFollower:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def log(self) -> Log:
        if self._log is None:
            raise RuntimeError("the WAL follower is not open (use it in an async with block)")
        return self._log

    async def follow(self, start: Position | None = None, timeout: float | None = None,
                     ) -> AsyncIterator[tuple[Position, bytes]]:
        """As :meth:`AsyncWAL.follow`: replay from ``start``, then each record as it is
        acknowledged; ends after ``timeout`` seconds with nothing new (None: never)."""
        async for batch in follow_batches(self.log, start, timeout, self._reader_options):
            for rec in batch:
                yield rec

    async def promote(self, **options: Any) -> AsyncWAL:
        """The writer's role: an open :class:`AsyncWAL` of this log (``options``: its
        knobs). The old writer is fenced (its next append fails with LedgerFencedError) and
        the records it had acknowledged are recovered first; read those this follower had
        not seen with ``wal.replay(start)``."""
        if self._log is None:
            raise RuntimeError("the WAL follower is not open (use it in an async with block)")
        if self._own_client:
            wal = AsyncWAL(name=self.name, metadata=self._metadata, namespace=self._namespace,
                           client_config=self._client_config,
                           reader_options=self._reader_options, **options)
        else:
            wal = AsyncWAL(name=self.name, client=self._client, namespace=self._namespace,
                           reader_options=self._reader_options, **options)
        return await wal.open()


class WAL:
    """The WAL for synchronous code (``with pybk.WAL(path) as wal:``); same arguments as
    :class:`AsyncWAL`, plus ``loop``: the kind of that loop (:mod:`pybk.runtime.eventloop`;
    ``"uvloop"`` needs ``pybk[speed]``). Calls hop to an event loop in a background thread."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 loop: str | None = None, **options: Any) -> None:
        if options.get("client") is None:  # (the caller's next append carries the LAC)
            cfg = options.get("client_config") or ClientConfig()
            if not cfg.immediate_lac_delay:
                options["client_config"] = replace(cfg, immediate_lac_delay=SYNC_LAC_DELAY)
        self._runner = LoopThread(loop)
        try:
            self._wal = self._runner.run(_open(AsyncWAL(path, **options)))
        except BaseException:
            self._runner.stop()
            raise
        self._closed = False

    @property
    def path(self) -> pathlib.Path | None:
        return self._wal.path

    @property
    def last_position(self) -> Position | None:
        return self._wal.last_position

    @property
    def log(self) -> Log:
        return self._wal.log

    def append(self, data: bytes) -> Position:
        """Append one record; returns its position once it is durable (one hop to the
        loop's thread and one back; sent at once when nothing else is in flight)."""
        return self._runner.resolve(partial(self._wal._append_now, data))

    def append_many(self, items: Sequence[bytes]) -> list[Position]:
        """Append several records; their positions once all are durable."""
        return self._runner.run(_append_many(self._wal, items))

    def truncate(self, before: Position) -> None:
        """Drop every record before ``before``."""
        self._runner.run(self._wal.truncate(before))

    def replay(self, start: Position | None = None) -> Iterator[tuple[Position, bytes]]:
        """``(position, data)`` from ``start`` (default: the oldest kept) up to the last
        record acknowledged now; fetched a batch per thread hop."""
        return self._runner.iterate(self._wal._replay(start))

    def follow(self, start: Position | None = None, timeout: float | None = None,
               ) -> Iterator[tuple[Position, bytes]]:
        """``(position, data)`` from ``start`` on, then each record as it is acknowledged;
        ends after ``timeout`` seconds with nothing new (None: never)."""
        return _flatten(self._runner.iterate(
            follow_batches(self._wal.log, start, timeout, self._wal._reader_options), 1))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._wal.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> WAL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WALFollower:
    """:class:`AsyncWALFollower` for synchronous code (``with pybk.WALFollower(name="app",
    metadata=URI) as f:``): ``follow`` is a blocking iterator, ``promote`` returns a
    :class:`WAL`. Calls hop to an event loop in a background thread."""

    def __init__(self, *, name: str = "wal", metadata: str, namespace: str = "wal",
                 loop: str | None = None, client_config: ClientConfig | None = None,
                 reader_options: ReaderOptions | None = None) -> None:
        self._loop_kind = loop
        self._runner = LoopThread(loop)
        self._f = AsyncWALFollower(name=name, metadata=metadata, namespace=namespace,
                                   client_config=client_config, reader_options=reader_options)
        try:
            self._runner.run(self._f.open())
        except BaseException:
            self._runner.stop()
            raise
        self._closed = False

    @property
    def log(self) -> Log:
        return self._f.log

    def follow(self, start: Position | None = None, timeout: float | None = None,
               ) -> Iterator[tuple[Position, bytes]]:
        """As :meth:`WAL.follow`: a blocking iterator, records handed over as they come."""
        f = self._f
        return _flatten(self._runner.iterate(
            follow_batches(f.log, start, timeout, f._reader_options), 1))

    def promote(self, **options: Any) -> WAL:
        """A :class:`WAL` writing this log: the old writer is fenced, what it acknowledged
        recovered (``options``: the WAL's knobs). This follower stays open."""
        f = self._f
        return WAL(name=f.name, metadata=f._metadata, namespace=f._namespace,
                   loop=self._loop_kind, client_config=f._client_config,
                   reader_options=f._reader_options, **options)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._f.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> WALFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _flatten(batches: Iterator[list[Any]]) -> Iterator[Any]:
    for batch in batches:
        yield from batch


async def _append_many(wal: AsyncWAL, items: Sequence[bytes]) -> list[Position]:
    return await wal.append_many(items)  # (on the loop's thread, where the writer lives)


async def _open(wal: AsyncWAL) -> AsyncWAL:
    return await wal.open()
