"""The options of the ``pybk`` Spark data source, checked on the driver with the option named.

Spark hands a data source its options as strings with lower-cased keys; these are parsed once
into :class:`SourceOptions`, and every mistake is an :class:`OptionError` (a ValueError) whose
message starts with the option's name as a user writes it (``option 'metadata': ...``), raised
when the query is planned, before any task runs.

Design notes: docs/internals.md, "pybk/spark/options.py".
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pybk.logs.config import LogConfig
from pybk.logs.cursor import check_cursor_name
from pybk.logs.namespace import check_name
from pybk.logs.position import Position
from pybk.metadata.registry import parse_uri, schemes

__all__ = ["OptionError", "SourceOptions", "parse_options"]


class OptionError(ValueError):
    """A ``pybk`` data source option is missing or wrong; ``option`` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"pybk data source: option '{option}': {message}")
        self.option = option


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options (see the module doc)."""

    metadata: str
    log: str
    namespace: str = "default"
    metadata_timeout: float = 15.0
    create_log: bool = False
    log_config: LogConfig = field(default_factory=LogConfig)
    fence_writer: bool = False
    batch_bytes: int = 1 << 20
    max_in_flight_bytes: int = 64 << 20
    sink_id: str = ""
    starting_position: str = "earliest"
    ending_position: str = "latest"
    max_records_per_trigger: int | None = None
    max_partition_bytes: int = 128 << 20
    #: a streaming read's durable cursor: where a new query starts, and reset to each
    #: committed batch's end (retention by consumption and backlog quotas see the query)
    cursor: str | None = None

    @property
    def log_key(self) -> str:
        return f"logs/{self.namespace}/{self.log}"

    def start(self) -> Position | str:
        """``earliest``, ``latest`` or a Position."""
        return _position_or(self.starting_position, ("earliest", "latest"))

    def end(self) -> Position | str:
        """``latest`` or a Position (exclusive)."""
        return _position_or(self.ending_position, ("latest",))


def _position_or(text: str, words: tuple[str, ...]) -> Position | str:
    low = text.strip().lower()
    if low in words:
        return low
    return Position.parse(text)


def _get(options: Mapping[str, Any], name: str) -> str | None:
    value = options.get(name.lower())
    if value is None:
        return None
    return str(value)


def _bool(options: Mapping[str, Any], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise OptionError(name, f"expected true or false, got {raw!r}")


def _int(options: Mapping[str, Any], name: str, default: int | None, low: int = 1) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(name, f"expected an integer, got {raw!r}") from None
    if value < low:
        raise OptionError(name, f"must be >= {low}, got {value}")
    return value


def _float(options: Mapping[str, Any], name: str, default: float) -> float:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise OptionError(name, f"expected a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise OptionError(name, f"must be > 0, got {raw!r}")
    return value


def check_metadata_uri(uri: str) -> str:
    """The URI, or OptionError('metadata') when executors could not share it."""
    uri = uri.strip()
    try:
        scheme, _rest = parse_uri(uri)
    except (TypeError, ValueError) as exc:
        raise OptionError("metadata", str(exc)) from None
    if not scheme.shared:
        raise OptionError("metadata", f"{uri!r} lives in one process; Spark's executors need "
                                      "a shared store: " + ", ".join(
                                          s.form for s in schemes() if s.shared))
    return uri


def parse_options(options: Mapping[str, Any], *, mode: str) -> SourceOptions:
    """Parse and check ``options`` for ``mode`` (``read``, ``write``, ``stream-read``,
    ``stream-write``); OptionError naming the first wrong option."""
    if mode not in ("read", "write", "stream-read", "stream-write"):
        raise ValueError(f"unknown mode {mode!r}")
    metadata = _get(options, "metadata")
    if not metadata:
        raise OptionError("metadata", "required: the metadata URI of the bookies, e.g. "
                                      ".option('metadata', 'sqlite:///abs/path/metadata.db')")
    metadata = check_metadata_uri(metadata)
    name = _get(options, "log") or _get(options, "path")
    if not name:
        raise OptionError("log", "required: the log's name, .option('log', 'events')")
    try:
        check_name("log", name)
    except ValueError as exc:
        raise OptionError("log", str(exc)) from None
    namespace = _get(options, "namespace") or "default"
    try:
        check_name("namespace", namespace)
    except ValueError as exc:
        raise OptionError("namespace", str(exc)) from None
    kwargs: dict[str, Any] = {
        "metadata": metadata, "log": name, "namespace": namespace,
        "metadata_timeout": _float(options, "metadataTimeout", 15.0),
        "max_partition_bytes": _int(options, "maxPartitionBytes", 128 << 20),
    }
    if mode in ("write", "stream-write"):
        kwargs["create_log"] = _bool(options, "createLog", False)
        kwargs["fence_writer"] = _bool(options, "fenceWriter", False)
        kwargs["batch_bytes"] = _int(options, "batchBytes", 1 << 20)
        kwargs["max_in_flight_bytes"] = _int(options, "maxInFlightBytes", 64 << 20)
        if kwargs["batch_bytes"] > 4 << 20:
            raise OptionError("batchBytes", f"at most {4 << 20} (an envelope's limit), got "
                                            f"{kwargs['batch_bytes']}")
        if kwargs["max_in_flight_bytes"] < kwargs["batch_bytes"]:
            raise OptionError("maxInFlightBytes", "must be at least batchBytes")
        try:
            kwargs["log_config"] = LogConfig(
                ensemble_size=_int(options, "ensembleSize", 3) or 3,
                write_quorum=_int(options, "writeQuorum", 2) or 2,
                ack_quorum=_int(options, "ackQuorum", 2) or 2,
                compression=(_get(options, "compression") or "none").strip().lower(),
                roll_bytes=_int(options, "rollBytes", 64 << 20),
            )
        except (ValueError, TypeError) as exc:
            raise OptionError("createLog", f"bad log settings: {exc}") from None
    if mode == "stream-write":
        sink = _get(options, "sinkId") or ""
        checkpoint = _get(options, "checkpointLocation")
        if not sink and checkpoint:
            sink = checkpoint if "://" in checkpoint else os.path.abspath(checkpoint)
        if not sink:
            raise OptionError("sinkId", "required without a checkpointLocation: the name "
                                        "under which the sink's batch ids are kept")
        kwargs["sink_id"] = sink.strip()
    if mode in ("read", "stream-read"):
        start = _get(options, "startingPosition") or "earliest"
        try:
            _position_or(start, ("earliest", "latest"))
        except (ValueError, TypeError) as exc:
            raise OptionError("startingPosition", f"expected earliest, latest or "
                                                  f"segment:entry:slot ({exc})") from None
        kwargs["starting_position"] = start
    if mode == "read":
        end = _get(options, "endingPosition") or "latest"
        try:
            _position_or(end, ("latest",))
        except (ValueError, TypeError) as exc:
            raise OptionError("endingPosition", f"expected latest or segment:entry:slot "
                                                f"({exc})") from None
        kwargs["ending_position"] = end
    if mode == "stream-read":
        kwargs["max_records_per_trigger"] = _int(options, "maxRecordsPerTrigger", None)
        cursor = _get(options, "cursor")
        if cursor is not None:
            try:
                kwargs["cursor"] = check_cursor_name(cursor.strip())
            except (ValueError, TypeError) as exc:
                raise OptionError("cursor", str(exc)) from None
    elif _get(options, "cursor") is not None:
        raise OptionError("cursor", "applies to streaming reads only")
    if mode != "stream-read" and _get(options, "maxRecordsPerTrigger") is not None:
        raise OptionError("maxRecordsPerTrigger", "applies to streaming reads only")
    if mode != "read" and _get(options, "endingPosition") is not None:
        raise OptionError("endingPosition", "applies to batch reads only")
    return SourceOptions(**kwargs)
