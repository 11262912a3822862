"""Every metric the proxy exposes is in docs/operations.md's table, with its type, and the table
names none the proxy does not expose: a new metric is its row in `kvproxy.proxy.ops.metrics`
(or its collector), where it is counted, and its line in the table, and this test says which is
missing."""

from __future__ import annotations

import re
from pathlib import Path

from kvproxy.proxy.ops.metrics import ProxyMetrics

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
ROW = re.compile(r"^\| `(kvproxy_[a-z_]+)` \| (counter|gauge|histogram) \|", re.MULTILINE)
WATCHED_FAMILIES = {
    "kvproxy_policy_crashes_total": "counter",
    "kvproxy_quarantine_entries_total": "counter",
    "kvproxy_quarantine_dropped_total": "counter",
    "kvproxy_quarantine_dropped_bytes_total": "counter",
    "kvproxy_quarantine_queued_bytes": "gauge",
    "kvproxy_quarantine_degraded": "gauge",
}
"""Collected from what the server hands over (`watch_policy_crashes`, `watch_journal`: only
while a journal is configured), so not in a bare `ProxyMetrics`: listed here."""


def exposed(metrics: ProxyMetrics) -> dict[str, str]:
    """Exposed name (counters with `_total`) -> type, as a scrape names them."""
    names: dict[str, str] = {}
    for family in metrics.registry.collect():
        if not family.name.startswith("kvproxy_"):
            continue
        suffix = "_total" if family.type == "counter" else ""
        names[family.name + suffix] = family.type
    return names


def documented() -> dict[str, str]:
    return dict(ROW.findall(PAGE.read_text()))


def counted_once_each() -> ProxyMetrics:
    """A `ProxyMetrics` whose counters shown only once they count have counted."""
    metrics = ProxyMetrics()
    metrics.repeated_refusals.inc()
    return metrics


def test_every_exposed_metric_is_documented_with_its_type() -> None:
    shown = exposed(counted_once_each())
    table = documented()
    assert len(shown) >= 25
    assert {name: kind for name, kind in shown.items() if table.get(name) != kind} == {}


def test_the_table_names_only_metrics_the_proxy_exposes() -> None:
    known = {**exposed(counted_once_each()), **WATCHED_FAMILIES}
    assert sorted(set(documented()) - set(known)) == []
