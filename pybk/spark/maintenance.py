"""Cleaning up after Spark drivers that died: jobs left open, with their ledgers."""

from __future__ import annotations

import pybk
from pybk.spark import jobs
from pybk.spark.driver import now_ms

__all__ = ["sweep_jobs"]


def sweep_jobs(metadata: str, *, older_than: float = 86_400.0) -> dict[str, list[int]]:
    """Abort every ``pybk`` write job that began more than ``older_than`` seconds ago and is
    still open (its driver died between starting it and committing or aborting it), and
    delete every ledger its tasks made that is not a segment of its log. Returns
    {job: ledger ids deleted}. Jobs still running that long are aborted too (their commit
    then fails): pick an age above your longest job. Runs in this process (no Spark)."""
    import asyncio

    if older_than < 0:
        raise ValueError(f"older_than must be >= 0 seconds, got {older_than}")

    async def go() -> dict[str, list[int]]:
        async with pybk.Client(metadata) as client:
            return await jobs.sweep_stale_jobs(client, int(older_than * 1000), now_ms())

    return asyncio.run(go())
