"""Metadata stores: the interface (``base``) and its backends, chosen by URI (:func:`open_store`).

=======================================  ====================================================
``memory://name``                         in this process; every ``open_store`` of the same
                                          name through one ``MemoryDirectory`` is a new
                                          session on the same shared data
``memory://``                             a fresh private store (nothing else can reach it)
``sqlite:///abs/path.db``                 a SQLite file, shared safely by processes on one host
``zk://host:port[,host:port]/root``       a ZooKeeper ensemble, everything under ``/root``
``etcd://host:port[,host:port]/root``     an etcd v3 cluster, everything under ``/root/``
=======================================  ====================================================
"""

from __future__ import annotations

from pybk.metadata.base import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    BookieRegistration,
    LedgerMetadata,
    MetadataStore,
    Watch,
)
from pybk.metadata.memory import MemoryMetadataStore
from pybk.metadata.uri import MemoryDirectory, open_store

__all__ = [
    "CLOSED",
    "IN_RECOVERY",
    "OPEN",
    "BookieRegistration",
    "LedgerMetadata",
    "MemoryDirectory",
    "MemoryMetadataStore",
    "MetadataStore",
    "Watch",
    "open_store",
]
