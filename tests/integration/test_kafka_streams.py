"""Kafka Streams 4.4 (kafka-streams from Maven Central) through kvproxy in front of Apache Kafka
4.4, with exactly_once_v2: a topology with a repartition topic and a state store (its changelog
compacted), under the classic and the `streams` group protocol (KIP-1071); its input read back
as output exactly once; then a record kvproxy refuses on the output topic (`key_pattern` there):
what the application sees with the default production exception handler and with one that
continues, and that its transaction is aborted, nothing of it readable. docs/clients.md ("Kafka
Streams") quotes what these tests see."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.kafka_broker import KafkaCluster
from tests.harness.kafka_streams import StreamsApp, running_app
from tests.harness.proxy import RunningProxy, run_proxy

OUTPUT_KEYS = "[a-z]+"
WORDS = ["apple:0", "pear:1", "apple:2", "fig:3", "apple:4", "pear:5"]
COUNTS = {b"apple": [b"1", b"2", b"3"], b"pear": [b"1", b"2"], b"fig": [b"1"]}
"""The count of each word after each of its records, in order: one output record per input."""
JOIN_GROUP, STREAMS_GROUP_HEARTBEAT = 11, 88


RULES = [{"match": "streams-out-*", "policies": [{"key_pattern": {"regex": OUTPUT_KEYS}}]}]


@pytest.fixture
def proxy(kafka: KafkaCluster) -> Iterator[RunningProxy]:
    with run_proxy(kafka.bootstrap_servers, topics=RULES) as running:
        yield running


def _topics(kafka: KafkaCluster) -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:10]
    return (
        kafka.create_topic(f"streams-in-{suffix}", partitions=2),
        kafka.create_topic(f"streams-out-{suffix}", partitions=1),
    )


def _produce(bootstrap: str, topic: str, values: list[str]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in values:
        producer.produce(topic, value=value.encode())
    assert producer.flush(15) == 0


def _read(bootstrap: str, topic: str, isolation: str) -> tuple[list[tuple[Any, Any]], int, int]:
    """The partition's records as a consumer of `isolation` reads them to its end, where that
    end is (the last stable offset for read_committed), and the high watermark."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    partition = TopicPartition(topic, 0, OFFSET_BEGINNING)
    records: list[tuple[Any, Any]] = []
    try:
        consumer.assign([partition])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                end = consumer.position([TopicPartition(topic, 0)])[0].offset
                high = consumer.get_watermark_offsets(TopicPartition(topic, 0))[1]
                return records, end, high
            if error is None:
                records.append((message.key(), message.value()))
    finally:
        consumer.close()
    raise AssertionError(f"{isolation} consumer did not reach the end of {topic}: {records}")


def _wait_for_output(bootstrap: str, topic: str, count: int) -> list[tuple[Any, Any]]:
    deadline = time.monotonic() + 150
    while True:
        records, _, _ = _read(bootstrap, topic, "read_committed")
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(1)


def _by_key(records: list[tuple[Any, Any]]) -> dict[Any, list[Any]]:
    grouped: dict[Any, list[Any]] = {}
    for key, value in records:
        grouped.setdefault(key, []).append(value)
    return grouped


def _uncaught(app: StreamsApp) -> list[dict[str, str]]:
    event = app.wait_for(lambda e: e["event"] == "uncaught")
    causes: list[dict[str, str]] = event["data"]["causes"]
    return causes


@pytest.mark.parametrize(
    ("broker", "protocol"),
    [("kafka", "classic"), ("kafka", "streams"), ("kafka3", "classic")],
    ids=["kafka-4.4-classic", "kafka-4.4-streams", "kafka-3.9-classic"],
)
def test_input_read_back_as_output_exactly_once(
    request: pytest.FixtureRequest, broker: str, protocol: str
) -> None:
    """Kafka 3.9 has no `streams` groups (KIP-1071 came with 4.x): the classic protocol there."""
    kafka: KafkaCluster = request.getfixturevalue(broker)
    with run_proxy(kafka.bootstrap_servers, topics=RULES) as proxy:
        _exactly_once(kafka, proxy, protocol)


def _exactly_once(kafka: KafkaCluster, proxy: RunningProxy, protocol: str) -> None:
    source, sink = _topics(kafka)
    _produce(proxy.bootstrap, source, WORDS)
    app_id = f"app-{uuid.uuid4().hex[:10]}"
    with running_app(
        proxy.bootstrap, input=source, output=sink, protocol=protocol, app_id=app_id
    ) as app:
        app.wait_for_state("RUNNING", timeout=150)
        output = _wait_for_output(proxy.bootstrap, sink, len(WORDS))
    assert _by_key(output) == COUNTS  # each input once: no count missing, none twice
    assert len(output) == len(WORDS)
    assert not [e for e in app.events if e["event"] == "uncaught"], app.log
    # the topology's internal topics, made by the application through kvproxy
    admin = kafka.admin()
    names = set(admin.list_topics(timeout=10).topics)
    assert f"{app_id}-counts-repartition" in names
    from confluent_kafka.admin import ConfigResource

    changelog = ConfigResource(ConfigResource.Type.TOPIC, f"{app_id}-counts-changelog")
    configs = admin.describe_configs([changelog])[changelog].result(30)
    assert configs["cleanup.policy"].value == "compact"
    answered = {(api, version) for api, version, _ in proxy.responses}
    produce = 13 if kafka.version.startswith("4.") else 11  # the highest each broker offers
    assert (0, produce) in answered  # v13: topics by id
    group_api = STREAMS_GROUP_HEARTBEAT if protocol == "streams" else JOIN_GROUP
    assert any(api == group_api for api, _ in answered), sorted(answered)


def _good_then_bad(
    kafka: KafkaCluster, proxy: RunningProxy, handler: str
) -> tuple[StreamsApp, str]:
    """Two words output and committed, then the refused key: alone in its transaction's batch
    to the output (a batch is written whole or not at all: another record beside it would fail
    with it, its exception saying only that it shared a batch with an invalid record)."""
    source, sink = _topics(kafka)
    _produce(proxy.bootstrap, source, ["apple:0", "pear:1"])
    with running_app(proxy.bootstrap, input=source, output=sink, handler=handler) as app:
        app.wait_for_state("RUNNING", timeout=150)
        assert len(_wait_for_output(proxy.bootstrap, sink, 2)) == 2
        _produce(proxy.bootstrap, source, ["BAD KEY:2"])
        app.wait_for_state("ERROR", timeout=120)
    return app, sink


def _aborted_cleanly(proxy: RunningProxy, sink: str) -> None:
    """What the failed transaction wrote is not readable; no transaction is left open."""
    committed, end, high = _read(proxy.bootstrap, sink, "read_committed")
    assert sorted(committed) == [(b"apple", b"1"), (b"pear", b"1")]  # before the refusal
    assert end == high  # the last stable offset is the end: the transaction is over
    everything, _, _ = _read(proxy.bootstrap, sink, "read_uncommitted")
    assert (b"BAD KEY", b"1") not in everything  # refused: never stored


def test_a_refusal_fails_the_application_with_the_default_handler(
    kafka: KafkaCluster, proxy: RunningProxy
) -> None:
    app, sink = _good_then_bad(kafka, proxy, "default")
    first, *_, root = _uncaught(app)
    assert first["exception"] == "org.apache.kafka.streams.errors.StreamsException"
    assert first["message"].startswith(f"Error encountered sending record to topic {sink} for task")
    assert first["message"].endswith(
        "Exception handler choose to FAIL the processing, no more records would be sent."
    )
    assert root == {
        "exception": "org.apache.kafka.common.InvalidRecordException",
        "message": f"Record key 'BAD KEY' does not match {OUTPUT_KEYS} in topic partition {sink}-0",
    }
    assert app.states()[-2:] == ["PENDING_ERROR", "ERROR"]
    assert "Error encountered sending record to topic" in app.log  # its ERROR line
    _aborted_cleanly(proxy, sink)


def test_a_continuing_handler_cannot_skip_a_refusal_under_exactly_once(
    kafka: KafkaCluster, proxy: RunningProxy
) -> None:
    """The handler is asked and says continue, but the transactional producer is in error once
    a batch of its transaction failed: the commit fails and the application stops all the same."""
    app, sink = _good_then_bad(kafka, proxy, "continue")
    handled = [e["data"] for e in app.events if e["event"] == "handler"]
    assert {h["topic"] for h in handled} == {sink}
    assert "org.apache.kafka.common.InvalidRecordException" in {h["exception"] for h in handled}
    causes = _uncaught(app)
    assert causes[0]["exception"] == "org.apache.kafka.streams.errors.StreamsException"
    assert causes[0]["message"].startswith("Error encountered trying to add offsets to a "), causes
    # the producer's own error between them (a KafkaException "... in an error state"), or,
    # when the refusal reached the producer first, the refusal itself: seen both ways
    assert len(causes) == 2 or any("in an error state" in c["message"] for c in causes[1:-1]), (
        causes
    )
    assert causes[-1]["exception"] == "org.apache.kafka.common.InvalidRecordException"
    assert f"Record key 'BAD KEY' does not match {OUTPUT_KEYS}" in causes[-1]["message"]
    assert app.states()[-1] == "ERROR"
    _aborted_cleanly(proxy, sink)
