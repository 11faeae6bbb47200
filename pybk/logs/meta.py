"""The log metadata record: one versioned, checksummed value per log in the metadata store.

Why one record: every change a writer makes (add a segment, complete one, truncate, take the
writer lock) is a single compare-and-set of this value, so the segment list, the writer's
epoch and the truncation point always change together and never half-way.

Stored at ``logs/<namespace>/<name>`` in the store's key/value namespace as
``b"PYBKLOG" + header(format u16, crc32c u32, length u32) + JSON`` (format 1; any other
format or a bad checksum is CorruptRecordError). The JSON document (listed in
docs/internals.md, "pybk/logs/meta.py").
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final

import crc32c

from pybk.errors import CorruptRecordError
from pybk.logs.config import LogConfig
from pybk.logs.position import Position

__all__ = [
    "BOOKIES",
    "BOTH",
    "COMPLETED",
    "IN_PROGRESS",
    "OFFLOADED",
    "TRUNCATED",
    "LogMetadata",
    "OffloadInfo",
    "SegmentInfo",
]

IN_PROGRESS: Final = "in-progress"
COMPLETED: Final = "completed"
TRUNCATED: Final = "truncated"
SEGMENT_STATES: Final = (IN_PROGRESS, COMPLETED, TRUNCATED)

FORMAT_VERSION: Final = 1
_MAGIC: Final = b"PYBKLOG"
_HDR = struct.Struct(">HII")


BOOKIES: Final = "bookies"
OFFLOADED: Final = "offloaded"
BOTH: Final = "both"


@dataclass(frozen=True)
class OffloadInfo:
    """A segment's copy in object storage (:mod:`pybk.logs.offload`): ``uid`` names this
    attempt's objects under ``url``; ``complete`` once both objects are written and verified;
    ``bk_deleted`` once the bookies' copy is being deleted (set before the deletion);
    ``ms`` when it started, then when it completed (wall clock; 0 in records older than
    start times)."""

    uid: str
    url: str
    complete: bool = False
    bk_deleted: bool = False
    ms: int = 0

    def to_doc(self) -> dict[str, Any]:
        return {"uid": self.uid, "url": self.url, "complete": self.complete,
                "bk_deleted": self.bk_deleted, "ms": self.ms}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> OffloadInfo:
        return cls(uid=str(doc["uid"]), url=str(doc["url"]), complete=bool(doc["complete"]),
                   bk_deleted=bool(doc["bk_deleted"]), ms=int(doc["ms"]))


@dataclass(frozen=True)
class SegmentInfo:
    """One segment (one ledger) of a log.

    For a completed segment ``last_entry``/``last_slot`` is its last record's place (-1 when it
    holds none), ``records`` its record count, ``bytes`` its ledger's length, ``max_txid`` the
    log's highest txid at its end (-1: none). An in-progress segment's counts are unknown
    (0 / -1) until it is completed.
    """

    seq: int
    ledger_id: int
    state: str = IN_PROGRESS
    last_entry: int = -1
    last_slot: int = -1
    records: int = 0
    bytes: int = 0
    max_txid: int = -1
    ctime_ms: int = 0
    mtime_ms: int = 0
    origin: str = ""  # who published it whole (pybk.logs.publish); "" for a writer's
    offload: OffloadInfo | None = None  # its copy in the tier (stored only when set)

    @property
    def is_completed(self) -> bool:
        return self.state == COMPLETED

    @property
    def in_progress(self) -> bool:
        return self.state == IN_PROGRESS

    @property
    def tier(self) -> str:
        """Where its records are: "bookies", "both" (offloaded, bookies' copy kept for the
        deletion lag) or "offloaded" (the object store only)."""
        o = self.offload
        if o is None or not o.complete:
            return BOOKIES
        return OFFLOADED if o.bk_deleted else BOTH

    @property
    def last_position(self) -> Position | None:
        """The last record's position (completed segments that hold records only)."""
        if self.state != COMPLETED or self.last_entry < 0:
            return None
        return Position(self.seq, self.last_entry, self.last_slot)

    def with_changes(self, **changes: Any) -> SegmentInfo:
        return replace(self, **changes)

    def to_doc(self) -> dict[str, Any]:
        doc = {
            "seq": self.seq, "ledger": self.ledger_id, "state": self.state,
            "last_entry": self.last_entry, "last_slot": self.last_slot,
            "records": self.records, "bytes": self.bytes, "max_txid": self.max_txid,
            "ctime_ms": self.ctime_ms, "mtime_ms": self.mtime_ms,
        }  # fmt: skip
        if self.origin:
            doc["origin"] = self.origin
        if self.offload is not None:
            doc["offload"] = self.offload.to_doc()
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> SegmentInfo:
        info = cls(
            seq=int(doc["seq"]), ledger_id=int(doc["ledger"]), state=str(doc["state"]),
            last_entry=int(doc["last_entry"]), last_slot=int(doc["last_slot"]),
            records=int(doc["records"]), bytes=int(doc["bytes"]),
            max_txid=int(doc["max_txid"]), ctime_ms=int(doc["ctime_ms"]),
            mtime_ms=int(doc["mtime_ms"]), origin=str(doc.get("origin", "")),
            offload=OffloadInfo.from_doc(doc["offload"]) if "offload" in doc else None,
        )  # fmt: skip
        if info.state not in SEGMENT_STATES or info.seq < 1 or info.ledger_id < 0:
            raise ValueError(f"bad segment {doc}")
        return info


@dataclass(frozen=True)
class LogMetadata:
    """What the metadata store knows about one log (see the module doc)."""

    namespace: str
    name: str
    config: LogConfig = field(default_factory=LogConfig)
    ctime_ms: int = 0
    epoch: int = 0
    writer: str = ""
    next_seq: int = 1
    segments: tuple[SegmentInfo, ...] = ()
    allocated: tuple[int, ...] = ()
    truncated_before: Position | None = None
    end_of_stream: bool = False
    deleting: bool = False
    #: publishers of numbered batches (a Spark streaming sink): sink id -> (the last batch
    #: id it published, when, ms); a batch at or below it is a replay and is not published
    sinks: dict[str, tuple[int, int]] = field(default_factory=dict)
    version: int = -1  # the store's version of this record (not serialized)

    # -- views -------------------------------------------------------------------------------

    @property
    def key(self) -> str:
        return log_key(self.namespace, self.name)

    @property
    def live_segments(self) -> list[SegmentInfo]:
        """Segments a reader may visit (not truncated), in order."""
        return [s for s in self.segments if s.state != TRUNCATED]

    def segment(self, seq: int) -> SegmentInfo | None:
        for s in self.segments:
            if s.seq == seq:
                return s
        return None

    @property
    def max_txid(self) -> int:
        """The highest txid of the completed segments (-1: none)."""
        return max((s.max_txid for s in self.segments if s.is_completed), default=-1)

    def last_position(self) -> Position | None:
        """The last record of the completed segments (an in-progress one is unknown here)."""
        for s in reversed(self.segments):
            if s.state == TRUNCATED:
                break
            pos = s.last_position
            if pos is not None:
                if self.truncated_before is not None and pos < self.truncated_before:
                    return None
                return pos
        return None

    def with_changes(self, **changes: Any) -> LogMetadata:
        return replace(self, **changes)

    def replace_segment(self, new: SegmentInfo) -> LogMetadata:
        return self.with_changes(
            segments=tuple(new if s.seq == new.seq else s for s in self.segments)
        )

    def without_segments(self, seqs: Iterable[int]) -> LogMetadata:
        gone = set(seqs)
        return self.with_changes(segments=tuple(s for s in self.segments if s.seq not in gone))

    # -- serialization -----------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        doc = {
            "namespace": self.namespace,
            "name": self.name,
            "config": self.config.to_doc(),
            "ctime_ms": self.ctime_ms,
            "epoch": self.epoch,
            "writer": self.writer,
            "next_seq": self.next_seq,
            "segments": [s.to_doc() for s in self.segments],
            "allocated": list(self.allocated),
            "truncated_before": None if self.truncated_before is None
            else list(self.truncated_before),
            "end_of_stream": self.end_of_stream,
            "deleting": self.deleting,
        }
        if self.sinks:
            doc["sinks"] = {k: [b, ms] for k, (b, ms) in sorted(self.sinks.items())}
        payload = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        return _MAGIC + _HDR.pack(FORMAT_VERSION, crc32c.crc32c(payload), len(payload)) + payload

    @classmethod
    def from_bytes(cls, data: bytes, version: int = -1) -> LogMetadata:
        """Parse a stored record; CorruptRecordError on damage or an unknown format."""
        if len(data) < len(_MAGIC) + _HDR.size or not data.startswith(_MAGIC):
            raise CorruptRecordError("log metadata: bad magic")
        fmt, crc, length = _HDR.unpack_from(data, len(_MAGIC))
        if fmt != FORMAT_VERSION:
            raise CorruptRecordError(f"log metadata: unknown format version {fmt}")
        payload = data[len(_MAGIC) + _HDR.size :]
        if len(payload) != length or crc32c.crc32c(payload) != crc:
            raise CorruptRecordError("log metadata: checksum mismatch")
        try:
            doc = json.loads(payload)
            tb = doc["truncated_before"]
            md = cls(
                namespace=str(doc["namespace"]),
                name=str(doc["name"]),
                config=LogConfig.from_doc(doc["config"]),
                ctime_ms=int(doc["ctime_ms"]),
                epoch=int(doc["epoch"]),
                writer=str(doc["writer"]),
                next_seq=int(doc["next_seq"]),
                segments=tuple(SegmentInfo.from_doc(s) for s in doc["segments"]),
                allocated=tuple(int(x) for x in doc["allocated"]),
                truncated_before=None if tb is None else Position(*(int(x) for x in tb)),
                end_of_stream=bool(doc["end_of_stream"]),
                deleting=bool(doc["deleting"]),
                sinks={str(k): (int(v[0]), int(v[1]))
                       for k, v in doc.get("sinks", {}).items()},
                version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(f"log metadata: malformed document ({exc})") from exc
        md._check()
        return md

    def _check(self) -> None:
        """Invariants every stored record keeps (CorruptRecordError when one does not)."""
        seqs = [s.seq for s in self.segments]
        if seqs != sorted(set(seqs)) or (seqs and seqs[-1] >= self.next_seq):
            raise CorruptRecordError(
                f"log metadata: segment numbers {seqs} out of order (next {self.next_seq})"
            )
        if any(s.in_progress for s in self.segments[:-1]):
            raise CorruptRecordError("log metadata: an in-progress segment that is not the last")


def log_key(namespace: str, name: str) -> str:
    """The metadata key of a log."""
    return f"logs/{namespace}/{name}"
