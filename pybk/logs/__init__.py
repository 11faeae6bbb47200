"""Logs over chains of ledgers (DistributedLog's model): namespaces, positions, record
batching, the single writer and tailing readers. The format and semantics are in
docs/logs.md.

``client.namespace("default")`` gives a :class:`Namespace`; ``await ns.create_log(name)`` /
``open_log(name)`` a :class:`Log`; ``await log.writer()`` its :class:`LogWriter` and
``log.reader(start)`` a :class:`LogReader` of :class:`LogRecord` s at :class:`Position` s;
:class:`LogMirror` copies a log to another cluster's.
"""

from pybk.logs.backlog import Backlog, BacklogStats
from pybk.logs.builder import BuiltSegment, SegmentBuilder
from pybk.logs.config import CursorOptions, LogConfig, ReaderOptions, WriterOptions
from pybk.logs.cursor import Cursor
from pybk.logs.cursor_consumer import CursorConsumer
from pybk.logs.log import Log
from pybk.logs.meta import (
    BOOKIES,
    BOTH,
    COMPLETED,
    IN_PROGRESS,
    OFFLOADED,
    TRUNCATED,
    LogMetadata,
    OffloadInfo,
    SegmentInfo,
)
from pybk.logs.mirror import (
    LogMirror,
    MirrorAccessError,
    MirroredRecord,
    MirrorError,
    MirrorStats,
)
from pybk.logs.namespace import Namespace
from pybk.logs.position import LogRecord, Position
from pybk.logs.publish import PublishResult
from pybk.logs.reader import LogReader
from pybk.logs.writer import LogWriter

__all__ = [
    "BOOKIES",
    "BOTH",
    "COMPLETED",
    "IN_PROGRESS",
    "OFFLOADED",
    "TRUNCATED",
    "Backlog",
    "BacklogStats",
    "BuiltSegment",
    "Cursor",
    "CursorConsumer",
    "CursorOptions",
    "Log",
    "LogConfig",
    "LogMetadata",
    "LogMirror",
    "LogReader",
    "LogRecord",
    "LogWriter",
    "MirrorAccessError",
    "MirrorError",
    "MirrorStats",
    "MirroredRecord",
    "Namespace",
    "OffloadInfo",
    "Position",
    "PublishResult",
    "ReaderOptions",
    "SegmentBuilder",
    "SegmentInfo",
    "WriterOptions",
]
