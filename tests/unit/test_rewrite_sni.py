"""Answers to a connection that came through the SNI listener: every broker named by its server
name, on the one port clients are told (`listen.sni.advertised_port`, else `listen.sni.port`).

Each answer that names brokers (Metadata, FindCoordinator before and from v4, DescribeCluster,
Produce and Fetch `node_endpoints`) is rewritten, decoded again and its names and ports read;
the directory still learns where each node really lives.
"""

from __future__ import annotations

import datetime
import importlib
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta, i64

from kvproxy.protocol.messages import (
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    decode_response,
    encode_response,
    make_response,
)
from kvproxy.proxy.cluster.rewrite import rewrite_response, sni_addresses
from kvproxy.proxy.config.sni_names import SniNames

NAMES = SniNames("bootstrap.kafka.example.com", "broker-$(nodeId).kafka.example.com")
ADVERTISED = 443
ZERO = i32Timedelta.parse(datetime.timedelta(0))


def rewrite(api_key: int, version: int, body: Any) -> tuple[Any, dict[int, tuple[str, int]]]:
    frame = encode_response(api_key, version, make_response(api_key, version, 5, body))
    out, learned = rewrite_response(
        frame, api_key, version, sni_addresses(NAMES.name_of, lambda: ADVERTISED)
    )
    return decode_response(out, api_key, version).body, learned


def name(node_id: int) -> str:
    return f"broker-{node_id}.kafka.example.com"


@pytest.mark.parametrize("version", [0, 1, 4, 9, 12])
def test_metadata_names_every_broker_by_its_server_name_on_the_one_port(version: int) -> None:
    schema = importlib.import_module(f"kio.schema.metadata.v{version}.response")
    fields: dict[str, Any] = {"brokers": (), "topics": ()}
    broker_fields = schema.MetadataResponseBroker.__dataclass_fields__
    brokers = []
    for node_id, host in ((0, "10.0.0.1"), (1001, "10.0.0.2"), (2**31 - 1, "kafka-max")):
        extra = {"rack": None} if "rack" in broker_fields else {}
        brokers.append(
            schema.MetadataResponseBroker(node_id=i32(node_id), host=host, port=i32(9092), **extra)
        )
    fields["brokers"] = tuple(brokers)
    for optional, value in (
        ("throttle_time", ZERO),
        ("cluster_id", "c"),
        ("controller_id", i32(0)),
        ("cluster_authorized_operations", i32(-2147483648)),
    ):
        if optional in schema.MetadataResponse.__dataclass_fields__:
            fields[optional] = value
    body, learned = rewrite(METADATA, version, schema.MetadataResponse(**fields))
    assert [(b.node_id, b.host, b.port) for b in body.brokers] == [
        (0, "broker-0.kafka.example.com", 443),
        (1001, "broker-1001.kafka.example.com", 443),
        (2**31 - 1, "broker-2147483647.kafka.example.com", 443),
    ]
    assert learned == {
        0: ("10.0.0.1", 9092),
        1001: ("10.0.0.2", 9092),
        2**31 - 1: ("kafka-max", 9092),
    }


def test_find_coordinator_before_v4_names_the_coordinator() -> None:
    from kio.schema.find_coordinator.v3.response import FindCoordinatorResponse

    body = FindCoordinatorResponse(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        error_message=None,
        node_id=i32(3),
        host="kafka-3",
        port=i32(9094),
    )
    decoded, learned = rewrite(FIND_COORDINATOR, 3, body)
    assert (decoded.node_id, decoded.host, decoded.port) == (3, name(3), 443)
    assert learned == {3: ("kafka-3", 9094)}


def test_find_coordinator_v4_names_each_coordinator_and_leaves_errors_alone() -> None:
    from kio.schema.find_coordinator.v4.response import Coordinator, FindCoordinatorResponse

    def coordinator(key: str, node_id: int, host: str, port: int, error: int) -> Coordinator:
        return Coordinator(
            key=key,
            node_id=i32(node_id),
            host=host,
            port=i32(port),
            error_code=ErrorCode(error),
            error_message=None,
        )

    body = FindCoordinatorResponse(
        throttle_time=ZERO,
        coordinators=(
            coordinator("group-a", 2, "kafka-2", 9092, 0),
            coordinator("group-b", -1, "", -1, 15),
        ),
    )
    decoded, learned = rewrite(FIND_COORDINATOR, 4, body)
    assert [(c.key, c.node_id, c.host, c.port) for c in decoded.coordinators] == [
        ("group-a", 2, name(2), 443),
        ("group-b", -1, "", -1),
    ]
    assert learned == {2: ("kafka-2", 9092)}


@pytest.mark.parametrize("version", [0, 1])
def test_describe_cluster_names_every_broker(version: int) -> None:
    schema = importlib.import_module(f"kio.schema.describe_cluster.v{version}.response")
    body = schema.DescribeClusterResponse(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        cluster_id="c",
        controller_id=i32(7),
        brokers=(
            schema.DescribeClusterBroker(broker_id=i32(7), host="kafka-7", port=i32(9099)),
            schema.DescribeClusterBroker(broker_id=i32(8), host="kafka-8", port=i32(9099)),
        ),
    )
    decoded, learned = rewrite(DESCRIBE_CLUSTER, version, body)
    assert [(b.broker_id, b.host, b.port) for b in decoded.brokers] == [
        (7, name(7), 443),
        (8, name(8), 443),
    ]
    assert learned == {7: ("kafka-7", 9099), 8: ("kafka-8", 9099)}


def test_produce_node_endpoints_name_the_new_leader() -> None:
    from kio.schema.produce.v10.response import (
        NodeEndpoint,
        PartitionProduceResponse,
        ProduceResponse,
        TopicProduceResponse,
    )

    partition = PartitionProduceResponse(
        index=i32(0), error_code=ErrorCode(6), base_offset=i64(-1), record_errors=()
    )
    body = ProduceResponse(
        responses=(TopicProduceResponse(name="orders", partition_responses=(partition,)),),
        throttle_time=ZERO,
        node_endpoints=(NodeEndpoint(node_id=i32(4), host="kafka-4", port=i32(9095), rack="r"),),
    )
    decoded, learned = rewrite(PRODUCE, 10, body)
    assert [(e.node_id, e.host, e.port, e.rack) for e in decoded.node_endpoints] == [
        (4, name(4), 443, "r")
    ]
    assert learned == {4: ("kafka-4", 9095)}


def test_fetch_node_endpoints_name_the_new_leader() -> None:
    from kio.schema.fetch.v16.response import (
        FetchableTopicResponse,
        FetchResponse,
        NodeEndpoint,
        PartitionData,
    )

    partition = PartitionData(
        partition_index=i32(0),
        error_code=ErrorCode(0),
        high_watermark=i64(5),
        aborted_transactions=None,
        records=b"",
    )
    body = FetchResponse(
        throttle_time=ZERO,
        error_code=ErrorCode(0),
        responses=(FetchableTopicResponse(topic_id=uuid.UUID(int=9), partitions=(partition,)),),
        node_endpoints=(NodeEndpoint(node_id=i32(1), host="kafka-1", port=i32(9092)),),
    )
    decoded, learned = rewrite(FETCH, 16, body)
    assert [(e.node_id, e.host, e.port) for e in decoded.node_endpoints] == [(1, name(1), 443)]
    assert learned == {1: ("kafka-1", 9092)}
