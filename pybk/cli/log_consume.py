"""``pybk log consume``: read a log through a durable cursor from the command line, each
record acknowledged once printed, so the next run goes on where this one stopped.
Registered on the ``pybk log`` group by :mod:`pybk.cli`."""

from __future__ import annotations

from typing import Any

import click

from pybk.cli.common import Conn, bounded, client_options, run_async
from pybk.cli.log import RECORD_FORMAT, emit_records, log
from pybk.cli.log_tier import cursor_argument, log_name_argument, namespace_option
from pybk.logs.position import Position

__all__ = ["log_consume"]


@log.command("consume")
@client_options
@log_name_argument
@cursor_argument
@namespace_option
@click.option("--start", type=click.Choice(["earliest", "latest"]), default="earliest",
              show_default=True, help="Where a new cursor starts (an existing one goes on "
                                      "from its position).")
@click.option("--count", type=click.IntRange(1), help="Stop after this many records.")
@click.option("--follow", is_flag=True,
              help="Wait for new records until the log is marked ended (with --timeout: "
                   "give up when none arrives for that long).")
@RECORD_FORMAT
def log_consume(conn: Conn, name: str, cursor: str, namespace: str, start: str,
                count: int | None, follow: bool, fmt: str) -> None:
    """Print NAME's records from CURSOR's position on, acknowledging each once it is
    written to stdout; without --follow, stop at the last record acknowledged when it
    started. Taking the cursor fences its earlier consumer. A run killed between printing
    a record and its acknowledgement prints that record again next time (at least once)."""

    async def go() -> int:
        async with conn.client() as client:
            lg = await bounded(conn, client.namespace(namespace).open_log(name))
            last = None if follow else await bounded(conn, lg.last_position())
            cur = await bounded(conn, lg.subscribe(cursor, start=start))
            done = 0
            try:
                resume = await bounded(conn, lg.cursor_resume_point(cursor))
                if not follow and resume is not None and last is not None and resume > last:
                    last = None  # (it starts past the last record: nothing to print)
                while count is None or done < count:
                    if not follow and _caught_up(await cur.mark_delete_position(), last):
                        break
                    if follow and not conn.timeout_given:
                        rec = await cur.receive()
                    else:
                        rec = await bounded(conn, cur.receive(),
                                            f"no new record for cursor {cursor!r}")
                    if rec is None:
                        break  # the log is ended
                    emit_records([rec], fmt)
                    await bounded(conn, cur.ack_cumulative(rec.position))
                    done += 1
            finally:
                await cur.close()
            return done

    done = run_async(go())
    click.echo(f"consumed {done} record{'' if done == 1 else 's'} of log {name!r} through "
               f"cursor {cursor!r}", err=True)


def _caught_up(mark_delete: Position | None, last: Any) -> bool:
    """Everything up to ``last`` (None: the log was empty) acknowledged."""
    return last is None or (mark_delete is not None and mark_delete >= last)
