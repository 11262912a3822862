"""What an operator scrapes: every sample on /metrics, one sample's value, a plain GET."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from tests.harness.proxy import RunningProxy


class ServesMetrics(Protocol):
    """A proxy in this process (RunningProxy) or a `kvproxy serve` process (ProxyProcess)."""

    @property
    def metrics_url(self) -> str: ...


def scrape(proxy: ServesMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on /metrics, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(f"{proxy.metrics_url}/metrics", timeout=5) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


CLOSED = "kvproxy_connections_closed_total"


def closed(proxy: RunningProxy, reason: str) -> float:
    return value(scrape(proxy), CLOSED, reason=reason)
