"""Self-tests of the Apache Kafka harness: both versions start from Maven Central's jars, answer
as the versions they are, store what is produced, and a broker that cannot start fails with the
last lines of its log."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.harness import RawKafkaClient, api_versions_v0_request, parse_api_versions_v0_response
from tests.harness.kafka_broker import (
    KAFKA_3,
    KAFKA_4,
    KafkaCluster,
    KafkaError,
    build_cluster,
    kafka_classpath,
    run_kafka,
)

PRODUCE = 0


def produce_versions(cluster: KafkaCluster) -> tuple[int, int]:
    with RawKafkaClient(cluster.host, cluster.port) as client:
        _, error_code, apis = parse_api_versions_v0_response(
            client.request(api_versions_v0_request())
        )
    assert error_code == 0
    return apis[PRODUCE]


def test_kafka_4_advertises_produce_up_to_v13(kafka: KafkaCluster) -> None:
    """Kafka 4 still advertises Produce from v0 (KAFKA-18659: librdkafka assumes v0 exists) while
    it refuses v0-v2 requests (KIP-896)."""
    low, high = produce_versions(kafka)
    assert kafka.version == KAFKA_4
    assert (low, high) == (0, 13)


def test_kafka_3_9_takes_produce_v0(kafka3: KafkaCluster) -> None:
    low, high = produce_versions(kafka3)
    assert kafka3.version == KAFKA_3
    assert (low, high) == (0, 11)


def test_records_round_trip(any_kafka: KafkaCluster) -> None:
    topic = any_kafka.create_topic(partitions=2)
    producer = Producer({"bootstrap.servers": any_kafka.bootstrap, "linger.ms": 0})
    for i in range(10):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": any_kafka.bootstrap, "group.id": "harness"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    values = set()
    while len(values) < 10:
        message = consumer.poll(10)
        assert message is not None, f"only {sorted(values)} read back"
        assert message.error() is None
        values.add(message.value())
    consumer.close()
    assert values == {b"v%d" % i for i in range(10)}


def test_three_brokers_lead_different_partitions(tmp_path: Path) -> None:
    with run_kafka(KAFKA_4, brokers=3, directory=tmp_path) as cluster:
        assert [node.node_id for node in cluster.brokers] == [1, 2, 3]
        topic = cluster.create_topic(partitions=6)
        leaders = {cluster.leader_of(topic, p) for p in range(6)}
        assert leaders == {1, 2, 3}
        survivor = cluster.leader_of(topic, 0)
        cluster.node(survivor).kill()
        cluster.restart(survivor)
        assert cluster.node(survivor).running


def test_a_broker_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    """Its client port is taken: the broker exits, and the error carries its log's last lines."""
    cluster = build_cluster(KAFKA_4, tmp_path)
    node = cluster.brokers[0]
    node.write_config(cluster.cluster_id)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", node.port))
        squatter.listen()
        try:
            with pytest.raises(KafkaError) as failure:
                cluster.start()
        finally:
            node.kill()
    message = str(failure.value)
    assert "last lines of" in message
    assert "Address already in use" in message


def test_jars_are_cached_once() -> None:
    classpath = kafka_classpath(KAFKA_4)
    assert classpath.endswith("/*")
    assert list(Path(classpath[:-2]).glob("kafka-clients-*.jar"))
