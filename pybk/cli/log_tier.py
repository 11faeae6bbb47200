"""``pybk log`` commands for a log's data life: its durable cursors, retention policy and
tiered storage (``cursors``, ``delete-cursor``, ``reset-cursor``, ``retention``,
``offload``). Registered on the
``pybk log`` group by :mod:`pybk.cli`; the same conventions as the other ``pybk log``
commands (data on stdout, messages on stderr, one-line errors)."""

from __future__ import annotations

import json
from typing import Any

import click

from pybk.cli.common import Conn, client_options, echo_data, printing, run_async, with_client
from pybk.cli.log import log, parse_position
from pybk.logs.cursor import check_cursor_name
from pybk.logs.namespace import check_name
from pybk.logs.position import Position

__all__ = ["check_namespace", "cursor_argument", "log_cursors", "log_delete_cursor",
           "log_name_argument", "log_offload", "log_reset_cursor", "log_retention",
           "namespace_option"]


def _name(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    try:
        return check_name("log", value)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _cursor(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    try:
        return check_cursor_name(value)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _namespace(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    try:
        return check_name("namespace", value)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def check_namespace(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A click callback: a namespace name (or a tuple of them, for a repeated option)."""
    if isinstance(value, tuple):
        return tuple(_namespace(ctx, param, v) for v in value)
    return _namespace(ctx, param, value)


_NAME = log_name_argument = click.argument("name", callback=_name)
_NAMESPACE = namespace_option = click.option(
    "--namespace", "-n", default="default", show_default=True, callback=_namespace,
    help="The namespace the log lives in.")
cursor_argument = click.argument("cursor", callback=_cursor)


@log.command("cursors")
@client_options
@_NAME
@_NAMESPACE
@click.option("--json", "as_json", is_flag=True, help="One JSON object: name -> position.")
def log_cursors(conn: Conn, name: str, namespace: str, as_json: bool) -> None:
    """List NAME's durable cursors with their mark-delete positions ('-': nothing
    acknowledged yet)."""

    async def go(client: Any) -> dict[str, Position | None]:
        lg = await client.namespace(namespace).open_log(name)
        return dict(await lg.cursors())

    cursors = run_async(with_client(conn, go))
    with printing():
        if as_json:
            echo_data(json.dumps({k: None if v is None else str(v) for k, v in cursors.items()}))
        else:
            for k, v in cursors.items():
                echo_data(f"{k}\t{'-' if v is None else v}")


@log.command("delete-cursor")
@client_options
@_NAME
@click.argument("cursor", callback=_cursor)
@_NAMESPACE
def log_delete_cursor(conn: Conn, name: str, cursor: str, namespace: str) -> None:
    """Delete CURSOR of NAME (its consumer, if any, is fenced); retention no longer waits
    for it."""

    async def go(client: Any) -> None:
        lg = await client.namespace(namespace).open_log(name)
        await lg.delete_cursor(cursor)

    run_async(with_client(conn, go))
    click.echo(f"deleted cursor {cursor!r} of log {name!r}", err=True)


@log.command("reset-cursor")
@client_options
@_NAME
@click.argument("cursor", callback=_cursor)
@click.argument("position", callback=parse_position)
@click.option("--create", is_flag=True, help="Create CURSOR there if it does not exist.")
@_NAMESPACE
def log_reset_cursor(conn: Conn, name: str, cursor: str, position: Position, create: bool,
                     namespace: str) -> None:
    """Move CURSOR of NAME to POSITION (segment:entry:slot): every record before it counts
    as consumed, and its next consumer resumes there (its consumer, if any, is fenced)."""

    async def go(client: Any) -> None:
        lg = await client.namespace(namespace).open_log(name)
        await lg.reset_cursor(cursor, position, create=create)

    run_async(with_client(conn, go))
    click.echo(f"cursor {cursor!r} of log {name!r} resumes at {position}", err=True)


@log.command("retention")
@client_options
@_NAME
@_NAMESPACE
@click.option("--max-age", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Drop completed segments older than this many seconds.")
@click.option("--max-bytes", type=click.IntRange(min=1), default=None,
              help="Drop the oldest completed segments beyond this many bytes.")
@click.option("--after-consumed/--regardless", default=False, show_default=True,
              help="Only segments every durable cursor is past (then by age/size; with "
                   "neither, as soon as consumed).")  # fmt: skip
@click.option("--apply", "apply_now", is_flag=True, help="Apply the policy now as well.")
def log_retention(conn: Conn, name: str, namespace: str, max_age: float | None,
                  max_bytes: int | None, after_consumed: bool, apply_now: bool) -> None:
    """Set NAME's retention policy (the writer applies it on its own)."""

    async def go(client: Any) -> None:
        lg = await client.namespace(namespace).open_log(name)
        await lg.set_retention(max_age=max_age, max_bytes=max_bytes,
                               after_consumed=after_consumed)
        if apply_now:
            await lg.apply_retention()

    run_async(with_client(conn, go))
    click.echo(f"retention of log {name!r} set", err=True)


@log.command("offload")
@client_options
@_NAME
@_NAMESPACE
@click.option("--url", default=None, help="Set the tier first: an fsspec URL (file:///path, "
              "s3://bucket/prefix).")
@click.option("--endpoint-url", default=None, help="With --url: the S3 endpoint (stored "
              "with the log; credentials come from the environment).")
@click.option("--deletion-lag", type=click.FloatRange(min=0), default=4 * 3600.0,
              show_default=True, help="With --url: seconds before the bookies' copy goes.")
@click.option("--threshold-bytes", type=click.IntRange(min=1), default=None,
              help="With --url: from now on the writer offloads by itself beyond this many "
                   "bytes of completed segments on the bookies.")
@click.option("--threshold-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --url: ... and segments completed longer ago than this.")
@click.option("--bytes-per-s", type=click.IntRange(min=1), default=None,
              help="With --url: the most bytes a second an offload reads from the bookies.")
@click.option("--before", metavar="POSITION", callback=parse_position, default=None,
              help="Only segments wholly before this position.")
def log_offload(conn: Conn, name: str, namespace: str, url: str | None,
                endpoint_url: str | None, deletion_lag: float, threshold_bytes: int | None,
                threshold_seconds: float | None, bytes_per_s: int | None,
                before: Position | None) -> None:
    """Offload NAME's completed segments to its tier; prints each segment offloaded."""
    if url is None and (threshold_bytes is not None or threshold_seconds is not None
                        or bytes_per_s is not None):
        raise click.UsageError("--threshold-bytes, --threshold-seconds and --bytes-per-s "
                               "need --url")

    async def go(client: Any) -> list[int]:
        lg = await client.namespace(namespace).open_log(name)
        if url is not None:
            opts = {"endpoint_url": endpoint_url} if endpoint_url else {}
            await lg.set_offload(url, options=opts, deletion_lag=deletion_lag,
                                 threshold_bytes=threshold_bytes,
                                 threshold_seconds=threshold_seconds,
                                 bytes_per_s=bytes_per_s)
        return list(await lg.offload(before))

    done = run_async(with_client(conn, go))
    with printing():
        for seq in done:
            echo_data(str(seq))
    click.echo(f"offloaded {len(done)} segment(s) of log {name!r}", err=True)
