"""A cluster of ``pybk bookie`` processes under one directory: what ``pybk cluster up``
starts, and a :class:`pybk.clusters.Cluster` for synchronous code and tests.

Bookies run as detached processes on free loopback ports, with SQLite metadata at
``root/metadata.db``; their PIDs, data directories and addresses are recorded in
``root/cluster.json`` so another process (``pybk cluster down``) can stop them, by PID and
only after checking that the PID is still that bookie.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pybk.errors import LockedError
from pybk.runtime.dirlock import DirectoryLock
from pybk.server.processes import (
    is_our_bookie,
    is_our_table_server,
    pid_alive,
    spawn_bookie,
    spawn_table_server,
    stop_pid,
    wait_file,
    wait_ready,
)

__all__ = ["STATE_FILE", "ProcessCluster", "load_state", "running_bookies", "stop_recorded"]

STATE_FILE = "cluster.json"


def load_state(root: Path) -> dict[str, Any]:
    """What ``root/cluster.json`` records ({} when nothing is)."""
    path = root / STATE_FILE
    if not path.exists():
        return {}
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def running_bookies(root: Path) -> list[str]:
    """The recorded bookies whose processes still run."""
    return [b for b, info in load_state(root).get("bookies", {}).items()
            if pid_alive(info["pid"]) and is_our_bookie(info["pid"], b)]


def stop_recorded(root: Path, timeout: float,
                  report: Callable[[str], None] = lambda _line: None) -> None:
    """Stop every bookie recorded under ``root`` (SIGTERM, SIGKILL after ``timeout``) and
    forget them; ``report`` gets one line per bookie (and the table server, stopped first:
    it writes to the bookies)."""
    tables = load_state(root).get("tables")
    if tables is not None:
        pid = int(tables["pid"])
        if pid_alive(pid) and is_our_table_server(pid):
            report(f"table server (pid {pid}): {stop_pid(pid, timeout)}")
    for bookie_id, info in sorted(load_state(root).get("bookies", {}).items()):
        pid = int(info["pid"])
        if not pid_alive(pid) or not is_our_bookie(pid, bookie_id):
            report(f"{bookie_id} (pid {pid}): not running")
            continue
        report(f"{bookie_id} (pid {pid}): {stop_pid(pid, timeout)}")
    (root / STATE_FILE).unlink(missing_ok=True)


class ProcessCluster:
    """``bookies`` ``pybk bookie`` processes under ``root`` (see the module doc).

    ``with ProcessCluster(root) as cluster:`` starts them and waits until each is ready;
    ``extra_args`` go to every ``pybk bookie`` (TLS, tokens, limits). ``tables_port`` not None
    also starts ``pybk table serve`` on that port (0: a free one) with ``tables_args``.
    ``metadata``: the store's URI (default: SQLite in ``root/metadata.db``), e.g. an
    ``etcd://`` or ``zk://`` one; ValueError when malformed or not shareable."""

    def __init__(self, root: str | os.PathLike[str], bookies: int | Sequence[str] = 3, *,
                 extra_args: Sequence[str] = (), ready_timeout: float = 60.0,
                 stop_timeout: float = 15.0, tables_port: int | None = None,
                 tables_args: Sequence[str] = (), metadata: str | None = None) -> None:
        self.root = Path(root).resolve()
        ids = ([f"bookie-{i}" for i in range(1, bookies + 1)] if isinstance(bookies, int)
               else list(bookies))
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"bookies must name at least one bookie, each once: {bookies!r}")
        for bookie_id in ids:
            if not bookie_id or "/" in bookie_id or bookie_id.startswith("."):
                raise ValueError(f"bad bookie id {bookie_id!r}: a file name, no '/'")
        self._ids = ids
        self.extra_args = list(extra_args)
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        if metadata is None:
            metadata = f"sqlite://{self.root / 'metadata.db'}"
        else:
            from pybk.metadata.registry import parse_uri

            scheme, _rest = parse_uri(metadata)
            if not scheme.shared:
                raise ValueError(f"metadata {metadata!r}: bookie processes cannot share a "
                                 f"{scheme.name}:// store (use sqlite://, zk:// or etcd://)")
        self.metadata = metadata
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._state: dict[str, Any] = {"metadata": self.metadata, "bookies": {}}
        self._clients: list[Any] = []
        self.tables_port = tables_port
        self.tables_args = list(tables_args)
        self._tables: subprocess.Popen[bytes] | None = None
        #: where the table server listens (``host:port``), once started
        self.tables_address: str | None = None

    @property
    def bookie_ids(self) -> list[str]:
        return list(self._ids)

    def address(self, bookie_id: str) -> str:
        """Where a started bookie listens (``host:port``)."""
        return str(self._state["bookies"][bookie_id]["address"])

    def pid(self, bookie_id: str) -> int:
        return int(self._state["bookies"][bookie_id]["pid"])

    def bookie_dir(self, bookie_id: str) -> Path:
        return self.root / "bookies" / bookie_id

    def _save(self) -> None:
        (self.root / STATE_FILE).write_text(json.dumps(self._state, indent=2) + "\n")

    def start(self, on_ready: Callable[[str, dict[str, Any]], None] | None = None,
              ) -> ProcessCluster:
        """Start every bookie and wait until each is ready (RuntimeError, with the log's
        tail, if one dies or is not ready in ``ready_timeout``; the others are stopped)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        # one start at a time under a root: from the check that nothing runs there until
        # every bookie is recorded (two starts at once both used to pass the check, and the
        # second's state file hid the first's bookies from `pybk cluster down`)
        lock = DirectoryLock(self.root, "cluster root")
        try:
            lock.acquire()
        except LockedError as exc:
            raise RuntimeError(f"another cluster is starting under {self.root}: {exc}") from None
        try:
            alive = running_bookies(self.root)
            if alive:
                raise RuntimeError(f"a cluster is already running under {self.root} "
                                   f"({', '.join(alive)})")
            for bookie_id in self._ids:
                self._spawn(bookie_id)
            self._save()
            try:
                for bookie_id in self._ids:
                    info = self._wait(bookie_id)
                    if on_ready is not None:
                        on_ready(bookie_id, info)
                if self.tables_port is not None:
                    self._start_tables(on_ready)
            except RuntimeError:
                self.close()
                raise
            self._save()
        finally:
            lock.release()
        return self

    def _start_tables(self, on_ready: Callable[[str, dict[str, Any]], None] | None) -> None:
        proc = spawn_table_server(self.root, self.metadata, port=self.tables_port or 0,
                                  extra_args=self.tables_args)
        self._tables = proc
        self._state["tables"] = {"pid": proc.pid}
        self._save()
        info = wait_file(self.root / "run" / "tables.ready", proc,
                         self.root / "logs" / "tables.log", self.ready_timeout, "table server")
        self.tables_address = f"{info['host']}:{info['port']}"
        self._state["tables"]["address"] = self.tables_address
        if on_ready is not None:
            on_ready("tables", {"address": self.tables_address, "pid": proc.pid})

    def _spawn(self, bookie_id: str) -> None:
        proc = spawn_bookie(self.root, bookie_id, self.metadata, extra_args=self.extra_args)
        self._procs[bookie_id] = proc
        self._state["bookies"][bookie_id] = {"pid": proc.pid,
                                             "data": str(self.bookie_dir(bookie_id))}

    def _wait(self, bookie_id: str) -> dict[str, Any]:
        info = wait_ready(self.root, bookie_id, self._procs[bookie_id], self.ready_timeout)
        self._state["bookies"][bookie_id]["address"] = info["address"]
        return info

    def client(self, **kwargs: Any) -> Any:
        """A synchronous client of these bookies (:class:`pybk.sync.Client`; closed with the
        cluster). ``kwargs``: :class:`pybk.Client`'s (e.g. ``auth_token=``, ``tls=``)."""
        from pybk.sync.client import Client

        client = Client(self.metadata, **kwargs)
        self._clients.append(client)
        return client

    def stop_bookie(self, bookie_id: str) -> None:
        """SIGKILL one bookie and reap it; its registration lapses with its lease."""
        proc = self._procs.pop(bookie_id, None)
        if proc is None:
            raise ValueError(f"bookie {bookie_id!r} is not running in this cluster")
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=self.stop_timeout)

    def start_bookie(self, bookie_id: str) -> None:
        """Start a stopped bookie again on its data and wait until it is ready."""
        if bookie_id not in self._ids:
            raise ValueError(f"no bookie {bookie_id!r} in this cluster")
        if bookie_id in self._procs and self._procs[bookie_id].poll() is None:
            raise ValueError(f"bookie {bookie_id!r} is running")
        self._spawn(bookie_id)
        self._wait(bookie_id)
        self._save()

    def close(self) -> None:
        """Close the clients handed out, stop every bookie (SIGTERM, then SIGKILL after
        ``stop_timeout``) and forget them. Idempotent."""
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self._tables is not None:  # (first: it writes to the bookies)
            if self._tables.poll() is None:
                stop_pid(self._tables.pid, self.stop_timeout)
            self._tables.wait()
            self._tables = None
        for proc in self._procs.values():
            if proc.poll() is None:
                stop_pid(proc.pid, self.stop_timeout)
            proc.wait()
        self._procs.clear()
        (self.root / STATE_FILE).unlink(missing_ok=True)

    def __enter__(self) -> ProcessCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ProcessCluster {self.root} {len(self._procs)}/{len(self._ids)} running>"
