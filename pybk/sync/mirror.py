"""A log mirror for synchronous code: ``pybk.sync.LogMirror(from_uri, to_uri, "orders")``.

Both clusters' clients and the mirror (:class:`pybk.ops.mirror.MirrorService`) live on one
:class:`pybk.sync.runner.LoopThread`: ``start()`` runs the mirror there in the background,
``drain()`` copies up to the source's last record and returns, ``stop()`` and ``close()``
end it. Each cluster has its own TLS and token, as ``pybk log mirror --from-tls-ca ...
--to-auth-token-file ...`` has: files (``from_tls_ca``, ``from_tls_cert``, ``from_tls_key``,
``from_auth_token_file``; ``to_...``) or what :class:`pybk.Client` takes (``from_tls``, an
``ssl.SSLContext``; ``from_auth_token``, bytes; ``to_...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from pathlib import Path
from typing import Any

from pybk.client.client import Client as AsyncClient
from pybk.logs.mirror import MirrorStats, open_target
from pybk.logs.position import Position
from pybk.ops.mirror import MirrorService
from pybk.sync.runner import LoopThread
from pybk.transport.tls import client_context

__all__ = ["LogMirror"]

#: a file's path
PathArg = str | os.PathLike[str]


def _side_credentials(side: str, tls: ssl.SSLContext | None, auth_token: bytes | None,
                     tls_ca: PathArg | None, tls_cert: PathArg | None, tls_key: PathArg | None,
                     auth_token_file: PathArg | None,
                     ) -> tuple[ssl.SSLContext | None, bytes | None]:
    """One side's (``"from"`` or ``"to"``) TLS context and token, from either form: the
    context made as ``pybk log mirror`` makes it (``client_context(ca, certfile=...,
    keyfile=...)``), the token file's bytes stripped. Bad combinations are ValueErrors
    naming the option; an unreadable file is the OSError (or ssl.SSLError) it raises."""
    if tls is not None and not isinstance(tls, ssl.SSLContext):
        raise TypeError(f"{side}_tls must be an ssl.SSLContext, not {type(tls).__name__}")
    if auth_token is not None and not isinstance(auth_token, bytes):
        raise TypeError(f"{side}_auth_token must be bytes, not {type(auth_token).__name__}")
    if tls is not None and (tls_ca or tls_cert or tls_key):
        raise ValueError(f"give {side}_tls or {side}_tls_ca/{side}_tls_cert/{side}_tls_key, "
                         "not both")
    if auth_token is not None and auth_token_file is not None:
        raise ValueError(f"give {side}_auth_token or {side}_auth_token_file, not both")
    if tls_key is not None and tls_cert is None:
        raise ValueError(f"{side}_tls_key without {side}_tls_cert")
    if tls_ca or tls_cert:
        tls = client_context(tls_ca, certfile=tls_cert, keyfile=tls_key)
    if auth_token_file is not None:
        auth_token = Path(auth_token_file).read_bytes().strip()
        if not auth_token:
            raise ValueError(f"{side}_auth_token_file {auth_token_file} is empty")
    if auth_token is not None and not auth_token:
        raise ValueError(f"{side}_auth_token is empty")
    return tls, auth_token



class LogMirror:
    """Mirrors log ``name`` of the cluster of ``source`` (a metadata URI) into the cluster of
    ``target`` (into ``target_name``, default the same name; created with the source's
    configuration when missing). ``mirror_options`` go to MirrorService (``batch_records=``,
    ``window=``, ``lag_interval=``, ``min_backoff=``, ...).

    Each side's bookies are reached with that side's credentials (the source's with the
    ``from_`` ones, the target's with the ``to_`` ones), as ``pybk log mirror`` takes them:
    ``*_tls_ca`` (the CA of its bookies' certificates), ``*_tls_cert`` and ``*_tls_key`` (a
    client certificate, for bookies that want one), ``*_auth_token_file`` (a file holding its
    token); or as :class:`pybk.Client` takes them: ``*_tls`` (an ``ssl.SSLContext``) and
    ``*_auth_token`` (bytes). A side given both forms of one is a ValueError."""

    def __init__(self, source: str, target: str, name: str, *, namespace: str = "default",
                 target_namespace: str | None = None, target_name: str | None = None,
                 loop: str | None = None,
                 from_tls: ssl.SSLContext | None = None, from_auth_token: bytes | None = None,
                 from_tls_ca: PathArg | None = None, from_tls_cert: PathArg | None = None,
                 from_tls_key: PathArg | None = None,
                 from_auth_token_file: PathArg | None = None,
                 to_tls: ssl.SSLContext | None = None, to_auth_token: bytes | None = None,
                 to_tls_ca: PathArg | None = None, to_tls_cert: PathArg | None = None,
                 to_tls_key: PathArg | None = None, to_auth_token_file: PathArg | None = None,
                 **mirror_options: Any) -> None:
        sides = [
            _side_credentials("from", from_tls, from_auth_token, from_tls_ca, from_tls_cert,
                             from_tls_key, from_auth_token_file),
            _side_credentials("to", to_tls, to_auth_token, to_tls_ca, to_tls_cert, to_tls_key,
                             to_auth_token_file)]
        self._runner = LoopThread(loop)
        self._clients: list[AsyncClient] = []
        self._task: asyncio.Task[None] | None = None
        try:
            self.service: MirrorService = self._runner.run(self._open(
                source, target, name, namespace, target_namespace or namespace,
                target_name or name, sides, mirror_options))
        except BaseException:
            self.close()
            raise

    async def _open(self, source: str, target: str, name: str, namespace: str,
                    target_namespace: str, target_name: str,
                    sides: list[tuple[ssl.SSLContext | None, bytes | None]],
                    options: dict[str, Any]) -> MirrorService:
        for uri, (tls, token) in zip((source, target), sides, strict=True):
            self._clients.append(await AsyncClient(uri, tls=tls, auth_token=token).start())
        src = await self._clients[0].namespace(namespace).open_log(name)
        dst = await open_target(src, self._clients[1].namespace(target_namespace), target_name)
        return MirrorService(src, dst, name=f"{namespace}/{name}", **options)

    @property
    def stats(self) -> MirrorStats:
        """What the mirror copied and its lag (read from this thread; updated by the loop)."""
        return self.service.stats

    def start(self) -> None:
        """Run the mirror in the background (restarting after failures) until :meth:`stop`."""
        if self._task is not None and not self._task.done():
            raise RuntimeError("the mirror is already running")
        self.stop()  # (re-raises how an earlier background run ended)
        self._task = self._runner.run(_spawn(self.service))

    def stop(self) -> None:
        """Stop the background mirror (as a crash would: a later run resumes from the
        target); re-raises what ended it, if it ended on an error."""
        task, self._task = self._task, None
        if task is not None:
            self._runner.run(_cancel(task))

    def drain(self) -> Position | None:
        """Copy up to the source's last record as of now and return the last source position
        the target holds (stop a background run first: two mirrors fence each other)."""
        if self._task is not None and not self._task.done():
            raise RuntimeError("stop() the background mirror before drain()")
        return self._runner.run(self.service.drain())

    def close(self) -> None:
        """Stop the mirror, close both clients and the loop thread."""
        try:
            self.stop()
        finally:
            for client in self._clients:
                self._runner.run(client.close())
            self._clients.clear()
            self._runner.stop()

    def __enter__(self) -> LogMirror:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _spawn(service: MirrorService) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(service.run())


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel the run and wait for it to stop; what ended it earlier is raised."""
    if task.done():
        task.result()
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

