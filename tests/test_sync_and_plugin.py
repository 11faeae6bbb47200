"""``pybk.sync`` as a new user meets it (the handles' methods, their docs and reprs), and the
pytest plugin in a fresh project, with and without pytest-asyncio."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest

import pybk
from pybk import sync


def test_sync_handles_read_back_and_say_what_they_are(sync_local_cluster):
    cluster = sync_local_cluster()
    assert repr(cluster).startswith("<pybk.sync <pybk.LocalCluster ")
    client = cluster.client()
    assert "pybk.Client" in repr(client)
    lh = client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    assert (lh.length, lh.is_closed, lh.last_add_confirmed) == (0, False, -1)
    assert lh.append_many([b"ab", b"cde"]) == [0, 1]
    assert [e.data for e in lh.read(0, 1)] == [b"ab", b"cde"]
    assert lh.length == 5
    with pytest.raises(pybk.EntryNotConfirmedError, match="last add confirmed is 1"):
        lh.read(0, 2)
    assert repr(lh) == f"<pybk.sync.LedgerHandle {lh.id} lac=1 lap=1 open>"
    lh.close()
    assert lh.is_closed and repr(lh).endswith("closed>")
    with client.open_ledger(lh.id) as rh:
        assert (rh.is_closed, rh.length, rh.last_add_confirmed) == (True, 5, 1)
        assert repr(rh) == f"<pybk.sync.ReadHandle {lh.id} lac=1 closed>"
        assert [e.data for e in rh.read(1, 1)] == [b"cde"]


def test_every_public_sync_method_says_what_it_does():
    missing = []
    for cls in (sync.LocalCluster, sync.Client, sync.LedgerHandle, sync.ReadHandle):
        assert cls.__doc__, cls.__name__
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            target = member.fget if isinstance(member, property) else member
            if callable(target) and not inspect.getdoc(target):
                missing.append(f"{cls.__name__}.{name}")
    assert missing == []
    for cls in (sync.LocalCluster, sync.Client, sync.LedgerHandle, sync.ReadHandle):
        assert "__repr__" in vars(cls), cls.__name__


_SYNC_TESTS = '''
def test_sync_cluster(sync_local_cluster):
    client = sync_local_cluster(bookies=3).client()
    lh = client.create_ledger()
    lh.append(b"x")
    assert lh.read(0, 0)[0].data == b"x"
    lh.close()


def test_sim(sim_cluster):
    async def scenario(cluster):
        lh = await cluster.client("app").create_ledger(3, 2, 2)
        return await lh.append(b"y")

    assert sim_cluster.run(scenario) == 0
'''

_ASYNC_TEST = '''
import pytest


{mark}
async def test_async_cluster(local_cluster):
    async with local_cluster(bookies=3) as cluster:
        lh = await cluster.client().create_ledger()
        assert await lh.append(b"z") == 0
        await lh.close()
'''


def _run_project(tmp_path, ini: str, files: dict[str, str], *args: str):
    (tmp_path / "pytest.ini").write_text("[pytest]\n" + textwrap.dedent(ini))
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.integration
def test_plugin_in_a_project_without_pytest_asyncio(tmp_path):
    out = _run_project(tmp_path, "", {"test_mine.py": _SYNC_TESTS}, "-p", "no:asyncio")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed" in out.stdout


@pytest.mark.integration
@pytest.mark.parametrize("mode, mark", [("auto", ""), ("strict", "@pytest.mark.asyncio")])
def test_plugin_in_a_project_with_pytest_asyncio(tmp_path, mode, mark):
    pytest.importorskip("pytest_asyncio")
    files = {"test_mine.py": _SYNC_TESTS, "test_async.py": _ASYNC_TEST.format(mark=mark)}
    out = _run_project(tmp_path, f"asyncio_mode = {mode}\n", files)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 passed" in out.stdout


def test_the_example_of_docs_api_md_runs(sync_local_cluster):
    """docs/api.md's testing example, as written there."""
    cluster = sync_local_cluster(bookies=4)
    client = cluster.client()
    lh = client.create_ledger(3, 3, 2)
    lh.append(b"before")
    cluster.stop_bookie(lh.metadata.ensembles[0][0])
    lh.append(b"after")                  # the writer replaces the stopped bookie
    assert [e.data for e in lh.read(0, 1)] == [b"before", b"after"]


@pytest.mark.integration
def test_type_checkers_see_the_installed_package(tmp_path):
    """mypy in a project of its own, against this environment's pybk (the Makefile's
    editable install): it must find pybk and its types, not "Cannot find implementation"."""
    pytest.importorskip("mypy")
    (tmp_path / "app.py").write_text(textwrap.dedent('''
        import pybk

        def confirmed(lh: pybk.LedgerHandle) -> int:
            return lh.last_add_confirmed

        cluster: str = pybk.sync.LocalCluster("/tmp/x")
    '''))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", sys.executable,
         "--no-incremental", "--strict", "app.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert "import-not-found" not in out.stdout and "import-untyped" not in out.stdout, out.stdout
    # the one deliberate mistake is found: mypy read pybk's own annotations
    assert out.stdout.count("error:") == 1, out.stdout
    assert 'expression has type "LocalCluster", variable has type "str"' in out.stdout
