"""A log mirror for synchronous code: ``pybk.sync.LogMirror(from_uri, to_uri, "orders")``.

Both clusters' clients and the mirror (:class:`pybk.ops.mirror.MirrorService`) live on one
:class:`pybk.sync.runner.LoopThread`: ``start()`` runs the mirror there in the background,
``drain()`` copies up to the source's last record and returns, ``stop()`` and ``close()``
end it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from pybk.client.client import Client as AsyncClient
from pybk.logs.mirror import MirrorStats, open_target
from pybk.logs.position import Position
from pybk.ops.mirror import MirrorService
from pybk.sync.runner import LoopThread

__all__ = ["LogMirror"]


class LogMirror:
    """Mirrors log ``name`` of the cluster of ``source`` (a metadata URI) into the cluster of
    ``target`` (into ``target_name``, default the same name; created with the source's
    configuration when missing). ``mirror_options`` go to MirrorService (``batch_records=``,
    ``window=``, ``lag_interval=``, ``min_backoff=``, ...)."""

    def __init__(self, source: str, target: str, name: str, *, namespace: str = "default",
                 target_namespace: str | None = None, target_name: str | None = None,
                 loop: str | None = None, **mirror_options: Any) -> None:
        self._runner = LoopThread(loop)
        self._clients: list[AsyncClient] = []
        self._task: asyncio.Task[None] | None = None
        try:
            self.service: MirrorService = self._runner.run(self._open(
                source, target, name, namespace, target_namespace or namespace,
                target_name or name, mirror_options))
        except BaseException:
            self.close()
            raise

    async def _open(self, source: str, target: str, name: str, namespace: str,
                    target_namespace: str, target_name: str,
                    options: dict[str, Any]) -> MirrorService:
        for uri in (source, target):
            self._clients.append(await AsyncClient(uri).start())
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

