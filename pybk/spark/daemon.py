"""PySpark's worker daemon, quiet when Spark stops reading a worker early.

When a job needs only part of a Python worker's output (``df.show(5)``, ``limit``, a task
cancelled, the session stopped), the JVM closes the worker's socket while the worker still
writes; PySpark's daemon then prints the worker's ``BrokenPipeError`` traceback on stderr,
although nothing failed. This daemon is PySpark's own with one change: a worker whose socket
the JVM closed ends quietly (and is not reused). ``local_session`` selects it
(``spark.python.daemon.module``); every other error is reported as PySpark reports it.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from typing import Any

from pyspark import daemon

__all__ = ["worker"]

_pyspark_worker = daemon.worker


def worker(sock: socket.socket, authenticated: bool) -> int:
    """PySpark's ``daemon.worker``; a socket closed by the JVM ends the worker with status 1
    (not reused), without a traceback: neither the worker's own nor the one its buffered
    socket file prints when it is freed unflushed (CPython 3.13 reports that one)."""
    sys.unraisablehook = _quiet_closed_socket(sys.unraisablehook)
    try:
        return int(_pyspark_worker(sock, authenticated))
    except (BrokenPipeError, ConnectionResetError):
        return 1


def _quiet_closed_socket(previous: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """An unraisable-exception hook that drops a closed socket's errors, passing on others."""
    if getattr(previous, "pybk_quiet", False):
        return previous

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, BrokenPipeError | ConnectionResetError):
            previous(unraisable)

    hook.pybk_quiet = True  # type: ignore[attr-defined]
    return hook


daemon.worker = worker

if __name__ == "__main__":
    daemon.manager()
