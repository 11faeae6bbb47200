"""``pybk log``: create, list, show, append to, read, tail, truncate and delete logs.

The logs are those of :mod:`pybk.logs` (named logs over chains of ledgers; docs/logs.md).
The conventions are the ``pybk ledger`` commands': ``--metadata URI`` and the TLS / token
options, data on stdout and messages on stderr, exit status 1 with one line naming the cause
when the operation fails, 2 for bad usage (a malformed position or log name is bad usage).
Ctrl-C stops a command with exit status 130 (128 + SIGINT), after an ``append`` has closed
its writer and printed every position that was acknowledged.

``--timeout`` bounds each wait on the cluster (opening the log, each acknowledgement, each
batch read), never the wait for input on stdin; ``tail`` waits for new records without a
bound unless ``--timeout`` is given, and then gives up after that long with none (as
``pybk ledger tail`` does).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import click

import pybk
from pybk.cli.common import (
    Conn,
    StdoutClosed,
    bounded,
    client_options,
    echo_data,
    printing,
    run_async,
    with_client,
    write_data,
)
from pybk.cli.log_show import pos_str, print_show, show_doc
from pybk.cli.stdin import StdinLines, from_args
from pybk.errors import AlreadyTruncatedError, EndOfStreamError, RecordTooLargeError
from pybk.logs.config import LogConfig, WriterOptions
from pybk.logs.namespace import check_name
from pybk.logs.position import LogRecord, Position

__all__ = ["RECORD_FORMAT", "emit_records", "log", "parse_position"]

T = TypeVar("T")

#: records appended but not yet printed (acknowledged or not) by one ``append``; bounds
#: what the command holds while its input runs ahead of the bookies
_APPEND_WINDOW = 4096
#: records fetched per read by ``read`` and ``tail``
_READ_BATCH = 1000


# -- parameters ------------------------------------------------------------------------------


def parse_position(ctx: click.Context | None, param: click.Parameter | None,
                   value: Any) -> Position | None:
    """A position given on the command line (``segment:entry:slot``, as ``str(Position)``
    prints it); a malformed one is bad usage naming the value."""
    if value is None or isinstance(value, Position):
        return value
    try:
        return Position.parse(value)
    except (TypeError, ValueError) as exc:
        reason = str(exc)
        if not reason.startswith("not a position"):
            reason = f"not a position: {value!r} ({reason})"
        raise click.BadParameter(reason, ctx=ctx, param=param) from None


def _checked_name(kind: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return value
        try:
            return check_name(kind, value)
        except (TypeError, ValueError) as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return check


_NAME = click.argument("name", callback=_checked_name("log"))
_NAMESPACE = click.option(
    "--namespace", "-n", default="default", show_default=True,
    callback=_checked_name("namespace"), help="The namespace the log lives in.",
)  # fmt: skip
RECORD_FORMAT = click.option(
    "--format", "fmt", type=click.Choice(["text", "hex", "json", "raw"]), default="text",
    show_default=True,
    help="text: 'POSITION<TAB>DATA', DATA as text when it is printable UTF-8, else 'hex:' and "
         "its bytes in hex; hex: 'POSITION<TAB>HEX'; json: one object per line (position, "
         "txid, base64 data); raw: the records' bytes, one per line.",
)  # fmt: skip


# -- running ---------------------------------------------------------------------------------


# Ctrl-C (exit 130), a closed stdout (141) and --timeout work as in every pybk command
# (pybk.cli.common); these names are this module's own for them.
_StdoutClosed = StdoutClosed
_out = echo_data
_out_bytes = write_data
_printing = printing
_run = run_async


async def _bounded(conn: Conn, aw: Awaitable[T]) -> T:
    """Wait for ``aw`` at most ``--timeout`` seconds (pybk.TimeoutError past it, the message
    of every client command)."""
    return await bounded(conn, aw)


# -- the group -------------------------------------------------------------------------------


@click.group()
def log() -> None:
    """Create, write, read, follow, truncate and delete named logs.

    A log is a sequence of records over a chain of ledgers (segments); a record's place is
    its position SEGMENT:ENTRY:SLOT. One writer at a time: `pybk log append` opens the
    log's writer, which fences any earlier writer.

    Besides 0, 1 and 2: Ctrl-C exits 130, and a closed stdout (`| head`) 141, quietly.
    """


@log.command("create")
@client_options
@_NAME
@_NAMESPACE
@click.option("--ensemble", "-e", type=click.IntRange(1), default=3, show_default=True,
              help="Bookies per segment.")  # fmt: skip
@click.option("--write-quorum", "-w", type=click.IntRange(1), default=2, show_default=True)
@click.option("--ack-quorum", "-a", type=click.IntRange(1), default=2, show_default=True)
@click.option("--digest", type=click.Choice(["CRC32C", "MAC", "DUMMY"]), default="CRC32C",
              show_default=True)  # fmt: skip
@click.option("--compression", type=click.Choice(["none", "zstd"]), default="none",
              show_default=True,
              help="Codec of the record batches (one per ledger entry).")  # fmt: skip
@click.option("--roll-bytes", type=click.IntRange(0), default=64 << 20, show_default=True,
              help="Start a new segment once one holds this many bytes "
                   "(0: never by size).")  # fmt: skip
@click.option("--roll-entries", type=click.IntRange(1), default=None,
              help="... or this many entries (record batches).")  # fmt: skip
@click.option("--roll-seconds", type=click.FloatRange(0, min_open=True), default=None,
              help="... or is this many seconds old.")  # fmt: skip
@click.option("--retention-seconds", type=click.FloatRange(0, min_open=True), default=None,
              help="Drop completed segments older than this "
                   "(default: keep until truncated).")  # fmt: skip
@click.option("--retention-bytes", type=click.IntRange(1), default=None,
              help="Drop the oldest completed segments beyond this many bytes.")  # fmt: skip
def log_create(
    conn: Conn,
    name: str,
    namespace: str,
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    digest: str,
    compression: str,
    roll_bytes: int,
    roll_entries: int | None,
    roll_seconds: float | None,
    retention_seconds: float | None,
    retention_bytes: int | None,
) -> None:
    """Create the empty log NAME with this configuration (stored with the log)."""
    try:
        config = LogConfig(
            ensemble_size=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
            digest_type=digest, compression=compression, roll_bytes=roll_bytes or None,
            roll_entries=roll_entries, roll_seconds=roll_seconds,
            retention_seconds=retention_seconds, retention_bytes=retention_bytes,
        )  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None

    async def go(client: Any) -> None:
        await client.namespace(namespace).create_log(name, **config.to_doc())

    _run(with_client(conn, go))
    click.echo(
        f"created log {name!r} in namespace {namespace!r} (E={ensemble} Qw={write_quorum} "
        f"Qa={ack_quorum}, compression {compression})",
        err=True,
    )


@log.command("list")
@client_options
@_NAMESPACE
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line: name, segments, records, end of stream.")  # fmt: skip
def log_list(conn: Conn, namespace: str, as_json: bool) -> None:
    """Print the names of the namespace's logs, one per line, sorted."""

    async def go(client: Any) -> list[dict[str, Any]]:
        ns = client.namespace(namespace)
        out: list[dict[str, Any]] = []
        for name in await ns.list_logs():
            if not as_json:
                out.append({"name": name})
                continue
            try:
                md = await (await ns.open_log(name)).metadata()
            except pybk.LogNotFoundError:
                continue  # deleted since it was listed
            out.append({
                "namespace": namespace,
                "name": name,
                "segments": len(md.live_segments),
                "records_completed": sum(s.records for s in md.live_segments
                                         if s.is_completed),
                "in_progress": any(s.in_progress for s in md.segments),
                "truncated_before": pos_str(md.truncated_before),
                "end_of_stream": md.end_of_stream,
                "writer": md.writer or None,
            })  # fmt: skip
        return out

    logs = _run(with_client(conn, go))
    with _printing():
        for doc in logs:
            _out(json.dumps(doc) if as_json else doc["name"])
    if not logs:
        click.echo(f"no logs in namespace {namespace!r}", err=True)


# -- show ------------------------------------------------------------------------------------


@log.command("show")
@client_options
@_NAME
@_NAMESPACE
@click.option("--json", "as_json", is_flag=True, help="The description as one JSON object.")
def log_show(conn: Conn, name: str, namespace: str, as_json: bool) -> None:
    """Describe NAME: its configuration, writer, first and last positions, truncation
    point, end of stream, and its segments (sequence number, ledger, state, counts).

    An in-progress segment's counts are known once it is completed ('?' until then); the
    log's last position includes it (the last record its bookies confirm)."""

    async def go(client: Any) -> dict[str, Any]:
        lg = await client.namespace(namespace).open_log(name)
        last = await lg.last_position()
        first = await lg.first_position() if last is not None else None
        md = await lg.metadata()
        return show_doc(md, first, last)

    doc = _run(with_client(conn, go))
    if as_json:
        with _printing():
            _out(json.dumps(doc, indent=2))
    else:
        print_show(doc)  # (rich ends the command quietly if stdout is closed)


# -- append ----------------------------------------------------------------------------------


def _writer_label() -> str:
    return f"pybk-cli@{socket.gethostname()}:{os.getpid()}"


async def _append(
    conn: Conn,
    namespace: str,
    name: str,
    source: AsyncGenerator[list[bytes], None],
    txid: int | None,
    label: str,
    end_of_stream: bool,
) -> tuple[int, Position | None]:
    """Append every record of ``source``, printing each position once acknowledged, in
    order; (records acknowledged, the last position)."""
    printed = 0
    last: Position | None = None
    # (future of the position) per record, in order; an exception ends the input
    futures: asyncio.Queue[asyncio.Future[Position] | BaseException | None] = asyncio.Queue(
        _APPEND_WINDOW
    )

    def emit(pos: Position) -> None:
        nonlocal printed, last
        _out(str(pos))
        printed += 1
        last = pos

    async with conn.client() as client:
        lg = await _bounded(conn, client.namespace(namespace).open_log(name))
        md = await _bounded(conn, lg.metadata())
        if md.end_of_stream:  # refuse before taking the writer lock from anyone
            raise EndOfStreamError(f"log {name!r} is marked ended; no more records")
        writer = await _bounded(conn, lg.writer(WriterOptions(), label=label))

        async def produce() -> None:
            next_txid = txid
            try:
                async with contextlib.aclosing(source):
                    async for records in source:
                        for data in records:
                            fut = writer.append(data, next_txid)
                            if next_txid is not None:
                                next_txid += 1
                            try:
                                await futures.put(fut)
                            except asyncio.CancelledError:
                                unqueued.append(fut)  # appended: printed if acknowledged
                                raise
            except Exception as exc:  # refused input, or the writer failed: after the rest
                await futures.put(exc)
            await futures.put(None)

        unqueued: list[asyncio.Future[Position]] = []
        producer = asyncio.create_task(produce())
        current: asyncio.Future[Position] | None = None
        try:
            while (item := await futures.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                current = item
                emit(item.result() if item.done()
                     else await _bounded(conn, asyncio.shield(item)))  # fmt: skip
                current = None
            await producer
            if end_of_stream:
                await _bounded(conn, writer.mark_end_of_stream())
        finally:
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
            try:
                await _bounded(conn, writer.close())  # sends and waits for what is appended
            finally:
                # records acknowledged after a failure or Ctrl-C are printed too, in order
                rest: list[Any] = [current] if current is not None else []
                while not futures.empty():
                    rest.append(futures.get_nowait())
                for fut in [*rest, *unqueued]:
                    if (isinstance(fut, asyncio.Future) and fut.done()
                            and not fut.cancelled() and fut.exception() is None):
                        emit(fut.result())
    return printed, last


@log.command("append")
@client_options
@_NAME
@click.argument("records", nargs=-1)
@_NAMESPACE
@click.option("--txid", type=click.IntRange(0),
              help="Transaction id of the first record; each next record gets the next one "
                   "(txids never decrease in a log).")  # fmt: skip
@click.option("--end-of-stream", is_flag=True,
              help="Then mark the log ended: it takes no more records, and readers and "
                   "tails stop after its last one.")  # fmt: skip
@click.option("--label", default=None,
              help="This writer's name in the log's metadata (default pybk-cli@HOST:PID).")
def log_append(
    conn: Conn,
    name: str,
    records: tuple[str, ...],
    namespace: str,
    txid: int | None,
    end_of_stream: bool,
    label: str | None,
) -> None:
    """Append RECORDS to NAME (one record per argument, or one per line of stdin with '-')
    and print each record's position once it is acknowledged (durable on the ack quorum).

    This opens the log's single writer, which fences any earlier writer: a program that is
    writing the log gets LedgerFencedError on its next append. Records are sent as they
    come, so a pipe can feed a long-running append.
    """
    if records == ("-",):
        source = StdinLines(sys.stdin.buffer, WriterOptions().max_record_bytes,
                            RecordTooLargeError, "the largest record")
        batches = source.batches()
    elif records:
        if "-" in records:
            raise click.UsageError("'-' (records from stdin) cannot be mixed with RECORDS")
        batches = from_args([r.encode() for r in records])
    elif end_of_stream:
        batches = from_args([])
    else:
        raise click.UsageError("nothing to append: give RECORDS, or '-' to read lines from stdin")
    count, last = _run(_append(conn, namespace, name, batches, txid,
                               label or _writer_label(), end_of_stream))  # fmt: skip
    where = f"; last position {last}" if last is not None else ""
    ended = "; the log is now ended" if end_of_stream else ""
    click.echo(f"appended {count} record{'' if count == 1 else 's'} to log {name!r}{where}{ended}",
               err=True)


# -- read and tail ---------------------------------------------------------------------------


def _printable(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def emit_records(records: list[LogRecord], fmt: str) -> None:
    """Print a batch of records at once (one write and flush per batch)."""
    if fmt == "raw":
        _out_bytes(b"".join(r.data + b"\n" for r in records))
        return
    lines: list[str] = []
    for rec in records:
        if fmt == "json":
            lines.append(json.dumps({
                "position": str(rec.position), "segment": rec.position.segment,
                "entry": rec.position.entry, "slot": rec.position.slot, "txid": rec.txid,
                "data": base64.b64encode(rec.data).decode(),
            }))  # fmt: skip
        elif fmt == "hex":
            lines.append(f"{rec.position}\t{rec.data.hex()}")
        else:
            text = _printable(rec.data)
            lines.append(f"{rec.position}\t{text if text is not None else 'hex:' + rec.data.hex()}")
    _out("\n".join(lines))


@log.command("read")
@client_options
@_NAME
@_NAMESPACE
@click.option("--from", "start", metavar="POSITION", callback=parse_position,
              help="First position to read (default: the oldest record kept).")
@click.option("--txid", type=click.IntRange(0),
              help="Start at the first record whose txid is at least this.")
@click.option("--count", type=click.IntRange(1), help="Stop after this many records.")
@RECORD_FORMAT
def log_read(
    conn: Conn,
    name: str,
    namespace: str,
    start: Position | None,
    txid: int | None,
    count: int | None,
    fmt: str,
) -> None:
    """Print NAME's records from --from (or --txid) up to the last acknowledged one, then
    stop (without waiting for more: see `pybk log tail`). Reading before the log's
    truncation point fails with AlreadyTruncatedError."""
    if start is not None and txid is not None:
        raise click.UsageError("give --from or --txid, not both")

    async def go() -> None:
        async with conn.client() as client:
            lg = await _bounded(conn, client.namespace(namespace).open_log(name))
            last = await _bounded(conn, lg.last_position())
            if last is None:
                md = await _bounded(conn, lg.metadata())
                tb = md.truncated_before
                if start is not None and tb is not None and start < tb:
                    raise AlreadyTruncatedError(
                        f"log {name!r}: position {start} is before the truncation point {tb}"
                    )
                return
            left = count
            async with lg.reader(start, txid=txid, stop_at=last,
                                 stop_at_acknowledged=True) as reader:  # fmt: skip
                while left is None or left > 0:
                    want = _READ_BATCH if left is None else min(left, _READ_BATCH)
                    batch = await _bounded(conn, reader.read_batch(want))
                    if not batch:
                        return
                    emit_records(batch, fmt)
                    if left is not None:
                        left -= len(batch)

    _run(go())


@log.command("tail")
@client_options
@_NAME
@_NAMESPACE
@click.option("--from", "start", metavar="POSITION", callback=parse_position,
              help="First position to print (default: the oldest record kept).")
@RECORD_FORMAT
def log_tail(conn: Conn, name: str, namespace: str, start: Position | None, fmt: str) -> None:
    """Follow NAME, printing records as they are acknowledged, until the log is marked
    ended (`pybk log append --end-of-stream`).

    Without --timeout it follows for as long as the log goes on (opening it is bounded by
    the default 30 s); with --timeout SECONDS it gives up (exit 1) when no new record
    arrives for that long. Ctrl-C stops it (exit 130)."""

    async def go() -> None:
        async with conn.client() as client:
            lg = await _bounded(conn, client.namespace(namespace).open_log(name))
            async with lg.reader(start) as reader:
                while True:
                    if conn.timeout_given:
                        batch = await bounded(conn, reader.read_batch(_READ_BATCH),
                                              f"no new record in log {name!r}")
                    else:
                        batch = await reader.read_batch(_READ_BATCH)
                    if not batch:
                        return
                    emit_records(batch, fmt)

    _run(go())
    click.echo(f"log {name!r} ended", err=True)


# -- truncate and delete ---------------------------------------------------------------------


@log.command("truncate")
@client_options
@_NAME
@_NAMESPACE
@click.option("--before", metavar="POSITION", callback=parse_position, required=True,
              help="Drop every record before this position (at most just after the last "
                   "record: LAST_SEGMENT:ENTRY:SLOT+1 drops them all).")  # fmt: skip
def log_truncate(conn: Conn, name: str, namespace: str, before: Position) -> None:
    """Drop NAME's records before --before: readers get AlreadyTruncatedError there, and
    segments wholly before it are deleted with their ledgers. Needs no writer (a running
    writer keeps writing)."""

    async def go(client: Any) -> None:
        lg = await client.namespace(namespace).open_log(name)
        await lg.truncate(before)

    _run(with_client(conn, go))
    click.echo(f"truncated log {name!r} before {before}", err=True)


@log.command("delete")
@client_options
@_NAME
@_NAMESPACE
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def log_delete(conn: Conn, name: str, namespace: str, yes: bool) -> None:
    """Delete NAME and its ledgers. A writer still writing it is fenced (its next append
    fails); readers get LogNotFoundError. A log that does not exist is reported (exit 1)
    before anything is asked."""
    if not yes:

        async def exists(client: Any) -> None:
            await client.namespace(namespace).open_log(name)  # LogNotFoundError

        _run(with_client(conn, exists))
        click.confirm(f"delete log {name!r} of namespace {namespace!r}?", abort=True, err=True)

    async def go(client: Any) -> None:
        await client.namespace(namespace).delete_log(name)

    _run(with_client(conn, go))
    click.echo(f"deleted log {name!r}", err=True)

