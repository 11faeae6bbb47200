"""``pybk tenant ...`` and ``pybk namespace ...`` on a SQLite metadata store: the records,
updates that keep what they do not name, refusals with one line and exit 1, bad flags exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

import pybk
from pybk.cli import main


def _store(tmp_path: Path) -> dict[str, str]:
    uri = f"sqlite://{tmp_path / 'md.db'}"
    with pybk.sync.Client(uri) as client:  # (commands refuse a database that does not exist)
        client.namespace().list_logs()
    return {"PYBK_METADATA": uri}


def _pybk(env: dict[str, str], *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == code, (args, result.output)
    return result


def test_tenants_and_namespaces_from_the_shell(tmp_path: Path) -> None:
    env = _store(tmp_path)
    made = json.loads(_pybk(env, "tenant", "create", "acme", "--max-logs", "5").stdout)
    assert made["name"] == "acme" and made["policies"]["max_logs"] == 5
    ns = json.loads(_pybk(env, "namespace", "create", "acme/orders", "--isolation-group", "g1",
                          "--write-bytes-per-s", "1048576").stdout)
    assert ns["policies"]["isolation_group"] == "g1" and ns["policies"]["max_logs"] == 5
    assert json.loads(_pybk(env, "tenant", "list").stdout) == ["acme"]
    assert json.loads(_pybk(env, "namespace", "list", "--tenant", "acme").stdout) == [
        "acme/orders"]
    updated = json.loads(_pybk(env, "namespace", "update", "acme/orders",
                               "--placement", "region-aware").stdout)
    assert updated["policies"]["placement"] == "region-aware"
    assert updated["policies"]["isolation_group"] == "g1"  # what the update did not name
    tiered = json.loads(_pybk(env, "namespace", "update", "acme/orders", "--offload-url",
                              f"file://{tmp_path}/tier", "--offload-threshold-bytes",
                              "1000000").stdout)["policies"]
    assert (tiered["offload_url"], tiered["offload_threshold_bytes"]) == (
        f"file://{tmp_path}/tier", 1000000)
    with pybk.sync.Client(env["PYBK_METADATA"]) as client:
        client.namespace("acme/orders").create_log("events")
    shown = json.loads(_pybk(env, "namespace", "show", "acme/orders").stdout)
    assert shown["logs"] == ["events"]
    assert json.loads(_pybk(env, "tenant", "show", "acme").stdout)["namespaces"] == [
        "acme/orders"]
    refused = _pybk(env, "namespace", "delete", "acme/orders", code=1)
    assert "NotEmptyError" in refused.output and "events" in refused.output
    refused = _pybk(env, "tenant", "delete", "acme", code=1)
    assert "NotEmptyError" in refused.output
    _pybk(env, "tenant", "delete", "acme", "--force")
    assert json.loads(_pybk(env, "tenant", "list").stdout) == []


def test_bad_input_from_the_shell(tmp_path: Path) -> None:
    env = _store(tmp_path)
    missing = _pybk(env, "namespace", "create", "nobody/x", code=1)
    assert "NoSuchTenantError" in missing.output
    assert "NoSuchNamespaceError" in _pybk(env, "namespace", "show", "a/b", code=1).output
    _pybk(env, "tenant", "create", "acme")
    assert "KeyExistsError" in _pybk(env, "tenant", "create", "acme", code=1).output
    bad = _pybk(env, "namespace", "create", "acme/x", "--max-logs", "0", code=2)
    assert "max_logs" in bad.output
    bad = _pybk(env, "namespace", "create", "acme/x", "--offload-threshold-seconds", "5",
                code=2)
    assert "need an offload_url" in bad.output
    bad = _pybk(env, "namespace", "create", "acme/x", "--placement", "anywhere", code=2)
    assert "anywhere" in bad.output
    assert "ValueError" in _pybk(env, "tenant", "create", "bad name", code=1).output
