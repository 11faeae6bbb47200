"""A conformance suite any :class:`~pybk.metadata.base.MetadataStore` implementation can run.

In the spirit of ``trio.testing.check_two_way_stream``: you describe how to reach your backend
with a :class:`MetadataBackend` (open another client on the same store, make a client's owner
vanish, damage stored bytes), and :func:`run_check` / :func:`run_all` exercise the contract:
CAS conflicts, the update loop under concurrent updaters, unique ids under concurrency,
watches, ephemeral registrations, read-only flag, cookies, under-replication marks, the
serialization round trip including corrupt bytes, and the key/value namespace (create, CAS,
delete, versions never reused, listing by prefix, watches, the update loop).

Typical pytest use::

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
    async def test_conformance(check, my_backend):
        await check(my_backend)

Each check is independent and expects a backend whose store starts empty. The checks live by
topic beside this module (``metadata_*_checks``), the backends in :mod:`.metadata_backends`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pybk.testing.metadata_backends import (
    DEFAULT_BOUND,
    MemoryBackend,
    MetadataBackend,
    SqliteBackend,
    ZooKeeperBackend,
)
from pybk.testing.metadata_coordination_checks import (
    check_election_has_one_leader_and_fails_over,
    check_lock_vanishes_with_its_owner,
    check_locks_are_exclusive_and_released,
)
from pybk.testing.metadata_helpers import sample_metadata, wait_until
from pybk.testing.metadata_ledger_checks import (
    check_bad_arguments_are_value_errors,
    check_cas_conflict,
    check_corrupt_metadata_is_an_error,
    check_create_read_round_trip,
    check_create_records_the_creation_time,
    check_delete_and_list,
    check_id_allocation_unique_under_concurrency,
    check_the_largest_ledger_id,
    check_update_loop_under_concurrent_updaters,
)
from pybk.testing.metadata_registration_checks import (
    check_clean_close_unregisters,
    check_cookies,
    check_read_only_flag,
    check_registration_carries_its_rack,
    check_registration_vanishes_with_its_owner,
    check_under_replication_marks,
    check_under_replication_marks_clear_only_what_was_repaired,
)
from pybk.testing.metadata_value_checks import (
    check_values_bad_arguments,
    check_values_create_read_cas,
    check_values_list_by_prefix,
    check_values_update_loop_under_concurrent_updaters,
)
from pybk.testing.metadata_watch_checks import (
    check_sync_watches_establishes_every_watch,
    check_values_watch,
    check_watch_bookies_fires_on_membership_change,
    check_watch_ledger_fires_on_change_and_delete,
    check_watches_fire_for_changes_made_through_the_same_store,
)
from pybk.testing.tenancy_conformance import TENANCY_CHECKS

__all__ = [
    "CHECKS",
    "DEFAULT_BOUND",
    "MemoryBackend",
    "MetadataBackend",
    "SqliteBackend",
    "ZooKeeperBackend",
    "check_bad_arguments_are_value_errors",
    "check_cas_conflict",
    "check_clean_close_unregisters",
    "check_cookies",
    "check_corrupt_metadata_is_an_error",
    "check_create_read_round_trip",
    "check_create_records_the_creation_time",
    "check_delete_and_list",
    "check_id_allocation_unique_under_concurrency",
    "check_read_only_flag",
    "check_registration_vanishes_with_its_owner",
    "check_sync_watches_establishes_every_watch",
    "check_the_largest_ledger_id",
    "check_under_replication_marks",
    "check_update_loop_under_concurrent_updaters",
    "check_values_bad_arguments",
    "check_values_create_read_cas",
    "check_values_list_by_prefix",
    "check_values_update_loop_under_concurrent_updaters",
    "check_values_watch",
    "check_watch_bookies_fires_on_membership_change",
    "check_watch_ledger_fires_on_change_and_delete",
    "check_watches_fire_for_changes_made_through_the_same_store",
    "conformance_test",
    "run_all",
    "run_check",
    "sample_metadata",
    "wait_until",
]


CHECKS: list[Callable[[MetadataBackend], Awaitable[None]]] = [
    check_create_read_round_trip, check_create_records_the_creation_time, check_cas_conflict,
    check_update_loop_under_concurrent_updaters, check_delete_and_list,
    check_id_allocation_unique_under_concurrency, check_the_largest_ledger_id,
    check_watch_ledger_fires_on_change_and_delete,
    check_watch_bookies_fires_on_membership_change, check_read_only_flag,
    check_registration_vanishes_with_its_owner, check_clean_close_unregisters, check_cookies,
    check_under_replication_marks, check_under_replication_marks_clear_only_what_was_repaired,
    check_registration_carries_its_rack, check_locks_are_exclusive_and_released,
    check_lock_vanishes_with_its_owner, check_election_has_one_leader_and_fails_over,
    check_corrupt_metadata_is_an_error, check_bad_arguments_are_value_errors,
    check_values_create_read_cas, check_values_update_loop_under_concurrent_updaters,
    check_values_list_by_prefix, check_values_watch,
    check_watches_fire_for_changes_made_through_the_same_store, check_values_bad_arguments,
    check_sync_watches_establishes_every_watch,
    *TENANCY_CHECKS,  # tenants and namespaces (pybk.testing.tenancy_conformance)
]


async def run_check(
    make_backend: Callable[[], MetadataBackend],
    check: Callable[[MetadataBackend], Awaitable[None]],
) -> None:
    """Run one check on a fresh backend and clean it up afterwards."""
    backend = make_backend()
    try:
        await check(backend)
        await backend.check_invariants()
    finally:
        await backend.cleanup()


async def run_all(make_backend: Callable[[], MetadataBackend]) -> None:
    """Run every check, each on a fresh backend."""
    for check in CHECKS:
        await run_check(make_backend, check)


def conformance_test(
    make_backend: Callable[[], MetadataBackend],
) -> Callable[..., Awaitable[None]]:
    """A pytest test (parametrized over :data:`CHECKS`) for a backend that needs no fixture::

        test_my_store = conformance_test(MyBackend)

    Needs pytest-asyncio (or another runner for ``async def`` tests).
    """
    import pytest

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
    async def test_metadata_conformance(
        check: Callable[[MetadataBackend], Awaitable[None]],
    ) -> None:
        await run_check(make_backend, check)

    return test_metadata_conformance
