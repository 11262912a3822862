"""The `schema` policy through the proxy, against the real broker, with confluent-kafka's own
schema-registry serializers and deserializers.

The registry is `tests/harness/schema_registry.TestRegistry`, a stand-in for Confluent Schema
Registry (none installs here); it speaks Confluent's documented REST contract and is checked
against `SchemaRegistryClient` in `test_schema_registry_stub.py`.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kvproxy.journal import JournalReader
from tests.harness.clients import consume
from tests.harness.metrics import scrape, value
from tests.harness.produce import batch, produce, record_errors, stored
from tests.harness.protobuf_messages import Order
from tests.harness.proxy import run_proxy
from tests.harness.quarantine import journal_settings
from tests.harness.schema_registry import TestRegistry
from tests.harness.upstream import Upstream

INVALID_RECORD = 87
REQUEST_TIMED_OUT = 7

ORDER_AVRO = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
}
ORDER_JSON = {
    "title": "Order",
    "type": "object",
    "properties": {"id": {"type": "string"}, "amount": {"type": "integer"}},
    "required": ["id", "amount"],
}

pytestmark = pytest.mark.upstreams("tansu", "kafka")


@pytest.fixture
def registry() -> Iterator[TestRegistry]:
    with TestRegistry() as running:
        yield running


def _rules(topic: str, **options: Any) -> list[dict[str, Any]]:
    schema = {"value": "required", "validate_payload": True, **options}
    return [
        {
            "match": topic,
            "default_policies": "drop",
            "policies": ["batch_integrity", "crc", {"schema": schema}],
        }
    ]


def _registry_section(registry: TestRegistry, **options: Any) -> dict[str, Any]:
    return {"url": registry.url, "timeout_ms": 500, "negative_cache_ttl_ms": 0, **options}


def _framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + payload


def _send(bootstrap: str, topic: str, values: list[bytes]) -> list[Any]:
    """Produce `values` to partition 0 with librdkafka; each one's delivery error (None: ok)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 10_000}
    )
    errors: list[Any] = [None] * len(values)

    def report(index: int) -> Any:
        return lambda error, _message: errors.__setitem__(index, error)

    for index, data in enumerate(values):
        producer.produce(topic, partition=0, value=data, on_delivery=report(index))
    assert producer.flush(20) == 0
    return errors


# ---- real serializers in, real deserializers out ----


@pytest.mark.parametrize("fmt", ["avro", "json", "protobuf"])
def test_confluent_serializers_produce_through_the_proxy_and_read_back(
    upstream: Upstream, make_topic: Any, registry: TestRegistry, fmt: str
) -> None:
    topic = make_topic(1)
    client = SchemaRegistryClient({"url": registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    serializer: Any
    deserializer: Any
    if fmt == "avro":
        serializer = AvroSerializer(client, json.dumps(ORDER_AVRO))
        deserializer = AvroDeserializer(client)
        values = [{"id": "a", "amount": 5}, {"id": "b", "amount": 7}]
    elif fmt == "json":
        serializer = JSONSerializer(json.dumps(ORDER_JSON), client)
        deserializer = JSONDeserializer(json.dumps(ORDER_JSON))
        values = [{"id": "a", "amount": 5}, {"id": "b", "amount": 7}]
    else:
        config = {"use.deprecated.format": False}
        serializer = ProtobufSerializer(Order, client, config)
        deserializer = ProtobufDeserializer(Order, config)
        values = [Order(id="a"), Order(id="b")]
    framed = [serializer(item, context) for item in values]
    with run_proxy(
        upstream.bootstrap, topics=_rules(topic), schema_registry=_registry_section(registry)
    ) as proxy:
        assert _send(proxy.bootstrap, topic, framed) == [None, None]
        got = consume(proxy.bootstrap, topic, partitions=1)[0]
        samples = scrape(proxy)
    assert [deserializer(data, context) for data in got] == values
    assert value(samples, "kvproxy_schema_lookups_total", outcome="found") == 1
    (schema_id,) = {struct.unpack(">I", data[1:5])[0] for data in framed}
    assert registry.count(f"/schemas/ids/{schema_id}") == 1


# ---- what is refused, and the words ----


def test_each_bad_record_is_named_with_its_reason(
    upstream: Upstream, make_topic: Any, registry: TestRegistry
) -> None:
    topic = make_topic(1)
    good_id = registry.register(f"{topic}-value", json.dumps(ORDER_AVRO))
    other_id = registry.register("payments-value", json.dumps({**ORDER_AVRO, "name": "Payment"}))
    good = _framed(good_id, b"\x02a\x0a")  # {"id": "a", "amount": 5}
    values = [
        good,
        b'{"id": "a"}',  # plain JSON: no header
        b"\x00\x00\x01",  # header cut short
        _framed(99, b"\x02a\x0a"),
        _framed(other_id, b"\x02a\x0a"),
        _framed(good_id, b"\x02a"),  # the long is missing
        None,  # a null value on a topic that is not compacted
    ]
    with run_proxy(
        upstream.bootstrap, topics=_rules(topic), schema_registry=_registry_section(registry)
    ) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(*values))])
        librdkafka = _send(proxy.bootstrap, topic, [_framed(99, b"")])
    answer = answers[(topic, 0)]
    assert answer.error_code == INVALID_RECORD
    assert record_errors(answer) == [
        (1, "no schema id: magic byte 0x7b, expected 0x00"),
        (2, "no schema id: 3 bytes, a schema id header is 5"),
        (3, "unknown schema id 99"),
        (4, f"schema {other_id} is not registered under {topic}-value"),
        (5, f"does not match schema {good_id}: truncated at byte 7"),
        (6, "no schema id: the value is null"),
    ]
    assert librdkafka[0] is not None and librdkafka[0].code() == KafkaError.INVALID_RECORD
    assert stored(upstream, topic) == []


@pytest.mark.parametrize("fmt", ["json", "protobuf"])
def test_a_payload_that_does_not_match_its_schema(
    upstream: Upstream, make_topic: Any, registry: TestRegistry, fmt: str
) -> None:
    topic = make_topic(1)
    client = SchemaRegistryClient({"url": registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    if fmt == "json":
        good = JSONSerializer(json.dumps(ORDER_JSON), client)({"id": "a", "amount": 5}, context)
        bad = good[:5] + b'{"id": "a", "amount": "five"}'
        reason = "data.amount must be integer"
    else:
        good = ProtobufSerializer(Order, client, {"use.deprecated.format": False})(
            Order(id="a"), context
        )
        bad = good[:7] + b"\x0a\x05ab"  # field 1 claims 5 bytes, 2 follow
        reason = "Error parsing message"
    with run_proxy(
        upstream.bootstrap, topics=_rules(topic), schema_registry=_registry_section(registry)
    ) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(good, bad))])
    ((index, message),) = record_errors(answers[(topic, 0)])
    assert index == 1
    assert message is not None
    assert message.startswith(f"does not match schema {struct.unpack('>I', good[1:5])[0]}: ")
    assert reason in message


def test_tombstones_pass_on_a_compacted_topic(
    upstream: Upstream, make_topic: Any, registry: TestRegistry
) -> None:
    topic = make_topic(1, {"cleanup.policy": "compact"})
    good_id = registry.register(f"{topic}-value", json.dumps(ORDER_AVRO))
    with run_proxy(
        upstream.bootstrap, topics=_rules(topic), schema_registry=_registry_section(registry)
    ) as proxy:
        answers = produce(
            proxy.host, proxy.port, 9, [(topic, 0, batch(_framed(good_id, b"\x02a\x0a"), None))]
        )
    assert answers[(topic, 0)].error_code == 0
    assert stored(upstream, topic) == [_framed(good_id, b"\x02a\x0a"), None]


# ---- the registry in trouble ----


@pytest.mark.parametrize("fail", ["down", "slow", "error500", "garbage"])
def test_an_unavailable_registry_is_a_retriable_refusal_or_lets_through(
    upstream: Upstream, make_topic: Any, registry: TestRegistry, fail: str
) -> None:
    topic = make_topic(1)
    good_id = registry.register(f"{topic}-value", json.dumps(ORDER_AVRO))
    record = _framed(good_id, b"\x02a\x0a")
    registry.slow_s = 2.0
    registry.fail = fail
    section = _registry_section(registry)
    with run_proxy(upstream.bootstrap, topics=_rules(topic), schema_registry=section) as proxy:
        refused = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(record))])
        samples = scrape(proxy)
    with run_proxy(
        upstream.bootstrap, topics=_rules(topic), schema_registry={**section, "on_error": "accept"}
    ) as proxy:
        let_through = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(record))])
    assert refused[(topic, 0)].error_code == REQUEST_TIMED_OUT
    assert let_through[(topic, 0)].error_code == 0
    assert stored(upstream, topic) == [record]
    assert value(samples, "kvproxy_schema_lookups_total", outcome="unavailable") == 1


def test_a_short_outage_delays_records_and_loses_none(
    upstream: Upstream, make_topic: Any, registry: TestRegistry, tmp_path: Any
) -> None:
    topic = make_topic(1)
    good_id = registry.register(f"{topic}-value", json.dumps(ORDER_AVRO))
    record = _framed(good_id, b"\x02a\x0a")
    registry.fail = "down"
    journal = tmp_path / "journal"
    section = _registry_section(registry, negative_cache_ttl_ms=200)
    with run_proxy(
        upstream.bootstrap,
        topics=_rules(topic),
        schema_registry=section,
        quarantine=journal_settings(journal),
    ) as proxy:
        threading.Timer(1.0, lambda: setattr(registry, "fail", None)).start()
        # librdkafka retries REQUEST_TIMED_OUT until message.timeout.ms (10 s here)
        (delivered,) = _send(proxy.bootstrap, topic, [record])
        (refused,) = _send(proxy.bootstrap, topic, [_framed(99, b"")])
        samples = scrape(proxy)
        assert proxy.server.journal is not None and proxy.server.journal.flush(10)
    assert delivered is None
    assert refused is not None and refused.code() == KafkaError.INVALID_RECORD
    assert stored(upstream, topic) == [record]
    assert value(samples, "kvproxy_schema_lookups_total", outcome="unavailable") >= 1
    assert value(samples, "kvproxy_schema_lookups_total", outcome="found") == 1
    # what was refused for the outage comes again and is not kept; the unknown id is
    kept = [(e.policy, e.code) for e in JournalReader(journal).entries()]
    assert kept == [("schema", INVALID_RECORD)]


def test_a_slow_registry_holds_only_the_requests_that_need_it(
    upstream: Upstream, make_topic: Any, registry: TestRegistry
) -> None:
    checked, plain = make_topic(1), make_topic(1)
    good_id = registry.register(f"{checked}-value", json.dumps(ORDER_AVRO))
    registry.slow_s = 1.5
    registry.fail = "slow"
    finished: dict[str, float] = {}

    def send(name: str, topic: str, data: bytes) -> None:
        produce(proxy.host, proxy.port, 9, [(topic, 0, batch(data))])
        finished[name] = time.monotonic()

    section = _registry_section(registry, timeout_ms=3000)
    with run_proxy(upstream.bootstrap, topics=_rules(checked), schema_registry=section) as proxy:
        waiting = threading.Thread(
            target=send, args=("checked", checked, _framed(good_id, b"\x02a\x0a"))
        )
        waiting.start()
        time.sleep(0.2)  # the first request is waiting for the registry
        send("plain", plain, b"no schema here")
        waiting.join(10)
    assert finished["plain"] < finished["checked"]
    assert stored(upstream, plain) == [b"no schema here"]


def test_many_clients_one_lookup_per_id(
    upstream: Upstream, make_topic: Any, registry: TestRegistry
) -> None:
    topic = make_topic(1)
    good_id = registry.register(f"{topic}-value", json.dumps(ORDER_AVRO))
    registry.slow_s = 0.3
    registry.fail = "slow"  # every client arrives while the first lookup is under way
    record = _framed(good_id, b"\x02a\x0a")
    with run_proxy(
        upstream.bootstrap, topics=_rules(topic), schema_registry=_registry_section(registry)
    ) as proxy:
        answers: list[Any] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(
                    produce(proxy.host, proxy.port, 9, [(topic, 0, batch(record))])
                )
            )
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert [a[(topic, 0)].error_code for a in answers] == [0] * 8
    assert registry.count(f"/schemas/ids/{good_id}") == 1
    assert registry.count(f"/schemas/ids/{good_id}/versions") == 1
