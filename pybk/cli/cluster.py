"""``pybk cluster up|down``: a local cluster of bookie processes under one directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import click

from pybk.cli.common import fail, stderr_console
from pybk.cli.processes import (
    is_our_bookie,
    is_our_table_server,
    pid_alive,
    spawn_bookie,
    spawn_table_server,
    stop_pid,
    wait_file,
    wait_ready,
)

__all__ = ["cluster"]

_STATE_FILE = "cluster.json"


def _load_state(root: Path) -> dict[str, Any]:
    path = root / _STATE_FILE
    if not path.exists():
        return {}
    state: dict[str, Any] = json.loads(path.read_text())
    return state


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
) -> None:
    """Start BOOKIES bookie processes on free loopback ports with SQLite metadata under ROOT.

    Prints the metadata URI on stdout (use it as --metadata); PIDs go to ROOT/cluster.json.
    """
    root_path = Path(root).resolve()
    root_path.mkdir(parents=True, exist_ok=True)
    previous = _load_state(root_path)
    alive = [
        b for b, info in previous.get("bookies", {}).items()
        if pid_alive(info["pid"]) and is_our_bookie(info["pid"], b)
    ]  # fmt: skip
    if alive:
        fail(f"a cluster is already running under {root_path} ({', '.join(alive)}); "
              f"run `pybk cluster down --root {root}` first")  # fmt: skip
    metadata = f"sqlite://{root_path / 'metadata.db'}"
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
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ids = [f"bookie-{i}" for i in range(1, bookies + 1)]
    for bookie_id in ids:
        procs[bookie_id] = spawn_bookie(root_path, bookie_id, metadata, extra_args=extra)
    state: dict[str, Any] = {"metadata": metadata, "bookies": {}}
    for b, p in procs.items():
        state["bookies"][b] = {"pid": p.pid, "data": str(root_path / "bookies" / b)}
    (root_path / _STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    try:
        with console.status(f"waiting for {bookies} bookies to register"):
            for bookie_id in ids:
                info = wait_ready(root_path, bookie_id, procs[bookie_id], ready_timeout)
                state["bookies"][bookie_id]["address"] = info["address"]
                console.print(f"{bookie_id} ready at {info['address']} (pid {info['pid']})")
    except RuntimeError as exc:
        for p in procs.values():
            if p.poll() is None:
                stop_pid(p.pid, 5.0)
        fail(str(exc))
    if tables:
        tls = []
        if tls_cert and tls_key:
            tls = ["--tls-cert", str(Path(tls_cert).resolve()),
                   "--tls-key", str(Path(tls_key).resolve())]
        proc = spawn_table_server(root_path, metadata, port=tables_port, extra_args=tls)
        state["tables"] = {"pid": proc.pid}
        (root_path / _STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        try:
            info = wait_file(root_path / "run" / "tables.ready", proc,
                             root_path / "logs" / "tables.log", ready_timeout)
        except RuntimeError as exc:
            for p in [*procs.values(), proc]:
                if p.poll() is None:
                    stop_pid(p.pid, 5.0)
            fail(str(exc))
        state["tables"]["address"] = f"{info['host']}:{info['port']}"
        console.print(f"table server ready at bk://{info['host']}:{info['port']} "
                      f"(pid {proc.pid})")
    (root_path / _STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    console.print(f"cluster up; stop it with: pybk cluster down --root {root}")
    click.echo(metadata)


@cluster.command("down")
@click.option("--root", required=True, type=click.Path(file_okay=False), help="Cluster dir.")
@click.option("--timeout", type=float, default=15.0, show_default=True, help="Before SIGKILL.")
def cluster_down(root: str, timeout: float) -> None:
    """Stop the bookies recorded under ROOT (SIGTERM, then SIGKILL after --timeout)."""
    root_path = Path(root).resolve()
    state = _load_state(root_path)
    if not state:
        fail(f"no cluster recorded under {root_path} (no {_STATE_FILE})")
    if "tables" in state:  # first: it writes to the bookies
        pid = int(state["tables"]["pid"])
        if pid_alive(pid) and is_our_table_server(pid):
            click.echo(f"table server (pid {pid}): {stop_pid(pid, timeout)}", err=True)
    for bookie_id, info in sorted(state.get("bookies", {}).items()):
        pid = int(info["pid"])
        if not pid_alive(pid) or not is_our_bookie(pid, bookie_id):
            click.echo(f"{bookie_id} (pid {pid}): not running", err=True)
            continue
        click.echo(f"{bookie_id} (pid {pid}): {stop_pid(pid, timeout)}", err=True)
    (root_path / _STATE_FILE).unlink()


