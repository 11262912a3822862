"""Real clients against the real broker (Tansu), no proxy: the baseline later tests rely on."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.harness import (
    Broker,
    RawKafkaClient,
    api_versions_v0_request,
    parse_api_versions_v0_response,
)

N = 10
RECORDS = [(f"key-{i}".encode(), f"value-{i}".encode()) for i in range(N)]


def _consume_confluent(broker: Broker, topic: str, n: int) -> list[tuple[bytes, bytes]]:
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


def test_confluent_kafka_produce_and_consume(tansu: Broker, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": tansu.bootstrap, "acks": "all", "linger.ms": 5})
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

    assert _consume_confluent(tansu, topic, N) == RECORDS


def test_kafka_python_produce_and_consume(tansu: Broker, topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(bootstrap_servers=tansu.bootstrap, acks="all", linger_ms=5)
    try:
        futures = [producer.send(topic, value=v, key=k, partition=0) for k, v in RECORDS]
        producer.flush(10)
        metas = [f.get(timeout=10) for f in futures]
    finally:
        producer.close(5)
    assert [m.offset for m in metas] == list(range(N))

    consumer = KafkaConsumer(
        bootstrap_servers=tansu.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000
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


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
def test_kcat_produce_and_consume(tansu: Broker, topic: str) -> None:
    lines = "".join(f"{k.decode()}:{v.decode()}\n" for k, v in RECORDS)
    produced = subprocess.run(
        ["kcat", "-b", tansu.bootstrap, "-P", "-t", topic, "-p", "0", "-K:", "-X", "acks=all"],
        input=lines.encode(),
        capture_output=True,
        check=False,
        timeout=20,
    )
    if produced.returncode != 0 and b"ApiVersionRequest failed" in produced.stderr:
        # kcat 1.7.1 bundles librdkafka 2.0.2, which cannot parse the tagged fields Tansu 0.6
        # puts in its ApiVersions v3 answer (FinalizedFeaturesEpoch = -1 sent explicitly):
        # "Read underflow ... ApiVersion v3 at 274/279". Newer librdkafka (confluent-kafka) works.
        pytest.xfail("this kcat's librdkafka cannot parse Tansu's ApiVersions v3 response")
    assert produced.returncode == 0, produced.stderr.decode(errors="replace")
    consume = ["kcat", "-b", tansu.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning"]
    out = subprocess.run(
        [*consume, "-e", "-f", "%k:%s\n"],
        capture_output=True,
        check=True,
        timeout=20,
    )
    got = [tuple(line.split(b":", 1)) for line in out.stdout.splitlines()]
    assert got == RECORDS


async def test_aiokafka_produce_and_consume(tansu: Broker, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    # aiokafka's idempotent producer fails on Tansu (InitProducerId v0 only): keep it off.
    producer = AIOKafkaProducer(
        bootstrap_servers=tansu.bootstrap, acks="all", enable_idempotence=False
    )
    await producer.start()
    try:
        metas = [await producer.send_and_wait(topic, v, key=k, partition=0) for k, v in RECORDS]
    finally:
        await producer.stop()
    assert [m.offset for m in metas] == list(range(N))

    consumer = AIOKafkaConsumer(bootstrap_servers=tansu.bootstrap, enable_auto_commit=False)
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
