"""A writer's ensemble change: replacing the bookies that failed its adds.

The write pipeline (:mod:`pybk.client.pipeline`) decides *that* bookies must be replaced (its
``ChangeEnsemble`` action); :func:`replace_failed_bookies` does it for the pipeline's driver
(:class:`pybk.client.writer.AddPipeline`): it picks replacements by the ledger's namespace
placement policy, compare-and-sets the new ensemble in the metadata store (recovery's
write-back keeps it locally instead, or writes around a bookie it cannot replace) and hands
it to the pipeline, which resends what the failed bookies held. Apart from the driver because
it is the one part of the add path that awaits the metadata store and the placement.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pybk.client.isolation import placement_for
from pybk.client.placement import BookieNode, PlacementPolicy, writable_nodes
from pybk.client.quorum import plan_ensemble_change
from pybk.errors import BKError, LedgerClosedError, LedgerFencedError, NotEnoughBookiesError
from pybk.metadata.base import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from pybk.runtime import sometimes

if TYPE_CHECKING:
    from pybk.client.context import ClientContext
    from pybk.client.pipeline import WritePipeline
    from pybk.client.writer import AddPipeline
    from pybk.stats import ClientStats

__all__ = ["replace_failed_bookies"]

#: the writer's log: what a user filters on to see its bookie failures and ensemble changes
log = logging.getLogger("pybk.client.writer")

_ENSEMBLE_CHANGED = sometimes.point(
    "client.ensemble_change", "a writer replaced a bookie and resent what it held")


async def replace_failed_bookies(driver: AddPipeline, stats: ClientStats | None) -> None:
    """Replace the failed bookies of ``driver``'s pipeline until none is left (more may fail
    meanwhile). Never raises: a change that cannot be made fails the pipeline (no spare
    bookie, named with what made the change necessary; the ledger closed or fenced by another
    client; anything unexpected, logged). The driver calls ``change_done`` after it.
    ``stats``: the client's metrics, when the writer counts its changes there."""
    core = driver.core
    ctx, ledger_id = driver.ctx, driver.ledger_id
    write_quorum = core.quorums.write_quorum
    try:
        while failed := core.take_failed():
            for index, bookie in failed.items():
                log.info("ledger %s: bookie %s (slot %d) failed: %s", ledger_id,
                         bookie, index, core.failure_causes.get(bookie, "?"))
            policy = await placement_for(ctx, driver.metadata.custom_metadata)  # its ns
            writable = await writable_nodes(ctx, policy)
            if driver.recovery:
                try:
                    change = plan_ensemble_change(core.ensembles, core.lac, failed,
                                                  writable, ctx.rng, policy, write_quorum)
                except NotEnoughBookiesError:
                    core.write_around(failed)  # raises if Qa is out of reach
                    log.info("ledger %s: writing around failed bookies %s (no spare)",
                             ledger_id, sorted(failed.values()))
                    continue
                if change is not None:
                    _log_change(core, change.ensembles, stats)
                    core.ensemble_changed(change.ensembles)
            else:
                driver.metadata = await _commit_change(ctx, ledger_id, core.lac, failed,
                                                       writable, policy, write_quorum)
                ensembles = {k: tuple(v) for k, v in driver.metadata.ensembles.items()}
                _log_change(core, ensembles, stats)
                core.ensemble_changed(ensembles)
    except NotEnoughBookiesError as exc:
        # name what made the change necessary: "no spare bookie" alone hides the cause
        # (a TLS or auth problem, a crashed bookie...)
        causes = "; ".join(f"{b}: {c}" for b, c in sorted(core.failure_causes.items()))
        core.fail(NotEnoughBookiesError(f"{exc} (replacing failed bookies: {causes})"))
    except BKError as exc:
        core.fail(exc)
    except Exception as exc:  # a bug or a store failure: fail loudly, never hang
        log.exception("ledger %s: ensemble change failed", ledger_id)
        core.fail(exc)


def _log_change(core: WritePipeline, ensembles: dict[int, tuple[str, ...]],
                stats: ClientStats | None) -> None:
    new = list(ensembles[max(ensembles)])
    if new != core.ensemble:
        _ENSEMBLE_CHANGED()
    if new != core.ensemble and stats is not None:
        stats.ensemble_changes += 1
    if new != core.ensemble:
        log.info("ledger %s: ensemble %s -> %s from entry %d", core.ledger_id,
                 core.ensemble, new, max(ensembles))


async def _commit_change(ctx: ClientContext, ledger_id: int, lac: int, failed: dict[int, str],
                         writable: Sequence[BookieNode], placement: PlacementPolicy,
                         write_quorum: int) -> LedgerMetadata:
    """CAS the new ensemble into the metadata (the one place a writer changes it)."""
    rng = ctx.rng

    def transform(md: LedgerMetadata) -> LedgerMetadata | None:
        if md.state != OPEN:
            return None
        change = plan_ensemble_change(md.ensembles, lac, failed, writable, rng, placement,
                                      write_quorum)
        if change is None:
            return None
        return md.with_changes(ensembles=change.ensembles)

    md = await ctx.store.update_ledger(ledger_id, transform)
    if md.state == CLOSED:
        raise LedgerClosedError(
            f"ledger {ledger_id} was closed by another client (recovered at "
            f"last entry {md.last_entry_id}) during an ensemble change"
        )
    if md.state == IN_RECOVERY:
        raise LedgerFencedError(
            f"ledger {ledger_id} is being recovered by another client"
        )
    return md
