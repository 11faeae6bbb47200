"""What users install: the wheel (and the sdist it was built from) hold every file of the
package, the installed pybk is the wheel's, and its version is the same everywhere.

``make test`` builds both (``python -m build``) and runs the suite in a venv where the wheel is
installed, with ``PYBK_WHEEL`` and ``PYBK_SDIST`` naming the files. Without them (a run from
the source tree) the tests that need them are skipped."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import pybk

CHECKOUT = Path(__file__).resolve().parents[1]
WHEEL = os.environ.get("PYBK_WHEEL")
SDIST = os.environ.get("PYBK_SDIST")
needs_wheel = pytest.mark.skipif(not WHEEL, reason="PYBK_WHEEL not set (not a wheel run)")


def package_files() -> set[str]:
    """Every file of the source tree's pybk/ (not caches), as paths like ``pybk/x/y.py``."""
    root = CHECKOUT / "pybk"
    return {p.relative_to(CHECKOUT).as_posix() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@needs_wheel
def test_pybk_is_imported_from_the_installed_wheel_not_the_checkout() -> None:
    installed = Path(pybk.__file__).resolve().parent
    assert installed.parent == Path(sysconfig.get_paths()["purelib"]).resolve(), installed
    assert installed != (CHECKOUT / "pybk").resolve()  # (venvs may live inside the checkout)
    direct = json.loads(importlib.metadata.distribution("pybk").read_text("direct_url.json")
                        or "{}")
    assert direct.get("url", "").endswith(".whl"), direct  # a wheel, not a directory (editable)


@needs_wheel
def test_the_wheel_holds_every_file_of_the_package() -> None:
    assert WHEEL is not None
    with zipfile.ZipFile(WHEEL) as whl:
        names = set(whl.namelist())
    missing = sorted(package_files() - names)
    assert not missing, f"not in the wheel: {missing}"
    assert "pybk/py.typed" in names


@needs_wheel
def test_the_sdist_holds_every_file_of_the_package_and_the_build_files() -> None:
    assert SDIST is not None
    with tarfile.open(SDIST) as tar:
        top = tar.getnames()[0].split("/")[0]
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert top == f"pybk-{pybk.__version__}"
    missing = sorted((package_files() | {"setup.cfg", "pyproject.toml", "README.md"}) - names)
    assert not missing, f"not in the sdist: {missing}"


@needs_wheel
def test_the_installed_files_match_the_source_tree() -> None:
    """Nothing was left out of the install, and nothing stale came with it."""
    dist = importlib.metadata.distribution("pybk")
    installed = {str(f) for f in dist.files or () if str(f).startswith("pybk/")
                 and "__pycache__" not in str(f)}
    assert installed == package_files()


def test_versions_agree() -> None:
    """``pybk.__version__``, the installed distribution's metadata and ``pybk --version``."""
    assert importlib.metadata.version("pybk") == pybk.__version__
    if WHEEL:
        assert Path(WHEEL).name.startswith(f"pybk-{pybk.__version__}-py3-none-any")
    exe = Path(sys.executable).with_name("pybk")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "pybk"]
    out = subprocess.run([*cmd, "--version"], check=True, capture_output=True, text=True,
                         timeout=60).stdout
    assert pybk.__version__ in out.split(), out


def test_the_entry_points_are_installed() -> None:
    """The CLI and the pytest plugin (``sim_cluster`` and friends) are found by name."""
    eps = importlib.metadata.distribution("pybk").entry_points
    found = {(ep.group, ep.name): ep.value for ep in eps}
    assert found[("console_scripts", "pybk")] == "pybk.cli:main"
    assert found[("pytest11", "pybk")] == "pybk.testing.pytest_plugin"
    for ep in eps:
        if ep.group in ("console_scripts", "pytest11"):
            assert ep.load() is not None
