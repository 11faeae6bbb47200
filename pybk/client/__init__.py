"""The ledger client (BookKeeper's ``client/``): :class:`Client` and everything it drives.

:mod:`.client` the entry point, :mod:`.quorum` the quorum rules, :mod:`.pipeline` the write
pipeline as a sans-IO core (events in, actions out) and :mod:`.writer` its driver
(``LedgerHandle``), :mod:`.adv` caller-chosen entry ids (``LedgerHandleAdv``),
:mod:`.placement` who gets picked for an ensemble, :mod:`.reader` and
:mod:`.recovery` the read side, :mod:`.context` what a client shares with its handles.

Layer: above :mod:`pybk.transport` and :mod:`pybk.metadata`, below the logs and the facades.
Nothing here touches sockets, threads, files or the wall clock: time is the running loop's,
bookies are reached through a Transport, so the simulator drives this code unchanged.
"""

from pybk.client.client import (
    Client,
    ClientConfig,
    DeferredSyncLedgerHandle,
    LedgerEntry,
    LedgerHandle,
    LedgerHandleAdv,
    ReadHandle,
)

__all__ = ["Client", "ClientConfig", "DeferredSyncLedgerHandle", "LedgerEntry", "LedgerHandle",
           "LedgerHandleAdv", "ReadHandle"]
