"""Legacy producers (Produce v0-v2, message formats 0 and 1) through kvproxy in front of Apache
Kafka: 3.9 still stores them, 4.x refuses them (KIP-896) by closing the connection, while both
advertise Produce from v0 (4.x for librdkafka's sake, KAFKA-18659). What the proxy offers in
ApiVersions and what a legacy client sees, direct and through the proxy (docs/clients.md,
"Legacy producers")."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaProducer
from kafka.errors import CorruptRecordError, InvalidRecordError, KafkaConnectionError

from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness.kafka_broker import KAFKA_3, KAFKA_4, KafkaCluster
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.raw_client import (
    RawClientError,
    RawKafkaClient,
    api_versions_v0_request,
    parse_api_versions_v0_response,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
AS_V0 = "@v0"
LEGACY_FRAMES = (
    "kafka-python-produce-v1-magic0" + AS_V0,
    "kafka-python-produce-v1-magic0",
    "kafka-python-produce-v1-magic0-snappy",
    "kafka-python-produce-v2-magic1",
    "kafka-python-produce-v2-magic1-gzip",
)
GOLDEN_TOPIC = "golden"  # the topic the recorded frames name


@pytest.fixture
def proxy(any_kafka: KafkaCluster) -> Iterator[RunningProxy]:
    with run_proxy(any_kafka.bootstrap_servers) as running:
        yield running


def produce_range(host: str, port: int) -> tuple[int, int]:
    with RawKafkaClient(host, port) as client:
        _, error_code, apis = parse_api_versions_v0_response(
            client.request(api_versions_v0_request())
        )
    assert error_code == 0
    return apis[PRODUCE]


def test_proxy_offers_produce_from_v0_as_the_broker_does(
    any_kafka: KafkaCluster, proxy: RunningProxy
) -> None:
    """The proxy keeps the broker's lowest Produce version (librdkafka needs v0 listed) and its
    highest (v13, topics by id, included)."""
    direct = produce_range(any_kafka.host, any_kafka.port)
    through = produce_range(proxy.host, proxy.port)
    expected = {KAFKA_4: ((0, 13), (0, 13)), KAFKA_3: ((0, 11), (0, 11))}[any_kafka.version]
    assert (direct, through) == expected


def golden_frame(name: str) -> tuple[bytes, int, list[tuple[bytes | None, bytes | None]]]:
    """A recorded request, its Produce version, and the records it carries for golden/0. A name
    ending in @v0 is a v1 request sent as v0 (the two requests are the same; v1 added the
    answer's throttle time)."""
    if name.endswith(AS_V0):
        frame, version, records = golden_frame(name.removesuffix(AS_V0))
        assert version == 1
        return frame[:2] + struct.pack(">h", 0) + frame[4:], 0, records
    sidecar = json.loads((GOLDEN / f"{name}.json").read_text())
    records = [
        (None if k is None else k.encode(), None if v is None else v.encode())
        for k, v, _headers in sidecar["topics"][GOLDEN_TOPIC]["0"]
    ]
    return (GOLDEN / f"{name}.bin").read_bytes(), int(sidecar["api_version"]), records


def ensure_topic(cluster: KafkaCluster, name: str, config: dict[str, str] | None = None) -> str:
    if name not in cluster.admin().list_topics(timeout=10).topics:
        cluster.create_topic(name, config=config)
    return name


def read_back(
    bootstrap: str, topic: str, start: int, count: int
) -> list[tuple[bytes | None, bytes | None]]:
    """`count` records of topic/0 from `start`, as a consumer reads them."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "legacy", "log_level": 3})
    consumer.assign([TopicPartition(topic, 0, start)])
    found: list[tuple[bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 30
    try:
        while len(found) < count and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is None:
                continue
            assert message.error() is None, message.error()
            found.append((message.key(), message.value()))
    finally:
        consumer.close()
    return found


def end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "legacy-end"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    return int(high)


@pytest.mark.parametrize("name", LEGACY_FRAMES)
def test_recorded_legacy_frames_are_stored_behind_kafka_3(kafka3: KafkaCluster, name: str) -> None:
    """kafka-python's recorded v1 (magic 0) and v2 (magic 1) requests, plain and compressed: the
    proxy passes them, Kafka 3.9 stores them, a consumer reads the same records back."""
    ensure_topic(kafka3, GOLDEN_TOPIC)
    frame, version, records = golden_frame(name)
    with run_proxy(kafka3.bootstrap_servers) as proxy, RawKafkaClient(proxy.host, proxy.port) as c:
        answer = decode_response(c.request(frame, timeout=15), PRODUCE, version).body
    (topic,) = answer.responses
    (partition,) = topic.partition_responses
    assert (topic.name, int(partition.error_code)) == (GOLDEN_TOPIC, 0)
    assert read_back(kafka3.bootstrap, GOLDEN_TOPIC, int(partition.base_offset), len(records)) == (
        records
    )
    stored = kvproxy_dump_json(kafka3.node(1).directory / "data" / f"{GOLDEN_TOPIC}-0")
    assert (stored["magics"], stored["errors"]) == ([2], [])  # converted on append


def kvproxy_dump_json(path: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "dump", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize("name", LEGACY_FRAMES[::2])  # v0, v1 snappy, v2 gzip
def test_kafka_4_closes_on_legacy_frames_direct_and_through_the_proxy(
    kafka: KafkaCluster, name: str
) -> None:
    """Kafka 4 answers nothing to Produce v0-v2: it closes the connection. Through the proxy the
    client sees the same, and nothing is stored."""
    ensure_topic(kafka, GOLDEN_TOPIC)
    frame, _, _ = golden_frame(name)
    before = end_offset(kafka.bootstrap, GOLDEN_TOPIC)
    with run_proxy(kafka.bootstrap_servers) as proxy:
        for host, port in ((kafka.host, kafka.port), (proxy.host, proxy.port)):
            with RawKafkaClient(host, port) as client:
                client.send_frame(frame)
                with pytest.raises(RawClientError, match=r"connection (closed|reset)"):
                    client.recv_frame(timeout=15)
    assert end_offset(kafka.bootstrap, GOLDEN_TOPIC) == before


def legacy_send(
    bootstrap: str, api_version: tuple[int, int], topic: str, key: bytes | None
) -> Exception | int:
    """What kafka-python forced to an old `api_version` gets for one record: the offset, or
    the exception `future.get()` raises."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        api_version=api_version,
        retries=0,
        linger_ms=0,
        request_timeout_ms=10_000,
        max_block_ms=10_000,
    )
    try:
        return int(producer.send(topic, key=key, value=b"legacy").get(timeout=30).offset)
    except Exception as exc:  # the exception is the result
        return exc
    finally:
        producer.close(timeout=5)


# kafka-python's api_version (0, 10) sends Produce v2 with magic 1, (0, 9) Produce v1 with magic 0
OLD_CLIENTS = [(0, 10), (0, 9)]


@pytest.mark.parametrize("api_version", OLD_CLIENTS)
def test_legacy_client_behind_kafka_3(kafka3: KafkaCluster, api_version: tuple[int, int]) -> None:
    """Behind 3.9 a legacy producer works through the proxy; a refused record (null key on a
    compacted topic) is answered CORRUPT_MESSAGE, the proxy's `errors.legacy_code`, where Kafka
    3.9 itself answers INVALID_RECORD, as the proxy does with `errors.legacy_below: 0`."""
    plain = ensure_topic(kafka3, "legacy-plain")
    compacted = ensure_topic(kafka3, "legacy-compacted", {"cleanup.policy": "compact"})
    with run_proxy(kafka3.bootstrap_servers) as proxy:
        offset = legacy_send(proxy.bootstrap, api_version, plain, b"k")
        refused = legacy_send(proxy.bootstrap, api_version, compacted, None)
    with run_proxy(kafka3.bootstrap_servers, errors={"legacy_below": 0}) as proxy:
        as_kafka = legacy_send(proxy.bootstrap, api_version, compacted, None)
    direct = legacy_send(kafka3.bootstrap, api_version, compacted, None)
    assert isinstance(offset, int), offset
    assert read_back(kafka3.bootstrap, plain, offset, 1) == [(b"k", b"legacy")]
    assert isinstance(refused, CorruptRecordError), refused
    assert isinstance(direct, InvalidRecordError), direct
    assert isinstance(as_kafka, InvalidRecordError), as_kafka  # errors.legacy_below: 0
    assert end_offset(kafka3.bootstrap, compacted) == 0


@pytest.mark.parametrize("api_version", OLD_CLIENTS)
def test_legacy_client_behind_kafka_4(kafka: KafkaCluster, api_version: tuple[int, int]) -> None:
    """Behind 4.x a record the proxy passes meets the broker's closed connection, as it does
    direct; a record the proxy refuses is answered CORRUPT_MESSAGE without reaching it."""
    plain = ensure_topic(kafka, "legacy-plain")
    compacted = ensure_topic(kafka, "legacy-compacted", {"cleanup.policy": "compact"})
    with run_proxy(kafka.bootstrap_servers) as proxy:
        through = legacy_send(proxy.bootstrap, api_version, plain, b"k")
        refused = legacy_send(proxy.bootstrap, api_version, compacted, None)
    direct = legacy_send(kafka.bootstrap, api_version, plain, b"k")
    assert isinstance(direct, KafkaConnectionError), direct
    assert isinstance(through, KafkaConnectionError), through
    assert str(through) == str(direct) == "KafkaConnectionError: socket disconnected"
    assert isinstance(refused, CorruptRecordError), refused
    assert str(refused) == "[Error 2] CorruptRecordError: None"
    assert end_offset(kafka.bootstrap, plain) == 0
