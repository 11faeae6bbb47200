"""The sync process's main loop (see :mod:`pybk.storage.syncer`). Standard library only: it
runs as ``python -I -S _sync_child.py <socket fd>``, without importing pybk, so it starts in
a few milliseconds.

Requests arrive on a SOCK_SEQPACKET socket, one per message, and are served in order:

* ``b"O" + key`` with one descriptor attached (SCM_RIGHTS): remember it under ``key``;
* ``b"S" + key``: ``fdatasync`` it, then answer ``key + errno`` (0: done);
* ``b"C" + key``: close it (no answer).

``key`` is a big-endian u32, ``errno`` a big-endian i32. The process exits when the socket
closes (its parent went away or closed it).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys

__all__ = [
    "serve",
]

_KEY = struct.Struct(">I")
_ANSWER = struct.Struct(">Ii")


def serve(sock: socket.socket) -> None:
    fds: dict[int, int] = {}
    while True:
        try:
            msg, passed, _flags, _addr = socket.recv_fds(sock, 16, 4)
        except (ConnectionError, OSError):
            return
        if not msg:
            return
        op, key = msg[:1], _KEY.unpack_from(msg, 1)[0]
        if op == b"O":
            old = fds.pop(key, None)
            if old is not None:
                os.close(old)
            if passed:
                fds[key] = passed[0]
            for extra in passed[1:]:
                os.close(extra)
        elif op == b"S":
            fd = fds.get(key)
            if fd is None:
                code = errno.EBADF
            else:
                try:
                    os.fdatasync(fd)
                    code = 0
                except OSError as exc:
                    code = exc.errno or errno.EIO
            try:
                sock.send(_ANSWER.pack(key, code))
            except OSError:
                return
        elif op == b"C":
            fd = fds.pop(key, None)
            if fd is not None:
                os.close(fd)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
