"""A broker's answer naming an entry with a negative node id, or more nodes than any cluster has:
no answer the client gets carries a broker's own host, and an answer beyond the bound is refused."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from kvproxy.protocol.admin import MAX_NODES_PER_ANSWER, brokers_of
from kvproxy.protocol.errors import TooManyNodes
from kvproxy.protocol.messages import (
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    decode_response,
)
from kvproxy.proxy.cluster.rewrite import rewrite_response
from tests.harness.rewrite_answers import (
    ADDRESSES,
    PROXY_HOST,
    ZERO,
    fetch_v16_answer,
    frame_of,
    produce_v10_answer,
)

SECRET = "secret-broker.internal"


def _metadata_v12(brokers: tuple[Any, ...]) -> Any:
    from kio.schema.metadata.v12.response import MetadataResponse

    return MetadataResponse(
        throttle_time=ZERO,
        brokers=brokers,
        cluster_id="c",
        controller_id=i32(1),
        topics=(),
    )


def _metadata_broker(node_id: int, host: str) -> Any:
    from kio.schema.metadata.v12.response import MetadataResponseBroker

    return MetadataResponseBroker(node_id=i32(node_id), host=host, port=i32(9092), rack=None)


def _hostile_answers() -> list[tuple[int, int, Any]]:
    from kio.schema.describe_cluster.v1.response import (
        DescribeClusterBroker,
        DescribeClusterResponse,
    )
    from kio.schema.fetch.v16.response import NodeEndpoint as FetchEndpoint
    from kio.schema.find_coordinator.v3.response import FindCoordinatorResponse as Coordinator3
    from kio.schema.find_coordinator.v4.response import Coordinator, FindCoordinatorResponse
    from kio.schema.produce.v10.response import NodeEndpoint as ProduceEndpoint

    return [
        (
            METADATA,
            12,
            _metadata_v12((_metadata_broker(1, "kafka-1"), _metadata_broker(-1, SECRET))),
        ),
        (
            DESCRIBE_CLUSTER,
            1,
            DescribeClusterResponse(
                throttle_time=ZERO,
                error_code=ErrorCode(0),
                cluster_id="c",
                controller_id=i32(1),
                brokers=(
                    DescribeClusterBroker(broker_id=i32(1), host="kafka-1", port=i32(9092)),
                    DescribeClusterBroker(broker_id=i32(-7), host=SECRET, port=i32(9092)),
                ),
            ),
        ),
        (
            FIND_COORDINATOR,
            3,
            Coordinator3(
                throttle_time=ZERO,
                error_code=ErrorCode(0),
                error_message=None,
                node_id=i32(-1),
                host=SECRET,
                port=i32(9092),
            ),
        ),
        (
            FIND_COORDINATOR,
            4,
            FindCoordinatorResponse(
                throttle_time=ZERO,
                coordinators=(
                    Coordinator(
                        key="g",
                        node_id=i32(-1),
                        host=SECRET,
                        port=i32(9092),
                        error_code=ErrorCode(0),
                        error_message=None,
                    ),
                ),
            ),
        ),
        (
            PRODUCE,
            10,
            produce_v10_answer(
                (ProduceEndpoint(node_id=i32(-2), host=SECRET, port=i32(9092), rack=None),)
            ),
        ),
        (
            FETCH,
            16,
            fetch_v16_answer((FetchEndpoint(node_id=i32(-3), host=SECRET, port=i32(9092)),)),
        ),
    ]


@pytest.mark.parametrize(
    ("api_key", "version", "body"),
    _hostile_answers(),
    ids=[
        "metadata",
        "describe_cluster",
        "find_coordinator_v3",
        "find_coordinator_v4",
        "produce",
        "fetch",
    ],
)
def test_an_entry_with_a_negative_node_id_never_carries_the_brokers_host(
    api_key: int, version: int, body: Any
) -> None:
    """Broker lists leave it out (Kafka never lists a broker with a negative id); a coordinator
    or leader endpoint keeps its id with host "" and port -1, as Kafka names "no coordinator"."""
    original = frame_of(api_key, version, body)
    assert SECRET.encode() in original
    out, learned = rewrite_response(original, api_key, version, ADDRESSES)
    assert SECRET.encode() not in bytes(out)
    assert all(node_id >= 0 for node_id in learned)
    decoded = decode_response(out, api_key, version).body
    if api_key in (METADATA, DESCRIBE_CLUSTER):
        assert [b.host for b in decoded.brokers] == [PROXY_HOST]
    elif api_key == FIND_COORDINATOR and version == 3:
        assert (decoded.node_id, decoded.host, decoded.port) == (-1, "", -1)
    else:
        entries = decoded.coordinators if api_key == FIND_COORDINATOR else decoded.node_endpoints
        assert [(e.host, e.port) for e in entries] == [("", -1)]


def test_an_answer_naming_more_brokers_than_the_bound_is_refused() -> None:
    """Refused whole, with the Kafka error code the protocol errors carry: the connection that
    asked is closed, as for an answer that does not decode."""
    brokers = tuple(_metadata_broker(n, f"b{n}") for n in range(MAX_NODES_PER_ANSWER + 1))
    original = frame_of(METADATA, 12, _metadata_v12(brokers))
    with pytest.raises(TooManyNodes, match=f"{MAX_NODES_PER_ANSWER + 1} nodes"):
        rewrite_response(original, METADATA, 12, ADDRESSES)
    with pytest.raises(TooManyNodes):
        brokers_of(decode_response(original, METADATA, 12).body)
    within = frame_of(METADATA, 12, _metadata_v12(brokers[:MAX_NODES_PER_ANSWER]))
    _, learned = rewrite_response(within, METADATA, 12, ADDRESSES)
    assert len(learned) == MAX_NODES_PER_ANSWER


@pytest.mark.parametrize("version", [0, 1, 3, 8, 9, 12])
def test_the_broker_count_is_read_before_decoding(version: int) -> None:
    """What `metadata_broker_count` reads from the frame is what the answer decodes to."""
    from kvproxy.protocol.admin import metadata_broker_count
    from tests.harness.stub_upstream import StubCluster

    with StubCluster((1, 2, 3, 4)) as stub:
        answer = stub._metadata(version, 5, type("NoTopics", (), {"topics": ()})())
    assert metadata_broker_count(answer, version) == 4
    assert len(decode_response(answer, METADATA, version).body.brokers) == 4
