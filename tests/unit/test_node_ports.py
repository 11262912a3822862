"""Which proxy port stands for which broker node: any cluster is served on the default file.

Unset `listen.lowest_node_id` (the default) maps node N to `broker_port_base + N mod
max_brokers`; set, to `broker_port_base + N - lowest_node_id`. A node with no port is left out
of the answers clients get (a coordinator becomes "not available", which clients retry).
"""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v2.response import FindCoordinatorResponse
from kio.schema.metadata.v1.response import MetadataResponse, MetadataResponseBroker
from kio.schema.types import BrokerId
from kio.static.primitive import i32, i32Timedelta

from kvproxy.protocol.messages import (
    FIND_COORDINATOR,
    METADATA,
    decode_response,
    encode_response,
    make_response,
)
from kvproxy.proxy.cluster.rewrite import proxy_addresses, rewrite_response
from kvproxy.proxy.config.listen_config import ListenConfig, NodePortError
from kvproxy.proxy.config.proxy_config import parse_config
from kvproxy.proxy.errors import ProxyError
from kvproxy.proxy.serve.server import ProxyServer

DEFAULT = ListenConfig()


@pytest.mark.parametrize(
    ("node_ids", "ports"),
    [
        ((0, 1, 2), (9193, 9194, 9195)),  # what the explicit lowest_node_id 0 gave before
        ((111,), (9204,)),  # Tansu, the embedded development broker
        ((1001, 1002, 1003), (9194, 9195, 9196)),  # ZooKeeper-era numbering
        ((1, 2, 3), (9194, 9195, 9196)),  # KRaft, small ids
        ((3000, 3001, 3002), (9193, 9194, 9195)),  # KRaft, large ids
    ],
)
def test_the_default_file_gives_every_node_of_common_clusters_a_port(
    node_ids: tuple[int, ...], ports: tuple[int, ...]
) -> None:
    assert DEFAULT.lowest_node_id is None
    assert DEFAULT.plan_ports(node_ids) == (dict(zip(node_ids, ports, strict=True)), [])


def test_ids_equal_modulo_max_brokers_share_a_port_and_the_second_is_refused() -> None:
    ports, problems = DEFAULT.plan_ports([1, 101, 2])
    assert ports == {1: 9194, 2: 9195}
    assert problems == [
        "node 101 has no port: port 9194 is node 1's (node ids 1 and 101 are equal modulo "
        "max_brokers 100); set listen.lowest_node_id and listen.max_brokers so that every "
        "node id fits"
    ]


def test_an_explicit_lowest_node_id_keeps_the_offset_mapping_and_its_range() -> None:
    listen = ListenConfig(lowest_node_id=1000, max_brokers=10, broker_port_base=9300)
    assert listen.broker_port(1000) == 9300 and listen.broker_port(1009) == 9309
    with pytest.raises(NodePortError, match="node id 1010 is outside"):
        listen.broker_port(1010)
    assert listen.port_rule == "node N -> port 9300 + (N - 1000), ports 9300-9309"
    assert DEFAULT.port_rule == "node N -> port 9193 + (N mod 100), ports 9193-9292"


def test_the_server_claims_each_port_for_one_node_for_its_whole_life() -> None:
    server = ProxyServer(parse_config({"upstream": {"bootstrap_servers": ["k:9092"]}}))
    assert server.listeners.brokers.port_for(1) == 9194
    assert server.listeners.brokers.port_for(1) == 9194
    with pytest.raises(ProxyError, match="node 101 has no port: port 9194 is node 1's"):
        server.listeners.brokers.port_for(101)
    assert server.listeners.brokers.port_or_none(101) is None
    assert server.listeners.brokers.port_or_none(2) == 9195
    gauge = server.metrics.exposition().decode()
    assert "kvproxy_unmapped_nodes 1.0" in gauge


def _metadata_v1(*node_ids: int) -> bytes:
    body = MetadataResponse(
        brokers=tuple(
            MetadataResponseBroker(node_id=BrokerId(n), host=f"b{n}", port=i32(9092), rack=None)
            for n in node_ids
        ),
        controller_id=BrokerId(node_ids[0]),
        topics=(),
    )
    return encode_response(METADATA, 1, make_response(METADATA, 1, 7, body))


def test_a_node_without_a_port_is_left_out_of_metadata_and_not_learned() -> None:
    ports = {1: 9001, 2: 9002}
    frame, learned = rewrite_response(
        _metadata_v1(1, 2, 101), METADATA, 1, proxy_addresses("proxy", ports.get)
    )
    brokers = decode_response(frame, METADATA, 1).body.brokers
    assert [(b.node_id, b.host, b.port) for b in brokers] == [
        (1, "proxy", 9001),
        (2, "proxy", 9002),
    ]
    assert learned == {1: ("b1", 9092), 2: ("b2", 9092)}


def test_a_coordinator_without_a_port_is_answered_not_available() -> None:
    body = FindCoordinatorResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=ErrorCode.none,
        error_message=None,
        node_id=BrokerId(101),
        host="b101",
        port=i32(9092),
    )
    answer = encode_response(FIND_COORDINATOR, 2, make_response(FIND_COORDINATOR, 2, 9, body))
    frame, learned = rewrite_response(
        answer, FIND_COORDINATOR, 2, proxy_addresses("proxy", {1: 9001}.get)
    )
    rewritten = decode_response(frame, FIND_COORDINATOR, 2).body
    assert rewritten.error_code == ErrorCode.coordinator_not_available  # clients retry it
    assert (rewritten.node_id, rewritten.host, rewritten.port) == (-1, "", -1)
    assert learned == {}
