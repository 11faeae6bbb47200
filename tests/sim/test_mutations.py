"""The checker can fail: each deliberately broken build is caught by the CI seed sweep.

For every switch in :mod:`pybk.testing.mutations` the CI sweep's seeds are run in order until one
shows a *safety* violation (I12 liveness failures do not count: a broken build must be caught
by the invariant it breaks, not by a timeout), and the same seed without the switch must pass:
the violation is the broken build's, not the seed's. With no mutation the sweep finds none:
that is ``test_ci_sweep.py``.
"""

from __future__ import annotations

import pytest

from pybk.sim.sweep import CI_DURATION, CI_FAULTS, CI_SEEDS, find_violation, run_seed
from pybk.testing import mutations

SAFETY = {"L1", "L2", "L3", "L4", "L5", "L6", "L7", "L8", "L9", "I1", "I3", "I5", "I7", "I9",
          "I10", "I11", "I14", "R1", "R2"}


#: Where each broken build must show up.
EXPECTED = {
    mutations.ACK_BEFORE_FSYNC: {"I9", "I10", "I11", "L1"},
    mutations.RECOVERY_READS_DONT_FENCE: {"L1", "L8"},
    mutations.NO_SUCH_ENTRY_ON_IO_ERROR: {"I9", "L1"},
    mutations.ACK_OUT_OF_ORDER: {"L6"},
    mutations.DELTA_SKIPS_LEDGER_STATE: {"I14"},
    mutations.ENSEMBLE_BEFORE_COPY_DURABLE: {"R1", "R2"},
}


def test_every_switch_has_its_expected_invariants() -> None:
    assert set(EXPECTED) == mutations.KNOWN
    assert all(expected <= SAFETY for expected in EXPECTED.values())


@pytest.mark.parametrize("mutation", sorted(mutations.KNOWN))
def test_sweep_catches_mutation(mutation: str) -> None:
    found = find_violation(list(CI_SEEDS)[:60], mutations=(mutation,),
                           invariants=EXPECTED[mutation])
    assert found is not None, f"{mutation}: no seed of the first 60 CI seeds caught it"
    caught = set(found.invariants) & EXPECTED[mutation]
    assert caught, f"{mutation}: seed {found.seed} violated {found.invariants} only"
    print(f"{mutation}: caught by seed {found.seed} ({', '.join(found.invariants)})")
    clean = run_seed(found.seed, CI_FAULTS, CI_DURATION, None, ())
    assert clean.ok, f"seed {found.seed} fails without {mutation} too: {clean.invariants}"
