"""Racks in the simulator: half the seeds place their bookies in two or three racks and every
client uses the rack-aware placement policy, as a deployment with racks does.

Invariant **P1**: a ledger's first ensemble spreads each of its write sets (the wrap-around
ones included) over ``min(2, Qw)`` racks whenever its bookies' racks allow an order that does.
Judged by brute force over the orders of the chosen bookies, not by the policy's own search.
"""

from __future__ import annotations

import itertools
import random
from typing import TYPE_CHECKING

from pybk.client.placement import RackAwarePlacementPolicy
from pybk.sim.checker import Violation
from pybk.sim.cluster import derive_rng
from pybk.sim.history import History

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["RackPlacementSim", "best_spread", "fewest_racks"]

#: the spread the policy is asked for (its default ``min_racks_per_write_quorum``)
MIN_RACKS = 2


def fewest_racks(racks: tuple[str, ...], write_quorum: int) -> int:
    """The fewest distinct racks any cyclic write set of an ensemble in this order spans."""
    size = len(racks)
    return min(len({racks[(s + i) % size] for i in range(write_quorum)}) for s in range(size))


def best_spread(racks: tuple[str, ...], write_quorum: int) -> int:
    """The best :func:`fewest_racks` any order of these bookies' racks gives."""
    return max(fewest_racks(order, write_quorum) for order in set(itertools.permutations(racks)))


class RackPlacementSim:
    """Racks and rack-aware clients for one run, and the P1 check."""

    name = "racks"

    @classmethod
    def for_run(cls, run: SimRun) -> RackPlacementSim | None:
        rng = derive_rng(run.seed, "racks")
        return cls(run, rng) if rng.random() < 0.5 else None

    def __init__(self, run: SimRun, rng: random.Random) -> None:
        self.run = run
        ids = list(run.cluster.bookie_ids)
        rng.shuffle(ids)
        count = rng.choice((2, 3))
        run.cluster.racks.update({b: f"/sim/rack-{i % count}" for i, b in enumerate(ids)})
        run.cluster.placement = RackAwarePlacementPolicy(
            min_racks_per_write_quorum=MIN_RACKS, mutations=frozenset(run.mutations))
        run.cover(f"config_racks_{count}")

    async def start(self) -> None:
        pass

    async def settle(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def check(self) -> list[Violation]:
        racks = self.run.cluster.racks
        seen: set[int] = set()
        out: list[Violation] = []
        for ev in self.run.history.events:
            if ev.kind != "ensembles" or ev.ledger in seen:
                continue
            seen.add(ev.ledger)  # (the first: the ensemble the ledger was created with)
            _e, qw, segments = History.parse_ensembles(ev.detail)
            ensemble = segments[0][1]
            order = tuple(racks.get(b, "") for b in ensemble)
            wanted = min(MIN_RACKS, qw)
            got = fewest_racks(order, qw)
            if got < wanted <= best_spread(order, qw):
                out.append(Violation(
                    "P1", ev.ledger, -1,
                    f"ledger {ev.ledger}'s ensemble {list(ensemble)} (racks {list(order)}) has "
                    f"a write set of {qw} on {got} rack(s); an order of the same bookies "
                    f"spans {wanted}", (ev.line,)))
        return out
