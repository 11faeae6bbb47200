"""The names docs/api.md promises exist, with the shapes it promises (a rename breaks this test,
not users). Behaviour is tested elsewhere; this is the contract's table of contents."""

from __future__ import annotations

import builtins
import dataclasses
import inspect

import pybk
from pybk import sim, sync


def test_top_level_names() -> None:
    for name in ("Client", "LocalCluster", "LedgerEntry", "LedgerMetadata", "LedgerHandle",
                 "ReadHandle", "sync"):
        assert hasattr(pybk, name), name
    assert set(pybk.__all__) <= set(dir(pybk))
    assert hasattr(sim, "run") and hasattr(sim, "Faults")
    assert hasattr(sync, "LocalCluster")


def test_errors_are_one_hierarchy() -> None:
    for name in ("LedgerFencedError", "LedgerClosedError", "NoSuchLedgerError",
                 "NoSuchEntryError", "NotEnoughBookiesError", "DigestMismatchError",
                 "BookieUnavailableError", "UnauthorizedError", "CorruptRecordError",
                 "MetadataVersionError", "TimeoutError"):
        cls = getattr(pybk, name)
        assert issubclass(cls, pybk.BKError), name
    assert issubclass(pybk.TimeoutError, builtins.TimeoutError)


def _has_methods(cls: type, *names: str) -> None:
    missing = [n for n in names if not hasattr(cls, n)]
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_cluster_client_and_handles() -> None:
    _has_methods(pybk.LocalCluster, "client", "stop_bookie", "start_bookie", "add_bookie",
                 "bookie_dir", "bookie_ids", "__aenter__", "__aexit__")
    _has_methods(pybk.Client, "create_ledger", "open_ledger", "delete_ledger", "list_ledgers",
                 "__aenter__", "__aexit__")
    _has_methods(pybk.LedgerHandle, "append", "append_many", "close", "id", "metadata",
                 "last_add_pushed", "last_add_confirmed")
    _has_methods(pybk.ReadHandle, "read", "read_unconfirmed", "read_last_add_confirmed",
                 "read_last_add_confirmed_and_entry", "tail", "last_add_confirmed",
                 "is_closed")
    create = inspect.signature(pybk.Client.create_ledger).parameters
    for param, default in (("ensemble_size", 3), ("write_quorum", 2), ("ack_quorum", 2),
                           ("digest_type", "CRC32C"), ("password", b"")):
        assert create[param].default == default, param
    assert "custom_metadata" in create
    opened = inspect.signature(pybk.Client.open_ledger).parameters
    assert {"ledger_id", "password", "recovery"} <= set(opened)


def test_metadata_and_entry_fields() -> None:
    fields = {f.name for f in dataclasses.fields(pybk.LedgerMetadata)}
    assert {"ensemble_size", "write_quorum", "ack_quorum", "state", "last_entry_id", "length",
            "ensembles", "digest_type", "custom_metadata", "version"} <= fields
    entry = pybk.LedgerEntry(1, 2, b"x")
    assert (entry.ledger_id, entry.entry_id, entry.data) == (1, 2, b"x")


def test_log_mirror_names() -> None:
    from pybk.logs import Log, LogMirror, MirrorAccessError, MirrorError
    from pybk.ops import MirrorService
    from pybk.transport.base import Transport
    from pybk.transport.refusals import REFUSAL_KINDS, Refusal

    assert issubclass(MirrorAccessError, pybk.UnauthorizedError)
    assert issubclass(MirrorError, pybk.CorruptRecordError)
    _has_methods(LogMirror, "run", "drain", "resume_position", "source_position")
    _has_methods(MirrorService, "run", "drain")
    _has_methods(Transport, "refusals")
    assert isinstance(Log.client, property)
    err = MirrorAccessError("x", side="target")
    assert (err.side, err.refusals, err.kinds) == ("target", (), ("unauthorized",))
    assert Refusal._fields == ("bookie_id", "address", "kind", "detail", "at")
    assert set(REFUSAL_KINDS) == {"needs-tls", "no-tls", "tls-verify", "needs-token",
                                  "token-refused"}
