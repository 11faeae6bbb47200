"""A bookie's files are its owner's alone (issue 34, item 9): metadata.db holds every
ledger's master key (anyone who reads it can forge adds and fences), the data files hold the
entries and keys too. Created 0600 (directories 0700) whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from abuse_kit import BookieUnderTest

from pybk.client import Client

pytestmark = pytest.mark.integration


def _modes(root: Path) -> dict[str, int]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


async def test_metadata_and_data_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        bookie = await BookieUnderTest(tmp_path / "root").astart()
    finally:
        os.umask(old)
    try:
        async with Client(bookie.metadata) as client:
            lh = await client.create_ledger(1, 1, 1, password=b"pw")
            await lh.append(b"secret")
            await lh.close()
        modes = _modes(tmp_path / "root")
        assert stat.S_IMODE(os.stat(tmp_path / "root" / "metadata.db").st_mode) == 0o600
        data = [p for p in modes if p.startswith("bookies/")]
        assert len(data) > 3, data  # the data directory, its journal and cookie
        for path, mode in modes.items():
            if path.startswith(("logs/", "run/")):
                continue  # (the directories holding them are private)
            assert mode & 0o077 == 0, (path, oct(mode))
    finally:
        bookie.stop()


def test_an_existing_world_readable_metadata_file_is_tightened(tmp_path: Path) -> None:
    import asyncio

    from pybk.metadata import open_store

    db = tmp_path / "metadata.db"
    db.touch(mode=0o644)
    os.chmod(db, 0o644)

    async def use() -> None:
        store = open_store(f"sqlite://{db}")
        await store.list_ledgers()
        await store.close()

    asyncio.run(use())
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
