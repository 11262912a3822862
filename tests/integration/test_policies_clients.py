"""Real clients through kvproxy with policies on: the bad record fails, the good one is consumed.

For each record-content policy a real producer sends one bad record to partition 0 and one good
record to partition 1 of the same topic, gets the documented error for the bad one, and a consumer
(assigned to both partitions, reading from the beginning up to the end) sees the good record and
not the bad one. librdkafka sends one ProduceRequest per partition, so with confluent-kafka the two
records travel in two requests; kafka-python and aiokafka put both partitions in one request
(checked with the proxy's response tap).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness.clients import LINGER_MS, confluent_send, consume, produce_partitions
from tests.harness.proxy import run_proxy
from tests.harness.upstream import Upstream

INVALID_RECORD = 87

pytestmark = pytest.mark.upstreams("tansu", "kafka")


# ---- the policies, each with one bad and one good record ----

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "price": {"type": "number", "minimum": 0}},
    "required": ["id", "price"],
}
AVRO_SCHEMA = {
    "type": "record",
    "name": "Person",
    "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}],
}


def _avro(datum: dict[str, Any]) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_SCHEMA), datum)
    return out.getvalue()


def _case(policy: str, tmp_path: Path) -> tuple[list[Any], dict[str, Any], dict[str, Any], int]:
    """(policies, bad record, good record, expected confluent-kafka error code)."""
    from confluent_kafka import KafkaError

    if policy == "max_record_bytes":
        return (
            [{"max_record_bytes": {"limit": 100}}],
            {"key": b"k", "value": b"x" * 300},
            {"key": b"k", "value": b"x" * 50},
            KafkaError.MSG_SIZE_TOO_LARGE,
        )
    if policy == "required_headers":
        return (
            [{"required_headers": {"names": ["trace-id"]}}],
            {"key": b"k", "value": b"v", "headers": [("other", b"1")]},
            {"key": b"k", "value": b"v", "headers": [("trace-id", b"abc")]},
            KafkaError.INVALID_RECORD,
        )
    if policy == "key_pattern":
        return (
            [{"key_pattern": {"regex": "order-[0-9]+"}}],
            {"key": b"customer-7", "value": b"v"},
            {"key": b"order-7", "value": b"v"},
            KafkaError.INVALID_RECORD,
        )
    if policy == "json":
        return (
            ["json"],
            {"value": b"{not json"},
            {"value": b'{"a": 1}'},
            KafkaError.INVALID_RECORD,
        )
    if policy == "json_schema":
        schema = tmp_path / "order.json"
        schema.write_text(json.dumps(ORDER_SCHEMA))
        return (
            [{"json_schema": {"value": str(schema)}}],
            {"value": b'{"id": "o-1", "price": -3}'},
            {"value": b'{"id": "o-2", "price": 3.5}'},
            KafkaError.INVALID_RECORD,
        )
    if policy == "avro":
        schema = tmp_path / "person.avsc"
        schema.write_text(json.dumps(AVRO_SCHEMA))
        return (
            [{"avro": {"value": str(schema)}}],
            {"value": _avro({"name": "ann", "age": 3}) + b"trailing"},
            {"value": _avro({"name": "bob", "age": 4})},
            KafkaError.INVALID_RECORD,
        )
    if policy == "timestamps":
        two_hours_ahead = int(time.time() * 1000) + 2 * 3600 * 1000
        return (
            ["timestamps"],
            {"value": b"future", "timestamp": two_hours_ahead},
            {"value": b"now"},
            KafkaError.INVALID_TIMESTAMP,
        )
    raise AssertionError(policy)


@pytest.mark.parametrize(
    "policy",
    [
        "max_record_bytes",
        "required_headers",
        "key_pattern",
        "json",
        "json_schema",
        "avro",
        "timestamps",
    ],
)
def test_confluent_kafka_gets_the_policy_error_and_the_good_record_is_consumed(
    upstream: Upstream, make_topic: Any, tmp_path: Path, policy: str
) -> None:
    topic = make_topic(2)
    policies, bad, good, expected = _case(policy, tmp_path)
    topics = [
        {
            "match": topic,
            "default_policies": "drop",
            "policies": ["batch_integrity", "crc", *policies],
        }
    ]
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        bad_error, good_error = confluent_send(proxy.bootstrap, topic, bad, good)
        assert bad_error is not None and bad_error.code() == expected, bad_error
        assert not bad_error.retriable()
        assert good_error is None, good_error
        got = consume(proxy.bootstrap, topic)
        assert dict(proxy.server.sink.rejections) == {
            (
                topic,
                policy,
                10 if policy == "max_record_bytes" else 32 if policy == "timestamps" else 87,
            ): 1
        }
    assert got == {0: [], 1: [good["value"]]}


def test_confluent_kafka_null_key_on_compacted_topic(upstream: Upstream, make_topic: Any) -> None:
    from confluent_kafka import KafkaError

    topic = make_topic(2, config={"cleanup.policy": "compact"})
    with run_proxy(upstream.bootstrap) as proxy:  # default policies; compaction is discovered
        bad_error, good_error = confluent_send(
            proxy.bootstrap, topic, {"value": b"no key"}, {"key": b"id", "value": b"keyed"}
        )
        assert bad_error is not None and bad_error.code() == KafkaError.INVALID_RECORD, bad_error
        assert good_error is None
        # librdkafka negotiates Produce v8+: the answer carried the Kafka message
        answers = [(version, frame) for key, version, frame in proxy.responses if key == PRODUCE]
        assert answers and all(version >= 8 for version, _ in answers)
        messages = [
            p.error_message
            for version, frame in answers
            for t in decode_response(frame, PRODUCE, version).body.responses
            for p in t.partition_responses
            if p.error_code
        ]
        assert len(messages) == 1
        assert (
            "Compacted topic cannot accept message without key in topic partition "
            f"{topic}-0" in messages[0]
        )
        got = consume(proxy.bootstrap, topic)
    assert got == {0: [], 1: [b"keyed"]}


def test_confluent_kafka_compression_policy_per_topic(upstream: Upstream, make_topic: Any) -> None:
    """gzip is refused on a topic that allows only uncompressed batches, accepted elsewhere."""
    from confluent_kafka import KafkaError, Producer

    strict, relaxed = make_topic(1), make_topic(1)
    topics = [
        {
            "match": strict,
            "default_policies": "drop",
            "policies": [{"compression": {"allowed": ["none"]}}],
        }
    ]
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "compression.type": "gzip",
                "linger.ms": LINGER_MS,
                "message.timeout.ms": 5000,
            }
        )
        results: dict[str, Any] = {}
        producer.produce(
            strict, b"a" * 200, partition=0, on_delivery=lambda e, m: results.update(s=e)
        )
        producer.produce(
            relaxed, b"b" * 200, partition=0, on_delivery=lambda e, m: results.update(r=e)
        )
        assert producer.flush(15) == 0
        assert results["s"] is not None
        assert results["s"].code() == KafkaError.UNSUPPORTED_COMPRESSION_TYPE, results["s"]
        assert results["r"] is None
        assert consume(proxy.bootstrap, strict, 1) == {0: []}
        assert consume(proxy.bootstrap, relaxed, 1) == {0: [b"b" * 200]}


def test_confluent_kafka_acks_policy_refuses_acks_1(upstream: Upstream, make_topic: Any) -> None:
    from confluent_kafka import KafkaError, Producer

    strict, relaxed = make_topic(1), make_topic(1)
    topics = [
        {"match": strict, "default_policies": "drop", "policies": [{"acks": {"allowed": [-1]}}]}
    ]
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        producer = Producer(
            {"bootstrap.servers": proxy.bootstrap, "acks": 1, "message.timeout.ms": 5000}
        )
        results: dict[str, Any] = {}
        producer.produce(strict, b"a", partition=0, on_delivery=lambda e, m: results.update(s=e))
        producer.produce(relaxed, b"b", partition=0, on_delivery=lambda e, m: results.update(r=e))
        assert producer.flush(15) == 0
        assert results["s"] is not None
        assert results["s"].code() == KafkaError.INVALID_REQUIRED_ACKS, results["s"]
        assert results["r"] is None
        assert consume(proxy.bootstrap, strict, 1) == {0: []}
        assert consume(proxy.bootstrap, relaxed, 1) == {0: [b"b"]}


def test_confluent_kafka_five_records_two_bad_all_five_fail(
    upstream: Upstream, make_topic: Any
) -> None:
    """Records 1 and 3 of 5 are not JSON: all five fail, as with a Kafka broker."""
    from confluent_kafka import KafkaError, Producer

    topic = make_topic(1)
    values = [b"[0]", b"nope", b"[2]", b"nah", b"[4]"]
    topics = [{"match": topic, "default_policies": "drop", "policies": ["json"]}]
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "linger.ms": LINGER_MS,
                "message.timeout.ms": 5000,
            }
        )
        errors: list[Any] = []
        for value in values:
            producer.produce(topic, value, partition=0, on_delivery=lambda e, m: errors.append(e))
        assert producer.flush(15) == 0
        assert len(produce_partitions(proxy)) == 1, "the five records should form one batch"
        # librdkafka reads record_errors (KIP-467): the culprits get INVALID_RECORD, the others
        # "part of a batch which had one or more invalid records"
        other = KafkaError._INVALID_DIFFERENT_RECORD
        bad = KafkaError.INVALID_RECORD
        assert [e.code() if e else None for e in errors] == [other, bad, other, bad, other]
        assert consume(proxy.bootstrap, topic, 1) == {0: []}


# ---- kafka-python ----


def test_kafka_python_null_key_on_compacted_topic_one_request(
    upstream: Upstream, make_topic: Any
) -> None:
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    topic = make_topic(2, config={"cleanup.policy": "compact"})
    with run_proxy(upstream.bootstrap) as proxy:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, linger_ms=LINGER_MS, retries=0)
        try:
            bad = producer.send(topic, value=b"no key", partition=0)
            good = producer.send(topic, value=b"keyed", key=b"id", partition=1)
            producer.flush(15)
            with pytest.raises(InvalidRecordError):
                bad.get(timeout=15)
            assert good.get(timeout=15).partition == 1
        finally:
            producer.close(5)
        assert [sorted(p) for p in produce_partitions(proxy)] == [
            [(topic, 0, INVALID_RECORD), (topic, 1, 0)]
        ]
        got = consume(proxy.bootstrap, topic)
    assert got == {0: [], 1: [b"keyed"]}


def test_kafka_python_json_policy_one_request(upstream: Upstream, make_topic: Any) -> None:
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    topic = make_topic(2)
    topics = [{"match": topic, "default_policies": "drop", "policies": ["json"]}]
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, linger_ms=LINGER_MS, retries=0)
        try:
            bad = producer.send(topic, value=b"{oops", partition=0)
            good = producer.send(topic, value=b'{"ok": 1}', partition=1)
            producer.flush(15)
            with pytest.raises(InvalidRecordError):
                bad.get(timeout=15)
            good.get(timeout=15)
        finally:
            producer.close(5)
        assert [sorted(p) for p in produce_partitions(proxy)] == [
            [(topic, 0, INVALID_RECORD), (topic, 1, 0)]
        ]
        got = consume(proxy.bootstrap, topic)
    assert got == {0: [], 1: [b'{"ok": 1}']}


def test_kafka_python_produce_v2_null_key_gets_corrupt_message(
    upstream: Upstream, make_topic: Any
) -> None:
    """api_version (0, 10, 1): Produce v2 with magic 1 messages; the legacy answer is
    CORRUPT_MESSAGE. Answered by the proxy (Tansu cannot store magic 1), so only the bad record."""
    from kafka import KafkaProducer
    from kafka.errors import CorruptRecordError

    topic = make_topic(1, config={"cleanup.policy": "compact"})
    with run_proxy(upstream.bootstrap) as proxy:
        producer = KafkaProducer(
            bootstrap_servers=proxy.bootstrap, api_version=(0, 10, 1), retries=0
        )
        try:
            future = producer.send(topic, value=b"no key", partition=0)
            with pytest.raises(CorruptRecordError):
                future.get(timeout=15)
        finally:
            producer.close(5)
        assert [v for k, v, _ in proxy.responses if k == PRODUCE] == [2]
        assert produce_partitions(proxy) == [[(topic, 0, 2)]]
        assert consume(proxy.bootstrap, topic, 1) == {0: []}


# ---- aiokafka ----


async def _aiokafka_send(
    bootstrap: str, topic: str, bad: dict[str, Any], good: dict[str, Any]
) -> tuple[BaseException | None, Any]:
    import asyncio

    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=False,
        linger_ms=LINGER_MS,
        request_timeout_ms=5000,
    )
    await producer.start()
    try:
        bad_future = await producer.send(topic, partition=0, **bad)
        good_future = await producer.send(topic, partition=1, **good)
        results = await asyncio.gather(bad_future, good_future, return_exceptions=True)
    finally:
        await producer.stop()
    bad_result, good_result = results
    return (bad_result if isinstance(bad_result, BaseException) else None), good_result


async def test_aiokafka_null_key_on_compacted_topic(upstream: Upstream, make_topic: Any) -> None:
    from aiokafka.errors import UnknownError

    topic = make_topic(2, config={"cleanup.policy": "compact"})
    with run_proxy(upstream.bootstrap) as proxy:
        error, good = await _aiokafka_send(
            proxy.bootstrap, topic, {"value": b"no key"}, {"value": b"keyed", "key": b"id"}
        )
        # aiokafka has no class for INVALID_RECORD (87): it raises UnknownError
        assert isinstance(error, UnknownError), repr(error)
        assert not isinstance(good, BaseException) and good.partition == 1, good
        assert [sorted(p) for p in produce_partitions(proxy)] == [
            [(topic, 0, INVALID_RECORD), (topic, 1, 0)]
        ]
        got = consume(proxy.bootstrap, topic)
    assert got == {0: [], 1: [b"keyed"]}


async def test_aiokafka_json_policy(upstream: Upstream, make_topic: Any) -> None:
    from aiokafka.errors import UnknownError

    topic = make_topic(2)
    topics = [{"match": topic, "default_policies": "drop", "policies": ["json"]}]
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        error, good = await _aiokafka_send(
            proxy.bootstrap, topic, {"value": b"nope"}, {"value": b"[1, 2]"}
        )
        assert isinstance(error, UnknownError), repr(error)
        assert not isinstance(good, BaseException), good
        got = consume(proxy.bootstrap, topic)
    assert got == {0: [], 1: [b"[1, 2]"]}
