"""The Transport conformance suite (pybk.testing.transport_conformance) on every transport
pybk ships: in process, TCP on loopback, the simulated network, and the simulated network as
an old client that sends single adds."""

from __future__ import annotations

import pytest

from pybk.testing import TRANSPORT_CHECKS as CHECKS
from pybk.testing import run_transport_check as run_check
from pybk.testing.transport_conformance import BACKENDS


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_transport_conformance(backend, check) -> None:  # type: ignore[no-untyped-def]
    run_check(backend, check)
