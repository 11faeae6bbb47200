"""Operations: auto-recovery (auditor + replication workers), the admin API, the HTTP admin
endpoint and Prometheus metrics.

* :mod:`.fragments`, :mod:`.replicator`: what a ledger's fragments hold and how one is
  re-replicated (sans policy: the placement policy is the client's,
  :mod:`pybk.client.placement`);
* :mod:`.auditor`, :mod:`.worker`, :mod:`.autorecovery`: who finds under-replicated ledgers
  and who repairs them; :mod:`.settings`: the cluster-wide switches in the metadata store;
* :mod:`.admin`: ``client.admin()``; :mod:`.http`: the bookie's HTTP admin endpoint;
* :mod:`.metrics`: Prometheus collectors for the bookie, the client and auto-recovery;
* :mod:`.mirror`: a log mirror run as a service (restarted after failures) and its metrics;
* :mod:`.offloader`: tiered storage run as a service over namespaces' logs, and its metrics.
"""

from __future__ import annotations

from pybk.ops.admin import Admin, BookieInfo, RecoveryReport
from pybk.ops.autorecovery import AutoRecovery
from pybk.ops.config import AutoRecoveryConfig, AutoRecoveryStats
from pybk.ops.mirror import MirrorCollector, MirrorService
from pybk.ops.offloader import OffloadCollector, OffloadService
from pybk.ops.settings import AutoRecoverySettings

__all__ = [
    "Admin",
    "AutoRecovery",
    "AutoRecoveryConfig",
    "AutoRecoverySettings",
    "AutoRecoveryStats",
    "BookieInfo",
    "MirrorCollector",
    "MirrorService",
    "OffloadCollector",
    "OffloadService",
    "RecoveryReport",
]
