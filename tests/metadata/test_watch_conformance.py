"""The adversarial watch section of the conformance suite on every backend, ZooKeeper included."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from pybk.testing.metadata_backends import MemoryBackend, MetadataBackend, SqliteBackend
from pybk.testing.metadata_conformance import run_check
from pybk.testing.watch_conformance import WATCH_CHECKS, watch_conformance_test

Check = Callable[[MetadataBackend], Awaitable[None]]

test_memory = watch_conformance_test(MemoryBackend)
test_sqlite = watch_conformance_test(SqliteBackend)


@pytest.mark.integration
@pytest.mark.parametrize("check", WATCH_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
async def test_zookeeper(check: Check, zk_backend_factory: Callable[[], MetadataBackend]) -> None:
    await run_check(zk_backend_factory, check)
