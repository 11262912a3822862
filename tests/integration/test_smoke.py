"""Real clients against the real brokers (Tansu and Apache Kafka), no proxy: the baseline later
tests rely on."""

from __future__ import annotations

import confluent_kafka
import pytest

from tests.harness import (
    RawKafkaClient,
    api_versions_v0_request,
    parse_api_versions_v0_response,
)
from tests.harness.kcat import librdkafka_version, run_kcat
from tests.harness.upstream import Upstream

pytestmark = pytest.mark.upstreams("tansu", "kafka")

N = 10
RECORDS = [(f"key-{i}".encode(), f"value-{i}".encode()) for i in range(N)]


def _consume_confluent(broker: Upstream, topic: str, n: int) -> list[tuple[bytes, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "smoke-unused",  # required by librdkafka; assign() never joins it
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[bytes, bytes]] = []
        for _ in range(50):
            if len(got) >= n:
                break
            for msg in consumer.consume(num_messages=n - len(got), timeout=0.5):
                assert msg.error() is None, msg.error()
                got.append((msg.key(), msg.value()))
        return got
    finally:
        consumer.close()


def test_confluent_kafka_produce_and_consume(upstream: Upstream, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": upstream.bootstrap, "acks": "all", "linger.ms": 5})
    reports: list[tuple[object, int, int]] = []
    for key, value in RECORDS:
        producer.produce(
            topic,
            value=value,
            key=key,
            partition=0,
            on_delivery=lambda err, msg: reports.append((err, msg.partition(), msg.offset())),
        )
    assert producer.flush(10) == 0
    assert len(reports) == N
    assert [err for err, _, _ in reports] == [None] * N
    assert sorted(off for _, _, off in reports) == list(range(N))

    assert _consume_confluent(upstream, topic, N) == RECORDS


def test_kafka_python_produce_and_consume(upstream: Upstream, topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(bootstrap_servers=upstream.bootstrap, acks="all", linger_ms=5)
    try:
        futures = [producer.send(topic, value=v, key=k, partition=0) for k, v in RECORDS]
        producer.flush(10)
        metas = [f.get(timeout=10) for f in futures]
    finally:
        producer.close(5)
    assert [m.offset for m in metas] == list(range(N))

    consumer = KafkaConsumer(
        bootstrap_servers=upstream.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek(TopicPartition(topic, 0), 0)
        got = []
        for msg in consumer:
            got.append((msg.key, msg.value))
            if len(got) == N:
                break
    finally:
        consumer.close()
    assert got == RECORDS


def test_kcat_produce_and_consume(upstream: Upstream, topic: str) -> None:
    assert librdkafka_version() == confluent_kafka.libversion()[0]
    lines = "".join(f"{k.decode()}:{v.decode()}\n" for k, v in RECORDS)
    produced = run_kcat(
        ["-b", upstream.bootstrap, "-P", "-t", topic, "-p", "0", "-K:", "-X", "acks=all"],
        input_bytes=lines.encode(),
    )
    assert produced.returncode == 0, produced.stderr.decode(errors="replace")
    consume = ["-b", upstream.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e"]
    consumed = run_kcat([*consume, "-f", "%k:%s\n"])
    assert consumed.returncode == 0, consumed.stderr.decode(errors="replace")
    got = [tuple(line.split(b":", 1)) for line in consumed.stdout.splitlines()]
    assert got == RECORDS


async def test_aiokafka_produce_and_consume(upstream: Upstream, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    # aiokafka's idempotent producer fails on Tansu (InitProducerId v0 only): on Kafka it is on.
    producer = AIOKafkaProducer(
        bootstrap_servers=upstream.bootstrap, acks="all", enable_idempotence=upstream.is_kafka
    )
    await producer.start()
    try:
        metas = [await producer.send_and_wait(topic, v, key=k, partition=0) for k, v in RECORDS]
    finally:
        await producer.stop()
    assert [m.offset for m in metas] == list(range(N))

    consumer = AIOKafkaConsumer(bootstrap_servers=upstream.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[tuple[bytes, bytes]] = []
        while len(got) < N:
            batch = await consumer.getmany(tp, timeout_ms=5000)
            assert batch, f"no records after {len(got)}"
            got.extend((m.key, m.value) for m in batch[tp])
    finally:
        await consumer.stop()
    assert got == RECORDS


def test_raw_client_api_versions_v0(raw_client: RawKafkaClient) -> None:
    response = raw_client.request(api_versions_v0_request(correlation_id=42))
    correlation_id, error_code, apis = parse_api_versions_v0_response(response)
    assert correlation_id == 42
    assert error_code == 0
    assert 0 in apis  # Produce
    assert apis[0][0] == 0
    assert 18 in apis  # ApiVersions itself
