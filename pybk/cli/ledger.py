"""``pybk ledger``: create, append, read, tail, list, show, recover and delete ledgers."""

from __future__ import annotations

import base64
import contextlib
import json
import sys
from collections.abc import AsyncGenerator
from typing import Any

import click

from pybk.cli.common import (
    Conn,
    bounded,
    client_options,
    echo_data,
    run_async,
    stderr_console,
    with_client,
    write_data,
)
from pybk.cli.stdin import StdinLines, from_args
from pybk.client.context import DEFAULT_MAX_ENTRY_SIZE
from pybk.errors import EntryTooLargeError, NoSuchEntryError

__all__ = ["ledger"]


@click.group()
def ledger() -> None:
    """Create, write, read, recover and delete ledgers."""


@ledger.command("create")
@client_options
@click.option("--ensemble", "-e", type=click.IntRange(1), default=3, show_default=True)
@click.option("--write-quorum", "-w", type=click.IntRange(1), default=2, show_default=True)
@click.option("--ack-quorum", "-a", type=click.IntRange(1), default=2, show_default=True)
@click.option("--digest", type=click.Choice(["CRC32C", "MAC", "DUMMY"]), default="CRC32C")
@click.option("--password", default="", help="Ledger password (needed to write/recover).")
def ledger_create(
    conn: Conn, ensemble: int, write_quorum: int, ack_quorum: int, digest: str, password: str
) -> None:
    """Create a ledger and print its id. (The ledger stays open: appends from other
    commands go through `pybk ledger append`, which opens a fresh ledger handle.)"""

    async def go(client: Any) -> int:
        lh = await client.create_ledger(
            ensemble_size=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            digest_type=digest,
            password=password.encode(),
        )
        return int(lh.id)

    click.echo(run_async(with_client(conn, go)))


def _entries_from(data: tuple[str, ...], count: int | None,
                  size: int) -> tuple[AsyncGenerator[list[bytes], None], int | None]:
    """The entries to append, in batches as they come, and how many there are (None: as
    many lines as stdin gives)."""
    if data and count:
        raise click.UsageError("give DATA arguments or --count, not both")
    if data == ("-",):
        lines = StdinLines(sys.stdin.buffer, DEFAULT_MAX_ENTRY_SIZE, EntryTooLargeError,
                           "the largest entry")
        return lines.batches(), None
    if data:
        if "-" in data:
            raise click.UsageError("'-' (entries from stdin) cannot be mixed with DATA")
        return from_args([d.encode() for d in data]), len(data)
    if count:
        return from_args([(b"%08d:" % i).ljust(size, b".")[: max(size, 9)]
                          for i in range(count)]), count
    raise click.UsageError("nothing to append: give DATA arguments, '-' for stdin, or --count")


#: entries in flight at once (sent before waiting for their acknowledgements)
_APPEND_BATCH = 256


@ledger.command("append")
@client_options
@click.argument("data", nargs=-1)
@click.option("--count", type=click.IntRange(1), help="Append COUNT generated entries.")
@click.option("--size", type=click.IntRange(1), default=100, show_default=True,
              help="Bytes per generated entry (--count).")  # fmt: skip
@click.option("--ensemble", "-e", type=click.IntRange(1), default=3, show_default=True)
@click.option("--write-quorum", "-w", type=click.IntRange(1), default=2, show_default=True)
@click.option("--ack-quorum", "-a", type=click.IntRange(1), default=2, show_default=True)
@click.option("--password", default="", help="Ledger password (needed to recover it later).")
@click.option("--close/--no-close", default=True, show_default=True, help="Seal when done.")
def ledger_append(
    conn: Conn,
    data: tuple[str, ...],
    count: int | None,
    size: int,
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    password: str,
    close: bool,
) -> None:
    """Write DATA (one entry per argument; '-' reads lines from stdin) to a NEW ledger.

    A ledger has one writer, so appending creates the ledger; its id is printed on stdout
    at once (also when an append then fails: the ledger exists), then the entries are
    appended (with '-', each line as it arrives, so `pybk ledger tail` can follow a live
    pipe) and the ledger is closed (unless --no-close), sealed at what was acknowledged.
    --timeout bounds each wait on the cluster, never the wait for stdin.
    """
    batches, total = _entries_from(data, count, size)
    appended = 0

    async def go() -> int:
        nonlocal appended
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        async with conn.client() as client:
            lh = await bounded(conn, client.create_ledger(
                ensemble_size=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
                password=password.encode()), "ledger not created")
            echo_data(str(lh.id))
            console = stderr_console()
            try:
                with Progress(
                    *Progress.get_default_columns()[:1],
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeRemainingColumn(),
                    console=console,
                    transient=True,
                    disable=not console.is_terminal,  # no bar (nor its blank line) in pipes
                ) as progress:
                    task = progress.add_task(f"ledger {lh.id}", total=total)
                    async with contextlib.aclosing(batches):
                        async for entries in batches:
                            for i in range(0, len(entries), _APPEND_BATCH):
                                chunk = entries[i : i + _APPEND_BATCH]
                                await bounded(conn, lh.append_many_nowait(chunk),
                                              f"entries of ledger {lh.id} not acknowledged")
                                appended += len(chunk)
                                progress.advance(task, len(chunk))
            except BaseException:
                if close:  # after a failure or Ctrl-C too: sealed at what was acknowledged
                    with contextlib.suppress(Exception):
                        await bounded(conn, lh.close(), f"ledger {lh.id} not closed")
                raise
            if close:
                await bounded(conn, lh.close(), f"ledger {lh.id} not closed")
            return int(lh.id)

    ledger_id = run_async(go())
    click.echo(f"appended {appended} entries to ledger {ledger_id}", err=True)


def _emit(entry: Any, fmt: str) -> None:
    if fmt == "json":
        echo_data(
            json.dumps(
                {
                    "ledger_id": entry.ledger_id,
                    "entry_id": entry.entry_id,
                    "data": base64.b64encode(entry.data).decode(),
                }
            )
        )
    elif fmt == "raw":
        write_data(entry.data + b"\n")
    else:
        echo_data(f"{entry.entry_id}\t{entry.data.decode('utf-8', 'backslashreplace')}")


_FORMAT = click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "raw"]), default="text",
    show_default=True, help="text: 'id<TAB>data'; json: base64 data; raw: data lines.",
)  # fmt: skip


@ledger.command("read")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--first", type=click.IntRange(0), default=0, show_default=True)
@click.option("--last", type=click.IntRange(0), default=None,
              help="Default: the last confirmed entry.")
@click.option("--password", default="")
@_FORMAT
def ledger_read(
    conn: Conn, ledger_id: int, first: int, last: int | None, password: str, fmt: str
) -> None:
    """Print entries FIRST..LAST of LEDGER_ID (without disturbing a writer).

    Entries past the last confirmed one are an error (exit 1) naming where the ledger ends;
    an empty ledger read from its start prints nothing."""
    if last is not None and last < first:
        raise click.BadParameter(f"--last {last} is before --first {first}",
                                 param_hint="--last")

    async def go(client: Any) -> None:
        rh = await client.open_ledger(ledger_id, password=password.encode(), recovery=False)
        lac = rh.last_add_confirmed
        if last is None and first > lac and not (first == 0 and lac == -1):
            raise NoSuchEntryError(
                f"ledger {ledger_id} has no confirmed entry {first}: "
                + (f"its last add confirmed is {lac}" if lac >= 0 else "it holds none"))
        end = lac if last is None else last
        step = 500
        for lo in range(first, end + 1, step):
            for entry in await rh.read(lo, min(end, lo + step - 1)):
                _emit(entry, fmt)

    run_async(with_client(conn, go))


@ledger.command("tail")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--start", type=click.IntRange(0), default=0, show_default=True)
@click.option("--password", default="")
@_FORMAT
def ledger_tail(conn: Conn, ledger_id: int, start: int, password: str, fmt: str) -> None:
    """Follow LEDGER_ID as it is written, printing entries; ends when it is closed.

    Without --timeout it follows for as long as the ledger stays open (opening it is
    bounded by the default 30 s); with --timeout SECONDS it gives up (exit 1) when no new
    entry arrives for that long. Ctrl-C stops it (exit 130)."""

    async def go() -> None:
        async with conn.client() as client:
            rh = await bounded(conn, client.open_ledger(ledger_id, password=password.encode(),
                                                        recovery=False), "ledger not opened")
            entries = rh.tail(start=start)
            try:
                while True:
                    try:
                        if conn.timeout_given:
                            entry = await bounded(conn, anext(entries),
                                                  f"no new entry in ledger {ledger_id}")
                        else:
                            entry = await anext(entries)
                    except StopAsyncIteration:
                        return
                    _emit(entry, fmt)
            finally:
                await entries.aclose()

    run_async(go())


@ledger.command("list")
@client_options
def ledger_list(conn: Conn) -> None:
    """Print every ledger id, one per line."""

    async def go(client: Any) -> list[int]:
        return list(await client.list_ledgers())

    for ledger_id in run_async(with_client(conn, go)):
        click.echo(ledger_id)


def _metadata_doc(md: Any) -> dict[str, Any]:
    return dict(md.public_view())


@ledger.command("show")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
def ledger_show(conn: Conn, ledger_id: int) -> None:
    """Print LEDGER_ID's metadata as JSON (ctime_ms: when it was created, in milliseconds
    since the epoch)."""

    async def go(client: Any) -> Any:
        return await client.ledger_metadata(ledger_id)

    click.echo(json.dumps(_metadata_doc(run_async(with_client(conn, go))), indent=2))


@ledger.command("recover")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--password", default="")
def ledger_recover(conn: Conn, ledger_id: int, password: str) -> None:
    """Fence and seal LEDGER_ID (its writer can no longer add); print its last entry id."""

    async def go(client: Any) -> int:
        rh = await client.open_ledger(ledger_id, password=password.encode(), recovery=True)
        return int(rh.last_add_confirmed)

    last = run_async(with_client(conn, go))
    click.echo(last)
    click.echo(f"ledger {ledger_id} is closed; last entry {last}", err=True)


@ledger.command("delete")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def ledger_delete(conn: Conn, ledger_id: int, yes: bool) -> None:
    """Delete LEDGER_ID (each bookie's garbage collector then deletes its entries: within
    two gc intervals, `pybk bookie gc` to ask now). A ledger that does not exist is
    reported (exit 1) before anything is asked."""
    if not yes:

        async def exists(client: Any) -> None:
            await client.ledger_metadata(ledger_id)  # NoSuchLedgerError

        run_async(with_client(conn, exists))
        click.confirm(f"delete ledger {ledger_id}?", abort=True, err=True)

    async def go(client: Any) -> None:
        await client.delete_ledger(ledger_id)

    run_async(with_client(conn, go))
    click.echo(f"deleted ledger {ledger_id}", err=True)


