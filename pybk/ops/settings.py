"""Cluster-wide auto-recovery settings, kept in the metadata store's key/value namespace.

Every auditor and replication worker of a cluster reads (and watches) the same keys, so an
operator changes them once, from any client (``pybk autorecovery enable|disable|trigger``,
the HTTP admin, :class:`pybk.ops.admin.Admin`):

=============================================  ==================================================
``pybk.autorecovery/disabled``                 present: replication is off cluster-wide (the
                                               auditor still audits; workers copy nothing)
``pybk.autorecovery/lost-bookie-recovery-delay`` seconds a bookie must stay gone before its
                                               ledgers are marked (rolling restarts copy nothing)
``pybk.autorecovery/audit-requests``           a counter; bumping it asks the auditor for an
                                               immediate audit (lost bookies marked at once)
``pybk.autorecovery/marks``                    a counter the auditor bumps after marking ledgers:
                                               workers watch it instead of polling the marks
=============================================  ==================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from pybk.errors import CorruptRecordError, KeyExistsError, NoSuchKeyError
from pybk.metadata.base import MetadataStore, VersionedValue, Watch

__all__ = ["AutoRecoverySettings"]

PREFIX: Final = "pybk.autorecovery"
DISABLED_KEY: Final = f"{PREFIX}/disabled"
DELAY_KEY: Final = f"{PREFIX}/lost-bookie-recovery-delay"
AUDIT_KEY: Final = f"{PREFIX}/audit-requests"
MARKS_KEY: Final = f"{PREFIX}/marks"


def _counter(value: VersionedValue) -> int:
    try:
        return int(value.value.decode())
    except ValueError:
        raise CorruptRecordError(f"{value.key}: not a counter: {value.value[:32]!r}") from None


class AutoRecoverySettings:
    """The settings of the cluster whose metadata ``store`` holds (see the module doc)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    # -- the enable switch -------------------------------------------------------------------

    async def is_enabled(self) -> bool:
        try:
            await self.store.read_value(DISABLED_KEY)
        except NoSuchKeyError:
            return True
        return False

    async def set_enabled(self, enabled: bool) -> None:
        if enabled:
            try:
                await self.store.delete_value(DISABLED_KEY)
            except NoSuchKeyError:
                pass
        else:
            try:
                await self.store.create_value(DISABLED_KEY, b"disabled by an operator")
            except KeyExistsError:
                pass

    # -- the lost-bookie recovery delay ------------------------------------------------------

    async def lost_bookie_recovery_delay(self) -> float | None:
        """The cluster-wide delay, or None when none was set (each auditor uses its own
        configured default)."""
        try:
            value = await self.store.read_value(DELAY_KEY)
        except NoSuchKeyError:
            return None
        try:
            delay = float(value.value.decode())
        except ValueError:
            raise CorruptRecordError(f"{DELAY_KEY}: not a number: {value.value[:32]!r}") \
                from None
        if not math.isfinite(delay) or delay < 0:
            raise CorruptRecordError(f"{DELAY_KEY}: not a delay: {delay}")
        return delay

    async def set_lost_bookie_recovery_delay(self, seconds: float | None) -> None:
        """Set (or with None, forget) the delay; the auditor re-audits when it changes."""
        if seconds is None:
            try:
                await self.store.delete_value(DELAY_KEY)
            except NoSuchKeyError:
                pass
            return
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
                not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"lost bookie recovery delay must be a number >= 0, got {seconds!r}")
        data = repr(float(seconds)).encode()
        try:
            await self.store.create_value(DELAY_KEY, data)
        except KeyExistsError:
            await self.store.update_value(DELAY_KEY, lambda _v: data)

    # -- counters ------------------------------------------------------------------------------

    async def _bump(self, key: str) -> int:
        try:
            await self.store.create_value(key, b"1")
            return 1
        except KeyExistsError:
            pass
        value = await self.store.update_value(key, lambda v: str(_counter(v) + 1).encode())
        return _counter(value)

    async def _read_counter(self, key: str) -> int:
        try:
            return _counter(await self.store.read_value(key))
        except NoSuchKeyError:
            return 0

    async def request_audit(self) -> int:
        """Ask the auditor for an audit now; returns the request's number."""
        return await self._bump(AUDIT_KEY)

    async def audit_requests(self) -> int:
        return await self._read_counter(AUDIT_KEY)

    async def marks_added(self) -> int:
        """Tell the workers that new marks exist; returns the new generation."""
        return await self._bump(MARKS_KEY)

    async def marks_generation(self) -> int:
        return await self._read_counter(MARKS_KEY)

    # -- watches -------------------------------------------------------------------------------

    def watch(self, callback: Callable[[], None]) -> list[Watch]:
        """Call ``callback()`` after any setting or counter changes; cancel the watches
        returned when done."""
        return [self.store.watch_value(key, lambda _k: callback())
                for key in (DISABLED_KEY, DELAY_KEY, AUDIT_KEY, MARKS_KEY)]
