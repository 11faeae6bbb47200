"""What the metadata conformance checks share: a sample ledger metadata with every field set,
bounded waits for a condition or an event (AssertionError naming what was awaited, never a
hang), and an "it must raise" helper. Tests of metadata users poll with :func:`wait_until` too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pybk.metadata.base import LedgerMetadata

__all__ = ["raises", "same_metadata", "sample_metadata", "wait_event", "wait_until"]


def sample_metadata(ledger_id: int, **changes: object) -> LedgerMetadata:
    """Metadata with every field set to something non-default."""
    md = LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles={0: ("bk-1", "bk-2", "bk-3"), 17: ("bk-1", "bk-4", "bk-3")},
        digest_type="MAC",
        password_hash=b"\x00\xffsecret-hash",
        custom_metadata={"app": b"\x01\x02", "name": b"ledger"},
        ctime_ms=1_700_000_000_123,
        master_key=bytes(range(32)),
        mac_key=bytes(range(32, 64)),
    )
    return md.with_changes(**changes) if changes else md


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], bound: float, what: str
) -> None:
    """Poll ``predicate`` until it holds; AssertionError naming ``what`` after ``bound`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {bound}s waiting for {what}")
        await asyncio.sleep(0.01)


async def wait_event(event: asyncio.Event, bound: float, what: str) -> None:
    """Wait for ``event``; AssertionError naming ``what`` after ``bound`` s."""
    try:
        await asyncio.wait_for(event.wait(), bound)
    except TimeoutError:
        raise AssertionError(f"timed out after {bound}s waiting for {what}") from None


def same_metadata(a: LedgerMetadata, b: LedgerMetadata) -> bool:
    """The same metadata but for the version (the store sets that)."""
    return a.with_changes(version=-1) == b.with_changes(version=-1)


async def raises(
    exc: type[BaseException], call: Callable[[], Awaitable[object]], what: str
) -> None:
    """Await ``call()``: it must raise ``exc`` (AssertionError naming ``what`` if not)."""
    try:
        await call()
    except exc:
        return
    raise AssertionError(f"{what} did not raise {exc.__name__}")
