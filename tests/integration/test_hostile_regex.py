"""Patterns from outside through a running proxy: a registry's JSON Schema whose pattern
backtracks exponentially, and a topic name Kafka cannot have sent against a topic rule. Before
they ran on RE2 (and before a name that cannot be a topic was refused unmatched) the first two
held the proxy's event loop, and the test with it, for years; the third was accepted."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import pytest

from kvproxy.protocol import error_codes
from kvproxy.protocol.messages import PRODUCE, decode_response
from kvproxy.protocol.records import build_batch
from tests.harness import Broker
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.produce import produce, stored
from tests.harness.proxy import run_proxy
from tests.harness.proxy_checks import assert_serves
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import produce_request
from tests.harness.schema_registry import TestRegistry

LONG_NAME = "a" * 16_000
"""Legal characters, too long for a topic; `(a|aa)+b` fails on it in 2^16000 ways."""
BACKTRACKING_RULE = {"match": "/(a|aa)+b/", "mode": "warn"}


@pytest.fixture
def registry() -> Iterator[TestRegistry]:
    with TestRegistry() as running:
        yield running


def _answer(host: str, port: int, version: int, topic: str) -> tuple[int, str | None]:
    """(error code, message) of a one-record Produce to `topic`, partition 0."""
    with RawKafkaClient(host, port) as client:
        frame = client.request(produce_request(version, 5, topic, [(b"k", b"v")]), timeout=10)
    body = decode_response(frame, PRODUCE, version).body
    partition = body.responses[0].partition_responses[0]
    return int(partition.error_code), partition.error_message


def test_a_name_that_cannot_be_a_topic_is_answered_as_kafka_answers_it(
    kafka: KafkaCluster,
) -> None:
    broker_code, broker_message = _answer(kafka.host, kafka.port, 9, LONG_NAME)
    assert (broker_code, broker_message) == (error_codes.UNKNOWN_TOPIC_OR_PARTITION, None)
    with run_proxy(kafka.bootstrap, topics=[BACKTRACKING_RULE]) as proxy:
        code, message = _answer(proxy.host, proxy.port, 9, LONG_NAME)
        assert code == broker_code
        assert message is not None
        assert "(16000 characters) cannot be a topic name: at most 249" in message
        assert proxy.server.routing.cached_topics == 0  # never kept either
        assert_serves(proxy)


def test_a_registry_pattern_that_backtracks_is_answered_invalid_record(
    tansu: Broker, topic: str, registry: TestRegistry
) -> None:
    schema = {"title": "Code", "type": "string", "pattern": "^(a+)+$"}
    schema_id = registry.register(f"{topic}-value", json.dumps(schema), "JSON")
    framed = b"\x00" + struct.pack(">I", schema_id)
    hostile = framed + json.dumps("a" * 60 + "!").encode()
    valid = framed + json.dumps("a" * 60).encode()
    schema_check = {"value": "required", "validate_payload": True}
    rules = [
        {"match": topic, "default_policies": "drop", "policies": ["crc", {"schema": schema_check}]}
    ]
    section = {"url": registry.url, "timeout_ms": 2000}
    with run_proxy(tansu.bootstrap, topics=rules, schema_registry=section) as proxy:
        refused = produce(
            proxy.host, proxy.port, 9, [(topic, 0, build_batch([(b"k", hostile, None, None)]))]
        )[(topic, 0)]
        assert refused.error_code == error_codes.INVALID_RECORD
        assert "data must match pattern ^(a+)+$" in str(refused.record_errors)
        accepted = produce(
            proxy.host, proxy.port, 9, [(topic, 0, build_batch([(b"k", valid, None, None)]))]
        )[(topic, 0)]
        assert accepted.error_code == 0
        assert_serves(proxy)
    assert stored(tansu, topic, 0) == [valid]


def test_a_registry_pattern_re2_cannot_run_refuses_its_records(
    tansu: Broker, topic: str, registry: TestRegistry
) -> None:
    """Never run by a backtracking engine instead: the schema cannot be used."""
    schema = {"title": "Pair", "type": "string", "pattern": r"^(a+)\1$"}
    schema_id = registry.register(f"{topic}-value", json.dumps(schema), "JSON")
    value = b"\x00" + struct.pack(">I", schema_id) + b'"aaaa"'
    schema_check = {"value": "required", "validate_payload": True}
    rules = [
        {"match": topic, "default_policies": "drop", "policies": ["crc", {"schema": schema_check}]}
    ]
    section = {"url": registry.url, "timeout_ms": 2000}
    with run_proxy(tansu.bootstrap, topics=rules, schema_registry=section) as proxy:
        refused = produce(
            proxy.host, proxy.port, 9, [(topic, 0, build_batch([(b"k", value, None, None)]))]
        )[(topic, 0)]
    assert refused.error_code == error_codes.INVALID_RECORD
    said = str(refused.record_errors)
    assert f"schema {schema_id} cannot be used: JSON schema does not compile: pattern" in said
    assert "no backreferences, lookahead or lookbehind" in said
    assert stored(tansu, topic, 0) == []
