"""The state the sessions of one memory metadata store share (see :mod:`.memory`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from pybk.metadata._common import CallbackWatch
from pybk.metadata.base import BookieRegistration, LedgerMetadata
from pybk.metadata.memory_watches import WatchPoller

__all__ = ["MemoryState"]


@dataclass
class MemoryState:
    """Everything the sessions of one memory store share."""

    ledgers: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # id -> (bytes, version)
    next_id: int = 0
    next_version: int = 0  # versions are store-wide so a re-created ledger never reuses one
    bookies: dict[str, tuple[BookieRegistration, int]] = field(default_factory=dict)  # -> owner
    under_replicated: dict[int, list[str]] = field(default_factory=dict)
    cookies: dict[str, bytes] = field(default_factory=dict)
    values: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # key -> (value, version)
    value_watches: dict[str, list[CallbackWatch]] = field(default_factory=dict)
    ledger_watches: dict[int, list[CallbackWatch]] = field(default_factory=dict)
    bookie_watches: list[CallbackWatch] = field(default_factory=list)
    locks: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (owner, session)
    lock_watches: dict[str, list[CallbackWatch]] = field(default_factory=dict)
    session_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    #: id -> (the stored bytes, version, their parse): metadata objects are immutable, so
    #: readers of an unchanged ledger share one parse (the auditor and the workers read
    #: every ledger again and again)
    parsed: dict[int, tuple[bytes, int, LedgerMetadata]] = field(default_factory=dict)
    #: ticks on every change of the bookie registry, and of each lock (a watch set after a
    #: read compares them with what the read returned)
    bookies_version: int = 0
    lock_versions: dict[str, int] = field(default_factory=dict)
    #: None: watches fire the moment a change is made; else they poll (the simulator's
    #: switch, :mod:`pybk.metadata.memory_watches`)
    poller: WatchPoller | None = None

    def bump_version(self) -> int:
        self.next_version += 1
        return self.next_version

    def ledger_changed(self, ledger_id: int) -> None:
        if self.poller is not None:
            return
        for w in list(self.ledger_watches.get(ledger_id, ())):
            w.fire()

    def value_changed(self, key: str) -> None:
        if self.poller is not None:
            return
        for w in list(self.value_watches.get(key, ())):
            w.fire()

    def bookies_changed(self) -> None:
        self.bookies_version += 1
        if self.poller is not None:
            return
        for w in list(self.bookie_watches):
            w.fire()

    def lock_changed(self, name: str) -> None:
        self.lock_versions[name] = self.lock_versions.get(name, 0) + 1
        if self.poller is not None:
            return
        for w in list(self.lock_watches.get(name, ())):
            w.fire()
