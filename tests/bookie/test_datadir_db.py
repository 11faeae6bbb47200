"""Offline inspection of a db bookie's data directory (``pybk.bookie.inspect_db``, ``pybk
bookie inspect``): its checkpoint, every entry log verified row by row and body by body, the
journal after the checkpoint's mark; damage is a problem, a flush's leftover log is not."""

from __future__ import annotations

import json
import random
from pathlib import Path

from click.testing import CliRunner

from pybk.bookie import Bookie, BookieConfig
from pybk.bookie.inspect import inspect_data_dir
from pybk.cli import main
from pybk.storage import OsFileSystem
from pybk.wire import DigestManager, master_key

CONFIG = BookieConfig(disk_check_interval=0, checkpoint_interval=0, storage="db",
                      segment_size=1 << 16, scrub_rate=0)


async def _db_dir(tmp_path: Path, n: int = 30) -> str:
    """A stopped db bookie's directory: ``n`` entries of ledgers 1 and 2 flushed into entry
    logs (two flushes), ledger 2 fenced."""
    data = str(tmp_path / "b1")
    fs = OsFileSystem()
    bookie = Bookie("b1", data, fs=fs, config=CONFIG, rng=random.Random(1))
    await bookie.start()
    assert bookie.store is not None
    for lid in (1, 2):
        for eid in range(n):
            await bookie.add(lid, eid, master_key(b"pw"),
                             DigestManager(lid).frame(eid, eid - 1, 0, b"x" * 200))
        await bookie.store.checkpoint()
    await bookie.store.fence(2, master_key(b"pw"))
    await bookie.stop()
    fs.close()
    return data


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x10
    path.write_bytes(bytes(raw))


def _files(data: str) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in Path(data).rglob("*") if p.is_file()}


def _inspect(data: str):  # type: ignore[no-untyped-def]
    fs = OsFileSystem()
    try:
        return inspect_data_dir(fs, data)
    finally:
        fs.close()


async def test_a_sound_db_directory_is_reported_sound(tmp_path: Path) -> None:
    data = await _db_dir(tmp_path)
    before = _files(data)
    report = _inspect(data)
    assert report.ok, report.problems
    assert report.storage == "db" and report.checkpoint.state == "ok"
    assert [lg.state for lg in report.entry_logs] == ["ok"] * len(report.entry_logs)
    assert sum(lg.rows for lg in report.entry_logs) == 60 == report.entries
    assert report.ledgers == 2 and report.fenced == 1
    assert _files(data) == before
    result = CliRunner().invoke(main, ["bookie", "inspect", data])
    assert result.exit_code == 0, result.output
    assert "sound" in result.output and "entry log" in result.output


async def test_damage_in_an_entry_log_is_a_problem(tmp_path: Path) -> None:
    data = await _db_dir(tmp_path)
    logs = sorted((Path(data) / "entrylogs").glob("*.log"))
    _flip(logs[0], 1000)  # a body
    _flip(logs[-1].with_suffix(".idx"), 40)  # a row
    report = _inspect(data)
    assert not report.ok
    assert [lg.state for lg in report.entry_logs] == ["damaged"] * len(logs)
    assert [lg.damaged for lg in report.entry_logs] == [1, 1]
    result = CliRunner().invoke(main, ["bookie", "inspect", "--json", data])
    assert result.exit_code == 1
    doc = json.loads(result.output.splitlines()[0])
    assert doc["storage"] == "db" and not doc["ok"] and len(doc["problems"]) == 2


async def test_a_flush_leftover_is_noted_and_an_older_format_refused(tmp_path: Path) -> None:
    data = await _db_dir(tmp_path)
    logs = Path(data) / "entrylogs"
    (logs / "0000000000000099.log").write_bytes(b"half written")
    report = _inspect(data)
    assert report.ok, report.problems
    assert report.entry_logs[-1].state == "unnamed"
    path = Path(data) / "db-checkpoint"
    doc = json.loads(path.read_text())
    del doc["format"]
    path.write_text(json.dumps(doc))
    report = _inspect(data)
    assert not report.ok and "format 1" in report.problems[0]
