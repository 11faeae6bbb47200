"""ZooKeeper metadata store (``zk://host:port[,host:port]/root``), split along its seams:

* :mod:`.paths`: where everything lives below the root (pure functions);
* :mod:`.bridge`: kazoo's threads to the event loop, the connection and the session, one
  bounded call;
* :mod:`.recipes`: shared watches and the ephemeral-sequential leader election;
* :mod:`.keyvalues`, :mod:`.locks`, :mod:`.underreplication`: the key/value namespace, the
  locks and the under-replication marks, each on the store's session;
* :mod:`.store`: the :class:`~pybk.metadata.base.MetadataStore` API on top of them.
"""

from __future__ import annotations

from pybk.metadata.zookeeper.paths import ledger_subpath
from pybk.metadata.zookeeper.store import ZooKeeperMetadataStore

__all__ = ["ZooKeeperMetadataStore", "ledger_subpath"]
