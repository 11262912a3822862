"""The SNI listener in front of a broker: one TLS port, the server name choosing the node.

A Python client connects to 127.0.0.1 with `server_hostname` set (so nothing depends on name
resolution), verifies the proxy's certificate (`*.kafka.localhost`) and speaks Kafka through it:
Metadata through the bootstrap's name names every broker `broker-<id>.kafka.localhost` on the SNI
port; that name reaches that node; a name of no node, of a node the cluster does not have, or no
name at all, ends in the TLS alert `unrecognized_name`, counted by reason.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvproxy.protocol.messages import METADATA, decode_response
from tests.harness.proxy import RunningProxy, proxy_config, run_proxy
from tests.harness.requests import metadata_request
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


def connect(port: int, name: str | None, tls: TlsFiles) -> ssl.SSLSocket:
    """A TLS connection to the SNI port sending `name` (None: no server name)."""
    context = ssl.create_default_context(cafile=str(tls.ca))
    if name is None:
        context.check_hostname = False  # nothing to check it against; the chain still is
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        return context.wrap_socket(sock, server_hostname=name)
    except BaseException:
        sock.close()
        raise


def ask(sock: ssl.SSLSocket, payload: bytes) -> bytes:
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", read_exactly(sock, 4))
    return read_exactly(sock, size)


def read_exactly(sock: ssl.SSLSocket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the proxy closed the connection"
        data += chunk
    return bytes(data)


def metadata_brokers(sock: ssl.SSLSocket, version: int) -> list[tuple[int, str, int]]:
    answer = ask(sock, metadata_request(version, 7))
    body = decode_response(answer, METADATA, version).body
    return [(int(b.node_id), str(b.host), int(b.port)) for b in body.brokers]


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
        connect(port, name, tls).close()
    return caught.value


@pytest.mark.parametrize("version", [1, 12])
def test_the_bootstrap_name_answers_every_broker_by_its_name_on_the_sni_port(
    upstream: Upstream, tls: TlsFiles, version: int
) -> None:
    with sni_proxy(upstream, tls) as proxy:
        port = sni_port(proxy)
        with connect(port, BOOTSTRAP, tls) as sock:
            brokers = metadata_brokers(sock, version)
    assert brokers == [(upstream.node_id, broker_name(upstream.node_id), port)]


def test_a_broker_name_reaches_that_node(upstream: Upstream, tls: TlsFiles) -> None:
    with sni_proxy(upstream, tls) as proxy:
        port = sni_port(proxy)
        node = str(upstream.node_id)
        with connect(port, broker_name(upstream.node_id).upper(), tls) as sock:
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
        with connect(port, None, tls) as sock:
            brokers = metadata_brokers(sock, 12)
    assert brokers == [(upstream.node_id, broker_name(upstream.node_id), port)]


@pytest.mark.upstreams("tansu")
def test_without_port_per_broker_only_the_sni_port_listens(
    upstream: Upstream, tls: TlsFiles
) -> None:
    with sni_proxy(upstream, tls, port_per_broker=False, sni={"advertised_port": 443}) as proxy:
        assert proxy.stats().listeners == 1
        with connect(sni_port(proxy), broker_name(upstream.node_id), tls) as sock:
            brokers = metadata_brokers(sock, 1)
        assert brokers == [(upstream.node_id, broker_name(upstream.node_id), 443)]
        assert proxy.stats().listeners == 1  # a node learnt opens no port of its own
