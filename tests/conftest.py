"""How the suite is shared between pytest-xdist's processes (``make test`` runs two with
``--dist loadgroup``): a test file to one process at a time, so its module fixtures (a
ZooKeeper server, a cluster) are made once; and every Spark test file to the same one, so
two JVMs never compete for the two cores (a streaming test's progress bound is about Spark,
not about sharing the machine with a second Spark)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = "spark" if path.startswith("tests/spark/") else path
        item.add_marker(pytest.mark.xdist_group(group))
