"""Producing to many names that are no topic must not make the proxy open a connection, or send
a request, to the cluster per name: its own requests (DescribeConfigs for the topic settings,
Metadata for the metrics' topic label) reuse one connection, carry many names at once, and new
names are described at most `topic_configs.lookups_per_client_per_second` per connection."""

from __future__ import annotations

import logging
import time

import pytest

from kvproxy.protocol.messages import DESCRIBE_CONFIGS, METADATA, PRODUCE, decode_response
from tests.harness.counting_relay import run_counting_relay
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.metrics import scrape, value
from tests.harness.proxy import run_proxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import produce_request
from tests.harness.tansu import Broker

NAMES = 500
PER_CLIENT = 10
"""`topic_configs.lookups_per_client_per_second` in these tests."""


def produce_codes(client: RawKafkaClient, topics: list[str], first_id: int) -> dict[str, int]:
    """Each topic's answer code, one Produce v8 per topic, sent one after the other."""
    codes = {}
    for n, topic in enumerate(topics):
        answer = client.request(produce_request(8, first_id + n, topic, [(b"k", b"v")]))
        body = decode_response(answer, PRODUCE, 8).body
        (entry,) = body.responses
        (partition,) = entry.partition_responses
        codes[str(entry.name)] = int(partition.error_code)
    return codes


def test_many_unknown_names_reuse_one_connection_and_bounded_requests(
    tansu: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """500 names: one connection carries the proxy's own requests, DescribeConfigs requests
    stay within the per-connection rate (counted against the time the client took), every
    name is answered as the broker answers it directly, and the names not asked about are
    counted and logged once per interval."""
    caplog.set_level(logging.WARNING, "kvproxy")
    names = [f"no-such-topic-{n}" for n in range(NAMES)]
    with run_counting_relay((tansu.host, tansu.port)) as relay:
        with RawKafkaClient(tansu.host, tansu.port) as direct:
            broker_codes = produce_codes(direct, names[:3], 1)
        with run_proxy(
            relay.bootstrap,
            topic_configs={
                "lookups_per_client_per_second": PER_CLIENT,
                "max_topics_per_request": PER_CLIENT,
            },
        ) as proxy:
            with RawKafkaClient(proxy.host, proxy.port) as client:
                started = time.monotonic()
                codes = produce_codes(client, names, 1)
                elapsed = time.monotonic() - started
            proxy.wait_until_idle()
            described = relay.requests(DESCRIBE_CONFIGS)
            metadata = relay.requests(METADATA)
            samples = scrape(proxy)
            admin = relay.connections_with(DESCRIBE_CONFIGS, METADATA)
    assert set(codes) == set(names)
    assert {codes[n] for n in names[:3]} == set(broker_codes.values()), (codes, broker_codes)
    assert admin == 1, f"{admin} connections for the proxy's own requests"
    # a token bucket of PER_CLIENT names refilled PER_CLIENT per second, one name per request
    assert described <= PER_CLIENT + PER_CLIENT * elapsed + 1, (described, elapsed)
    assert metadata < NAMES / 10, metadata
    lookups = "kvproxy_topic_settings_lookups_total"
    asked = value(samples, lookups, outcome="asked")
    skipped = value(samples, lookups, outcome="client_rate")
    assert asked + skipped == NAMES and asked <= PER_CLIENT + PER_CLIENT * elapsed + 1
    said = [r.getMessage() for r in caplog.records if "settings unknown" in r.getMessage()]
    assert len(said) == 1, said  # once per 10 s, the first time


def test_names_beyond_the_bound_get_kafkas_own_answer(kafka: KafkaCluster) -> None:
    """Against Apache Kafka: a name described and a name beyond the client's budget (decided
    with its settings unknown, forwarded) both get what Kafka answers a Produce to no such
    topic, UNKNOWN_TOPIC_OR_PARTITION (3, retriable), as a client sending to Kafka directly."""
    names = [f"no-such-topic-kafka-{n}" for n in range(60)]
    with run_counting_relay((kafka.host, kafka.port)) as relay:
        with RawKafkaClient(kafka.host, kafka.port) as direct:
            assert set(produce_codes(direct, names[-2:], 1).values()) == {3}
        with run_proxy(
            relay.bootstrap,
            topic_configs={"lookups_per_client_per_second": 5, "max_topics_per_request": 5},
        ) as proxy:
            with RawKafkaClient(proxy.host, proxy.port) as client:
                started = time.monotonic()
                codes = produce_codes(client, names[:-2], 1)
                elapsed = time.monotonic() - started
            proxy.wait_until_idle()
            described = relay.requests(DESCRIBE_CONFIGS)
    assert set(codes.values()) == {3}, codes
    assert described <= 5 + 5 * elapsed + 1, (described, elapsed)
