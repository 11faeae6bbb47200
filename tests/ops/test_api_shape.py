"""The Operations names and shapes API.md promises (a rename breaks this test, not users)."""

from __future__ import annotations

import dataclasses
import inspect

import pybk
from pybk.ops import BookieInfo


def test_cluster_takes_autorecovery_and_racks() -> None:
    params = inspect.signature(pybk.LocalCluster).parameters
    assert params["autorecovery"].default is False
    assert {"racks", "autorecovery_config", "metrics"} <= set(params)
    assert {"rack", "group"} <= set(inspect.signature(pybk.LocalCluster.add_bookie).parameters)
    assert "groups" in params


def test_admin_methods() -> None:
    admin = pybk.Client("memory://").admin()
    for name in ("list_bookies", "under_replicated", "recover_bookie", "decommission_bookie",
                 "trigger_audit", "enable_autorecovery", "disable_autorecovery",
                 "autorecovery_status", "set_lost_bookie_recovery_delay", "bookie_info"):
        assert inspect.iscoroutinefunction(getattr(admin, name)), name
    assert {f.name for f in dataclasses.fields(BookieInfo)} == {"id", "address", "state",
                                                                 "rack", "group"}


def test_placement_and_auto_recovery_names() -> None:
    assert issubclass(pybk.RackAwarePlacementPolicy, pybk.PlacementPolicy)
    assert issubclass(pybk.DefaultPlacementPolicy, pybk.PlacementPolicy)
    assert issubclass(pybk.RegionAwarePlacementPolicy, pybk.RackAwarePlacementPolicy)
    assert "min_regions" in inspect.signature(pybk.RegionAwarePlacementPolicy).parameters
    params = inspect.signature(pybk.RackAwarePlacementPolicy).parameters
    assert {"min_racks_per_write_quorum", "strict", "racks", "local_rack"} <= set(params)
    assert pybk.ClientConfig().placement.__class__ is pybk.DefaultPlacementPolicy
    assert pybk.AutoRecoveryConfig().lost_bookie_recovery_delay == 0.0
    assert "metrics" in inspect.signature(pybk.Client).parameters
