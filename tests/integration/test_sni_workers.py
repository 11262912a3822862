"""`kvproxy serve --workers 2` with an SNI listener: both workers bind the one SNI port
(SO_REUSEPORT), each answers through it with the brokers' names, and the supervisor's /metrics
counts what each worker accepted by listener and node."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.processes import wait_until
from tests.harness.proxy_process import HOST, ProxyProcess
from tests.harness.sni import (
    BOOTSTRAP_NAME,
    BROKER_NAMES,
    CERTIFICATE_NAMES,
    SniEndpoint,
    wait_for_sni,
)
from tests.harness.sni_raw import metadata_brokers, sni_connect
from tests.harness.tansu import free_port
from tests.harness.tls import make_tls_files
from tests.harness.upstream import Upstream

pytestmark = pytest.mark.upstreams("tansu")

CONNECTIONS = 16


def accepted_by_worker(metrics_port: int) -> dict[tuple[str, str], float]:
    """kvproxy_client_connections_accepted_total{listener="sni"} by (worker, node)."""
    url = f"http://{HOST}:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            if name == "kvproxy_client_connections_accepted_total" and labels["listener"] == "sni":
                key = (labels["worker"], labels["node"])
                found[key] = found.get(key, 0.0) + sample.value
    return found


def ready(metrics_port: int) -> bool:
    """The supervisor's /readyz: every worker has started its listeners and is ready."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{metrics_port}/readyz", timeout=10) as answer:
            return bool(answer.status == 200)
    except OSError:  # not listening yet, or 503 (urllib's HTTPError is an OSError)
        return False


def test_two_workers_share_the_sni_port(upstream: Upstream, tmp_path: Path) -> None:
    node = upstream.node_id
    broker = BROKER_NAMES.replace("$(nodeId)", str(node))
    with make_tls_files(hostnames=CERTIFICATE_NAMES) as tls:
        port = free_port()
        sni = {
            "port": port,
            "bootstrap": BOOTSTRAP_NAME,
            "brokers": BROKER_NAMES,
            "tls": {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)},
        }
        proxy = ProxyProcess.in_front_of(
            tmp_path, [upstream.bootstrap], 2, {"sni": sni, "lowest_node_id": None}
        )
        try:
            proxy.start()
            metrics_port = proxy.config["metrics"]["port"]
            wait_until(lambda: ready(metrics_port), "both workers listening (/readyz)", 90)
            wait_for_sni(SniEndpoint(port, tls.ca))
            for index in range(CONNECTIONS):
                name = BOOTSTRAP_NAME if index % 2 else broker
                with sni_connect(port, name, tls.ca) as sock:
                    assert metadata_brokers(sock, 12) == [(node, broker, port)]

            def counted() -> dict[tuple[str, str], float] | None:
                found = accepted_by_worker(metrics_port)
                by_node = sum(n for (_, label), n in found.items() if label == str(node))
                return found if by_node >= CONNECTIONS / 2 else None

            found = wait_until(counted, "the workers' accepted connections", 30)
            assert {worker for worker, _ in found} == {"0", "1"}, found  # both served the port
            assert (
                sum(n for (_, label), n in found.items() if label == str(node)) == CONNECTIONS / 2
            )
        finally:
            proxy.close()
