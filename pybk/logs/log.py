"""A named log: open its writer, make readers, look at its segments and ends.

A :class:`Log` is a cheap handle (a name in a namespace and a client); nothing is held
open until a writer or a reader is made.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pybk.errors import CursorNotFoundError
from pybk.logs.backlog import Backlog, measure_backlog
from pybk.logs.builder import BuiltSegment, LedgerFactory, SegmentBuilder
from pybk.logs.config import CursorOptions, LogConfig, ReaderOptions, WriterOptions
from pybk.logs.cursor import Cursor, delete_cursor
from pybk.logs.cursor_meta import read_cursor_states
from pybk.logs.cursor_reset import reset_cursor
from pybk.logs.meta import LogMetadata, SegmentInfo
from pybk.logs.offload import offload_segments, sweep_orphans
from pybk.logs.offload_trigger import plan_offload
from pybk.logs.position import Position
from pybk.logs.publish import PublishResult, publish_segments
from pybk.logs.reader import LogReader
from pybk.logs.retention import consumed_before, housekeep
from pybk.logs.tail import last_position
from pybk.logs.truncation import plan_truncation
from pybk.logs.writer import LogWriter

if TYPE_CHECKING:
    from pybk.client.client import Client
    from pybk.logs.catalog import LogCatalog

__all__ = ["Log"]


class Log:
    """One log of a namespace (see :meth:`pybk.logs.Namespace.open_log`)."""

    def __init__(self, catalog: LogCatalog, rng: random.Random) -> None:
        self._cat = catalog
        self._rng = rng

    @property
    def name(self) -> str:
        return self._cat.name

    @property
    def namespace(self) -> str:
        return self._cat.namespace

    @property
    def client(self) -> Client:
        """The client this handle works through (its cluster's store and transport)."""
        return self._cat.client

    async def writer(
        self, options: WriterOptions | None = None, *, label: str | None = None, **knobs: object
    ) -> LogWriter:
        """Open the log's single writer (``async with await log.writer() as w``).

        Fences any earlier writer and recovers what it left (see :mod:`pybk.logs.writer`).
        ``label`` names this writer in the metadata and in other writers' errors; batching
        knobs go in ``options`` or as keywords (``flush_bytes=...``, see WriterOptions).
        Raises WriterConflictError when another writer opened the log at the same moment."""
        if options is None:
            options = WriterOptions(**knobs)  # type: ignore[arg-type]
        elif knobs:
            raise TypeError("give WriterOptions or keyword knobs, not both")
        if label is None:
            label = f"writer-{self._rng.getrandbits(32):08x}"
        elif not isinstance(label, str):
            raise TypeError(f"label must be a str, not {type(label).__name__}")
        return await LogWriter.open(self._cat, options, label)

    def reader(
        self,
        start: Position | None = None,
        *,
        txid: int | None = None,
        stop_at: Position | None = None,
        stop_at_acknowledged: bool = False,
        options: ReaderOptions | None = None,
    ) -> LogReader:
        """Records from ``start`` (default: the oldest kept) or from the first record with a
        txid >= ``txid``, following the tail until the end of stream, or up to ``stop_at``
        inclusive. ``async for rec in log.reader(...)``.

        ``stop_at_acknowledged``: ``stop_at`` is known acknowledged (a writer's own last
        position), so entries up to it are read without waiting for the bookies' LAC."""
        return LogReader(self._cat, start=start, txid=txid, stop_at=stop_at,
                         stop_at_acknowledged=stop_at_acknowledged, options=options)

    async def metadata(self) -> LogMetadata:
        """The log's metadata record as stored now."""
        return await self._cat.read()

    async def segments(self) -> list[SegmentInfo]:
        """Every segment, oldest first: sequence number, ledger id, state, counts."""
        return list((await self._cat.read()).segments)

    async def last_position(self) -> Position | None:
        """The last record's position (acknowledged), None when the log holds none. In the
        client holding the log's live writer this is the writer's own view (read-your-writes);
        elsewhere the in-progress segment's LAC, asked of its bookies."""
        return await last_position(self._cat)

    async def first_position(self) -> Position | None:
        """The first record kept (None when the log holds none)."""
        last = await self.last_position()
        if last is None:
            return None
        async with self.reader(stop_at=last, stop_at_acknowledged=True,
                               options=ReaderOptions(read_ahead_entries=1)) as reader:
            batch = await reader.read_batch(1)
        return batch[0].position if batch else None

    async def truncate(self, before: Position) -> None:
        """Drop every record before ``before`` without being the writer (a writer's
        :meth:`~pybk.logs.LogWriter.truncate` does the same under its lock). ``before``
        may be at most just past the last record."""
        if not isinstance(before, Position):
            raise TypeError(f"truncate(before=...) takes a Position, not {type(before).__name__}")
        md = await self._cat.read()
        if md.truncated_before is not None and before <= md.truncated_before:
            return
        last = await self.last_position()
        if last is None or before > last.next_slot():
            raise ValueError(
                f"cannot truncate log {self.name!r} before {before}: its last record is {last}"
            )
        md = await self._cat.update(lambda cur: plan_truncation(cur, before))
        await self._cat.purge_truncated(md)

    async def segment_builder(
        self,
        *,
        custom_metadata: Mapping[str, bytes] | None = None,
        create_ledger: LedgerFactory | None = None,
        **knobs: int,
    ) -> SegmentBuilder:
        """A :class:`~pybk.logs.builder.SegmentBuilder` for this log: records written into
        ledgers of their own with the log's quorums and codec, invisible to readers until
        :meth:`publish` adds them (bulk loads; a Spark job's tasks). ``knobs``:
        ``flush_bytes``, ``flush_records``, ``max_envelope_bytes``, ``max_pending_bytes``."""
        md = await self._cat.read()
        return SegmentBuilder(self._cat.client, self._cat.key, md.config,
                              custom_metadata={**self._cat.ledger_tags,
                                               **dict(custom_metadata or {})},
                              create_ledger=create_ledger,
                              **knobs)

    async def publish(
        self,
        segments: Sequence[BuiltSegment],
        *,
        origin: str = "",
        sink: tuple[str, int] | None = None,
        fence_writer: bool = False,
    ) -> PublishResult:
        """Add built segments at the end of the log, all in one compare-and-set (see
        :mod:`pybk.logs.publish`): only while no writer has an in-progress segment
        (WriterConflictError) unless ``fence_writer``; idempotent for the same ledgers, the
        same ``origin`` or a ``sink`` batch id already published."""
        return await publish_segments(
            self._cat, segments, origin=origin, sink=sink, fence_writer=fence_writer,
            label=f"publisher-{self._rng.getrandbits(32):08x}",
        )

    # -- cursors, retention, tiered storage ------------------------------------------------

    async def subscribe(
        self,
        name: str,
        start: str | Position = "earliest",
        *,
        options: CursorOptions | None = None,
        label: str | None = None,
        **knobs: Any,
    ) -> Cursor:
        """Take over the durable cursor ``name`` (creating it at ``start``: "earliest",
        "latest" or a Position; an existing cursor keeps its position) and read from just
        after its mark-delete position (see :mod:`pybk.logs.cursor`). An earlier consumer of
        the same cursor is fenced: its next acknowledgement fails with LedgerFencedError.
        ``knobs``: CursorOptions fields (``redelivery_delay=``, ``ack_timeout=``, ...)."""
        if options is None:
            options = CursorOptions(**knobs)
        elif knobs:
            raise TypeError("give CursorOptions or keyword knobs, not both")
        if label is None:
            label = f"consumer-{self._rng.getrandbits(32):08x}"
        return await Cursor.open(self._cat, name, start, options, label)

    async def cursors(self) -> dict[str, Position | None]:
        """The log's durable cursors: name -> mark-delete position (None: nothing
        acknowledged), as last made durable."""
        states = await read_cursor_states(self._cat)
        return {name: st.mark_delete for name, st in sorted(states.items())}

    async def delete_cursor(self, name: str) -> None:
        """Delete a durable cursor (its consumer, if any, is fenced); CursorNotFoundError
        when there is none. Retention no longer waits for it."""
        await delete_cursor(self._cat, name)

    async def cursor_resume_point(self, name: str) -> Position | None:
        """Where cursor ``name``'s next consumer resumes (None: at the oldest record kept);
        CursorNotFoundError when there is no such cursor."""
        state = (await read_cursor_states(self._cat)).get(name)
        if state is None:
            raise CursorNotFoundError(f"log {self.name!r} has no cursor {name!r}")
        return state.resume_point()

    async def reset_cursor(self, name: str, position: Position, *,
                           create: bool = False) -> None:
        """Move durable cursor ``name`` (Pulsar's ``resetCursor``): every record before
        ``position`` counts as consumed and the next consumer resumes there; the consumer
        holding it is fenced. CursorNotFoundError when there is none (unless ``create``)."""
        await reset_cursor(self._cat, name, position, create=create)

    async def set_retention(
        self,
        max_age: float | None = None,
        max_bytes: int | None = None,
        after_consumed: bool = False,
    ) -> None:
        """Set the log's retention (stored in its config; the writer applies it after each
        roll and on its housekeeping interval): completed segments older than ``max_age``
        seconds, and the oldest beyond ``max_bytes``; with ``after_consumed`` only segments
        every durable cursor is past, and with neither limit all of those."""
        def change(md: LogMetadata) -> LogMetadata:
            cfg = replace(md.config, retention_seconds=max_age, retention_bytes=max_bytes,
                          retention_after_consumed=after_consumed)
            return md.with_changes(config=cfg)

        replace(LogConfig(), retention_seconds=max_age, retention_bytes=max_bytes,
                retention_after_consumed=after_consumed)  # checks the values first
        await self._cat.update(change)

    async def set_backlog_quota(self, max_bytes: int | None = None,
                                max_age: float | None = None, policy: str = "refuse",
                                ) -> None:
        """Set the log's backlog quota (stored in its config; pybk.logs.backlog): the most
        its slowest durable cursor may be behind, in bytes and in seconds (None: no limit),
        and the ``policy`` past it: "refuse" new appends until the cursors catch up, or
        "evict" the oldest backlog (cursors behind skip ahead). The writer checks after each
        roll and on its housekeeping interval."""
        replace(LogConfig(), backlog_quota_bytes=max_bytes, backlog_quota_seconds=max_age,
                backlog_policy=policy)  # checks the values first

        def change(md: LogMetadata) -> LogMetadata:
            return md.with_changes(config=replace(
                md.config, backlog_quota_bytes=max_bytes, backlog_quota_seconds=max_age,
                backlog_policy=policy))

        await self._cat.update(change)

    async def backlog(self) -> Backlog:
        """How far the slowest durable cursor is behind now (completed segments only: the
        writer's current segment is counted by the writer's own checks)."""
        md = await self._cat.read()
        consumed = await consumed_before(self._cat, md)
        return measure_backlog(md, consumed, self._cat.now_ms())

    async def apply_retention(self) -> None:
        """Apply the retention (and the tier's deletion lag) now, without waiting for the
        writer to."""
        await housekeep(self._cat)

    async def set_offload(
        self,
        url: str | None,
        *,
        options: dict[str, Any] | None = None,
        deletion_lag: float = 4 * 3600.0,
        threshold_bytes: int | None = None,
        threshold_seconds: float | None = None,
        bytes_per_s: int | None = None,
    ) -> None:
        """Configure the log's tier: an fsspec URL (``file:///path``, ``s3://bucket/prefix``;
        None: no tier), its filesystem ``options`` (e.g. ``{"endpoint_url": ...}``; stored
        in the metadata, so credentials belong in the environment), and how long after a
        verified offload the bookies' copy is deleted (seconds, wall clock). With
        ``threshold_bytes`` / ``threshold_seconds`` the writer offloads by itself: the oldest
        completed segments beyond that many bytes on the bookies, and those completed longer
        ago (pybk.logs.offload_trigger). ``bytes_per_s`` throttles an offload's reads from
        the bookies (None: unthrottled)."""
        cfg_check = replace(LogConfig(), offload_url=url, offload_options=dict(options or {}),
                            offload_deletion_lag=deletion_lag,
                            offload_threshold_bytes=threshold_bytes,
                            offload_threshold_seconds=threshold_seconds,
                            offload_bytes_per_s=bytes_per_s)

        def change(md: LogMetadata) -> LogMetadata:
            return md.with_changes(config=replace(
                md.config, offload_url=cfg_check.offload_url,
                offload_options=cfg_check.offload_options,
                offload_deletion_lag=cfg_check.offload_deletion_lag,
                offload_threshold_bytes=threshold_bytes,
                offload_threshold_seconds=threshold_seconds,
                offload_bytes_per_s=bytes_per_s))

        await self._cat.update(change)

    async def offload(self, before: Position | None = None, *,
                      take_over_after: float | None = None) -> list[int]:
        """Copy completed segments (those wholly before ``before``, or all) to the log's
        tier, verified, oldest first; their sequence numbers. The bookies' copies go after
        the deletion lag (at once with a lag of 0). Readers read offloaded segments from the
        tier transparently; ``SegmentInfo.tier`` says where each segment is. A segment whose
        offload another offloader started less than ``take_over_after`` seconds ago is left
        to it (None: taken over at once, as after a crash)."""
        if before is not None and not isinstance(before, Position):
            raise TypeError(f"before must be a Position or None, not {type(before).__name__}")
        return await offload_segments(self._cat, self._rng, before=before,
                                      take_over_after=take_over_after)

    async def offload_due(self) -> Position | None:
        """What the log's offload triggers (``threshold_bytes``/``threshold_seconds``) say is
        due now: offload every completed segment before the position returned; None when
        nothing is (or the log has no trigger)."""
        return plan_offload(await self._cat.read(), self._cat.now_ms())

    async def sweep_tier(self, grace: float = 3600.0) -> list[str]:
        """Delete objects in the log's tier folder that no segment refers to (left by an
        offload cut short whose attempt was then replaced or truncated) and that were last
        modified more than ``grace`` seconds ago (wall clock), and abort such attempts'
        multipart uploads begun before that; the attempts (object names without
        ``.data``/``.index``) swept. Safe beside offloads and readers."""
        return await sweep_orphans(self._cat, grace)

    def __repr__(self) -> str:
        return f"<Log {self.namespace}/{self.name}>"
