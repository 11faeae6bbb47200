"""Property tests: any metadata survives a store round trip; stores behave like a simple model.

The state machine drives the memory and SQLite stores with random create / CAS / delete /
read sequences (fresh and stale versions) and checks every outcome against a dict model.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pybk.errors import LedgerExistsError, MetadataVersionError, NoSuchLedgerError
from pybk.metadata.base import STATES, LedgerMetadata, MetadataStore
from pybk.metadata.memory import MemoryMetadataStore
from pybk.metadata.sqlite import SqliteMetadataStore

bookie_ids = st.text(alphabet="abcdefgh0123456789-:.", min_size=1, max_size=12)


@st.composite
def ledger_metadata(draw: st.DrawFn, ledger_id: int | None = None) -> LedgerMetadata:
    e = draw(st.integers(1, 5))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    starts = sorted(draw(st.sets(st.integers(0, 10**12), min_size=1, max_size=3)))
    ensembles = {
        s: tuple(draw(st.lists(bookie_ids, min_size=e, max_size=e))) for s in starts
    }
    return LedgerMetadata(
        ledger_id=draw(st.integers(0, 2**63 - 1)) if ledger_id is None else ledger_id,
        ensemble_size=e,
        write_quorum=qw,
        ack_quorum=qa,
        ensembles=ensembles,
        state=draw(st.sampled_from(STATES)),
        last_entry_id=draw(st.integers(-1, 2**62)),
        length=draw(st.integers(0, 2**62)),
        digest_type=draw(st.sampled_from(["CRC32C", "MAC", "DUMMY"])),
        password_hash=draw(st.binary(max_size=40)),
        custom_metadata=draw(st.dictionaries(st.text(max_size=8), st.binary(max_size=16),
                                             max_size=3)),
        # (0 is "not given": the store stamps its own, checked by the conformance suite)
        ctime_ms=draw(st.integers(1, 2**53)),
    )


def _memory(_: Path) -> MetadataStore:
    return MemoryMetadataStore()


def _sqlite(tmp: Path) -> MetadataStore:
    return SqliteMetadataStore(str(tmp / "props.db"), synchronous="OFF")


BACKENDS: dict[str, Callable[[Path], MetadataStore]] = {"memory": _memory, "sqlite": _sqlite}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_any_metadata_round_trips_through_the_store(backend: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        loop = asyncio.new_event_loop()
        store = BACKENDS[backend](Path(tmp))

        @settings(max_examples=60, derandomize=True, deadline=None)
        @given(md=ledger_metadata())
        def prop(md: LedgerMetadata) -> None:
            async def go() -> None:
                created = await store.create_ledger(md)
                read = await store.read_ledger(md.ledger_id)
                assert read == created
                assert read.with_changes(version=-1) == md
                await store.delete_ledger(md.ledger_id)

            loop.run_until_complete(go())

        try:
            prop()
        finally:
            loop.run_until_complete(store.close())
            loop.close()


class StoreMatchesModel(RuleBasedStateMachine):
    """Outcomes of random operations equal those of a dict model of CAS semantics."""

    make_store: Callable[[Path], MetadataStore] = _memory

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.loop = asyncio.new_event_loop()
        self.store = type(self).make_store(Path(self.tmp.name))
        self.model: dict[int, tuple[LedgerMetadata, int]] = {}
        self.old_versions: dict[int, list[int]] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def outcome(self, coro: Any) -> Any:
        try:
            return self.run(coro)
        except (LedgerExistsError, MetadataVersionError, NoSuchLedgerError) as exc:
            return type(exc)

    @rule(lid=st.integers(0, 4), data=st.data())
    def create(self, lid: int, data: st.DataObject) -> None:
        md = data.draw(ledger_metadata(ledger_id=lid))
        got = self.outcome(self.store.create_ledger(md))
        if lid in self.model:
            assert got is LedgerExistsError
        else:
            assert isinstance(got, LedgerMetadata)
            self.model[lid] = (md, got.version)

    @rule(lid=st.integers(0, 4), stale=st.booleans(), length=st.integers(0, 100))
    def cas(self, lid: int, stale: bool, length: int) -> None:
        if lid in self.model:
            md, version = self.model[lid]
            olds = self.old_versions.get(lid, [])
            use = olds[-1] if stale and olds else version
            got = self.outcome(self.store.write_ledger(md.with_changes(length=length), use))
            if use == version:
                assert isinstance(got, LedgerMetadata) and got.version != version
                self.old_versions.setdefault(lid, []).append(version)
                self.model[lid] = (md.with_changes(length=length), got.version)
            else:
                assert got is MetadataVersionError
        else:
            got = self.outcome(self.store.write_ledger(_placeholder(lid), 1))
            assert got is NoSuchLedgerError

    @rule(lid=st.integers(0, 4), with_version=st.booleans())
    def delete(self, lid: int, with_version: bool) -> None:
        version = self.model[lid][1] if with_version and lid in self.model else None
        got = self.outcome(self.store.delete_ledger(lid, version))
        if lid in self.model:
            assert got is None
            del self.model[lid]
        else:
            assert got is NoSuchLedgerError

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(sorted(self.model)))
        got = self.run(self.store.read_ledger(lid))
        md, version = self.model[lid]
        assert got.version == version
        assert got.with_changes(version=-1) == md

    @invariant()
    def listing_matches(self) -> None:
        assert self.run(self.store.list_ledgers()) == sorted(self.model)
        if isinstance(self.store, MemoryMetadataStore):
            self.store._check()

    def teardown(self) -> None:
        self.run(self.store.close())
        self.loop.close()
        self.tmp.cleanup()


def _placeholder(lid: int) -> LedgerMetadata:
    return LedgerMetadata(lid, 1, 1, 1, {0: ("b",)})


class MemoryMachine(StoreMatchesModel):
    make_store = _memory


class SqliteMachine(StoreMatchesModel):
    make_store = _sqlite


_machine_settings = settings(
    max_examples=25, stateful_step_count=25, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMemoryMatchesModel = MemoryMachine.TestCase
TestMemoryMatchesModel.settings = _machine_settings
TestSqliteMatchesModel = SqliteMachine.TestCase
TestSqliteMatchesModel.settings = _machine_settings
