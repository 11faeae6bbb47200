"""The one shape every cluster has, whatever runs its bookies.

:class:`AsyncCluster` is met by :class:`pybk.LocalCluster` (bookies as objects of this
process) and :class:`pybk.sim.cluster.SimCluster` (simulated bookies on virtual time);
:class:`Cluster` by :class:`pybk.sync.LocalCluster` and :class:`pybk.server.cluster.ProcessCluster`
(``pybk bookie`` processes, what ``pybk cluster up`` starts). Code written against the
protocol (a test, a benchmark, an application's fixture) runs on any of them.
``pybk.testing.SimTestCluster`` is not a cluster but a fixture that runs a scenario on a
fresh :class:`~pybk.sim.cluster.SimCluster`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["AsyncCluster", "Cluster"]


@runtime_checkable
class AsyncCluster(Protocol):
    """A cluster driven from an event loop."""

    @property
    def bookie_ids(self) -> list[str]:
        """Every bookie of the cluster, running or stopped."""
        ...

    async def start(self) -> Any:
        """Start the bookies (and the metadata store); returns the cluster."""
        ...

    async def close(self) -> None:
        """Stop everything it started."""
        ...

    def client(self) -> Any:
        """A client of this cluster's bookies (:class:`pybk.Client` or its simulated twin)."""
        ...

    async def stop_bookie(self, bookie_id: str) -> None:
        """Crash-stop one bookie: what it had not synced is lost, as after ``kill -9``."""
        ...

    async def start_bookie(self, bookie_id: str) -> Any:
        """Start a stopped bookie again on its data."""
        ...


@runtime_checkable
class Cluster(Protocol):
    """A cluster driven from synchronous code."""

    @property
    def bookie_ids(self) -> list[str]:
        """Every bookie of the cluster, running or stopped."""
        ...

    def start(self) -> Any:
        """Start the bookies; returns the cluster."""
        ...

    def close(self) -> None:
        """Stop everything it started."""
        ...

    def client(self) -> Any:
        """A synchronous client of this cluster's bookies (:class:`pybk.sync.Client`)."""
        ...

    def stop_bookie(self, bookie_id: str) -> None:
        """Crash-stop one bookie (``kill -9`` of a process)."""
        ...

    def start_bookie(self, bookie_id: str) -> Any:
        """Start a stopped bookie again on its data."""
        ...
