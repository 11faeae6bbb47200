"""The bookie's local scrubber (:mod:`pybk.storage.scrub`), started with the bookie so every
deployment runs it (a ``pybk bookie`` process, a LocalCluster, the WAL's embedded bookies,
the simulator): damage it finds is logged, shown in the bookie's info, and marks the ledger
under-replicated in the bookie's metadata store, so auto-recovery copies the entry back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from pybk.storage.scrub import Scrubber

if TYPE_CHECKING:
    from pybk.bookie.bookie import Bookie

__all__ = ["start_scrubber"]

log = logging.getLogger(__name__)


def start_scrubber(bookie: Bookie) -> Scrubber | None:
    """The started scrubber of ``bookie`` (opened), or None when ``scrub_rate`` is 0."""
    cfg = bookie.config
    if cfg.scrub_rate <= 0 or bookie.store is None:
        return None
    scrubber = Scrubber(bookie.store, rate=cfg.scrub_rate, interval=cfg.scrub_interval,
                        on_damage=lambda lid, eid, what: _damaged(bookie, lid, eid, what))
    scrubber.start()
    return scrubber


def _damaged(bookie: Bookie, ledger_id: int, entry_id: int, what: str) -> None:
    log.error("bookie %s: scrubber: ledger %d entry %d is damaged (%s): marking the ledger "
              "under-replicated", bookie.bookie_id, ledger_id, entry_id, what)
    if bookie.cookie_store is None:
        return
    bookie._spawn(_mark(bookie, ledger_id, entry_id))


async def _mark(bookie: Bookie, ledger_id: int, entry_id: int) -> None:
    assert bookie.cookie_store is not None
    try:
        await bookie.cookie_store.mark_under_replicated(ledger_id, [bookie.bookie_id])
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the next pass reports the entry again, and retries
        log.warning("bookie %s: could not mark ledger %d under-replicated: %s",
                    bookie.bookie_id, ledger_id, exc)
        if bookie.store is not None:
            bookie.store.damaged.pop((ledger_id, entry_id), None)
