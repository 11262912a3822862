"""Several brokers behind one proxy: one listener per broker, each request reaches its broker.

Tansu is a single node, so the cluster here is the stub of tests/harness/stub_upstream.py.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i32Timedelta

from kvproxy.protocol.messages import (
    DESCRIBE_CLUSTER,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    codec_for,
    decode_response,
    encode_request,
    make_request,
)
from kvproxy.protocol.records import build_batch
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.stub_upstream import StubCluster, run_stub_cluster

NODES = (1, 2, 3)


@pytest.fixture
def cluster() -> Iterator[StubCluster]:
    with run_stub_cluster(node_ids=NODES) as stub:
        yield stub


@pytest.fixture
def cluster_proxy(cluster: StubCluster) -> Iterator[RunningProxy]:
    with run_proxy(cluster.bootstrap, max_brokers=10) as running:
        yield running


def _call(port: int, api_key: int, version: int, body: object, host: str = "127.0.0.1") -> object:
    client = RawKafkaClient(host, port)
    try:
        payload = client.request(encode_request(make_request(api_key, version, 5, "t", body)))
    finally:
        client.close()
    return decode_response(payload, api_key, version).body


def _metadata_body(version: int) -> object:
    fields: dict[str, object] = {"topics": None}
    if version >= 4:
        fields["allow_auto_topic_creation"] = False
    if 8 <= version <= 10:
        fields["include_cluster_authorized_operations"] = False
    if version >= 8:
        fields["include_topic_authorized_operations"] = False
    return codec_for(METADATA, version).request_type(**fields)


@pytest.mark.parametrize("version", [1, 9, 12])
def test_metadata_names_one_proxy_listener_per_broker(
    cluster_proxy: RunningProxy, cluster: StubCluster, version: int
) -> None:
    body = _call(cluster_proxy.port, METADATA, version, _metadata_body(version))
    brokers = {(b.node_id, b.host, b.port) for b in body.brokers}
    assert brokers == {(n, "127.0.0.1", cluster_proxy.broker_port(n)) for n in NODES}
    assert cluster_proxy.nodes == dict(cluster.nodes)
    assert cluster_proxy.stats().listeners == 1 + len(NODES)


def _produce_body(batch: bytes) -> object:
    request_type = codec_for(PRODUCE, 9).request_type
    module = __import__(request_type.__module__, fromlist=["TopicProduceData"])
    return request_type(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        topic_data=(
            module.TopicProduceData(
                name=TopicName("stub-topic"),
                partition_data=(module.PartitionProduceData(index=i32(1), records=Records(batch)),),
            ),
        ),
    )


@pytest.mark.parametrize("node", NODES)
def test_each_listener_reaches_its_own_broker(
    cluster_proxy: RunningProxy, cluster: StubCluster, node: int
) -> None:
    _call(cluster_proxy.port, METADATA, 12, _metadata_body(12))  # opens the broker listeners
    cluster.clear()
    batch = build_batch([(b"k", b"v", (), None), (b"k2", b"v2", (), None)])
    answer = _call(cluster_proxy.broker_port(node), PRODUCE, 9, _produce_body(batch))
    assert int(answer.responses[0].partition_responses[0].error_code) == 0
    for other in NODES:
        produced = [r for r in cluster.requests(other) if r[0] == PRODUCE]
        assert len(produced) == (1 if other == node else 0)


def test_find_coordinator_and_describe_cluster_name_proxy_listeners(
    cluster_proxy: RunningProxy,
) -> None:
    v3 = codec_for(FIND_COORDINATOR, 3).request_type(key="g", key_type=0)
    answer = _call(cluster_proxy.port, FIND_COORDINATOR, 3, v3)
    assert (answer.host, answer.port) == ("127.0.0.1", cluster_proxy.broker_port(NODES[0]))
    v4 = codec_for(FIND_COORDINATOR, 4).request_type(key_type=0, coordinator_keys=("a", "b"))
    answer = _call(cluster_proxy.port, FIND_COORDINATOR, 4, v4)
    assert {(c.host, c.port) for c in answer.coordinators} == {
        ("127.0.0.1", cluster_proxy.broker_port(NODES[0]))
    }
    request = codec_for(DESCRIBE_CLUSTER, 0).request_type(
        include_cluster_authorized_operations=False
    )
    answer = _call(cluster_proxy.port, DESCRIBE_CLUSTER, 0, request)
    assert {(b.broker_id, b.host, b.port) for b in answer.brokers} == {
        (n, "127.0.0.1", cluster_proxy.broker_port(n)) for n in NODES
    }


def test_confluent_producer_reaches_every_leader_through_the_proxy(
    cluster_proxy: RunningProxy, cluster: StubCluster
) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster_proxy.bootstrap, "linger.ms": 0})
    reports: list[tuple[object, int]] = []
    for partition in range(len(NODES)):
        producer.produce(
            "stub-topic",
            b"value",
            b"key",
            partition=partition,
            on_delivery=lambda err, msg: reports.append((err, msg.partition())),
        )
    assert producer.flush(20) == 0
    assert sorted(reports, key=lambda r: r[1]) == [(None, p) for p in range(len(NODES))]
    for index, node in enumerate(NODES):
        assert cluster.produced(node) == 1, f"partition {index} should be led by node {node}"


def test_proxy_learns_brokers_at_start(cluster: StubCluster) -> None:
    """A client that cached a broker listener from a previous proxy run can use it at once."""
    with run_proxy(cluster.bootstrap, max_brokers=10) as running:
        assert running.stats().listeners == 1 + len(NODES)
        body = _call(running.broker_port(3), METADATA, 1, _metadata_body(1))
        assert len(body.brokers) == len(NODES)
        assert [r[0] for r in cluster.requests(3)][-1] == METADATA
