"""Operator commands on a running cluster: ``pybk bookie info|decommission|recover`` and
``pybk ledger under-replicated`` (attached to the ``bookie`` and ``ledger`` groups)."""

from __future__ import annotations

import json
from typing import Any

import click

from pybk.cli.autorecovery import placement_options
from pybk.cli.common import Conn, client_options, run_async, with_client


def _placed(placement: Any) -> Any:
    from pybk.client import ClientConfig

    return ClientConfig(placement=placement)

__all__ = ["bookie_decommission", "bookie_info", "bookie_recover", "ledger_under_replicated"]


@click.command("info")
@client_options
@click.argument("bookie_id")
def bookie_info(conn: Conn, bookie_id: str) -> None:
    """What a running bookie says of itself: state, free and total disk (one JSON object)."""

    async def go(client: Any) -> dict[str, Any]:
        info: dict[str, Any] = await client.admin().bookie_info(bookie_id)
        return info

    click.echo(json.dumps(run_async(with_client(conn, go)), sort_keys=True))


@click.command("decommission")
@client_options
@placement_options
@click.argument("bookie_id")
@click.option("--delete-cookie", is_flag=True,
              help="Forget the bookie's identity too, so a fresh bookie may reuse the id.")
@click.option("--grace", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Seconds an open ledger naming the bookie is left to its writer before "
                   "it is fenced.")
def bookie_decommission(conn: Conn, bookie_id: str, delete_cookie: bool, grace: float,
                        placement: Any) -> None:
    """Retire a stopped bookie for good: copy everything it held elsewhere and wait until no
    ledger names it (bounded by --timeout). Refused while the bookie runs. Prints a report."""

    async def go(client: Any) -> dict[str, Any]:
        report = await client.admin().decommission_bookie(
            bookie_id, delete_cookie=delete_cookie, grace=grace)
        result: dict[str, Any] = report.as_dict()
        return result

    conn.config = _placed(placement)
    click.echo(json.dumps(run_async(with_client(conn, go)), sort_keys=True))


@click.command("recover")
@client_options
@placement_options
@click.argument("bookie_id")
@click.option("--password-file", "password_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False),
              help="A ledger password for ledgers without recovery keys (repeatable).")
def bookie_recover(conn: Conn, bookie_id: str, password_files: tuple[str, ...],
                   placement: Any) -> None:
    """Copy every fragment naming BOOKIE_ID to other bookies and update the ledgers (open
    ledgers naming it are fenced first). Prints a report."""
    from pathlib import Path

    passwords = [b""] + [Path(p).read_bytes().rstrip(b"\n") for p in password_files]

    async def go(client: Any) -> dict[str, Any]:
        report = await client.admin(passwords=passwords).recover_bookie(bookie_id)
        result: dict[str, Any] = report.as_dict()
        return result

    conn.config = _placed(placement)
    click.echo(json.dumps(run_async(with_client(conn, go)), sort_keys=True))


@click.command("under-replicated")
@client_options
@click.option("--missing", help="Only ledgers lacking this bookie.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: ledger id -> bookies it lacks.")
def ledger_under_replicated(conn: Conn, missing: str | None, as_json: bool) -> None:
    """Ledgers marked under-replicated (fewer than Qw live copies of some entry), one per
    line with the bookies they lack; nothing when every ledger is fully replicated."""

    async def go(client: Any) -> dict[int, list[str]]:
        marks: dict[int, list[str]] = await client.admin().under_replicated_details()
        return marks

    marks = {lid: m for lid, m in run_async(with_client(conn, go)).items()
             if missing is None or missing in m}
    if as_json:
        click.echo(json.dumps({str(k): v for k, v in sorted(marks.items())}))
        return
    for lid, m in sorted(marks.items()):
        click.echo(f"{lid}\t{','.join(m)}")
