"""A real standalone ZooKeeper server for tests (Debian's ``zookeeper`` package, Java).

:class:`ZooKeeperServer` starts ``ZooKeeperServerMain`` on a free loopback port with a
temporary data directory, waits until the server is *serving* (the ``srvr`` four-letter word
answers ``Zookeeper version:``; ``ruok`` answers earlier, before it serves), and stops it by
PID (SIGTERM, then SIGKILL). ``restart()`` brings it back on the same port and data directory,
so sessions and znodes survive, as they would on a production server restart.

A short ``tickTime`` keeps session timeouts short (ZooKeeper allows 2..20 ticks).
:func:`force_session_expiry` expires a live kazoo session on demand: a second client attaches
to the same session id and password and closes it.

Missing Java or the jar is an error, never a skip: ``make system-deps`` installs them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "DEFAULT_JAR",
    "ZooKeeperServer",
    "ZooKeeperUnavailable",
    "force_session_expiry",
    "four_letter_word",
    "free_port",
]

DEFAULT_JAR = "/usr/share/java/zookeeper.jar"
_JVM_FLAGS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]


class ZooKeeperUnavailable(RuntimeError):
    """Java or the ZooKeeper jar is missing, or the server would not start."""


class _ExitedEarly(Exception):
    """The server process ended before it served (e.g. its port was taken)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def four_letter_word(host: str, port: int, word: str, timeout: float = 1.0) -> str | None:
    """Send a 4lw command; the reply, or None when nothing answers."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None


class ZooKeeperServer:
    """One standalone ZooKeeper process; use as a context manager or start()/stop()."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        tick_time_ms: int = 250,
        jar: str = DEFAULT_JAR,
        java: str | None = None,
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pybk-zk-")
            data_dir = self._tmp.name
        self.dir = Path(data_dir)
        self.port = port or free_port()
        self._may_move = port is None  # an auto-chosen port may be re-picked on a bind race
        self.host = "127.0.0.1"
        self.tick_time_ms = tick_time_ms
        self.jar = jar
        self.java = java or shutil.which("java") or ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    # -- addresses -----------------------------------------------------------------------------

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    def uri(self, root: str = "/pybk") -> str:
        """A ``zk://`` metadata URI for this server."""
        return f"zk://{self.hosts}/{root.strip('/')}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def max_session_timeout(self) -> float:
        return 20 * self.tick_time_ms / 1000

    # -- lifecycle -----------------------------------------------------------------------------

    def _check_prerequisites(self) -> None:
        if not self.java or not os.access(self.java, os.X_OK):
            raise ZooKeeperUnavailable(
                "ZooKeeper tests need Java: no 'java' on PATH. Install Debian's zookeeper "
                "package (make system-deps, or apt-get install zookeeper)."
            )
        if not Path(self.jar).is_file():
            raise ZooKeeperUnavailable(
                f"ZooKeeper tests need {self.jar}: install Debian's zookeeper package "
                "(make system-deps, or apt-get install zookeeper)."
            )

    def _write_config(self) -> Path:
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "zoo.cfg"
        cfg.write_text(
            f"tickTime={self.tick_time_ms}\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={self.host}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat,mntr,envi,cons\n"
            "maxClientCnxns=0\n"
            "minSessionTimeout=" + str(2 * self.tick_time_ms) + "\n"
            "maxSessionTimeout=" + str(20 * self.tick_time_ms) + "\n"
        )
        return cfg

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and return once it serves requests (ZooKeeperUnavailable if not
        within ``timeout`` seconds, with the server's output in the message).

        The first start on an auto-chosen port retries on another free port if the server
        exits early (another process took the port between choosing and binding)."""
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"ZooKeeper on port {self.port} is already running")
        self._check_prerequisites()
        attempts = 3 if self._may_move else 1
        for attempt in range(attempts):
            try:
                self._start_once(timeout)
                break
            except _ExitedEarly as exc:
                if attempt + 1 == attempts:
                    raise ZooKeeperUnavailable(str(exc)) from None
                self.port = free_port()
        self._may_move = False  # restarts keep the port clients know

    def _start_once(self, timeout: float) -> None:
        cfg = self._write_config()
        self._log = open(self.dir / "zk.out", "ab")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [self.java, *_JVM_FLAGS, "-cp", self.jar,
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while True:
            reply = four_letter_word(self.host, self.port, "srvr")
            if reply is not None and reply.startswith("Zookeeper version:"):
                return
            if self._proc.poll() is not None:
                output = (self.dir / "zk.out").read_text(errors="replace")[-2000:]
                status = self._proc.returncode
                self._proc = None
                if self._log is not None:
                    self._log.close()
                    self._log = None
                raise _ExitedEarly(
                    f"ZooKeeper exited with status {status} before serving on port "
                    f"{self.port}:\n{output}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ZooKeeperUnavailable(
                    f"ZooKeeper on port {self.port} did not serve within {timeout}s"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop by PID: SIGTERM, then SIGKILL after ``timeout`` seconds. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL now (a crashed server); data on disk is whatever ZooKeeper synced."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self.stop()

    def restart(self, timeout: float = 60.0) -> None:
        """Stop and start again on the same port and data directory."""
        self.stop()
        self.start(timeout)

    def close(self) -> None:
        """Stop and remove the temporary data directory (if this object made it)."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def force_session_expiry(hosts: str, client_id: tuple[int, bytes], timeout: float = 10.0) -> None:
    """Expire a live ZooKeeper session now: attach a second client to the same session id and
    password, then close it. The original client sees ``KazooState.LOST`` and its ephemeral
    nodes are deleted. Blocking (call it via ``asyncio.to_thread`` from async code)."""
    from kazoo.client import KazooClient

    twin = KazooClient(hosts=hosts, client_id=client_id)
    twin.start(timeout=timeout)
    twin.stop()
    twin.close()
