"""Mirroring a log to a log of another cluster, in order, exactly once.

Why: a second data centre keeps a copy of a log, and takes over when the first is lost
(docs/logs.md, "Mirroring a log to another cluster").

How exactly-once holds: every target record is a *frame* carrying the source position of
the record it copies (and the source record's key; its txid is the target record's own).
The source position therefore reaches the target's bookies in the same entry as the data:
there is no second write to lose. A mirror starting (or restarting after any crash) opens
the target's writer, which fences an earlier mirror and recovers what it left, reads the
target's last record and resumes the source just after the position that record names.
What was acknowledged on the target is the truth; what a mirror remembered is not used.

Frame layout: ``b"PYBKMIR1"``, flags (u8: bit 0 a key follows), the source position
(25 bytes, ``bytes(Position)``), with a key its length (u32 big-endian) and the key, a
CRC32C (u32 big-endian) of all of that, then the source record's bytes unchanged.

Only loop time is read (the lag); no threads, no wall clock: the simulator can drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, NamedTuple, NoReturn

import crc32c

from pybk.errors import (
    AlreadyTruncatedError,
    BKError,
    CorruptRecordError,
    LogExistsError,
    UnauthorizedError,
)
from pybk.logs.config import ReaderOptions
from pybk.logs.position import LogRecord, Position
from pybk.transport.refusals import Refusal

if TYPE_CHECKING:
    from pybk.logs.log import Log
    from pybk.logs.namespace import Namespace
    from pybk.logs.reader import LogReader
    from pybk.logs.writer import LogWriter

__all__ = [
    "FRAME_MAGIC",
    "MIRROR_RESUMES_FROM_MEMORY",
    "LogMirror",
    "MirrorAccessError",
    "MirrorError",
    "MirrorStats",
    "MirroredRecord",
    "frame",
    "is_frame",
    "open_target",
    "unframe",
]

FRAME_MAGIC: Final = b"PYBKMIR1"
_FLAG_KEY: Final = 0x01
_POS_SIZE: Final = 25
_FIXED: Final = len(FRAME_MAGIC) + 1 + _POS_SIZE  # 34
_U32 = struct.Struct(">I")


class MirrorError(CorruptRecordError):
    """The target log cannot be a mirror's target: its last record is not a mirror frame
    (something else wrote to it), or a frame is damaged."""


SOURCE: Final = "source"
TARGET: Final = "target"

#: mutation switch (a name in the target client's ``ClientConfig.mutations``; registry:
#: ``pybk.testing.mutations``): a restarted run resumes after the last position this mirror
#: saw acknowledged, not after the target's last record (copies acknowledged to the target's
#: bookies but not yet to the mirror are made twice)
MIRROR_RESUMES_FROM_MEMORY: Final = "mirror_resumes_from_memory"


class MirrorAccessError(UnauthorizedError):
    """A cluster refused the mirror's credentials, which retrying cannot mend: its bookies
    want TLS and the mirror has none (or the reverse), their certificate fails
    verification, a token is missing or refused, or a ledger's master key does not match.
    ``side`` is ``"source"`` or ``"target"``; ``refusals`` the bookies that refused and how
    (:class:`pybk.transport.refusals.Refusal`; empty for a refusal only the error names)."""

    def __init__(self, message: str, *, side: str = SOURCE,
                 refusals: Sequence[Refusal] = ()) -> None:
        super().__init__(message)
        self.side = side
        self.refusals = tuple(refusals)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The refusals' kinds (``needs-tls``, ``no-tls``, ``tls-verify``, ``needs-token``,
        ``token-refused``), each once, in order; ``("unauthorized",)`` without refusals."""
        return tuple(dict.fromkeys(r.kind for r in self.refusals)) or ("unauthorized",)


async def access_error(log: Log, side: str, exc: BaseException,
                       since: float) -> MirrorAccessError | None:
    """``exc`` (what failed on ``side``, whose log is ``log``) as a MirrorAccessError when
    it came from refused credentials: a bookie of that cluster refused them at or after
    loop time ``since`` (proof recorded by its transport), or the error is an
    UnauthorizedError. None: a failure a retry may mend."""
    if isinstance(exc, MirrorAccessError):
        return exc
    if not isinstance(exc, BKError | OSError) or isinstance(
            exc, CorruptRecordError | AlreadyTruncatedError | ValueError | TypeError):
        return None  # (those say what is wrong themselves)
    refusals = await log.client.transport.refusals(since)
    if not refusals and not isinstance(exc, UnauthorizedError):
        return None
    said = "; ".join(f"{side} {r.describe()}" for r in refusals) or \
        f"the {side} cluster refused the mirror"
    return MirrorAccessError(f"{said} [{type(exc).__name__}: {exc}]", side=side,
                             refusals=refusals)


class MirroredRecord(NamedTuple):
    """What a target record says about the source record it copies."""

    source_position: Position
    data: bytes
    key: bytes | None


def frame(position: Position, data: bytes, key: bytes | None = None) -> bytes:
    """The target record copying the source record at ``position``."""
    head = bytearray(FRAME_MAGIC)
    head.append(_FLAG_KEY if key is not None else 0)
    head += bytes(position)
    if key is not None:
        head += _U32.pack(len(key))
        head += key
    head += _U32.pack(crc32c.crc32c(head))
    return bytes(head) + data


def is_frame(data: bytes) -> bool:
    """Whether ``data`` starts like a mirror frame (checked whole by :func:`unframe`)."""
    return data[: len(FRAME_MAGIC)] == FRAME_MAGIC


def unframe(data: bytes) -> MirroredRecord:
    """The source position, bytes and key a target record carries (MirrorError when it is
    not a whole, undamaged frame)."""
    if not is_frame(data) or len(data) < _FIXED + 4:
        raise MirrorError(f"not a mirror frame ({len(data)} bytes, {data[:8]!r}...)")
    flags = data[len(FRAME_MAGIC)]
    if flags & ~_FLAG_KEY:
        raise MirrorError(f"mirror frame with unknown flags {flags:#x}")
    at = _FIXED
    key: bytes | None = None
    if flags & _FLAG_KEY:
        if len(data) < at + 4:
            raise MirrorError("mirror frame cut inside its key length")
        (n,) = _U32.unpack_from(data, at)
        at += 4
        if len(data) < at + n + 4:
            raise MirrorError(f"mirror frame cut inside its key ({n} bytes)")
        key = bytes(data[at : at + n])
        at += n
    (crc,) = _U32.unpack_from(data, at)
    if crc != crc32c.crc32c(data[:at]):
        raise MirrorError("mirror frame header fails its CRC32C")
    try:
        pos = Position.from_bytes(bytes(data[len(FRAME_MAGIC) + 1 : _FIXED]))
    except (TypeError, ValueError) as exc:
        raise MirrorError(f"mirror frame with a bad source position: {exc}") from None
    return MirroredRecord(pos, bytes(data[at + 4 :]), key)


@dataclass
class MirrorStats:
    """What a mirror did and how far behind it is (exported by
    :class:`pybk.ops.mirror.MirrorCollector`)."""

    #: records copied and acknowledged on the target by this process
    records: int = 0
    #: their bytes (the source records' own, frames not counted)
    bytes: int = 0
    #: the last source position acknowledged on the target (None: nothing yet)
    position: Position | None = None
    #: the source's last position when last asked
    source_position: Position | None = None
    #: seconds (loop time) since the target last held everything the source held when
    #: asked; 0 while caught up
    lag_seconds: float = 0.0
    #: times the mirror started (the first start and every restart from the target's truth)
    starts: int = 0
    #: the last error that stopped a run ("" for none)
    last_error: str = ""
    caught_up_at: float | None = field(default=None, repr=False)


class LogMirror:
    """Copies ``source`` (a log of one cluster) to ``target`` (a log of another).

    ``await mirror.run()`` copies until cancelled (following the source's tail) or until the
    source's stream ends; ``await mirror.drain()`` copies up to the source's last record as
    of the call and returns (the failover step). Any failure (a bookie, the network, the
    target's writer fenced) ends the run with its error: running again resumes from the
    target's truth, so a supervisor (:class:`pybk.ops.mirror.MirrorService`) only restarts.
    A failure caused by refused credentials ends it with :class:`MirrorAccessError` (which
    side, which bookie, what was refused): restarting cannot help.
    """

    def __init__(
        self,
        source: Log,
        target: Log,
        *,
        batch_records: int = 1000,
        window: int = 8,
        lag_interval: float = 1.0,
        label: str = "mirror",
        stats: MirrorStats | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if batch_records < 1:
            raise ValueError(f"batch_records must be >= 1, got {batch_records}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if not lag_interval > 0:
            raise ValueError(f"lag_interval must be > 0, got {lag_interval}")
        self.source = source
        self.target = target
        self.batch_records = batch_records
        self.window = window
        self.lag_interval = lag_interval
        self.label = label
        self.stats = stats if stats is not None else MirrorStats()
        self._clock = clock
        self._side = TARGET  # the cluster the run is waiting on (which side a failure hit)
        self._reading: asyncio.Task[object] | None = None  # the run, while it reads the source
        self._append_failed = False
        self._copies = 0  # runs' copies started (an append's callback knows its own)
        self._from_memory = MIRROR_RESUMES_FROM_MEMORY in target.client.config.mutations

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()

    @contextlib.asynccontextmanager
    async def _refusals_checked(self, side: str | None = None) -> AsyncIterator[None]:
        """A failure inside (on ``side``; default: the side the run waits on) that came from
        refused credentials is raised as MirrorAccessError."""
        since = asyncio.get_running_loop().time()
        try:
            yield
        except Exception as exc:
            hit = side or self._side
            refused = await access_error(self.source if hit == SOURCE else self.target, hit,
                                         exc, since)
            if refused is None or refused is exc:
                raise
            self.stats.last_error = f"{type(refused).__name__}: {refused}"
            raise refused from exc

    async def source_position(self) -> Position | None:
        """The source's last position (MirrorAccessError: its cluster refused the mirror)."""
        async with self._refusals_checked(SOURCE):
            return await self.source.last_position()

    async def resume_position(self, writer: LogWriter | None = None) -> Position | None:
        """The last source position the target holds (None: the target holds no record),
        read from the target's last record. Pass the mirror's own open ``writer`` to read
        what it recovered; without one, the target's last position is asked of its bookies."""
        if writer is None:
            async with self._refusals_checked(TARGET):
                return await self._resume_position(None)
        return await self._resume_position(writer)

    async def _resume_position(self, writer: LogWriter | None) -> Position | None:
        if self._from_memory and writer is not None and self.stats.starts > 1:
            return self.stats.position  # (the broken build: what this mirror last saw)
        last = writer.last_position if writer is not None else await self.target.last_position()
        if last is None:
            return None
        async with self.target.reader(start=last, stop_at=last, stop_at_acknowledged=True,
                                      options=ReaderOptions(read_ahead_entries=1)) as reader:
            batch = await reader.read_batch(1)
        if not batch or batch[0].position != last:
            raise MirrorError(f"cannot read the target's last record at {last}")
        try:
            return unframe(batch[0].data).source_position
        except MirrorError as exc:
            raise MirrorError(
                f"the last record of log {self.target.name!r} ({last}) was not written by a "
                f"mirror, so it cannot tell where to resume: {exc}") from None

    async def run(self, *, stop_at: Position | None = None) -> None:
        """Copy from the target's truth onwards, following the source's tail, until cancelled,
        until the source's stream ends, or past ``stop_at`` (inclusive)."""
        self.stats.starts += 1
        self._side = TARGET
        async with self._refusals_checked():
            await self._run(stop_at)

    async def _run(self, stop_at: Position | None) -> None:
        try:
            writer = await self.target.writer(label=self.label)
        except BaseException as exc:
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            raise
        try:
            resume = await self.resume_position(writer)
            self.stats.position = resume
            if stop_at is not None and resume is not None and resume >= stop_at:
                await writer.close()
                return
            lag = asyncio.get_running_loop().create_task(self._watch_lag())
            try:
                await self._copy(writer, resume, stop_at)
            finally:
                lag.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lag
            await writer.close()
        except BaseException as exc:
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            await writer.abort()  # as a crash would: the next run recovers from the target
            raise

    async def drain(self) -> Position | None:
        """Copy up to the source's last record as of now and stop (the failover step, once
        the source's writers are stopped); the last source position the target holds."""
        last = await self.source_position()
        if last is not None:
            await self.run(stop_at=last)
        return await self.resume_position()

    async def _copy(self, writer: LogWriter, resume: Position | None,
                    stop_at: Position | None) -> None:
        inflight: deque[asyncio.Future[list[Position]]] = deque()
        self._append_failed = False
        self._copies += 1
        self._side = SOURCE
        async with self.source.reader(start=resume, stop_at=stop_at) as reader:
            while True:
                self._side = SOURCE
                batch = await self._next_batch(reader, inflight)
                self._side = TARGET
                if not batch:
                    break
                if resume is not None:
                    batch = [r for r in batch if r.position > resume]
                    if not batch:
                        continue
                    resume = None  # the reader is past it now
                inflight.append(self._send(writer, batch))
                while len(inflight) >= self.window:
                    await inflight.popleft()  # bounded: at most ``window`` batches unacknowledged
            self._side = TARGET
            while inflight:
                await inflight.popleft()
        self._side = TARGET
        await writer.flush()

    async def _next_batch(self, reader: LogReader,
                          inflight: deque[asyncio.Future[list[Position]]]) -> list[LogRecord]:
        """The source's next batch. While waiting for it (a source without new records keeps
        the reader waiting), a failed append on the target ends the wait with its error:
        the run must not go on as if the target held what it was sent. (The failed append's
        callback cancels this task: no task per batch on the hot path.)"""
        task = asyncio.current_task()
        if self._append_failed:
            return self._raise_failed_append(inflight)
        self._reading = task
        try:
            return await reader.read_batch(self.batch_records)
        except asyncio.CancelledError:
            if task is None or not self._failed_append_seen() or task.uncancel() > 0:
                raise  # not ours (or another cancel as well)
            return self._raise_failed_append(inflight)
        finally:
            self._reading = None

    def _raise_failed_append(self, inflight: deque[asyncio.Future[list[Position]]]) -> NoReturn:
        self._side = TARGET
        for f in inflight:
            if f.done():
                f.result()  # raises the first failed append's error
        raise AssertionError("an append failed but none of those in flight did")

    def _failed_append_seen(self) -> bool:
        return self._append_failed

    def _on_failed_append(self, copy: int) -> None:
        if copy != self._copies:
            return  # an append of an earlier run (its writer aborted) failing late
        self._append_failed = True
        task, self._reading = self._reading, None
        if task is not None:
            task.cancel()

    def _send(self, writer: LogWriter, batch: list[LogRecord]) -> asyncio.Future[list[Position]]:
        framed = [frame(r.position, r.data, r.key) for r in batch]
        txids = [r.txid for r in batch]
        fut = writer.append_many(framed, txids if any(t is not None for t in txids) else None)
        last, count, nbytes = batch[-1].position, len(batch), sum(len(r.data) for r in batch)
        copy = self._copies

        def acked(f: asyncio.Future[list[Position]]) -> None:
            if f.cancelled() or f.exception() is not None:
                self._on_failed_append(copy)
                return
            st = self.stats  # batches are acknowledged in order, so this only moves on
            st.records += count
            st.bytes += nbytes
            st.position = last
            src = st.source_position
            if src is not None and last >= src:
                st.caught_up_at, st.lag_seconds = self._now(), 0.0

        fut.add_done_callback(acked)
        return fut

    async def _watch_lag(self) -> None:
        """Every ``lag_interval`` s of loop time: ask the source's last position; the lag is
        the time since the target last held all of it (it keeps growing while the source
        cannot be asked)."""
        st = self.stats
        st.caught_up_at = caught = self._now()
        while True:
            try:
                src = await self.source.last_position()
                asked = True
            except (BKError, OSError, TimeoutError):
                asked = False  # the copy fails on its own if it must
            now = self._now()  # (once: a caught-up mirror's lag is exactly 0)
            if asked:
                st.source_position = src
                if src is None or (st.position is not None and st.position >= src):
                    st.caught_up_at = now
            caught = st.caught_up_at if st.caught_up_at is not None else caught
            st.lag_seconds = now - caught
            await asyncio.sleep(self.lag_interval)


async def open_target(source: Log, namespace: Namespace, name: str) -> Log:
    """The target log ``name`` of ``namespace``, created with ``source``'s configuration
    (ensemble, quorums, digest, codec, rolling) when it does not exist."""
    if await namespace.log_exists(name):
        return await namespace.open_log(name)
    cfg = (await source.metadata()).config
    with contextlib.suppress(LogExistsError):  # another mirror made it meanwhile
        await namespace.create_log(
            name, ensemble_size=cfg.ensemble_size, write_quorum=cfg.write_quorum,
            ack_quorum=cfg.ack_quorum, compression=cfg.compression, roll_bytes=cfg.roll_bytes,
            roll_entries=cfg.roll_entries, roll_seconds=cfg.roll_seconds,
            digest_type=cfg.digest_type)
    return await namespace.open_log(name)
