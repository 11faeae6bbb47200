"""``pybk autorecovery``: run auto-recovery on its own, or look at / switch it cluster-wide.

``pybk autorecovery --metadata URI`` runs an auditor candidate and a replication worker until
SIGTERM (next to bookies that run without ``--autorecovery``); ``status``, ``enable``,
``disable``, ``trigger`` and ``delay`` act on the whole cluster through its metadata store.
The tuning options (:func:`autorecovery_options`) are shared with ``pybk bookie``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

from pybk.cli.common import (
    Conn,
    check_metadata_uri,
    client_options,
    fail,
    run_async,
    with_client,
)

__all__ = ["autorecovery", "autorecovery_options", "make_autorecovery_config",
           "placement_options"]


def placement_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """How re-replication (and the admin's copies) choose target bookies; passes
    ``placement`` (a pybk PlacementPolicy)."""

    @click.option("--placement", type=click.Choice(["random", "disk-weighted", "rack-aware"]),
                  default="random", show_default=True,
                  help="Policy for new bookies of a ledger (re-replication targets).")
    @click.option("--min-racks", type=click.IntRange(1, 64), default=2, show_default=True,
                  help="rack-aware: racks each write set should span.")
    @click.option("--strict-placement", is_flag=True,
                  help="rack-aware: refuse a target that cannot keep --min-racks.")
    @functools.wraps(fn)
    def wrapper(*args: Any, placement: str, min_racks: int, strict_placement: bool,
                **kwargs: Any) -> Any:
        from pybk.client.placement import (
            DefaultPlacementPolicy,
            PlacementPolicy,
            RackAwarePlacementPolicy,
        )

        policy: PlacementPolicy
        if placement == "rack-aware":
            policy = RackAwarePlacementPolicy(min_racks_per_write_quorum=min_racks,
                                              strict=strict_placement)
        else:
            if strict_placement:
                raise click.UsageError("--strict-placement needs --placement rack-aware")
            policy = DefaultPlacementPolicy(disk_weighted=placement == "disk-weighted")
        return fn(*args, placement=policy, **kwargs)

    return wrapper


def autorecovery_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The auto-recovery knobs; passes ``autorecovery_config`` (None: all defaults)."""

    @click.option("--lost-bookie-delay", type=click.FloatRange(0), default=None,
                  help="Seconds a bookie must stay gone before its ledgers are copied "
                       "(default 0; a value set with `pybk autorecovery delay` wins).")
    @click.option("--open-ledger-grace", type=click.FloatRange(0, min_open=True),
                  default=None, help="Seconds an open ledger naming a lost bookie is left to "
                  "its writer before it is fenced and copied (default 30).")
    @click.option("--ledger-check", type=click.Choice(["edges", "entries", "scrub"]),
                  default=None, help="How deep the periodic check of every replica looks.")
    @click.option("--ledger-check-interval", type=click.FloatRange(0), default=None,
                  help="Seconds between checks of every ledger's replicas (0: only on "
                       "`pybk autorecovery trigger`; default a week).")
    @click.option("--bookie-check-interval", type=click.FloatRange(0, min_open=True),
                  default=None, help="Seconds between bookie checks besides registry "
                                     "changes (default 3600).")
    @click.option("--worker-poll-interval", type=click.FloatRange(0, min_open=True),
                  default=None, help="Seconds between a worker's looks at the marks "
                                     "(it also wakes when the auditor marks; default 10).")
    @click.option("--concurrent-repairs", type=click.IntRange(1, 1024), default=None,
                  help="Ledgers one worker repairs at once (default 2).")
    @click.option("--copy-window", type=click.IntRange(1, 65536), default=None,
                  help="Entries one repair copies at once (default 64).")
    @functools.wraps(fn)
    def wrapper(*args: Any, lost_bookie_delay: float | None, open_ledger_grace: float | None,
                ledger_check: str | None, ledger_check_interval: float | None,
                bookie_check_interval: float | None, worker_poll_interval: float | None,
                concurrent_repairs: int | None, copy_window: int | None,
                **kwargs: Any) -> Any:
        config = make_autorecovery_config(
            lost_bookie_recovery_delay=lost_bookie_delay, open_ledger_grace=open_ledger_grace,
            ledger_check=ledger_check, ledger_check_interval=ledger_check_interval,
            bookie_check_interval=bookie_check_interval,
            worker_poll_interval=worker_poll_interval, concurrent_repairs=concurrent_repairs,
            copy_window=copy_window)
        return fn(*args, autorecovery_config=config, **kwargs)

    return wrapper


def make_autorecovery_config(**given: Any) -> Any:
    """An AutoRecoveryConfig from the options that were given (None: the default)."""
    from pybk.ops import AutoRecoveryConfig

    chosen = {k: v for k, v in given.items() if v is not None}
    try:
        return AutoRecoveryConfig(**chosen)
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc


@click.group(invoke_without_command=True)
@click.option("--metadata", envvar="PYBK_METADATA", callback=check_metadata_uri,
              help="Metadata store URI.")
@click.option("--name", help="This instance's name in the auditor election (default: "
                             "host name and pid).")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), help="CA bundle.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Client cert.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="Client key.")
@click.option("--auth-token-file", envvar="PYBK_AUTH_TOKEN_FILE",
              type=click.Path(exists=True, dir_okay=False), help="The bookies' auth token.")
@click.option("--session-timeout", type=click.FloatRange(0, min_open=True), default=None,
              help="Seconds after which a dead instance's election candidacy and locks lapse.")
@click.option("--password-file", "password_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False),
              help="A ledger password to try for ledgers without recovery keys (repeatable).")
@autorecovery_options
@placement_options
@click.pass_context
def autorecovery(ctx: click.Context, metadata: str | None, name: str | None,
                 tls_ca: str | None, tls_cert: str | None, tls_key: str | None,
                 auth_token_file: str | None, session_timeout: float | None,
                 password_files: tuple[str, ...], autorecovery_config: Any,
                 placement: Any) -> None:
    """Run auto-recovery (`pybk autorecovery --metadata URI`) until SIGTERM, or act on it
    cluster-wide: status, enable, disable, trigger, delay.

    An auditor is elected among every running instance (bookies started with
    --autorecovery included); every instance repairs the ledgers the auditor marks."""
    if ctx.invoked_subcommand is not None:
        return
    if not metadata:
        raise click.UsageError("pybk autorecovery needs --metadata URI (or a subcommand)")
    from pybk.cli.common import require_existing_store

    require_existing_store(metadata)
    from dataclasses import replace
    from pathlib import Path

    passwords = tuple(Path(p).read_bytes().rstrip(b"\n") for p in password_files)
    if passwords:
        autorecovery_config = replace(autorecovery_config,
                                      passwords=(*autorecovery_config.passwords, *passwords))
    conn = Conn(metadata, tls_ca, tls_cert, tls_key, auth_token_file, timeout=30.0)
    label = name or f"{socket.gethostname()}:{os.getpid()}"
    logging.basicConfig(level=os.environ.get("PYBK_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve(conn, label, autorecovery_config, session_timeout, placement))
    except (OSError, ValueError) as exc:
        fail(f"{type(exc).__name__}: {exc}")


async def _serve(conn: Conn, name: str, config: Any, session_timeout: float | None,
                 placement: Any) -> None:
    from pybk.client import Client, ClientConfig
    from pybk.metadata import open_store
    from pybk.metadata.uri import session_options
    from pybk.ops import AutoRecovery

    store = open_store(conn.metadata, **session_options(conn.metadata, session_timeout))
    client_config = ClientConfig(placement=placement)
    client = Client(store, tls=conn.ssl_context(), auth_token=conn.token(),
                    config=client_config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    recovery = AutoRecovery(store, client.transport, name=name, config=config,
                            client_config=client_config)
    try:
        await recovery.start()
        print(json.dumps({"event": "ready", "name": name, "pid": os.getpid()}), flush=True)
        await stop.wait()
    finally:
        await recovery.stop()
        await client.close()  # and the transport it made
        await store.close()
    if recovery.failure is not None:
        fail(f"auto-recovery stopped on an unexpected error: {recovery.failure!r}")


@autorecovery.command("status")
@client_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def autorecovery_status(conn: Conn, as_json: bool) -> None:
    """Enabled or not, the elected auditor, the delay, marks and repairs in progress."""

    async def go(client: Any) -> dict[str, Any]:
        status: dict[str, Any] = await client.admin().autorecovery_status()
        return status

    status = run_async(with_client(conn, go))
    if as_json:
        click.echo(json.dumps(status, sort_keys=True))
        return
    click.echo(f"enabled: {'yes' if status['enabled'] else 'no'}")
    click.echo(f"auditor: {status['auditor'] or 'none elected'}")
    delay = status["lost_bookie_recovery_delay"]
    click.echo(f"lost bookie recovery delay: "
               f"{'each auditor its own (default 0 s)' if delay is None else f'{delay:g} s'}")
    click.echo(f"under-replicated ledgers: {status['under_replicated']}")
    for ledger_id, owner in sorted(status["repairing"].items()):
        click.echo(f"repairing ledger {ledger_id}: {owner}")


def _switch(conn: Conn, what: str) -> None:
    async def go(client: Any) -> None:
        admin = client.admin()
        if what == "enable":
            await admin.enable_autorecovery()
        elif what == "disable":
            await admin.disable_autorecovery()
        else:
            click.echo(await admin.trigger_audit())

    run_async(with_client(conn, go))


@autorecovery.command("enable")
@client_options
def autorecovery_enable(conn: Conn) -> None:
    """Let replication workers copy again (cluster-wide)."""
    _switch(conn, "enable")


@autorecovery.command("disable")
@client_options
def autorecovery_disable(conn: Conn) -> None:
    """Stop every replication worker from copying (cluster-wide); the auditor still marks."""
    _switch(conn, "disable")


@autorecovery.command("trigger")
@client_options
def autorecovery_trigger(conn: Conn) -> None:
    """Ask the auditor for an audit now: lost bookies are marked at once (whatever the
    delay) and every ledger's replicas are checked. Prints the request number."""
    _switch(conn, "trigger")


@autorecovery.command("delay")
@client_options
@click.argument("seconds", required=False)
def autorecovery_delay(conn: Conn, seconds: str | None) -> None:
    """Show the lost-bookie recovery delay, or set it cluster-wide (SECONDS, or `none` to
    let each auditor use its own)."""

    async def go(client: Any) -> Any:
        admin = client.admin()
        if seconds is not None:
            await admin.set_lost_bookie_recovery_delay(
                None if seconds == "none" else float(seconds))
        return await admin.settings.lost_bookie_recovery_delay()

    delay = run_async(with_client(conn, go))
    click.echo("none" if delay is None else f"{delay:g}")
