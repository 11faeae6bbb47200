"""Listening sockets and the accept loop of a bookie's server, and the open-file budget.

Why not ``loop.create_server``: there, a TLS connection reaches the server's code only once
its handshake is done, so handshakes escape the connection caps; and when ``accept()`` fails
for want of descriptors (EMFILE), asyncio logs a traceback per attempt. Here every accepted
socket is handed to ``on_accept`` at once (the server judges it before any handshake) and a
descriptor shortage pauses accepting for a moment and is reported through ``on_error``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import socket
from collections.abc import Callable
from typing import Final

__all__ = [
    "Listener",
    "bind_sockets",
    "open_descriptors",
    "open_file_limit",
    "raise_open_file_limit",
    "set_keepalive",
]

#: errors of accept() that mean "no descriptors or memory now": pause, then retry
_SHORTAGE: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: errors of accept() about the one connection (it died in the queue): go on with the next
_GONE: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.ECONNRESET, errno.EPERM})
#: connections accepted per readiness callback, so one busy port cannot starve the loop
ACCEPT_BATCH: Final = 64


async def bind_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening, non-blocking sockets for ``host:port`` (every address ``host`` resolves
    to; with port 0 only the first, so the bookie has one port)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, family=socket.AF_UNSPEC,
                                   type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if port == 0:
        infos = infos[:1]
    sockets: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _name, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {address}: {exc.strerror}") from None
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(f"{host!r} resolves to no address to listen on")
    return sockets


def set_keepalive(sock: socket.socket, idle: float) -> None:
    """TCP keepalive: first probe after ``idle`` seconds of silence, then every idle/4 s,
    the peer declared gone after 4 unanswered probes (0: off). Also TCP_NODELAY."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if idle <= 0:
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        seconds = max(1, int(idle))
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, seconds // 4))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 4)
    except OSError:  # the peer is already gone: the transport will find out
        pass


class Listener:
    """Accepts on ``sockets`` and hands each ``(socket, peer address)`` to ``on_accept``.

    On a descriptor shortage it stops accepting for ``retry_delay`` seconds (the pending
    connections wait in the kernel's queue) and calls ``on_error(exc)`` once per pause."""

    def __init__(
        self,
        sockets: list[socket.socket],
        on_accept: Callable[[socket.socket, str], None],
        on_error: Callable[[OSError], None],
        retry_delay: float = 0.1,
        batch: int = ACCEPT_BATCH,
    ) -> None:
        self.sockets = sockets
        #: connections accepted per readiness callback
        self.batch = max(1, batch)
        self.on_accept = on_accept
        self.on_error = on_error
        self.retry_delay = retry_delay
        self.loop = asyncio.get_running_loop()
        self._reading = False
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False

    def start(self) -> None:
        if self._reading or self._closed:
            return
        for sock in self.sockets:
            self.loop.add_reader(sock.fileno(), self._ready, sock)
        self._reading = True

    def _pause(self) -> None:
        if self._reading:
            for sock in self.sockets:
                self.loop.remove_reader(sock.fileno())
            self._reading = False

    def _resume(self) -> None:
        self._retry = None
        self.start()

    def _ready(self, sock: socket.socket) -> None:
        for _ in range(self.batch):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _GONE:
                    continue
                if exc.errno in _SHORTAGE:
                    self._pause()
                    if self._retry is None and not self._closed:
                        self._retry = self.loop.call_later(self.retry_delay, self._resume)
                    self.on_error(exc)
                    return
                raise
            conn.setblocking(False)
            peer = address[0] if isinstance(address, tuple) and address else str(address)
            self.on_accept(conn, str(peer))

    def close(self) -> None:
        """Stop accepting and close the listening sockets."""
        self._closed = True
        self._pause()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for sock in self.sockets:
            sock.close()


def open_file_limit() -> int:
    """This process's soft RLIMIT_NOFILE."""
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one (as far as the kernel allows);
    returns (before, after). Why: a server's connections are descriptors, and the usual
    soft limit (1024) is far below what the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:
        target = _nr_open()
    if target <= soft and soft != resource.RLIM_INFINITY:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def open_descriptors() -> int | None:
    """How many descriptors this process has open; None if it cannot tell now (no such
    directory, or no descriptor left to list it with)."""
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(directory)) - 1)  # (listdir's own descriptor)
        except OSError:
            continue
    return None
