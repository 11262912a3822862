"""Pipelined raw requests through kvproxy: answers leave in request order, local answers included.

The requests are built with the project codec and sent back to back on one connection before any
answer is read, so a proxy that answered in arrival order from the broker (or that lost the slot of
a locally answered request) would hand the client the wrong answer for a correlation id.
"""

from __future__ import annotations

import struct
import time

import pytest

from kvproxy.protocol.messages import (
    API_VERSIONS,
    FETCH,
    METADATA,
    PRODUCE,
    decode_response,
    encode_request,
    make_request,
    supported_versions,
)
from kvproxy.proxy.cluster.rewrite import PRODUCE_MAX_VERSION
from tests.harness.proxy import RunningProxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import (
    CLIENT_ID,
    api_versions_request,
    correlation_id_of,
    fetch_request,
    fetched_values,
    metadata_request,
    produce_request,
    topic_id_of,
)
from tests.harness.upstream import Upstream

pytestmark = pytest.mark.upstreams("tansu", "kafka")

# ---- tests ----


def test_pipelined_answers_come_back_in_request_order(
    proxy: RunningProxy, upstream: Upstream, topic: str
) -> None:
    requests = [
        (METADATA, 12, metadata_request(12, 101)),
        (PRODUCE, 9, produce_request(9, 102, topic, [(b"k1", b"v9")])),
        (API_VERSIONS, 99, api_versions_request(99, 103)),
        (METADATA, 1, metadata_request(1, 104)),
        (PRODUCE, 3, produce_request(3, 105, topic, [(b"k2", b"v3")])),
    ]
    with RawKafkaClient(proxy.host, proxy.port) as client:
        client.send_raw(b"".join(struct.pack(">i", len(r)) + r for _, _, r in requests))
        answers = [client.recv_frame(timeout=10) for _ in requests]

    assert [correlation_id_of(a) for a in answers] == [101, 102, 103, 104, 105]

    metadata12 = decode_response(answers[0], METADATA, 12).body
    assert [(b.node_id, b.host, b.port) for b in metadata12.brokers] == [
        (upstream.node_id, proxy.host, proxy.broker_port(upstream.node_id))
    ]
    produce9 = decode_response(answers[1], PRODUCE, 9).body
    (topic9,) = produce9.responses
    assert topic9.name == topic
    assert [(p.index, p.error_code) for p in topic9.partition_responses] == [(0, 0)]

    # The proxy's own answer to an ApiVersions version it does not know: v0 body, error 35 and
    # the ApiVersions range it does support, so the client retries with v4 or lower.
    local = decode_response(answers[2], API_VERSIONS, 0).body
    assert local.error_code == 35
    assert [(a.api_key, a.min_version, a.max_version) for a in local.api_keys] == [
        (API_VERSIONS, 0, 4)
    ]

    metadata1 = decode_response(answers[3], METADATA, 1).body
    assert [(b.node_id, b.host, b.port) for b in metadata1.brokers] == [
        (upstream.node_id, proxy.host, proxy.broker_port(upstream.node_id))
    ]
    produce3 = decode_response(answers[4], PRODUCE, 3).body
    assert [(p.index, p.error_code) for p in produce3.responses[0].partition_responses] == [(0, 0)]
    # both batches landed, in order
    assert produce3.responses[0].partition_responses[0].base_offset == (
        topic9.partition_responses[0].base_offset + 1
    )


def test_acks0_produce_gets_no_answer_and_the_others_keep_their_order(
    proxy: RunningProxy, topic: str
) -> None:
    requests = [
        metadata_request(1, 201),
        produce_request(3, 202, topic, [(b"k", b"fire-and-forget")], acks=0),
        metadata_request(12, 203),
        produce_request(9, 204, topic, [(b"k", b"acked")], acks=-1),
        api_versions_request(0, 205),
    ]
    with RawKafkaClient(proxy.host, proxy.port) as client:
        client.send_raw(b"".join(struct.pack(">i", len(r)) + r for r in requests))
        answers = [client.recv_frame(timeout=10) for _ in range(4)]
        assert [correlation_id_of(a) for a in answers] == [201, 203, 204, 205]
        # nothing else arrives: the acks=0 request had no slot
        assert not client.is_closed_by_peer(timeout=0.5)
        with_nothing_more = client.request(metadata_request(1, 206))
        assert correlation_id_of(with_nothing_more) == 206

        # the acks=0 batch was written before the acked one
        produced = decode_response(answers[2], PRODUCE, 9).body
        (partition,) = produced.responses[0].partition_responses
        assert partition.error_code == 0
        topic_id = topic_id_of(client, topic)
        fetched = decode_response(client.request(fetch_request(16, 207, topic_id)), FETCH, 16)
        assert fetched_values(fetched.body) == [b"fire-and-forget", b"acked"]


def test_api_versions_v3_offers_only_what_the_proxy_can_follow(proxy: RunningProxy) -> None:
    with RawKafkaClient(proxy.host, proxy.port) as client:
        answer = client.request(api_versions_request(3, 301))
    body = decode_response(answer, API_VERSIONS, 3).body
    assert body.error_code == 0
    offered = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in body.api_keys}
    assert PRODUCE in offered and offered[PRODUCE][1] <= PRODUCE_MAX_VERSION
    assert METADATA in offered and FETCH in offered and API_VERSIONS in offered
    if 17 in offered:  # SaslHandshake v0 is followed by unframed tokens: never offered
        assert offered[17][0] >= 1
    if 55 in offered:  # DescribeQuorum v2+ carries listener addresses
        assert offered[55][1] <= 1
    for api_key in (78, 79):  # ShareFetch / ShareAcknowledge: node_endpoints rewritten
        if api_key in offered:
            assert offered[api_key][1] <= max(supported_versions(api_key))
    for api_key in (52, 53, 54, 59):  # raft APIs naming the voters' listeners from v1
        if api_key in offered:
            assert offered[api_key][1] == 0
    assert 82 not in offered  # UpdateRaftVoter: its leader's listener from v0


def test_produce_v10_plus_and_fetch_v16_plus_answers_decode(
    proxy: RunningProxy, upstream: Upstream, topic: str
) -> None:
    """The answers that go through the rewrite path arrive complete and decodable."""
    with RawKafkaClient(proxy.host, proxy.port) as client:
        offers = decode_response(client.request(api_versions_request(3, 400)), API_VERSIONS, 3).body
        versions = {
            int(a.api_key): (int(a.min_version), int(a.max_version)) for a in offers.api_keys
        }
        produce_versions = [v for v in (10, 11, 12) if v <= versions[PRODUCE][1]]
        fetch_versions = [v for v in (16, 17) if v <= versions[FETCH][1]]
        assert produce_versions and fetch_versions, versions

        values = []
        for n, version in enumerate(produce_versions):
            value = f"produced-with-v{version}".encode()
            answer = client.request(produce_request(version, 410 + n, topic, [(b"k", value)]))
            assert correlation_id_of(answer) == 410 + n
            body = decode_response(answer, PRODUCE, version).body
            (partition,) = body.responses[0].partition_responses
            assert (partition.error_code, partition.base_offset) == (0, n)
            for endpoint in body.node_endpoints:
                assert (endpoint.host, endpoint.port) == (
                    proxy.host,
                    proxy.broker_port(endpoint.node_id),
                )
            values.append(value)

        topic_id = topic_id_of(client, topic)
        for n, version in enumerate(fetch_versions):
            answer = client.request(fetch_request(version, 420 + n, topic_id))
            assert correlation_id_of(answer) == 420 + n
            body = decode_response(answer, FETCH, version).body
            assert body.error_code == 0
            assert fetched_values(body) == values
            for endpoint in body.node_endpoints:
                assert endpoint.port != upstream.port
                assert (endpoint.host, endpoint.port) == (
                    proxy.host,
                    proxy.broker_port(endpoint.node_id),
                )

    seen = {(key, version) for key, version, _ in proxy.responses}
    for version in produce_versions:
        assert (PRODUCE, version) in seen
    for version in fetch_versions:
        assert (FETCH, version) in seen


def test_many_pipelined_requests_keep_their_order(proxy: RunningProxy, topic: str) -> None:
    """A longer pipeline mixing local, rewritten and opaque answers (more than fits one read)."""
    requests = []
    for n in range(60):
        kind = n % 4
        if kind == 0:
            requests.append(metadata_request(12, 1000 + n))
        elif kind == 1:
            requests.append(produce_request(9, 1000 + n, topic, [(b"k", b"x" * 2000)]))
        elif kind == 2:
            requests.append(api_versions_request(7, 1000 + n))
        else:
            requests.append(api_versions_request(0, 1000 + n))
    with RawKafkaClient(proxy.host, proxy.port) as client:
        client.send_raw(b"".join(struct.pack(">i", len(r)) + r for r in requests))
        deadline = time.monotonic() + 20
        ids = []
        while len(ids) < len(requests):
            assert time.monotonic() < deadline
            ids.append(correlation_id_of(client.recv_frame(timeout=10)))
    assert ids == list(range(1000, 1060))


def test_describe_cluster_names_only_proxy_listeners(
    proxy: RunningProxy, upstream: Upstream
) -> None:
    from kio.schema.describe_cluster.v0.request import DescribeClusterRequest

    from kvproxy.protocol.messages import DESCRIBE_CLUSTER

    body = DescribeClusterRequest(include_cluster_authorized_operations=False)
    request = encode_request(make_request(DESCRIBE_CLUSTER, 0, 501, CLIENT_ID, body))
    with RawKafkaClient(proxy.host, proxy.port) as client:
        answer = decode_response(client.request(request), DESCRIBE_CLUSTER, 0).body
    assert answer.error_code == 0
    assert [(b.broker_id, b.host, b.port) for b in answer.brokers] == [
        (upstream.node_id, proxy.host, proxy.broker_port(upstream.node_id))
    ]
