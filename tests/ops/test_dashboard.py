"""dashboards/pybk.json: valid Grafana, and every metric its PromQL names is one a real
``pybk bookie --http-port --autorecovery`` process (and a client's registry) exports."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pybk.cli import spawn_bookie, wait_ready
from pybk.client import Client
from pybk.server.processes import stop_pid

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "pybk.json"

#: the per-tenant metrics the bookie exports (labels tenant, namespace; rejected: reason).
#: Until a bookie exports them the Tenants row is checked against this list only; as soon as
#: any ``pybk_tenant_`` metric appears in the scrape, the whole row is checked against the
#: scrape too (test_every_panel_metric_is_exported).
TENANT_METRICS = frozenset({
    "pybk_tenant_write_bytes_total", "pybk_tenant_write_records_total",
    "pybk_tenant_read_bytes_total", "pybk_tenant_read_records_total",
    "pybk_tenant_throttled_seconds_total", "pybk_tenant_rejected_requests_total",
    "pybk_tenant_storage_bytes", "pybk_tenant_storage_quota_bytes",
})  # fmt: skip

_KEYWORDS = frozenset({
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "inf", "nan",
})  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not functions, keywords, labels)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values)
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # ranges
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\$\w+", " ", s)  # dashboard variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", s):
        if m.group(2) or m.group(1).lower() in _KEYWORDS:
            continue  # a function call or a keyword
        names.add(m.group(1))
    return names


def balanced(expr: str) -> bool:
    """Brackets outside strings nest and close."""
    stack: list[str] = []
    for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if ch in "([{":
            stack.append(")]}"["([{".index(ch)])
        elif ch in ")]}" and (not stack or stack.pop() != ch):
            return False
    return not stack


def _panels(dash: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(row title, panel) for every panel, rows' nested panels included."""
    row = ""
    for p in dash["panels"]:
        if p["type"] == "row":
            row = p["title"]
            for q in p.get("panels", []):
                yield row, q
        else:
            yield row, p


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Sample names from a real bookie process's /metrics (auto-recovery on) after a client
    wrote and read a few entries, plus that client's own registry."""
    root = tmp_path_factory.mktemp("dash")
    metadata = f"sqlite://{root / 'metadata.db'}"
    proc = spawn_bookie(root, "b1", metadata, extra_args=["--http-port", "0", "--autorecovery"])
    registry = CollectorRegistry()
    try:
        info = wait_ready(root, "b1", proc, 60.0)

        async def traffic() -> None:
            async with Client(metadata, metrics=registry) as client:
                lh = await client.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
                await lh.append_many([b"entry %d" % i for i in range(5)])
                await lh.close()
                assert [e.data for e in await lh.read(0, 4)] == [b"entry %d" % i
                                                                for i in range(5)]

        asyncio.run(traffic())
        with urllib.request.urlopen(f"http://{info['http']}/metrics", timeout=30) as r:
            text = r.read().decode()
    finally:
        stop_pid(proc.pid, 10.0)
        proc.wait(10)
    text += generate_latest(registry).decode()
    names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert "pybk_bookie_adds_total" in names and "pybk_client_adds_total" in names
    assert "pybk_autorecovery_under_replicated_ledgers" in names
    return names


def test_metric_names_finds_metrics_not_functions_labels_or_keywords() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, bookie) (rate(pybk_x_bucket{bookie=~"$b", '
            'event="refused_y"}[$__rate_interval]))) / on (instance) group_left '
            'max without (z) (pybk_y) and pybk_z == 1 or vector(0)')
    assert metric_names(expr) == {"pybk_x_bucket", "pybk_y", "pybk_z"}
    assert balanced(expr) and not balanced("sum(rate(pybk_x[5m])") \
        and not balanced('max(pybk_x{a="("}])')


def test_the_dashboard_is_valid_grafana(dashboard: dict[str, Any]) -> None:
    for key in ("title", "uid", "schemaVersion", "panels", "templating", "time"):
        assert key in dashboard, key
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 30
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    ids = [p["id"] for p in dashboard["panels"]] + [
        q["id"] for p in dashboard["panels"] for q in p.get("panels", [])]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert len(rows) == len(set(rows))
    for row, p in _panels(dashboard):
        assert row and p["title"], p
        assert p["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}, p["title"]
        assert p["datasource"]["type"] == "prometheus", p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and metric_names(t["expr"]), (p["title"], t)
            assert balanced(t["expr"]), (p["title"], t["expr"])
            used = set(re.findall(r"\$(\w+)", t["expr"] + json.dumps(t["datasource"])))
            assert used - {"__rate_interval"} <= variables, (p["title"], used)


def unexported(dashboard: dict[str, Any], scraped: set[str]) -> list[tuple[str, str, str]]:
    """(row, panel, metric) for every metric a panel reads that ``scraped`` lacks; the Tenants
    row's only once any ``pybk_tenant_`` metric is exported (before: checked against
    TENANT_METRICS alone)."""
    tenants_exported = any(n.startswith("pybk_tenant_") for n in scraped)
    tenant_row: set[str] = set()
    missing = []
    for row, p in _panels(dashboard):
        for t in p["targets"]:
            names = metric_names(t["expr"])
            if row == "Tenants":
                tenant_row |= names
                assert names <= TENANT_METRICS, (p["title"], names - TENANT_METRICS)
                if not tenants_exported:
                    continue
            missing += [(row, p["title"], n) for n in sorted(names - scraped)]
    assert tenant_row == TENANT_METRICS  # the row shows every per-tenant metric
    return missing


def test_every_panel_metric_is_exported(dashboard: dict[str, Any], scraped: set[str]) -> None:
    assert unexported(dashboard, scraped) == []


def test_the_tenants_row_is_checked_against_the_scrape_once_one_tenant_metric_is_exported(
        dashboard: dict[str, Any], scraped: set[str]) -> None:
    with_one = scraped | {"pybk_tenant_write_bytes_total"}
    missing = {n for row, _, n in unexported(dashboard, with_one)}
    assert missing == TENANT_METRICS - {"pybk_tenant_write_bytes_total"}
    assert unexported(dashboard, scraped | TENANT_METRICS) == []


def test_every_exported_family_is_on_the_dashboard(dashboard: dict[str, Any],
                                                   scraped: set[str]) -> None:
    used = {n for _, p in _panels(dashboard) for t in p["targets"]
            for n in metric_names(t["expr"])}
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in scraped}
    shown = {re.sub(r"_(bucket|count|sum)$", "", n) for n in used}
    missing = sorted(f for f in families if f.startswith("pybk_") and f not in shown)
    assert not missing, f"exported but on no panel: {missing}"
