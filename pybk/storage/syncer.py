"""A helper process that runs ``fdatasync`` for us, so a sync overlaps the event loop's work.

Why a process and not a thread: under CPython's GIL a sync thread has to take the GIL to
start its ``fdatasync`` and again to report back. While the event loop is busy (answering the
last batch, taking new requests) that wait lasts until the loop thread is forced to let go
(the switch interval): measured with 256 writers, about 0.2 ms between handing a sync to the
thread and the ``fdatasync`` starting, as long as the sync itself. The journal could then not
overlap a batch's sync with the previous batch's completion, and synced inline instead
(``pybk bookie``). A separate process has its own interpreter: the loop sends a few bytes on a
socket and goes on; the helper syncs at once on the other CPU and answers on the socket,
which the loop reads like any other I/O.

Correctness: the helper receives a duplicate of the journal's own descriptor (SCM_RIGHTS), so
it syncs the very same open file (Linux reports a writeback error to each open file once;
a shared open file description shares that report). Answers come back in request order. If the
helper dies, every unanswered sync fails with EIO and so does every later one: the caller
cannot know whether its data reached the disk, which for the journal is fatal, as any failed
fsync is.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import socket
import struct
import subprocess
import sys

log = logging.getLogger(__name__)

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sync_child.py")
_KEY = struct.Struct(">I")
_ANSWER = struct.Struct(">Ii")


class SyncProcess:
    """One helper process serving ``fdatasync`` requests in order. Not thread-safe: use it
    from one event loop (it may move to a new loop once the old one is closed)."""

    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-I", "-S", _CHILD, str(child.fileno())],
                pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, close_fds=True)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self._sock: socket.socket | None = parent
        self._loop: asyncio.AbstractEventLoop | None = None
        #: (key, path, future) of the syncs sent and not yet answered, in request order
        self._waiting: collections.deque[tuple[int, str, asyncio.Future[None]]] = (
            collections.deque())
        self._next_key = 1
        #: why the helper can no longer be used (None while it serves)
        self.failed: OSError | None = None
        self.stats = {"syncs": 0}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def register(self, fd: int) -> int:
        """Hand the helper a duplicate of ``fd``; returns the key to sync it by. Never raises:
        if the helper is gone, syncs of the key fail instead."""
        key = self._next_key
        self._next_key += 1
        self._send(b"O" + _KEY.pack(key), [fd])
        return key

    def unregister(self, key: int) -> None:
        """The helper closes its copy (syncs sent before are answered first)."""
        self._send(b"C" + _KEY.pack(key))

    def sync(self, key: int, path: str) -> asyncio.Future[None]:
        """Start an ``fdatasync`` of ``key`` now; the future resolves when it is done, or
        fails with the ``OSError`` it raised (EIO if the helper is gone)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if self._loop is not loop:
            self._attach(loop)
        if self._send(b"S" + _KEY.pack(key)):
            self._waiting.append((key, path, fut))
            self.stats["syncs"] += 1
        else:
            assert self.failed is not None
            fut.set_exception(OSError(errno.EIO, f"fdatasync of {path} not done: {self.failed}"))
        return fut

    def close(self) -> None:
        """Stop the helper (it exits when its socket closes) and wait for it, bounded."""
        self._fail(OSError(errno.EIO, "sync process closed"))
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- internals --------------------------------------------------------------------------

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        sock = self._sock
        if sock is None:
            self._loop = loop
            return
        # unanswered syncs of a loop that still runs: their answers would go to the wrong loop
        if any(not fut.done() and not fut.get_loop().is_closed() for _k, _p, fut in self._waiting):
            raise RuntimeError("SyncProcess used from two running event loops")
        old = self._loop
        if old is not None and not old.is_closed():
            old.remove_reader(sock.fileno())
        self._loop = loop
        loop.add_reader(sock.fileno(), self._on_readable)

    def _send(self, msg: bytes, fds: list[int] | None = None) -> bool:
        sock = self._sock
        if sock is None:
            return False
        try:
            if fds:
                socket.send_fds(sock, [msg], fds)
            else:
                sock.send(msg)
        except OSError as exc:
            self._fail(OSError(errno.EIO, f"sync process {self.pid} is gone ({exc})"))
            return False
        return True

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while True:
            try:
                msg = sock.recv(_ANSWER.size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                self._fail(OSError(errno.EIO, f"sync process {self.pid} is gone ({exc})"))
                return
            if not msg:
                self._fail(OSError(errno.EIO, f"sync process {self.pid} exited "
                                              f"(status {self._status()})"))
                return
            key, code = _ANSWER.unpack(msg)
            if not self._waiting or self._waiting[0][0] != key:
                self._fail(OSError(errno.EIO, f"sync process {self.pid} answered out of "
                                              f"order (key {key})"))
                return
            _key, path, fut = self._waiting.popleft()
            if fut.done():
                if not self._waiting:
                    return
                continue
            if code:
                fut.set_exception(OSError(code, f"fdatasync of {path}: {os.strerror(code)}"))
            else:
                fut.set_result(None)
            if not self._waiting:
                return  # nothing else expected: skip the read that would only say EAGAIN
                # (anything unexpected still on the socket wakes us again and is refused)

    def _status(self) -> str:
        proc = self._proc
        if proc is None:
            return "unknown"
        try:
            code = proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return "still running"
        return str(code)

    def _fail(self, exc: OSError) -> None:
        """The helper is unusable: fail every unanswered sync, close our end."""
        if self.failed is None:
            self.failed = exc
        sock, self._sock = self._sock, None
        if sock is not None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.remove_reader(sock.fileno())
            sock.close()
        waiting, self._waiting = self._waiting, collections.deque()
        for _key, path, fut in waiting:
            if not fut.done() and not fut.get_loop().is_closed():
                fut.set_exception(OSError(exc.errno, f"fdatasync of {path} not confirmed: "
                                                     f"{exc.strerror}"))


def start_sync_process() -> SyncProcess | None:
    """A new helper, or None (logged) if this system cannot start one: callers then keep
    their syncs on a thread. Also None in a frozen application (``sys.frozen``: its
    ``sys.executable`` is the application itself, not an interpreter that can run the helper's
    script) or where Python does not know its own executable."""
    if getattr(sys, "frozen", False) or not sys.executable:
        log.warning("no interpreter to run the sync process (frozen application or unknown "
                    "sys.executable); syncs stay on a thread")
        return None
    try:
        return SyncProcess()
    except OSError as exc:
        log.warning("cannot start the sync process (%s); syncs stay on a thread", exc)
        return None


__all__ = ["SyncProcess", "start_sync_process"]
