"""Placement: which bookies a new ledger's ensemble gets, and which replace failed ones.

The client asks its :class:`PlacementPolicy` (``ClientContext.placement``) at the two places
BookKeeper asks its ``EnsemblePlacementPolicy``: creating a ledger (``new_ensemble``) and an
ensemble change (``replace``, for the writer's change and recovery's). A policy sees the
writable bookies the metadata store lists, the injected ``random.Random`` (so the simulator
replays it) and what to avoid; it returns bookie ids or raises
:class:`pybk.errors.NotEnoughBookiesError`. :class:`RandomPlacement` (the default) picks
uniformly; rack- or region-aware policies plug in here.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Sequence

from pybk.replication.quorum import choose_ensemble

__all__ = ["PlacementPolicy", "RandomPlacement"]


class PlacementPolicy(abc.ABC):
    """Chooses bookies for ensembles (see the module docstring)."""

    @abc.abstractmethod
    def new_ensemble(self, size: int, writable: Sequence[str], rng: random.Random,
                     exclude: Sequence[str] = ()) -> list[str]:
        """``size`` distinct bookies of ``writable`` (none of ``exclude``), in slot order."""

    def replace(self, ensemble: Sequence[str], slots: Sequence[int], writable: Sequence[str],
                rng: random.Random, exclude: Sequence[str] = ()) -> list[str]:
        """New bookies for ``ensemble[slot]`` of each of ``slots`` (in that order): none of
        ``ensemble`` or ``exclude`` (the failed ones). By default: :meth:`new_ensemble`."""
        return self.new_ensemble(len(slots), writable, rng, [*ensemble, *exclude])


class RandomPlacement(PlacementPolicy):
    """Any writable bookies, uniformly at random (with the client's rng)."""

    def new_ensemble(self, size: int, writable: Sequence[str], rng: random.Random,
                     exclude: Sequence[str] = ()) -> list[str]:
        return choose_ensemble(writable, size, rng, exclude=exclude)
