"""The knobs of a log: what is stored with it (:class:`LogConfig`) and what each writer and
reader picks for itself (:class:`WriterOptions`, :class:`ReaderOptions`).

Every value is checked when the object is made, with the knob named, so a mistake is a
ValueError at the call that made it, not a surprise at the thousandth append.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pybk.client.quorum import validate_quorums
from pybk.logs.envelope import CODECS, HEADER_SIZE, MAX_RAW_SIZE, PER_RECORD_OVERHEAD
from pybk.wire import DIGEST_TYPES

__all__ = ["BACKLOG_POLICIES", "CursorOptions", "LogConfig", "ReaderOptions", "WriterOptions"]

#: what a log does once its slowest cursor is behind by more than its backlog quota: refuse
#: new appends until the cursors catch up (Pulsar's producer_exception), or truncate the
#: oldest backlog so the cursors skip ahead (consumer_backlog_eviction)
BACKLOG_POLICIES = ("refuse", "evict")


def _positive(name: str, value: Any, *, optional: bool = False, allow_float: bool = False) -> None:
    if value is None and optional:
        return
    ok = isinstance(value, int | float) if allow_float else isinstance(value, int)
    if isinstance(value, bool) or not ok:
        raise TypeError(f"{name} must be {'a number' if allow_float else 'an int'}, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0{' or None' if optional else ''}, got {value!r}")


@dataclass(frozen=True)
class LogConfig:
    """What a log is made of; stored in its metadata when the log is created.

    Segments are ledgers with this ensemble and these quorums (DistributedLog's defaults:
    E=3, Qw=3, Qa=2; ``Namespace.create_log`` defaults to E=3, Qw=2, Qa=2). A writer rolls to
    a new segment once the current one holds ``roll_bytes`` bytes, ``roll_entries`` entries or
    is ``roll_seconds`` old (checked when it writes); ``None`` turns a rule off. Retention
    (``retention_seconds``, ``retention_bytes``) drops the oldest completed segments when
    a writer rolls: segments completed longer ago than the age, and as many oldest ones as
    needed to bring the completed segments under the size. Both default to None (keep all
    until ``truncate``).
    """

    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    digest_type: str = "CRC32C"
    compression: str = "none"
    roll_bytes: int | None = 64 << 20
    roll_entries: int | None = None
    roll_seconds: float | None = None
    retention_seconds: float | None = None
    retention_bytes: int | None = None
    #: retention drops only segments every durable cursor has consumed (then by age / size)
    retention_after_consumed: bool = False
    #: tiered storage: the fsspec URL closed segments are offloaded under (None: no tier),
    #: its filesystem options (stored in the metadata: endpoints, not secrets), and how long
    #: after a verified offload the bookies' copy is deleted
    offload_url: str | None = None
    offload_options: dict[str, Any] = field(default_factory=dict)
    offload_deletion_lag: float = 4 * 3600.0
    #: offload by itself (pybk.logs.offload_trigger): keep at most this many bytes of
    #: completed segments on the bookies, and offload segments completed longer ago than this
    offload_threshold_bytes: int | None = None
    offload_threshold_seconds: float | None = None
    #: offload throttling: the most bytes a second an offload reads from the bookies (None:
    #: as fast as they answer), so offloading a backlog does not starve the log's readers
    offload_bytes_per_s: int | None = None
    #: backlog quota (pybk.logs.backlog): the most the slowest durable cursor may be behind,
    #: in bytes and in age (None: no limit), and what happens past it: "refuse" new appends
    #: (BacklogQuotaExceededError) or "evict" the oldest backlog (cursors skip ahead)
    backlog_quota_bytes: int | None = None
    backlog_quota_seconds: float | None = None
    backlog_policy: str = "refuse"

    def __post_init__(self) -> None:
        validate_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        if self.digest_type not in DIGEST_TYPES:
            raise ValueError(
                f"digest_type must be one of {', '.join(DIGEST_TYPES)}, not {self.digest_type!r}"
            )
        if self.compression not in CODECS:
            raise ValueError(
                f"compression must be one of {', '.join(CODECS)}, not {self.compression!r}"
            )
        _positive("roll_bytes", self.roll_bytes, optional=True)
        _positive("roll_entries", self.roll_entries, optional=True)
        _positive("roll_seconds", self.roll_seconds, optional=True, allow_float=True)
        _positive("retention_seconds", self.retention_seconds, optional=True, allow_float=True)
        _positive("retention_bytes", self.retention_bytes, optional=True)
        if not isinstance(self.retention_after_consumed, bool):
            raise TypeError("retention_after_consumed must be a bool, got "
                            f"{self.retention_after_consumed!r}")
        if self.offload_url is not None and (not isinstance(self.offload_url, str)
                                             or "://" not in self.offload_url):
            raise ValueError(f"offload_url must be a URL such as file:///path or "
                             f"s3://bucket/prefix, got {self.offload_url!r}")
        if not isinstance(self.offload_options, dict):
            raise TypeError("offload_options must be a dict")
        _positive("offload_threshold_bytes", self.offload_threshold_bytes, optional=True)
        _positive("offload_threshold_seconds", self.offload_threshold_seconds, optional=True,
                  allow_float=True)
        _positive("offload_bytes_per_s", self.offload_bytes_per_s, optional=True)
        _positive("backlog_quota_bytes", self.backlog_quota_bytes, optional=True)
        _positive("backlog_quota_seconds", self.backlog_quota_seconds, optional=True,
                  allow_float=True)
        if self.backlog_policy not in BACKLOG_POLICIES:
            raise ValueError(f"backlog_policy must be one of {', '.join(BACKLOG_POLICIES)}, "
                             f"not {self.backlog_policy!r}")
        if (isinstance(self.offload_deletion_lag, bool)
                or not isinstance(self.offload_deletion_lag, int | float)
                or self.offload_deletion_lag < 0):
            raise ValueError(f"offload_deletion_lag must be a number >= 0, got "
                             f"{self.offload_deletion_lag!r}")

    @property
    def codec(self) -> int:
        return CODECS[self.compression]

    def to_doc(self) -> dict[str, Any]:
        return {
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "digest_type": self.digest_type,
            "compression": self.compression,
            "roll_bytes": self.roll_bytes,
            "roll_entries": self.roll_entries,
            "roll_seconds": self.roll_seconds,
            "retention_seconds": self.retention_seconds,
            "retention_bytes": self.retention_bytes,
            **self._optional_doc(),
        }

    def _optional_doc(self) -> dict[str, Any]:
        """Knobs stored only when set, so older records stay byte for byte the same."""
        doc: dict[str, Any] = {}
        if self.retention_after_consumed:
            doc["retention_after_consumed"] = True
        if self.offload_url is not None:
            doc["offload_url"] = self.offload_url
            doc["offload_options"] = self.offload_options
            doc["offload_deletion_lag"] = self.offload_deletion_lag
            if (self.offload_threshold_bytes is not None
                    or self.offload_threshold_seconds is not None):
                doc["offload_threshold_bytes"] = self.offload_threshold_bytes
                doc["offload_threshold_seconds"] = self.offload_threshold_seconds
            if self.offload_bytes_per_s is not None:
                doc["offload_bytes_per_s"] = self.offload_bytes_per_s
        if self.backlog_quota_bytes is not None or self.backlog_quota_seconds is not None:
            doc["backlog_quota_bytes"] = self.backlog_quota_bytes
            doc["backlog_quota_seconds"] = self.backlog_quota_seconds
            doc["backlog_policy"] = self.backlog_policy
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> LogConfig:
        known = cls().to_doc()
        extra = {k: doc[k] for k in ("retention_after_consumed", "offload_url",
                                     "offload_options", "offload_deletion_lag",
                                     "offload_threshold_bytes", "offload_threshold_seconds",
                                     "offload_bytes_per_s",
                                     "backlog_quota_bytes", "backlog_quota_seconds",
                                     "backlog_policy") if k in doc}
        return cls(**{k: doc[k] for k in known}, **extra)


@dataclass(frozen=True)
class WriterOptions:
    """Batching and limits of one writer (not stored with the log).

    Records are packed into one envelope (one ledger entry) until it holds ``flush_bytes``
    bytes or ``flush_records`` records, or ``flush_delay`` seconds passed since its first
    record; ``flush_delay=0`` (the default) sends it at the end of the current pass of the
    event loop, so everything appended in one pass (by one loop or by many tasks woken
    together) shares an entry and a lone writer waits for nothing. A record above
    ``max_record_bytes`` or a batch whose envelope would exceed ``max_envelope_bytes`` is
    refused (RecordTooLargeError) before anything is sent. ``max_pending_bytes`` bounds the
    bytes appended but not yet acknowledged, each record counted with its 4 bytes of length
    (12 with a txid) (slow bookies cannot make a writer hold unbounded memory): an append
    beyond it raises TooManyRequestsError.
    """

    flush_bytes: int = 128 << 10
    flush_records: int = 10_000
    flush_delay: float = 0.0
    max_record_bytes: int = 1 << 20
    max_envelope_bytes: int = 4 << 20
    max_pending_bytes: int = 256 << 20
    #: how often (loop seconds) the writer applies the log's retention and offload policy
    #: besides after each roll (None: only after rolls)
    housekeeping_interval: float | None = 60.0
    #: while the backlog quota refuses appends, how often (loop seconds) the writer checks
    #: whether the cursors caught up
    backlog_check_interval: float = 1.0

    def __post_init__(self) -> None:
        for name in ("flush_bytes", "flush_records", "max_record_bytes", "max_envelope_bytes",
                     "max_pending_bytes"):
            _positive(name, getattr(self, name))
        _positive("backlog_check_interval", self.backlog_check_interval, allow_float=True)
        _positive("housekeeping_interval", self.housekeeping_interval, optional=True,
                  allow_float=True)
        if isinstance(self.flush_delay, bool) or not isinstance(self.flush_delay, int | float):
            raise TypeError(f"flush_delay must be a number, got {self.flush_delay!r}")
        if self.flush_delay < 0:
            raise ValueError(f"flush_delay must be >= 0, got {self.flush_delay!r}")
        if self.max_envelope_bytes > MAX_RAW_SIZE:
            raise ValueError(
                f"max_envelope_bytes must be <= {MAX_RAW_SIZE}, got {self.max_envelope_bytes}"
            )
        room = self.max_envelope_bytes - HEADER_SIZE - PER_RECORD_OVERHEAD - 8
        if self.max_record_bytes > room:
            raise ValueError(
                f"max_record_bytes ({self.max_record_bytes}) must leave room for the envelope "
                f"around it: at most max_envelope_bytes - {HEADER_SIZE + PER_RECORD_OVERHEAD + 8}"
                f" = {room}"
            )


@dataclass(frozen=True)
class ReaderOptions:
    """Read-ahead of one reader: ``read_ahead_entries`` entries (envelopes) per read, one
    read in flight ahead of the records being handed out, so a reader holds at most about
    ``2 * read_ahead_entries`` envelopes whatever the log's length. ``long_poll_timeout`` is
    how long one wait for the tail's next entry lasts on the bookies."""

    read_ahead_entries: int = 16
    long_poll_timeout: float = 1.0

    def __post_init__(self) -> None:
        _positive("read_ahead_entries", self.read_ahead_entries)
        _positive("long_poll_timeout", self.long_poll_timeout, allow_float=True)


@dataclass(frozen=True)
class CursorOptions:
    """How one consumer uses a durable cursor (not stored with it).

    ``redelivery_delay``: how long after ``nack`` a record is handed out again;
    ``ack_timeout``: hand a record out again when it is not acknowledged that long after it
    was (None: never); ``max_ack_ranges``: acknowledged ranges kept beyond the mark-delete
    position (an individual acknowledgement that would open one more is refused, never
    dropped); ``rollover_entries``: state entries per cursor ledger before a new one;
    ``reader``: the read-ahead of the cursor's reader."""

    redelivery_delay: float = 1.0
    ack_timeout: float | None = None
    max_ack_ranges: int = 50_000
    rollover_entries: int = 10_000
    reader: ReaderOptions = ReaderOptions()

    def __post_init__(self) -> None:
        if (isinstance(self.redelivery_delay, bool)
                or not isinstance(self.redelivery_delay, int | float)):
            raise TypeError(f"redelivery_delay must be a number, got {self.redelivery_delay!r}")
        if self.redelivery_delay < 0:
            raise ValueError(f"redelivery_delay must be >= 0, got {self.redelivery_delay!r}")
        _positive("ack_timeout", self.ack_timeout, optional=True, allow_float=True)
        _positive("max_ack_ranges", self.max_ack_ranges)
        _positive("rollover_entries", self.rollover_entries)
        if self.rollover_entries < 2:
            raise ValueError("rollover_entries must be >= 2 (a ledger starts with its state)")
        if not isinstance(self.reader, ReaderOptions):
            raise TypeError(f"reader must be ReaderOptions, not {type(self.reader).__name__}")
