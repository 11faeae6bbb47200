"""pybk's processes and clusters on etcd metadata: ``pybk cluster up --metadata etcd://``,
``LocalCluster(metadata="etcd://...")``, and auto-recovery (under-replication marks,
the auditor's election and the workers' locks live in etcd)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from ops_kit import lost_bookie_is_re_replicated

from pybk import LocalCluster
from pybk.cli import main
from pybk.metadata import open_store
from pybk.testing.etcd import EtcdCluster

pytestmark = pytest.mark.integration

_roots = itertools.count()


def _pybk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})},
                          check=False)


async def test_a_killed_and_wiped_bookie_is_re_replicated_on_etcd(
        tmp_path: Path, etcd: EtcdCluster) -> None:
    await lost_bookie_is_re_replicated(tmp_path, etcd.uri(f"/ar-{next(_roots)}"))


def test_cluster_up_with_etcd_metadata(tmp_path: Path, etcd: EtcdCluster) -> None:
    root = tmp_path / "c"
    uri = etcd.uri(f"/up-{next(_roots)}")
    runner = CliRunner()
    env = {"PYBK_METADATA": uri}

    def listed() -> list[str]:
        r = runner.invoke(main, ["bookie", "list", "--json"], env=env)
        assert r.exit_code == 0, r.output
        return [json.loads(x)["bookie_id"] for x in r.stdout.splitlines()]

    up = _pybk("cluster", "up", "--root", str(root), "--bookies", "2", "--metadata", uri)
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == uri
        assert json.loads((root / "cluster.json").read_text())["metadata"] == uri
        assert listed() == ["bookie-1", "bookie-2"]
        r = runner.invoke(main, ["ledger", "append", "--ensemble", "2", "--write-quorum", "2",
                                 "--ack-quorum", "2", "alpha", "beta"], env=env)
        assert r.exit_code == 0, r.output
        lid = r.stdout.split()[0]
        r = runner.invoke(main, ["ledger", "read", lid], env=env)
        assert r.stdout == "0\talpha\n1\tbeta\n", r.output
    finally:
        down = _pybk("cluster", "down", "--root", str(root))
    assert down.returncode == 0, down.stderr
    assert listed() == []  # a clean stop revokes the leases at once


def test_cluster_up_refuses_metadata_bookie_processes_cannot_share(tmp_path: Path) -> None:
    for bad, words in (("memory://", "cannot share"), ("etcd://h:1", "etcd://host:port")):
        r = CliRunner().invoke(main, ["cluster", "up", "--root", str(tmp_path / "c"),
                                      "--metadata", bad])
        assert r.exit_code == 2 and words in r.output, r.output


async def test_local_cluster_on_etcd(tmp_path: Path, etcd: EtcdCluster) -> None:
    uri = etcd.uri(f"/local-{next(_roots)}")
    async with LocalCluster(tmp_path, 3, metadata=uri) as cluster:
        client = cluster.client()
        lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        for i in range(20):
            await lh.append(b"r%d" % i)
        await lh.close()
        await cluster.stop_bookie(lh.metadata.ensembles[0][0])
        rh = await client.open_ledger(lh.id)
        assert [e.data for e in await rh.read(0, 19)] == [b"r%d" % i for i in range(20)]
    store = open_store(uri)
    try:
        assert (await store.read_ledger(lh.id)).is_closed
        assert await store.list_bookies() == []
    finally:
        await store.close()
