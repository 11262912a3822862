"""The SNI listener in front of a broker: one TLS port, the server name choosing the node.

A Python client connects to 127.0.0.1 with `server_hostname` set (so nothing depends on name
resolution), verifies the proxy's certificate (`*.kafka.localhost`) and speaks Kafka through it:
Metadata through the bootstrap's name names every broker `broker-<id>.kafka.localhost` on the SNI
port; that name reaches that node; a name of no node, of a node the cluster does not have, or no
name at all, ends in the TLS alert `unrecognized_name`, counted by reason.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.proxy import RunningProxy, proxy_config, run_proxy
from tests.harness.sni_raw import metadata_brokers, sni_connect
from tests.harness.tls import TlsFiles, make_tls_files
from tests.harness.upstream import Upstream

pytestmark = pytest.mark.upstreams("tansu", "kafka")

BOOTSTRAP = "bootstrap.kafka.localhost"
BROKERS = "broker-$(nodeId).kafka.localhost"


def broker_name(node_id: int) -> str:
    return f"broker-{node_id}.kafka.localhost"


@pytest.fixture(scope="module")
def tls() -> Iterator[TlsFiles]:
    with make_tls_files(hostnames=("*.kafka.localhost",)) as files:
        yield files


def sni_proxy(upstream: Upstream, tls: TlsFiles, **listen: Any) -> Any:
    server_tls = {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)}
    sni = {"port": 0, "bootstrap": BOOTSTRAP, "brokers": BROKERS, **listen.pop("sni", {})}
    config = proxy_config(upstream.bootstrap, listen={"tls": server_tls, "sni": sni, **listen})
    return run_proxy(config=config)


def sni_port(proxy: RunningProxy) -> int:
    async def read() -> int:
        return proxy.server.listeners.sni_port

    return proxy.call(read())


def sample(proxy: RunningProxy, name: str, **labels: str) -> float:
    async def read() -> float:
        return proxy.server.metrics.registry.get_sample_value(name, labels) or 0.0

    return proxy.call(read())


def wait_for_sample(proxy: RunningProxy, name: str, expected: float, **labels: str) -> float:
    deadline = time.monotonic() + 10
    while (seen := sample(proxy, name, **labels)) < expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return seen


def refused(port: int, name: str | None, tls: TlsFiles) -> ssl.SSLError:
    with pytest.raises(ssl.SSLError) as caught:
        sni_connect(port, name, tls.ca).close()
    return caught.value


@pytest.mark.parametrize("version", [1, 12])
def test_the_bootstrap_name_answers_every_broker_by_its_name_on_the_sni_port(
    upstream: Upstream, tls: TlsFiles, version: int
) -> None:
    with sni_proxy(upstream, tls) as proxy:
        port = sni_port(proxy)
        with sni_connect(port, BOOTSTRAP, tls.ca) as sock:
            brokers = metadata_brokers(sock, version)
    assert brokers == [(upstream.node_id, broker_name(upstream.node_id), port)]


def test_a_broker_name_reaches_that_node(upstream: Upstream, tls: TlsFiles) -> None:
    with sni_proxy(upstream, tls) as proxy:
        port = sni_port(proxy)
        node = str(upstream.node_id)
        with sni_connect(port, broker_name(upstream.node_id).upper(), tls.ca) as sock:
            brokers = metadata_brokers(sock, 12)
        assert brokers == [(upstream.node_id, broker_name(upstream.node_id), port)]
        accepted = "kvproxy_client_connections_accepted_total"
        assert sample(proxy, accepted, listener="sni", node=node) == 1
        assert sample(proxy, accepted, listener="sni", node="bootstrap") == 0
        assert proxy.nodes[upstream.node_id] == (upstream.host, upstream.port)


@pytest.mark.upstreams("tansu")  # the TLS handshake alone: any broker will do
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("elsewhere.kafka.localhost", "no_matching_name"),
        ("broker-007.kafka.localhost", "no_matching_name"),
        ("broker-4242.kafka.localhost", "unknown_node"),
        (None, "no_sni"),
    ],
)
def test_a_name_of_no_known_node_gets_the_unrecognized_name_alert(
    upstream: Upstream, tls: TlsFiles, name: str | None, reason: str
) -> None:
    with sni_proxy(upstream, tls) as proxy:
        error = refused(sni_port(proxy), name, tls)
        assert "UNRECOGNIZED_NAME" in str(error.reason), error
        failures = "kvproxy_tls_handshake_failures_total"
        assert wait_for_sample(proxy, failures, 1, listener="sni", reason=reason) == 1
        assert proxy.stats().upstream_connections == 0


@pytest.mark.upstreams("tansu")
def test_a_client_without_a_name_gets_the_bootstrap_when_configured(
    upstream: Upstream, tls: TlsFiles
) -> None:
    with sni_proxy(upstream, tls, sni={"without_sni": "bootstrap"}) as proxy:
        port = sni_port(proxy)
        with sni_connect(port, None, tls.ca) as sock:
            brokers = metadata_brokers(sock, 12)
    assert brokers == [(upstream.node_id, broker_name(upstream.node_id), port)]


@pytest.mark.upstreams("tansu")
def test_without_port_per_broker_only_the_sni_port_listens(
    upstream: Upstream, tls: TlsFiles
) -> None:
    with sni_proxy(upstream, tls, port_per_broker=False, sni={"advertised_port": 443}) as proxy:
        assert proxy.stats().listeners == 1
        with sni_connect(sni_port(proxy), broker_name(upstream.node_id), tls.ca) as sock:
            brokers = metadata_brokers(sock, 1)
        assert brokers == [(upstream.node_id, broker_name(upstream.node_id), 443)]
        assert proxy.stats().listeners == 1  # a node learnt opens no port of its own


@pytest.mark.upstreams("tansu")
def test_a_node_the_proxy_has_not_seen_is_served_on_the_retry(
    upstream: Upstream, tls: TlsFiles
) -> None:
    """As a broker added to the cluster, or one only another worker has seen: the first client
    is refused, the proxy asks the cluster, and the client's retry reaches the node."""
    node = upstream.node_id
    with sni_proxy(upstream, tls) as proxy:

        async def forget() -> None:
            proxy.server.listeners.brokers._addresses.clear()  # as if never named to it

        proxy.call(forget())
        port = sni_port(proxy)
        error = refused(port, broker_name(node), tls)
        assert "UNRECOGNIZED_NAME" in str(error.reason), error
        deadline = time.monotonic() + 10
        while node not in proxy.nodes and time.monotonic() < deadline:
            time.sleep(0.02)
        with sni_connect(port, broker_name(node), tls.ca) as sock:
            assert metadata_brokers(sock, 12) == [(node, broker_name(node), port)]


@pytest.mark.upstreams("tansu")
def test_mutual_tls_on_the_sni_listener(upstream: Upstream, tls: TlsFiles) -> None:
    """`sni.tls.client_ca_file`: a client without a certificate is refused and counted; one
    with a certificate of that CA is served."""
    own = {
        "cert_file": str(tls.server_cert),
        "key_file": str(tls.server_key),
        "client_ca_file": str(tls.ca),
    }
    with sni_proxy(upstream, tls, sni={"tls": own}) as proxy:
        port = sni_port(proxy)
        with pytest.raises((ssl.SSLError, OSError)), sni_connect(port, BOOTSTRAP, tls.ca) as sock:
            metadata_brokers(sock, 12)  # TLS 1.3: the refusal comes after the handshake
        failures = "kvproxy_tls_handshake_failures_total"
        reason = "no_client_certificate"
        assert wait_for_sample(proxy, failures, 1, listener="sni", reason=reason) == 1
        client_cert = (tls.client_cert, tls.client_key)
        with sni_connect(port, BOOTSTRAP, tls.ca, client_cert=client_cert) as sock:
            brokers = metadata_brokers(sock, 12)
        assert brokers == [(upstream.node_id, broker_name(upstream.node_id), port)]
