"""Requests about ledgers a bookie has never stored, checked against the metadata before
they leave any state (issue: ledger-id squatting).

Ledger ids are handed out in ascending blocks, so the next ones are easy to guess. A FENCE
for a ledger the bookie does not know used to create it, fenced, under whatever master key
it carried: a peer without the password could fence ids not yet handed out, and their
creator's adds were then refused ("fenced", "master key does not match"). Such a request is
now served only when the metadata holds the ledger (it is created there before any bookie
hears of it) and, when the metadata keeps the ledger's master key, the keys match.

The refusal for a ledger the metadata lacks is "unknown" (never "absent": a recovering
client must not count a fence that did not happen as one that did). Each check costs one
metadata read, so at most ``limit`` run at once; beyond, TOO_MANY_REQUESTS.
"""

from __future__ import annotations

import hmac
from typing import Final

from pybk.errors import (
    NoSuchLedgerError,
    TooManyRequestsError,
    UnauthorizedError,
    UnknownLedgerStateError,
)
from pybk.metadata.base import MetadataStore
from pybk.storage.engine import LedgerStorage

__all__ = ["UNKNOWN_LEDGER_CHECKS", "UnknownLedgerCheck", "fence_checked"]

#: metadata reads for unknown ledgers in flight at once, per bookie
UNKNOWN_LEDGER_CHECKS: Final = 64


class UnknownLedgerCheck:
    """Checks a request about a ledger this bookie does not hold against ``store``."""

    def __init__(self, store: MetadataStore, limit: int = UNKNOWN_LEDGER_CHECKS) -> None:
        self.store = store
        self.limit = limit
        self.in_flight = 0
        #: refused checks (tests, operators)
        self.refused = 0

    async def check(self, ledger_id: int, master_key: bytes, what: str) -> None:
        """Return if ``what`` (e.g. "fence") of ``ledger_id`` with ``master_key`` may create
        the ledger here; raise UnknownLedgerStateError (not in the metadata),
        UnauthorizedError (another key), TooManyRequestsError (too many checks at once) or the
        metadata's own error."""
        if self.in_flight >= self.limit:
            self.refused += 1
            raise TooManyRequestsError(
                f"ledger {ledger_id}: {self.limit} checks of unknown ledgers already running")
        self.in_flight += 1
        try:
            md = await self.store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            self.refused += 1
            raise UnknownLedgerStateError(
                f"{what} of ledger {ledger_id} refused: this bookie does not hold it and the "
                "metadata does not either (a ledger is created in the metadata first)"
            ) from None
        finally:
            self.in_flight -= 1
        if md.master_key and not hmac.compare_digest(md.master_key, master_key):
            self.refused += 1
            raise UnauthorizedError(f"{what} of ledger {ledger_id}: master key does not match")


async def fence_checked(check: UnknownLedgerCheck | None, store: LedgerStorage, ledger_id: int,
                        key: bytes) -> None:
    """Fence durably (``store.fence``); a ledger ``store`` does not hold only once ``check``
    (None: no check) let it."""
    if (check is not None and store.find(ledger_id) is None
            and not store.is_deleted(ledger_id)):
        await check.check(ledger_id, key, "a fence")
    await store.fence(ledger_id, key)
