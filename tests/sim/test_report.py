"""A failing seed's pictures: the timeline a person reads, rendered in a real browser."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from pybk import sim
from pybk.cli import main
from pybk.sim.report import FAULT_COLOR, VIOLATION_COLOR, write_report

#: a seed the rack mutation breaks (P1), with faults in its schedule
SEED, MUTATION = 8, "rack_plan_ignores_wrap"


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def _near(pixel: tuple[int, ...], rgb: tuple[int, int, int], tolerance: int = 40) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], rgb, strict=True))


def test_a_report_needs_the_history() -> None:
    r = sim.run(1, duration=5.0, faults=sim.Faults.none())
    with pytest.raises(ValueError, match="keep_history"):
        write_report(r, "/nonexistent")


@pytest.mark.timeout(180)
def test_the_timeline_shows_the_violation_and_the_faults_in_a_browser(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["simulate", "--seed", str(SEED), "--faults", "all",
                                       "--duration", "30", "--mutation", MUTATION,
                                       "--report", str(out)])
    assert result.exit_code == 1, result.output  # the seed fails, and says where its pictures are
    assert "pictures:" in result.output and f"report: {out / 'timeline.html'}" in result.output
    names = {p.name for p in out.iterdir()}
    assert {"timeline.html", "history.jsonl", "latency-raw.png", "latency-quantiles.png",
            "rate.png"} <= names
    events = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "fault" for e in events) and any(e["kind"] == "add_done"
                                                             for e in events)
    page = (out / "timeline.html").read_text()
    assert 'id="violation-0"' in page and "P1" in page
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser is not None, "make test installs Debian's chromium"
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1600,700", f"--screenshot={shot}",
                    (out / "timeline.html").as_uri()],
                   check=True, capture_output=True, timeout=120)
    image = Image.open(shot).convert("RGB")
    width, height = image.size

    def tallest_column(rgb: tuple[int, int, int], tolerance: int) -> int:
        """The most pixels of this colour in one column: a vertical mark, not text."""
        best = 0
        for x in range(width):
            n = 0
            for y in range(height):
                pixel = image.getpixel((x, y))
                if isinstance(pixel, tuple) and _near(pixel, rgb, tolerance):
                    n += 1
            best = max(best, n)
        return best

    red = tallest_column(_rgb(VIOLATION_COLOR), 40)
    gold = tallest_column(_rgb(FAULT_COLOR), 60)
    assert red > 150, f"the violation's mark is not on screen (tallest red column {red} px)"
    assert gold > 150, f"no fault band on screen (tallest fault-coloured column {gold} px)"
