"""What the driver checks before any task runs: the metadata store answers, the log exists
(or is created), and a write may publish there. Every failure is an OptionError naming the
option to fix, raised while Spark plans the query."""

from __future__ import annotations

import os
import time

from pybk.errors import KeyExistsError, LogExistsError, LogNotFoundError
from pybk.logs.meta import LogMetadata
from pybk.logs.publish import check_no_live_writer
from pybk.metadata.registry import parse_uri
from pybk.spark import runtime
from pybk.spark.options import OptionError, SourceOptions

__all__ = ["connect", "now_ms"]


def now_ms() -> int:
    """Wall-clock milliseconds (job records' times): the outermost layer's clock."""
    return int(time.time() * 1000)


def connect(opts: SourceOptions, *, create: bool = False, for_write: bool = False) -> LogMetadata:
    """The log's metadata as stored now, read through this process's client.

    OptionError('metadata') when the store cannot be reached within ``metadataTimeout`` (or an
    SQLite URI names no file), OptionError('log') when the log does not exist (and ``create``
    is off), OptionError('fenceWriter') when a write would meet a live writer."""
    uri = opts.metadata
    scheme, rest = parse_uri(uri)
    path = scheme.local_path(rest)
    if path is not None and not os.path.isfile(path):
        raise OptionError("metadata", f"no SQLite metadata file at {path} (is the cluster "
                                      "up? `pybk cluster up --root DIR` prints its URI)")
    try:
        md = runtime.run(_fetch(opts, create), timeout=opts.metadata_timeout)
    except TimeoutError as exc:
        runtime.drop_client(uri)
        raise OptionError("metadata", f"cannot reach the metadata store {uri} within "
                                      f"{opts.metadata_timeout:g} s (metadataTimeout)") from exc
    except LogNotFoundError:
        raise OptionError(
            "log", f"log {opts.log!r} does not exist in namespace {opts.namespace!r} at {uri}"
            + (" (set .option('createLog', 'true') to create it)" if for_write else "")
        ) from None
    except OptionError:
        raise
    except Exception as exc:  # what the store said, with the option to look at
        runtime.drop_client(uri)
        raise OptionError("metadata", f"cannot use the metadata store {uri}: "
                                      f"{type(exc).__name__}: {exc}") from exc
    if for_write and not opts.fence_writer:
        try:
            check_no_live_writer(md)
        except Exception as exc:
            raise OptionError("fenceWriter", f"{exc}. Set .option('fenceWriter', 'true') to "
                                             "fence that writer at commit") from exc
    return md


async def _fetch(opts: SourceOptions, create: bool) -> LogMetadata:
    client = await runtime.aclient(opts.metadata)
    ns = client.namespace(opts.namespace)
    try:
        log = await ns.open_log(opts.log)
    except LogNotFoundError:
        if not create:
            raise
        cfg = opts.log_config
        try:
            log = await ns.create_log(
                opts.log, ensemble_size=cfg.ensemble_size, write_quorum=cfg.write_quorum,
                ack_quorum=cfg.ack_quorum, compression=cfg.compression,
                roll_bytes=cfg.roll_bytes,
            )
        except (LogExistsError, KeyExistsError):  # created meanwhile by someone else
            log = await ns.open_log(opts.log)
    return await log.metadata()
