"""``pybk cluster up|down``: a local cluster of bookie processes under one directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pybk.cli.common import check_metadata_uri, fail, stderr_console
from pybk.server.cluster import (
    STATE_FILE,
    ProcessCluster,
    load_state,
    running_bookies,
    stop_recorded,
)

__all__ = ["cluster"]

@click.group()
def cluster() -> None:
    """Start or stop a local cluster of bookie processes."""


@cluster.command("up")
@click.option("--root", required=True, type=click.Path(file_okay=False), help="Cluster dir.")
@click.option("--bookies", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--ready-timeout", type=float, default=60.0, show_default=True)
@click.option("--auth-token-file", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="For every bookie.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False))
@click.option("--require-client-cert", is_flag=True, help="Mutual TLS.")
@click.option("--tables", is_flag=True,
              help="Also start a table server (BookKeeper's table-service gRPC; pybk[tables]).")
@click.option("--tables-port", type=click.IntRange(0, 65535), default=4181, show_default=True,
              help="The table server's port (0: any free one).")
@click.option("--metadata", callback=check_metadata_uri, default=None,
              help="The metadata store's URI (etcd://, zk://, sqlite:///; default: SQLite "
                   "in ROOT/metadata.db).")
def cluster_up(
    root: str,
    bookies: int,
    ready_timeout: float,
    auth_token_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    require_client_cert: bool,
    tables: bool,
    tables_port: int,
    metadata: str | None,
) -> None:
    """Start BOOKIES bookie processes on free loopback ports with SQLite metadata under ROOT
    (or in the store --metadata names).

    Prints the metadata URI on stdout (use it as --metadata); PIDs go to ROOT/cluster.json.
    """
    extra: list[str] = []
    for flag, value in (
        ("--auth-token-file", auth_token_file),
        ("--tls-cert", tls_cert),
        ("--tls-key", tls_key),
        ("--tls-ca", tls_ca),
    ):
        if value:
            extra += [flag, str(Path(value).resolve())]
    if require_client_cert:
        extra.append("--require-client-cert")
    console = stderr_console()
    tls = (["--tls-cert", str(Path(tls_cert).resolve()), "--tls-key", str(Path(tls_key).resolve())]
           if tls_cert and tls_key else [])
    try:
        procs = ProcessCluster(root, bookies, extra_args=extra, ready_timeout=ready_timeout,
                               tables_port=tables_port if tables else None, tables_args=tls,
                               metadata=metadata)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--metadata") from None

    def ready(name: str, info: dict[str, Any]) -> None:
        if name == "tables":
            console.print(f"table server ready at bk://{info['address']} (pid {info['pid']})")
        else:
            console.print(f"{name} ready at {info['address']} (pid {info['pid']})")

    alive = running_bookies(procs.root)
    if alive:
        fail(f"a cluster is already running under {procs.root} ({', '.join(alive)}); "
             f"run `pybk cluster down --root {root}` first")
    try:
        with console.status(f"waiting for {bookies} bookies to register"):
            procs.start(on_ready=ready)
    except RuntimeError as exc:
        fail(str(exc))
    console.print(f"cluster up; stop it with: pybk cluster down --root {root}")
    click.echo(procs.metadata)


@cluster.command("down")
@click.option("--root", required=True, type=click.Path(file_okay=False), help="Cluster dir.")
@click.option("--timeout", type=float, default=15.0, show_default=True, help="Before SIGKILL.")
def cluster_down(root: str, timeout: float) -> None:
    """Stop the bookies recorded under ROOT (SIGTERM, then SIGKILL after --timeout)."""
    root_path = Path(root).resolve()
    if not load_state(root_path):
        fail(f"no cluster recorded under {root_path} (no {STATE_FILE})")
    stop_recorded(root_path, timeout, report=lambda line: click.echo(line, err=True))
