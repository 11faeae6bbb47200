"""Helpers for the bookie tests: a bookie on a MemFileSystem, framed entries, restarts."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pybk.bookie import Bookie, BookieConfig
from pybk.storage import MemFileSystem
from pybk.wire import AddRequest, DigestManager, ReadRequest, Status, master_key

KEY = master_key(b"pw")
DATA_DIR = "/data/b1"


def frame(ledger_id: int, entry_id: int, payload: bytes | None = None, lac: int | None = None
          ) -> bytes:
    """A framed CRC32C entry as a client would send it."""
    if payload is None:
        payload = f"L{ledger_id}E{entry_id}".encode() * 3
    lac = entry_id - 1 if lac is None else lac
    return DigestManager(ledger_id).frame(entry_id, lac, 0, payload)


@dataclass
class Harness:
    """One bookie identity over one MemFileSystem, restartable."""

    fs: MemFileSystem = field(default_factory=MemFileSystem)
    config: BookieConfig = field(default_factory=lambda: BookieConfig(
        disk_check_interval=0, checkpoint_interval=0))
    bookie_id: str = "b1"
    cookie_store: object | None = None
    seed: int = 7
    bookie: Bookie | None = None

    KEY = KEY
    DATA_DIR = DATA_DIR
    frame = staticmethod(frame)

    def new(self) -> Bookie:
        return Bookie(self.bookie_id, DATA_DIR, fs=self.fs, config=self.config,
                      cookie_store=self.cookie_store,  # type: ignore[arg-type]
                      rng=random.Random(self.seed))

    async def start(self) -> Bookie:
        self.bookie = self.new()
        await self.bookie.start()
        return self.bookie

    async def restart_with(self, **config: Any) -> Bookie:
        """Stop cleanly and start again with ``config`` changed (e.g. ``mutations=``)."""
        assert self.bookie is not None
        await self.bookie.stop()
        self.config = dataclasses.replace(self.config, **config)
        return await self.start()

    async def crash_restart(self, mode: str = "drop", seed: int = 0) -> Bookie:
        assert self.bookie is not None
        self.bookie.crash()
        self.fs.crash(mode, random.Random(seed))
        return await self.start()

    async def add(self, ledger_id: int, entry_id: int, body: bytes | None = None, *,
                  key: bytes = KEY, recovery: bool = False) -> Status:
        assert self.bookie is not None
        body = frame(ledger_id, entry_id) if body is None else body
        resp = await self.bookie.handle(AddRequest(ledger_id, entry_id, key, body, recovery))
        return resp.status

    async def read(self, ledger_id: int, entry_id: int) -> tuple[Status, bytes | None]:
        assert self.bookie is not None
        resp = await self.bookie.handle(ReadRequest(ledger_id, entry_id))
        return resp.status, resp.body


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    await h.start()
    yield h
    if h.bookie is not None:
        h.bookie.crash()


@pytest.fixture
def harness_cls() -> type[Harness]:
    """The Harness class (tests that need several bookies or custom configs)."""
    return Harness
