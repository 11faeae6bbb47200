"""The client side of the ledger protocol: quorum rules, the write pipeline, reads, recovery.

:mod:`.quorum` holds the quorum rules, :mod:`.pipeline` the write pipeline as a sans-IO core
(events in, actions out) and :mod:`.writer` its driver (``LedgerHandle``), :mod:`.placement`
who gets picked for an ensemble, :mod:`.reader` and :mod:`.recovery` the read side.

Layer: above :mod:`pybk.transport` and :mod:`pybk.metadata`, below the public facades
(:mod:`pybk.client`, :mod:`pybk.stream`). Nothing here touches sockets, threads, files or the
wall clock: time is the running loop's, bookies are reached through a Transport, so the
simulator drives this code unchanged.
"""

__all__: list[str] = []
