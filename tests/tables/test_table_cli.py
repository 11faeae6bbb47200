"""``pybk cluster up --tables`` (bookie processes and a table server), the official client
against it, and the ``pybk table`` commands on the same tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pybk.cli import main

bk_admin = pytest.importorskip("bookkeeper.admin")
bk_kv = pytest.importorskip("bookkeeper.kv")

from bookkeeper.types import StorageClientSettings  # noqa: E402

pytestmark = pytest.mark.integration


def _pybk(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True,
                          text=True, env=env, timeout=180)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    root = tmp_path_factory.mktemp("tables") / "c"
    up = _pybk("cluster", "up", "--root", str(root), "--bookies", "3", "--tables",
               "--tables-port", "0")
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((root / "cluster.json").read_text())
        yield up.stdout.strip(), state["tables"]["address"]
    finally:
        down = _pybk("cluster", "down", "--root", str(root))
        assert down.returncode == 0, down.stderr
        assert "table server" in down.stderr


def _cli(uri: str, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["table", *args], env={"PYBK_METADATA": uri})
    return r.exit_code, r.stdout, r.stderr


def test_cluster_up_tables_serves_the_official_client(cluster: tuple[str, str]) -> None:
    uri, address = cluster
    settings = StorageClientSettings(service_uri=f"bk://{address}")
    bk_admin.Client(storage_client_settings=settings).namespaces().create("shop")
    bk_admin.Client(storage_client_settings=settings).namespace("shop").create("carts")
    tbl = bk_kv.Client(storage_client_settings=settings, namespace="shop").table("carts")
    tbl.put_str("alice", "3 apples")
    tbl.incr_str("orders", 2)
    # the shell sees what the client wrote (taking the ranges over for the command) ...
    code, out, err = _cli(uri, "get", "shop/carts", "alice")
    assert code == 0, err
    assert json.loads(out)["value"] == "3 apples"
    assert _cli(uri, "incr", "shop/carts", "orders", "5")[1].strip() == "7"
    assert _cli(uri, "put", "shop/carts", "bob", "1 pear")[0] == 0
    # ... and the server, taking them back on its next request, sees what the shell wrote
    assert tbl.get_str("bob").value == b"1 pear"
    assert tbl.get_str("orders").number_value == 7
    code, out, _ = _cli(uri, "scan", "shop/carts")
    assert [json.loads(line)["key"] for line in out.splitlines()] == ["alice", "bob", "orders"]
    assert _cli(uri, "list")[1].split() == ["shop"]
    assert _cli(uri, "list", "shop")[1].split() == ["carts"]
    assert _cli(uri, "del", "shop/carts", "bob")[1].strip() == "true"


def test_table_commands_and_their_errors(cluster: tuple[str, str]) -> None:
    uri, _ = cluster
    code, out, err = _cli(uri, "create", "kv", "--ranges", "2")
    assert code == 0, err
    assert int(out) >= 1024
    code, _, err = _cli(uri, "create", "kv")
    assert code == 1 and "TableExistsError" in err
    code, _, err = _cli(uri, "get", "kv", "missing")
    assert code == 1 and "no key" in err
    code, _, err = _cli(uri, "get", "nope/kv", "k")
    assert code == 1 and "NamespaceNotFoundError" in err
    code, _, err = _cli(uri, "put", "kv", "k", "v")
    assert code == 0
    code, _, err = _cli(uri, "incr", "kv", "k", "1")
    assert code == 1 and "TableBadRequestError" in err
    code, _, err = _cli(uri, "create", "bad name!")
    assert code == 1 and "bad table name" in err
    assert _cli(uri, "delete", "kv")[0] == 0
    code, _, err = _cli(uri, "get", "kv", "k")
    assert code == 1 and "TableNotFoundError" in err


def test_serve_needs_one_source() -> None:
    r = CliRunner().invoke(main, ["table", "serve"])
    assert r.exit_code == 2 and "--metadata URI or --path DIR" in r.output
