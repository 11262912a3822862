"""Real clients through kvproxy to the real brokers (Tansu and Apache Kafka): everything works,
nothing bypasses the proxy."""

from __future__ import annotations

import time
import uuid

import pytest

from kvproxy.protocol.messages import (
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    decode_response,
)
from tests.harness.kcat import run_kcat
from tests.harness.proxy import RunningProxy
from tests.harness.upstream import Upstream

pytestmark = pytest.mark.upstreams("tansu", "kafka")

N = 20
RECORDS = [(f"key-{i}".encode(), f"value-{i}".encode()) for i in range(N)]


def _addresses(api_key: int, api_version: int, payload: bytes) -> list[tuple[int, str, int]]:
    if api_key not in (METADATA, DESCRIBE_CLUSTER, FIND_COORDINATOR, PRODUCE, FETCH):
        return []
    if api_key in (PRODUCE, FETCH) and api_version < (10 if api_key == PRODUCE else 16):
        return []
    body = decode_response(payload, api_key, api_version).body
    if api_key in (METADATA, DESCRIBE_CLUSTER):
        nodes = body.brokers
    elif api_key == FIND_COORDINATOR:
        nodes = body.coordinators if api_version >= 4 else ([body] if body.node_id >= 0 else [])
    else:
        nodes = body.node_endpoints
    return [(int(n.node_id), n.host, int(n.port)) for n in nodes]


def assert_only_proxy_addresses(proxy: RunningProxy, upstream: Upstream, *apis: int) -> set[int]:
    """Every address any client was told is a proxy listener; returns the versions seen."""
    seen_versions: dict[int, set[int]] = {}
    for api_key, api_version, payload in list(proxy.responses):
        for node_id, host, port in _addresses(api_key, api_version, payload):
            assert (host, port) == (proxy.host, proxy.broker_port(node_id))
            assert port != upstream.port
            seen_versions.setdefault(api_key, set()).add(api_version)
    for api in apis:
        assert api in seen_versions, f"no answer of api {api} reached a client"
    return {v for versions in seen_versions.values() for v in versions}


def test_confluent_kafka_produces_and_consumes(proxy: RunningProxy, upstream: Upstream, topic: str):
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 5})
    errors: list[object] = []
    for key, value in RECORDS:
        producer.produce(topic, value, key, partition=0, on_delivery=lambda e, m: errors.append(e))
    assert producer.flush(20) == 0
    assert errors == [None] * N
    brokers = producer.list_topics(timeout=10).brokers
    listener = (proxy.host, proxy.broker_port(upstream.node_id))
    assert {(b.host, b.port) for b in brokers.values()} == {listener}

    consumer = Consumer(
        {"bootstrap.servers": proxy.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < N and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            got.append((message.key(), message.value()))
    consumer.close()
    assert got == RECORDS
    assert_only_proxy_addresses(proxy, upstream, METADATA)


def test_kafka_python_produces_and_consumes(proxy: RunningProxy, upstream: Upstream, topic: str):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all")
    for key, value in RECORDS:
        producer.send(topic, value=value, key=key, partition=0).get(timeout=20)
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=proxy.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000
    )
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    got = []
    for message in consumer:
        got.append((message.key, message.value))
        if len(got) == N:
            break
    consumer.close()
    assert got == RECORDS
    assert_only_proxy_addresses(proxy, upstream, METADATA)


async def test_aiokafka_produces_and_consumes(proxy: RunningProxy, upstream: Upstream, topic: str):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    # aiokafka's idempotent producer fails on Tansu (InitProducerId v0 only): on Kafka it is on.
    producer = AIOKafkaProducer(
        bootstrap_servers=proxy.bootstrap, enable_idempotence=upstream.is_kafka
    )
    await producer.start()
    try:
        for key, value in RECORDS:
            await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=proxy.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        got = []
        while len(got) < N:
            batch = await consumer.getmany(partition, timeout_ms=5000)
            assert batch, "no records within 5 s"
            got.extend((m.key, m.value) for m in batch[partition])
    finally:
        await consumer.stop()
    assert got == RECORDS
    assert_only_proxy_addresses(proxy, upstream, METADATA)


def test_kcat_produces_and_consumes(proxy: RunningProxy, upstream: Upstream, topic: str) -> None:
    lines = "".join(f"{k.decode()}:{v.decode()}\n" for k, v in RECORDS).encode()
    produced = run_kcat(
        ["-b", proxy.bootstrap, "-P", "-t", topic, "-p", "0", "-K:"], input_bytes=lines
    )
    assert produced.returncode == 0, produced.stderr.decode(errors="replace")
    consume = ["-b", proxy.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e"]
    consumed = run_kcat([*consume, "-f", "%k:%s\n"])
    assert consumed.returncode == 0, consumed.stderr.decode(errors="replace")
    assert [tuple(line.split(b":", 1)) for line in consumed.stdout.splitlines()] == RECORDS
    assert_only_proxy_addresses(proxy, upstream, METADATA)


def test_consumer_group_commits_and_resumes(proxy: RunningProxy, upstream: Upstream, topic: str):
    """A group member commits through the proxy; a new member resumes from the commit."""
    from confluent_kafka import Consumer, Producer

    producer = Producer({"bootstrap.servers": proxy.bootstrap})
    for key, value in RECORDS:
        producer.produce(topic, value, key, partition=0)
    assert producer.flush(20) == 0
    group = f"g-{uuid.uuid4().hex[:8]}"
    settings = {
        "bootstrap.servers": proxy.bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    }

    def consume(count: int) -> list[tuple[bytes, bytes]]:
        consumer = Consumer(settings)
        consumer.subscribe([topic])
        got = []
        deadline = time.monotonic() + 60
        try:
            while len(got) < count and time.monotonic() < deadline:
                message = consumer.poll(1)
                if message is not None and message.error() is None:
                    got.append((message.key(), message.value()))
            consumer.commit(asynchronous=False)
        finally:
            consumer.close()
        return got

    first = consume(N // 2)
    assert first == RECORDS[: len(first)]
    assert len(first) >= N // 2
    rest = consume(N - len(first))
    assert first + rest == RECORDS
    assert_only_proxy_addresses(proxy, upstream, METADATA, FIND_COORDINATOR)


@pytest.mark.parametrize("version", [0, 1, 4, 9, 12])
def test_metadata_every_version_names_only_proxy_listeners(
    proxy: RunningProxy, upstream: Upstream, version: int
) -> None:
    from kvproxy.protocol.messages import codec_for, encode_request, make_request
    from tests.harness.raw_client import RawKafkaClient

    request_type = codec_for(METADATA, version).request_type
    fields = {"topics": None} if version >= 1 else {"topics": ()}
    if version >= 4:
        fields["allow_auto_topic_creation"] = False
    if 8 <= version <= 10:
        fields["include_cluster_authorized_operations"] = False
    if version >= 8:
        fields["include_topic_authorized_operations"] = False
    body = request_type(**fields)
    client = RawKafkaClient(proxy.host, proxy.port)
    try:
        answer = client.request(encode_request(make_request(METADATA, version, 7, "t", body)))
    finally:
        client.close()
    assert _addresses(METADATA, version, answer) == [
        (upstream.node_id, proxy.host, proxy.broker_port(upstream.node_id))
    ]


def test_system_kcat_works_through_the_proxy(proxy: RunningProxy, topic: str) -> None:
    """Debian 12's kcat links librdkafka 2.0.2, which cannot parse Tansu's ApiVersions v3 answer
    (a tag sent at its default value) when it talks to Tansu directly. The proxy re-encodes that
    answer, so the same old client works through it; and through it to Apache Kafka 4.x."""
    import subprocess

    def system_kcat(*args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["kcat", *args], input=data, capture_output=True, timeout=30, check=False
        )

    produce = ["-b", proxy.bootstrap, "-P", "-t", topic, "-p", "0", "-K:"]
    produced = system_kcat(*produce, data=b"a:1\n")
    assert produced.returncode == 0, produced.stderr.decode(errors="replace")
    consume = ["-b", proxy.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e"]
    consumed = system_kcat(*consume, "-f", "%k:%s\n")
    assert consumed.returncode == 0, consumed.stderr.decode(errors="replace")
    assert consumed.stdout == b"a:1\n"
