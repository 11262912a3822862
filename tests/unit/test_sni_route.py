"""The SNI listener's route (`kvproxy.proxy.listen.sni_route`), the connection counts by listener
and
node, and what `--workers` needs of the SNI port.

The route runs inside the TLS handshake: it must answer at once, so a name of a node the proxy
does not know yet is refused and the cluster asked again in the background, at most one request
in flight and at most one a second however many clients ask.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kvproxy.proxy.config.listen_config import ListenSni
from kvproxy.proxy.config.proxy_config import LimitsConfig, parse_config
from kvproxy.proxy.listen.client_connections import ClientConnections
from kvproxy.proxy.listen.sni_route import SniRoute
from kvproxy.proxy.listen.tls_accept import Refusal
from kvproxy.proxy.ops.metrics import MAX_NODE_LABELS, ProxyMetrics
from kvproxy.proxy.serve.workers import WorkersError, check_config

SNI = {"port": 9443, "bootstrap": "kafka.example.com", "brokers": "b-$(nodeId).kafka.example.com"}
TLS = {"cert_file": "/c.pem", "key_file": "/k.pem"}


class Directory:
    def __init__(self, known: dict[int, tuple[str, int]]) -> None:
        self.known = known

    def address_of(self, node_id: int) -> tuple[str, int] | None:
        return self.known.get(node_id)


class Cluster:
    """Counts the Metadata refreshes asked for; each waits until `release` is set."""

    def __init__(self) -> None:
        self.asked = 0
        self.release = asyncio.Event()

    async def refresh(self) -> bool:
        self.asked += 1
        await self.release.wait()
        return True


def route_of(without_sni: str = "refuse", known: Any = None) -> tuple[SniRoute, Cluster]:
    cluster = Cluster()
    sni = ListenSni(**SNI, without_sni=without_sni)
    return SniRoute(sni, Directory(known or {3: ("kafka-3", 9092)}), cluster.refresh), cluster  # type: ignore[arg-type]


def test_names_route_to_the_bootstrap_a_known_node_or_a_refusal() -> None:
    async def scenario() -> None:
        route, cluster = route_of()
        assert route("kafka.example.com") is None
        assert route("B-3.Kafka.Example.Com.") == 3
        assert route("b-03.kafka.example.com") == Refusal("no_matching_name")
        assert route("kafka.example.org") == Refusal("no_matching_name")
        assert route(None) == Refusal("no_sni")
        assert cluster.asked == 0  # none of these asks the cluster

    asyncio.run(scenario())


def test_without_a_name_the_bootstrap_when_configured() -> None:
    async def scenario() -> None:
        route, _ = route_of("bootstrap")
        assert route(None) is None

    asyncio.run(scenario())


def test_an_unknown_node_is_refused_and_the_cluster_asked_at_most_once_a_second() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        now = [1000.0]
        loop.time = lambda: now[0]  # type: ignore[method-assign]
        route, cluster = route_of()
        for _ in range(5):  # a burst of clients naming a new broker: one request
            assert route("b-4.kafka.example.com") == Refusal("unknown_node")
        await asyncio.sleep(0)
        assert cluster.asked == 1
        now[0] += 5.0  # long after, but the first request is still in flight
        assert route("b-4.kafka.example.com") == Refusal("unknown_node")
        await asyncio.sleep(0)
        assert cluster.asked == 1
        cluster.release.set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the request has answered
        route("b-4.kafka.example.com")  # 5 s after the last one started: asked again
        await asyncio.sleep(0)
        assert cluster.asked == 2
        await asyncio.sleep(0)  # answered at once (`release` is still set)
        now[0] += 0.5  # within a second of the last request: not again
        route("b-4.kafka.example.com")
        await asyncio.sleep(0)
        assert cluster.asked == 2
        now[0] += 0.6
        route("b-4.kafka.example.com")
        await asyncio.sleep(0)
        assert cluster.asked == 3
        route.stop()

    asyncio.run(scenario())


class Client:
    def __init__(self, listener: str, node_id: int | None, host: str = "10.0.0.1") -> None:
        self.listener, self.node_id = listener, node_id
        self.client_host, self.peer = host, f"{host}:1"
        self.transport = None  # a plain connection: no TLS handshake to stop counting


def test_connection_limits_count_each_node_of_the_sni_listener_apart() -> None:
    connections = ClientConnections(
        LimitsConfig(max_connections_per_listener=1),
        ProxyMetrics(),
        upstreams=None,  # type: ignore[arg-type]
    )
    assert connections.connection_opened(Client("sni", 1))  # type: ignore[arg-type]
    assert connections.connection_opened(Client("sni", 2))  # type: ignore[arg-type]
    assert connections.connection_opened(Client("sni", None))  # type: ignore[arg-type]
    assert connections.connection_opened(Client("broker", 1))  # type: ignore[arg-type]


def test_accepted_connections_are_labelled_by_listener_and_at_most_a_thousand_nodes() -> None:
    metrics = ProxyMetrics()
    connections = ClientConnections(LimitsConfig(), metrics, upstreams=None)  # type: ignore[arg-type]
    for node_id in [None, *range(MAX_NODE_LABELS + 5), 0]:
        assert connections.connection_opened(Client("sni", node_id, f"h{node_id}"))  # type: ignore[arg-type]

    def accepted(node: str, listener: str = "sni") -> float | None:
        labels = {"listener": listener, "node": node}
        return metrics.registry.get_sample_value(
            "kvproxy_client_connections_accepted_total", labels
        )

    assert accepted("bootstrap") == 1
    assert accepted("0") == 2
    assert accepted(str(MAX_NODE_LABELS - 1)) == 1
    assert accepted(str(MAX_NODE_LABELS)) is None
    assert accepted("other") == 5


@pytest.mark.parametrize(
    ("listen", "why"),
    [
        ({"tls": TLS, "sni": {**SNI, "port": 0}}, "--workers needs a fixed listen.sni.port"),
        ({"port": 0, "tls": TLS, "sni": SNI}, "--workers needs a fixed listen.port"),
    ],
)
def test_workers_need_fixed_ports(listen: dict[str, Any], why: str) -> None:
    config = parse_config({"upstream": {"bootstrap_servers": ["k:1"]}, "listen": listen})
    with pytest.raises(WorkersError, match=why.replace(".", r"\.")):
        check_config(config, 2)


def test_workers_without_port_per_broker_need_no_listen_port() -> None:
    listen = {"port": 0, "port_per_broker": False, "tls": TLS, "sni": SNI}
    check_config(parse_config({"upstream": {"bootstrap_servers": ["k:1"]}, "listen": listen}), 2)
