"""etcd metadata store (``etcd://host:port[,host:port]/root``), split along its seams:

* :mod:`.client`: etcd's v3 HTTP/JSON gateway on aiohttp, several members, bounded calls;
* :mod:`.keys`: where everything lives below the root (pure functions);
* :mod:`.lease`: the lease registrations and locks are attached to, and its renewal;
* :mod:`.watches`: one revision-ordered watch stream shared by every watch (no missed change);
* :mod:`.store`: the :class:`~pybk.metadata.base.MetadataStore` API on top of them.
"""

from __future__ import annotations

from pybk.metadata.etcd.store import EtcdMetadataStore

__all__ = ["EtcdMetadataStore"]
