"""What users need to test their own code against pybk (as ``trio.testing`` is for trio).

* :class:`HookedTransport` / :class:`Hooks`: hold, fail, drop or delay requests per bookie
  and operation, around any transport (``LocalCluster(..., transport_wrapper=HookedTransport)``);
* :class:`LocalTransport` and :class:`MemFileSystem`: bookies in memory, with crash semantics;
* :class:`SimTestCluster` / :class:`SimCluster`: a deterministic simulated cluster (virtual
  time, faults; the ``sim_cluster`` pytest fixture); :func:`assert_app_survives`: sweep seeds
  of faults over your own application (``pybk.sim.check``) in one assertion;
* conformance suites any implementation of a seam can run: :mod:`.metadata_conformance`
  (MetadataStore) and its adversarial watch section :mod:`.watch_conformance`,
  :mod:`.fs_conformance` (FileSystem), :mod:`.transport_conformance`
  (Transport: ``run_transport_check(MyBackend, check)`` for each of ``TRANSPORT_CHECKS``);
* :mod:`.zookeeper`: a real ZooKeeper server on a free port for tests;
* :class:`Mutations` (:mod:`.mutations`): deliberately broken builds for checker tests.

Names load on first use (PEP 562), so importing the pytest plugin stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pybk.sim.cluster import SimCluster
    from pybk.storage.memfs import MemFileSystem
    from pybk.testing.fs_conformance import check_filesystem
    from pybk.testing.hooks import (
        HeldRequest,
        HookedTransport,
        Hooks,
        Rule,
        is_fencing,
        is_normal_add,
        is_recovery_add,
    )
    from pybk.testing.mutations import Mutations
    from pybk.testing.simulated import SimTestCluster, assert_app_survives
    from pybk.testing.transport_conformance import CHECKS as TRANSPORT_CHECKS
    from pybk.testing.transport_conformance import TransportBackend
    from pybk.testing.transport_conformance import run_check as run_transport_check
    from pybk.transport.local import LocalTransport

_WHERE = {
    "HeldRequest": "pybk.testing.hooks",
    "HookedTransport": "pybk.testing.hooks",
    "Hooks": "pybk.testing.hooks",
    "Rule": "pybk.testing.hooks",
    "is_fencing": "pybk.testing.hooks",
    "is_normal_add": "pybk.testing.hooks",
    "is_recovery_add": "pybk.testing.hooks",
    "LocalTransport": "pybk.transport.local",
    "MemFileSystem": "pybk.storage.memfs",
    "Mutations": "pybk.testing.mutations",
    "SimCluster": "pybk.sim.cluster",
    "SimTestCluster": "pybk.testing.simulated",
    "assert_app_survives": "pybk.testing.simulated",
    "check_filesystem": "pybk.testing.fs_conformance",
    "TransportBackend": "pybk.testing.transport_conformance",
}
_RENAMED = {
    "TRANSPORT_CHECKS": ("pybk.testing.transport_conformance", "CHECKS"),
    "run_transport_check": ("pybk.testing.transport_conformance", "run_check"),
}

__all__ = [
    "TRANSPORT_CHECKS",
    "HeldRequest",
    "HookedTransport",
    "Hooks",
    "LocalTransport",
    "MemFileSystem",
    "Mutations",
    "Rule",
    "SimCluster",
    "SimTestCluster",
    "TransportBackend",
    "assert_app_survives",
    "check_filesystem",
    "is_fencing",
    "is_normal_add",
    "is_recovery_add",
    "run_transport_check",
]


def __getattr__(name: str) -> Any:
    module, attr = _RENAMED.get(name, (_WHERE.get(name), name))
    if module is None:
        raise AttributeError(f"module 'pybk.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
