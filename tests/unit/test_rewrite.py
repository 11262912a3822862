"""kvproxy.proxy.cluster.rewrite: the answers kvproxy changes so that clients only learn proxy
addresses."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32

from kvproxy.protocol.api_table import API_TABLE
from kvproxy.protocol.messages import (
    API_VERSIONS,
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    decode_response,
    supported_versions,
)
from kvproxy.proxy.cluster.rewrite import (
    PRODUCE_MAX_VERSION,
    needs_rewrite,
    offered_range,
    proxy_addresses,
    rewrite_response,
    trim_api_versions,
    unsupported_api_versions_answer,
)
from tests.harness.rewrite_answers import (
    ADDRESSES,
    PROXY_HOST,
    ZERO,
    fetch_v16_answer,
    frame_of,
    produce_v10_answer,
)


def rewrite(api_key: int, version: int, body: Any) -> tuple[bytes, Any, dict[int, tuple[str, int]]]:
    original = frame_of(api_key, version, body)
    out, learned = rewrite_response(original, api_key, version, ADDRESSES)
    response = decode_response(out, api_key, version)
    assert response.header.correlation_id == 42
    return out, response.body, learned


# ---- offered_range / needs_rewrite ----


def test_offered_range_keeps_plain_apis_as_the_broker_offers_them() -> None:
    assert offered_range(19, 0, 7) == (0, 7)  # CreateTopics: no addresses
    assert offered_range(API_VERSIONS, 0, 4) == (0, 4)


def test_offered_range_caps_produce_at_the_decodable_version() -> None:
    assert offered_range(PRODUCE, 0, 13) == (0, PRODUCE_MAX_VERSION)
    assert offered_range(PRODUCE, 3, 11) == (3, 11)


def test_offered_range_caps_rewritten_apis_at_what_the_codec_knows() -> None:
    for api_key in (METADATA, FETCH, FIND_COORDINATOR, DESCRIBE_CLUSTER):
        high = max(supported_versions(api_key))
        assert offered_range(api_key, 0, high + 5) == (0, high)


def test_offered_range_keeps_every_version_up_to_the_first_naming_controllers() -> None:
    # raft APIs (controllers only) name the voters' listeners from v1; DescribeQuorum from v2
    for api_key in (52, 53, 54, 59):
        assert offered_range(api_key, 0, 3) == (0, 0)
        assert offered_range(api_key, 1, 3) is None
    assert offered_range(82, 0, 0) is None  # UpdateRaftVoter: its leader's address from v0
    assert offered_range(55, 0, 2) == (0, 1)
    assert offered_range(55, 2, 2) is None


def test_offered_range_offers_share_groups_at_the_versions_it_rewrites() -> None:
    assert offered_range(SHARE_FETCH, 1, 2) == (1, 2)
    assert offered_range(SHARE_ACKNOWLEDGE, 1, 2) == (1, 2)
    assert offered_range(76, 1, 1) == (1, 1)  # ShareGroupHeartbeat: no address


def test_offered_range_relays_address_free_apis_the_schema_library_lacks() -> None:
    # StreamsGroupTopologyDescriptionUpdate and UnregisterController: no codec, no address
    assert offered_range(93, 0, 0) == (0, 0)
    assert offered_range(94, 0, 0) == (0, 0)
    assert offered_range(88, 0, 1) == (0, 1)  # StreamsGroupHeartbeat: a member's own endpoint


def test_offered_range_drops_sasl_handshake_v0() -> None:
    assert offered_range(17, 0, 1) == (1, 1)
    assert offered_range(17, 0, 0) is None


def test_offered_range_removes_what_is_newer_than_the_table_unless_told_to_relay() -> None:
    assert offered_range(31_000, 0, 1) is None
    assert offered_range(31_000, 0, 1, "relay") == (0, 1)
    newest = API_TABLE[19].newest  # CreateTopics
    assert offered_range(19, 0, newest + 2) == (0, newest)
    assert offered_range(19, 0, newest + 2, "relay") == (0, newest + 2)
    # relaying never lifts the caps: what is rewritten must be decoded, controllers never
    assert offered_range(METADATA, 0, 99, "relay") == (0, max(supported_versions(METADATA)))
    assert offered_range(55, 0, 9, "relay") == (0, 1)


def test_needs_rewrite() -> None:
    assert needs_rewrite(API_VERSIONS, 0)
    assert needs_rewrite(METADATA, 0)
    assert needs_rewrite(FIND_COORDINATOR, 0)
    assert needs_rewrite(DESCRIBE_CLUSTER, 0)
    assert not needs_rewrite(PRODUCE, 9)
    assert needs_rewrite(PRODUCE, 10)
    assert not needs_rewrite(FETCH, 15)
    assert needs_rewrite(FETCH, 16)
    assert needs_rewrite(SHARE_FETCH, 1)
    assert needs_rewrite(SHARE_ACKNOWLEDGE, 2)
    assert not needs_rewrite(19, 5)
    assert not needs_rewrite(93, 0)


# ---- ApiVersions ----


def test_trim_api_versions_and_its_frame() -> None:
    from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse

    offered = {
        0: (0, 13),
        1: (0, 17),
        17: (0, 1),
        18: (0, 4),
        55: (0, 2),
        78: (1, 2),
        19: (0, 7),
        52: (1, 2),
        31_000: (0, 0),
    }
    body = ApiVersionsResponse(
        error_code=ErrorCode(0),
        api_keys=tuple(
            ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
            for k, (lo, hi) in offered.items()
        ),
        throttle_time=ZERO,
    )
    trimmed = trim_api_versions(body)
    got = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in trimmed.api_keys}
    assert got == {
        0: (0, PRODUCE_MAX_VERSION),
        1: (0, min(17, max(supported_versions(FETCH)))),
        17: (1, 1),
        18: (0, 4),
        55: (0, 1),
        78: (1, 2),
        19: (0, 7),
    }
    relayed = trim_api_versions(body, "relay")
    assert {int(a.api_key) for a in relayed.api_keys} == {*got, 31_000}
    _, decoded, learned = rewrite(API_VERSIONS, 3, body)
    assert decoded == trimmed
    assert learned == {}


def test_unsupported_api_versions_answer_is_a_v0_error_body() -> None:
    body = decode_response(unsupported_api_versions_answer(7), API_VERSIONS, 0)
    assert body.header.correlation_id == 7
    assert body.body.error_code == 35
    assert [(a.api_key, a.min_version, a.max_version) for a in body.body.api_keys] == [
        (18, 0, max(supported_versions(API_VERSIONS)))
    ]


# ---- Metadata ----


def test_metadata_v0_brokers_become_proxy_addresses() -> None:
    from kio.schema.metadata.v0.response import MetadataResponse, MetadataResponseBroker

    body = MetadataResponse(
        brokers=(
            MetadataResponseBroker(node_id=i32(1), host="kafka-1", port=i32(9092)),
            MetadataResponseBroker(node_id=i32(2), host="kafka-2", port=i32(9093)),
        ),
        topics=(),
    )
    _, decoded, learned = rewrite(METADATA, 0, body)
    assert [(b.node_id, b.host, b.port) for b in decoded.brokers] == [
        (1, PROXY_HOST, 20_001),
        (2, PROXY_HOST, 20_002),
    ]
    assert learned == {1: ("kafka-1", 9092), 2: ("kafka-2", 9093)}


def test_metadata_v12_brokers_keep_their_rack_and_the_rest_of_the_answer() -> None:
    import uuid

    from kio.schema.metadata.v12.response import (
        MetadataResponse,
        MetadataResponseBroker,
        MetadataResponsePartition,
        MetadataResponseTopic,
    )

    topic = MetadataResponseTopic(
        error_code=ErrorCode(0),
        name="orders",
        topic_id=uuid.UUID(int=5),
        partitions=(
            MetadataResponsePartition(
                error_code=ErrorCode(0),
                partition_index=i32(0),
                leader_id=i32(111),
                replica_nodes=(i32(111),),
                isr_nodes=(i32(111),),
                offline_replicas=(),
            ),
        ),
    )
    body = MetadataResponse(
        throttle_time=ZERO,
        brokers=(
            MetadataResponseBroker(node_id=i32(111), host="10.0.0.1", port=i32(9092), rack="r1"),
        ),
        cluster_id="c",
        controller_id=i32(111),
        topics=(topic,),
    )
    _, decoded, learned = rewrite(METADATA, 12, body)
    (broker,) = decoded.brokers
    assert (broker.node_id, broker.host, broker.port, broker.rack) == (
        111,
        PROXY_HOST,
        20_111,
        "r1",
    )
    assert decoded.topics == (topic,)
    assert decoded.cluster_id == "c"
    assert learned == {111: ("10.0.0.1", 9092)}


def test_metadata_answers_tell_which_topics_exist() -> None:
    import uuid

    from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseTopic

    def topic(name: str | None, code: int) -> Any:
        return MetadataResponseTopic(
            error_code=ErrorCode(code), name=name, topic_id=uuid.UUID(int=0), partitions=()
        )

    body = MetadataResponse(
        throttle_time=ZERO,
        brokers=(),
        cluster_id="c",
        controller_id=i32(-1),
        topics=(
            topic("orders", 0),
            topic("electing", 5),  # LEADER_NOT_AVAILABLE: there, without a leader yet
            topic("made-up", 3),  # UNKNOWN_TOPIC_OR_PARTITION
            topic("bad\nname", 17),  # INVALID_TOPIC_EXCEPTION
            topic(None, 0),  # asked by id, named by none
        ),
    )
    seen: list[str] = []
    out, _ = rewrite_response(
        frame_of(METADATA, 12, body), METADATA, 12, ADDRESSES, topics_seen=seen.extend
    )
    assert seen == ["orders", "electing"]
    decoded = decode_response(out, METADATA, 12).body.topics
    assert [t.name for t in decoded] == ["orders", "electing", "made-up", "bad\nname", None]


# ---- FindCoordinator ----


def test_find_coordinator_v3_single_node() -> None:
    from kio.schema.find_coordinator.v3.response import FindCoordinatorResponse

    body = FindCoordinatorResponse(
        throttle_time=ZERO,
        error_code=ErrorCode(0),
        error_message=None,
        node_id=i32(3),
        host="kafka-3",
        port=i32(9094),
    )
    _, decoded, learned = rewrite(FIND_COORDINATOR, 3, body)
    assert (decoded.node_id, decoded.host, decoded.port) == (3, PROXY_HOST, 20_003)
    assert learned == {3: ("kafka-3", 9094)}


def test_find_coordinator_v3_error_answer_is_left_alone() -> None:
    from kio.schema.find_coordinator.v3.response import FindCoordinatorResponse

    body = FindCoordinatorResponse(
        throttle_time=ZERO,
        error_code=ErrorCode(15),  # COORDINATOR_NOT_AVAILABLE
        error_message="not yet",
        node_id=i32(-1),
        host="",
        port=i32(-1),
    )
    original = frame_of(FIND_COORDINATOR, 3, body)
    out, learned = rewrite_response(original, FIND_COORDINATOR, 3, ADDRESSES)
    assert out is original
    assert learned == {}


def test_find_coordinator_v4_coordinators_with_an_error_entry() -> None:
    from kio.schema.find_coordinator.v4.response import Coordinator, FindCoordinatorResponse

    body = FindCoordinatorResponse(
        throttle_time=ZERO,
        coordinators=(
            Coordinator(
                key="group-a",
                node_id=i32(0),
                host="kafka-0",
                port=i32(9092),
                error_code=ErrorCode(0),
                error_message=None,
            ),
            Coordinator(
                key="group-b",
                node_id=i32(-1),
                host="",
                port=i32(-1),
                error_code=ErrorCode(15),
                error_message="not yet",
            ),
        ),
    )
    _, decoded, learned = rewrite(FIND_COORDINATOR, 4, body)
    assert [(c.key, c.node_id, c.host, c.port, c.error_code) for c in decoded.coordinators] == [
        ("group-a", 0, PROXY_HOST, 20_000, 0),
        ("group-b", -1, "", -1, 15),
    ]
    assert learned == {0: ("kafka-0", 9092)}


# ---- DescribeCluster ----


@pytest.mark.parametrize("version", [0, 1])
def test_describe_cluster_brokers(version: int) -> None:
    import importlib

    schema = importlib.import_module(f"kio.schema.describe_cluster.v{version}.response")
    fields: dict[str, Any] = {
        "throttle_time": ZERO,
        "error_code": ErrorCode(0),
        "cluster_id": "c",
        "controller_id": i32(7),
        "brokers": (
            schema.DescribeClusterBroker(broker_id=i32(7), host="kafka-7", port=i32(9099)),
        ),
    }
    _, decoded, learned = rewrite(
        DESCRIBE_CLUSTER, version, schema.DescribeClusterResponse(**fields)
    )
    (broker,) = decoded.brokers
    assert (broker.broker_id, broker.host, broker.port) == (7, PROXY_HOST, 20_007)
    assert learned == {7: ("kafka-7", 9099)}


# ---- Produce v10 / Fetch v16 node_endpoints ----


def test_produce_v10_node_endpoints() -> None:
    from kio.schema.produce.v10.response import NodeEndpoint

    body = produce_v10_answer(
        (NodeEndpoint(node_id=i32(4), host="kafka-4", port=i32(9095), rack="r"),)
    )
    _, decoded, learned = rewrite(PRODUCE, 10, body)
    assert [(e.node_id, e.host, e.port, e.rack) for e in decoded.node_endpoints] == [
        (4, PROXY_HOST, 20_004, "r")
    ]
    assert decoded.responses == body.responses
    assert learned == {4: ("kafka-4", 9095)}


def test_produce_v10_without_endpoints_is_the_same_bytes_object() -> None:
    original = frame_of(PRODUCE, 10, produce_v10_answer(()))
    out, learned = rewrite_response(original, PRODUCE, 10, ADDRESSES)
    assert out is original
    assert learned == {}


def test_a_produce_answer_naming_no_broker_is_passed_on_undecoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker's bytes themselves reach the client: a Produce answer is decoded only when its
    top-level tagged fields (`node_endpoints`) are not empty."""
    import kvproxy.proxy.cluster.rewrite as rewrite_module

    def no_decoding(*_args: object) -> None:
        raise AssertionError("decoded")

    monkeypatch.setattr(rewrite_module, "decode_response", no_decoding)
    original = frame_of(PRODUCE, 10, produce_v10_answer(()))
    out, learned = rewrite_response(original, PRODUCE, 10, ADDRESSES)
    assert out is original
    assert learned == {}


def test_fetch_v16_node_endpoints() -> None:
    from kio.schema.fetch.v16.response import NodeEndpoint

    body = fetch_v16_answer(
        (
            NodeEndpoint(node_id=i32(1), host="kafka-1", port=i32(9092)),
            NodeEndpoint(node_id=i32(2), host="kafka-2", port=i32(9092)),
        )
    )
    _, decoded, learned = rewrite(FETCH, 16, body)
    assert [(e.node_id, e.host, e.port) for e in decoded.node_endpoints] == [
        (1, PROXY_HOST, 20_001),
        (2, PROXY_HOST, 20_002),
    ]
    assert decoded.responses == body.responses
    assert learned == {1: ("kafka-1", 9092), 2: ("kafka-2", 9092)}


def test_fetch_v16_without_endpoints_is_the_same_bytes_object() -> None:
    original = frame_of(FETCH, 16, fetch_v16_answer(()))
    out, learned = rewrite_response(original, FETCH, 16, ADDRESSES)
    assert out is original
    assert learned == {}


def test_a_node_outside_the_port_range_raises_what_port_for_raises() -> None:
    from kio.schema.metadata.v0.response import MetadataResponse, MetadataResponseBroker

    class OutOfRange(Exception):
        pass

    def narrow(node_id: int) -> int:
        raise OutOfRange(node_id)

    body = MetadataResponse(
        brokers=(MetadataResponseBroker(node_id=i32(999), host="h", port=i32(1)),), topics=()
    )
    with pytest.raises(OutOfRange):
        rewrite_response(
            frame_of(METADATA, 0, body), METADATA, 0, proxy_addresses(PROXY_HOST, narrow)
        )
