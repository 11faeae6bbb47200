"""A namespace of logs in one metadata store: create, open, list and delete logs by name.

``client.namespace("default")`` on any metadata backend (memory, SQLite, ZooKeeper): a log's
metadata is one value at ``logs/<namespace>/<name>`` in the store's key/value namespace, so
listing a namespace is one prefix listing and every change is a compare-and-set.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pybk.errors import (
    BKError,
    KeyExistsError,
    LogExistsError,
    LogNotFoundError,
    MetadataVersionError,
    NoSuchKeyError,
)
from pybk.logs.catalog import LogCatalog
from pybk.logs.config import LogConfig
from pybk.logs.cursor import delete_cursor
from pybk.logs.cursor_meta import cursor_prefix
from pybk.logs.log import Log
from pybk.logs.meta import LogMetadata, log_key
from pybk.logs.offload import delete_objects

if TYPE_CHECKING:
    from pybk.client import Client

__all__ = ["Namespace", "check_name"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")


def check_name(kind: str, name: object) -> str:
    """Namespace and log names: 1-200 of ``[A-Za-z0-9._-]``, not starting with '.' or '-'."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a str, not {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"bad {kind} name {name!r}: 1-200 letters, digits and ._- (not starting with . or -)"
        )
    return name


class Namespace:
    """The logs of one namespace, through one client."""

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.name = check_name("namespace", name)
        #: wall clock for segment times (retention by age); the outermost layer's default
        self._clock = clock if clock is not None else time.time
        self._rng = rng if rng is not None else random.Random()

    def _catalog(self, name: str) -> LogCatalog:
        return LogCatalog(self.client, self.name, check_name("log", name), self._clock)

    def _log(self, name: str) -> Log:
        return Log(self._catalog(name), random.Random(self._rng.getrandbits(64)))

    async def create_log(
        self,
        name: str,
        *,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        compression: str = "none",
        roll_bytes: int | None = 64 << 20,
        roll_entries: int | None = None,
        roll_seconds: float | None = None,
        retention_seconds: float | None = None,
        retention_bytes: int | None = None,
        digest_type: str = "CRC32C",
    ) -> Log:
        """Create an empty log; LogExistsError when the name is taken. The knobs are checked
        (ValueError naming one) before anything is stored; see LogConfig."""
        config = LogConfig(
            ensemble_size=ensemble_size, write_quorum=write_quorum, ack_quorum=ack_quorum,
            digest_type=digest_type, compression=compression, roll_bytes=roll_bytes,
            roll_entries=roll_entries, roll_seconds=roll_seconds,
            retention_seconds=retention_seconds, retention_bytes=retention_bytes,
        )  # fmt: skip
        cat = self._catalog(name)
        md = LogMetadata(self.name, name, config, ctime_ms=cat.now_ms())
        try:
            await self.client.store.create_value(cat.key, md.to_bytes())
        except KeyExistsError:
            raise LogExistsError(
                f"log {name!r} already exists in namespace {self.name!r}"
            ) from None
        return self._log(name)

    async def open_log(self, name: str) -> Log:
        """An existing log; LogNotFoundError when there is none by that name."""
        cat = self._catalog(name)
        await cat.read()
        return self._log(name)

    async def log_exists(self, name: str) -> bool:
        try:
            await self._catalog(name).read()
        except LogNotFoundError:
            return False
        return True

    async def list_logs(self) -> list[str]:
        """The names of the namespace's logs, sorted."""
        prefix = f"logs/{self.name}/"
        return [k[len(prefix):] for k in await self.client.store.list_keys(prefix)
                if "/" not in k[len(prefix):]]

    async def delete_log(self, name: str) -> None:
        """Delete a log, its ledgers, its durable cursors and its offloaded objects. Its
        in-progress segment is fenced first, so its writer's next append fails
        (LedgerFencedError), as does any metadata change it tries; readers get
        LogNotFoundError. LogNotFoundError when there is no such log."""
        cat = self._catalog(name)
        store = self.client.store
        key = log_key(self.name, name)
        for _ in range(100):
            try:
                value = await store.read_value(key)
            except NoSuchKeyError:
                raise LogNotFoundError(
                    f"log {name!r} does not exist in namespace {self.name!r}"
                ) from None
            md = LogMetadata.from_bytes(value.value, value.version)
            if not md.deleting:  # step 1: the log is gone for everyone (epoch bumped too)
                try:
                    value = await store.write_value(
                        key, md.with_changes(deleting=True, epoch=md.epoch + 1).to_bytes(),
                        value.version,
                    )
                except MetadataVersionError:
                    continue
            for seg in md.segments:
                if seg.in_progress:  # fence it: its writer's next add fails at once
                    try:
                        await self.client.open_ledger(seg.ledger_id, recovery=True)
                    except BKError as exc:  # the deletion goes on; the writer fails later
                        log.info("delete_log %s: could not fence ledger %d: %s", name,
                                 seg.ledger_id, exc)
            for lid in [s.ledger_id for s in md.segments] + list(md.allocated):
                await cat.delete_ledger(lid)
            await delete_objects(cat, md, list(md.segments))  # offloaded copies
            for cursor in await store.list_keys(cursor_prefix(self.name, name)):
                try:  # each cursor's ledger (fenced first) and record
                    await delete_cursor(cat, cursor.rsplit("/", 1)[-1])
                except LogNotFoundError:
                    pass  # (CursorNotFoundError: deleted meanwhile)
            try:
                await store.delete_value(key, value.version)
            except MetadataVersionError:
                continue
            except NoSuchKeyError:
                pass  # deleted by a concurrent delete_log
            return
        raise MetadataVersionError(f"log {name!r}: could not delete it (contention)")

    def __repr__(self) -> str:
        return f"<Namespace {self.name}>"
