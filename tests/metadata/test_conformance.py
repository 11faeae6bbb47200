"""The backend conformance suite (pybk.testing.metadata_conformance) on every backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from pybk.testing.metadata_backends import MemoryBackend, MetadataBackend, SqliteBackend
from pybk.testing.metadata_conformance import CHECKS, conformance_test, run_check

Check = Callable[[MetadataBackend], Awaitable[None]]

# the packaged one-liner users write for their own backend
test_memory = conformance_test(MemoryBackend)
test_sqlite = conformance_test(SqliteBackend)


@pytest.mark.integration
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
async def test_zookeeper(check: Check, zk_backend_factory: Callable[[], MetadataBackend]) -> None:
    await run_check(zk_backend_factory, check)
