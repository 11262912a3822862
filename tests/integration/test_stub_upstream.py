"""Self-tests of the stub multi-broker upstream (tests/harness/stub_upstream.py)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.raw_client import RawKafkaClient, parse_api_versions_v0_response
from tests.harness.stub_upstream import StubCluster, run_stub_cluster


@pytest.fixture
def cluster() -> Iterator[StubCluster]:
    with run_stub_cluster(node_ids=(1, 2, 3)) as c:
        yield c


def _call(
    cluster: StubCluster, node_id: int, api_key: int, version: int, *, cid: int, body: Any
) -> Any:
    """Send one request with the project codec to ``node_id`` and decode the answer."""
    from kvproxy.protocol.messages import decode_response, encode_request, make_request

    host, port = cluster.nodes[node_id]
    payload = encode_request(make_request(api_key, version, cid, "stub-test", body))
    with RawKafkaClient(host, port) as c:
        answer = decode_response(c.request(payload), api_key, version)
    assert answer.header.correlation_id == cid
    return answer.body


def _metadata_request(version: int, topics: list[str] | None = None) -> Any:
    import importlib

    mod = importlib.import_module(f"kio.schema.metadata.v{version}.request")
    kw: dict[str, Any] = {}
    fields = mod.MetadataRequest.__dataclass_fields__
    if topics is None:
        kw["topics"] = () if version == 0 else None
    else:
        topic_fields = mod.MetadataRequestTopic.__dataclass_fields__
        extra = {"topic_id": None} if "topic_id" in topic_fields else {}
        kw["topics"] = tuple(mod.MetadataRequestTopic(name=t, **extra) for t in topics)
    for flag in (
        "allow_auto_topic_creation",
        "include_cluster_authorized_operations",
        "include_topic_authorized_operations",
    ):
        if flag in fields:
            kw[flag] = False
    return mod.MetadataRequest(**kw)


def _produce_request(version: int, partition: int, n_records: int, acks: int = -1) -> Any:
    import importlib

    from kio.static.primitive import Records, i16, i32, i32Timedelta

    from kvproxy.protocol.records import build_batch

    mod = importlib.import_module(f"kio.schema.produce.v{version}.request")
    batch = build_batch([(b"k%d" % i, b"v", None, None) for i in range(n_records)])
    return mod.ProduceRequest(
        transactional_id=None,
        acks=i16(acks),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        topic_data=(
            mod.TopicProduceData(
                name="stub-topic",
                partition_data=(
                    mod.PartitionProduceData(index=i32(partition), records=Records(batch)),
                ),
            ),
        ),
    )


def test_nodes_and_bootstrap(cluster: StubCluster) -> None:
    assert list(cluster.nodes) == [1, 2, 3]
    ports = {port for _, port in cluster.nodes.values()}
    assert len(ports) == 3
    assert all(host == "127.0.0.1" for host, _ in cluster.nodes.values())
    assert cluster.bootstrap == f"127.0.0.1:{cluster.nodes[1][1]}"


@pytest.mark.parametrize("version", [0, 3, 4])
def test_api_versions_in_request_version(cluster: StubCluster, version: int) -> None:
    from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0

    if version == 0:
        body: Any = ApiVersionsV0()
    else:
        import importlib

        mod = importlib.import_module(f"kio.schema.api_versions.v{version}.request")
        body = mod.ApiVersionsRequest(client_software_name="t", client_software_version="1")
    answer = _call(cluster, 2, 18, version, cid=77, body=body)
    apis = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert answer.error_code == 0
    assert apis[18] == (0, 4)
    assert apis[3] == (0, 12)
    assert apis[0] == (3, 11)
    assert apis[10] == (0, 6)
    assert apis[60] == (0, 1)
    assert cluster.requests(2) == [(18, version, 77)]


def test_api_versions_too_new_gets_v0_unsupported(cluster: StubCluster) -> None:
    import struct

    host, port = cluster.nodes[1]
    with RawKafkaClient(host, port) as c:
        # ApiVersions v9 (unknown to the stub): header v2, empty body with tagged fields
        payload = struct.pack(">hhih", 18, 9, 5, 1) + b"x" + b"\x00" + b"\x00\x00\x00"
        cid, error_code, apis = parse_api_versions_v0_response(c.request(payload))
    assert (cid, error_code) == (5, 35)
    assert apis[18] == (0, 4)


@pytest.mark.parametrize("version", [1, 12])
def test_metadata_lists_every_broker(cluster: StubCluster, version: int) -> None:
    answer = _call(cluster, 1, 3, version, cid=9, body=_metadata_request(version))
    brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
    assert brokers == cluster.nodes
    assert answer.controller_id == 1
    if version >= 2:
        assert answer.cluster_id == "stub-cluster"
    (topic,) = answer.topics
    assert topic.name == "stub-topic"
    assert topic.error_code == 0
    leaders = {p.partition_index: p.leader_id for p in topic.partitions}
    assert leaders == {0: 1, 1: 2, 2: 3}
    assert cluster.requests(1) == [(3, version, 9)]
    assert cluster.requests(2) == cluster.requests(3) == []


def test_metadata_unknown_topic(cluster: StubCluster) -> None:
    answer = _call(cluster, 3, 3, 9, cid=1, body=_metadata_request(9, ["stub-topic", "nope"]))
    errors = {t.name: t.error_code for t in answer.topics}
    assert errors == {"stub-topic": 0, "nope": 3}


def test_find_coordinator_is_first_node(cluster: StubCluster) -> None:
    from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindCoordinatorV3
    from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest as FindCoordinatorV6

    old = _call(cluster, 3, 10, 3, cid=1, body=FindCoordinatorV3(key="g", key_type=0))
    assert (old.node_id, old.host, old.port) == (1, *cluster.nodes[1])
    new = _call(
        cluster, 2, 10, 6, cid=2, body=FindCoordinatorV6(key_type=0, coordinator_keys=("g1", "g2"))
    )
    assert [(c.key, c.node_id, c.port) for c in new.coordinators] == [
        ("g1", 1, cluster.nodes[1][1]),
        ("g2", 1, cluster.nodes[1][1]),
    ]


def test_describe_cluster_lists_every_broker(cluster: StubCluster) -> None:
    from kio.schema.describe_cluster.v1.request import DescribeClusterRequest

    answer = _call(
        cluster,
        2,
        60,
        1,
        cid=4,
        body=DescribeClusterRequest(include_cluster_authorized_operations=False, endpoint_type=1),
    )
    assert answer.cluster_id == "stub-cluster"
    assert answer.controller_id == 1
    assert {b.broker_id: (b.host, b.port) for b in answer.brokers} == cluster.nodes


@pytest.mark.parametrize("version", [3, 8, 11])
def test_produce_is_recorded_on_its_node_only(cluster: StubCluster, version: int) -> None:
    first = _call(cluster, 2, 0, version, cid=11, body=_produce_request(version, 1, 3))
    second = _call(cluster, 2, 0, version, cid=12, body=_produce_request(version, 1, 2))
    (p1,) = first.responses[0].partition_responses
    (p2,) = second.responses[0].partition_responses
    assert (p1.index, p1.error_code, p1.base_offset) == (1, 0, 0)
    assert (p2.error_code, p2.base_offset) == (0, 3)
    assert cluster.requests(2) == [(0, version, 11), (0, version, 12)]
    assert cluster.requests(1) == cluster.requests(3) == []
    assert cluster.produced(2) == 5
    assert cluster.produced(1) == cluster.produced(3) == 0


def test_produce_acks0_is_recorded_without_answer(cluster: StubCluster) -> None:
    from kvproxy.protocol.messages import encode_request, make_request

    host, port = cluster.nodes[3]
    with RawKafkaClient(host, port) as c:
        c.send_frame(encode_request(make_request(0, 9, 21, "t", _produce_request(9, 2, 4, 0))))
        assert not c.is_closed_by_peer(timeout=0.3)
    assert cluster.requests(3) == [(0, 9, 21)]
    assert cluster.produced(3) == 4


@pytest.mark.parametrize(
    "header",
    [
        (1, 11),  # Fetch: advertised for librdkafka's sake, not served
        (19, 4),  # CreateTopics: not served
        (0, 2),  # Produce below v3
        (3, 13),  # Metadata above v12
    ],
)
def test_unserved_requests_close_the_connection(
    cluster: StubCluster, header: tuple[int, int]
) -> None:
    import struct

    host, port = cluster.nodes[1]
    with RawKafkaClient(host, port) as c:
        c.send_frame(struct.pack(">hhih", *header, 3, 1) + b"x" + b"\x00" * 16)
        assert c.is_closed_by_peer(timeout=2)
    assert cluster.requests(1) == []


def test_librdkafka_routes_by_partition_leader(cluster: StubCluster) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=5)
    assert md.cluster_id == "stub-cluster"
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == cluster.nodes

    results: list[tuple[Any, int, int]] = []
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0})
    for partition in (1, 1, 2):
        producer.produce(
            "stub-topic",
            b"v",
            key=b"k",
            partition=partition,
            on_delivery=lambda err, msg: results.append((err, msg.partition(), msg.offset())),
        )
        producer.flush(5)
    assert producer.flush(5) == 0
    assert results == [(None, 1, 0), (None, 1, 1), (None, 2, 0)]
    assert cluster.requests(1, api_key=0) == []
    assert len(cluster.requests(2, api_key=0)) == 2
    assert len(cluster.requests(3, api_key=0)) == 1
    assert (cluster.produced(2), cluster.produced(3)) == (2, 1)


def test_close_stops_listening() -> None:
    import socket

    with run_stub_cluster(node_ids=(7,)) as c:
        host, port = c.nodes[7]
        assert c.bootstrap == f"{host}:{port}"
    with pytest.raises(OSError), socket.create_connection((host, port), timeout=1):
        pass
