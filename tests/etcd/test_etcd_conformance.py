"""The whole metadata conformance suite (and its adversarial watch section) on a real etcd."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from pybk.testing.etcd import EtcdBackend, EtcdCluster
from pybk.testing.metadata_backends import MetadataBackend
from pybk.testing.metadata_conformance import CHECKS, run_check
from pybk.testing.watch_conformance import WATCH_CHECKS

Check = Callable[[MetadataBackend], Awaitable[None]]


@pytest.mark.integration
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
async def test_conformance(check: Check, etcd: EtcdCluster) -> None:
    await run_check(lambda: EtcdBackend(etcd.hosts), check)


@pytest.mark.integration
@pytest.mark.parametrize("check", WATCH_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
async def test_watch_conformance(check: Check, etcd: EtcdCluster) -> None:
    await run_check(lambda: EtcdBackend(etcd.hosts), check)
