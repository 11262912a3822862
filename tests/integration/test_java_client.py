"""The Java client (kafka-clients 4.4.0) through kvproxy in front of Apache Kafka 4.4.0.

Each test runs `tests/harness/java_client/KvproxyJavaClient.java` (one JVM per command) and
asserts what the application sees: offsets, the records a consumer reads back, the exception
class and message a refused send fails with (docs/clients.md quotes them), and, from the proxy's
record of every answer it sent, which APIs and versions the client used through it. For
CORRUPT_MESSAGE a relay between the client and the proxy flips one bit of a record, as no client
builds a bad CRC itself. Telemetry is tested both with the session's broker (no telemetry
reporter) and with a broker of its own that loads `KvproxyJavaClient$TelemetryReporter`.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.produce.v13.request import PartitionProduceData, TopicProduceData
from kio.schema.produce.v13.request import ProduceRequest as ProduceRequestV13
from kio.static.primitive import i16, i32, i32Timedelta

from kvproxy.protocol.messages import PRODUCE, decode_response, encode_request, make_request
from kvproxy.protocol.records import build_batch
from tests.harness.flipping_relay import PROXY_HOST, RELAY_HOST, FlippingRelay
from tests.harness.java_client import (
    TELEMETRY_REPORTER,
    brokers_load_the_reporter,
    held_producer,
    run_java_client,
)
from tests.harness.kafka_broker import KafkaCluster, run_kafka
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.raw_client import (
    RawKafkaClient,
    api_versions_v0_request,
    parse_api_versions_v0_response,
)
from tests.harness.version_cap_relay import capped_versions

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN = 24
END_TXN = 26
JOIN_GROUP = 11
SYNC_GROUP = 14
CONSUMER_GROUP_HEARTBEAT = 68
GET_TELEMETRY_SUBSCRIPTIONS = 71
PUSH_TELEMETRY = 72

CURRENCY = {
    "custom": {"class": "examples.policies:CurrencyPolicy", "config": {"allowed": ["EUR", "USD"]}}
}
GBP = '{"amount": 5, "currency": "GBP"}'
BATCH_REFUSED = (
    "org.apache.kafka.common.KafkaException",
    "Failed to append record because it was part of a batch which had one more more invalid "
    "records",
)


# One worker runs the module: one proxy stage, one client JVM at a time.
pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("java_client")]


@dataclass
class Stage:
    kafka: KafkaCluster
    proxy: RunningProxy
    topics: dict[str, str]

    def answered(self, since: int = 0) -> Counter[tuple[int, int]]:
        """(api key, version) of every answer the proxy sent a client after the `since`th."""
        return Counter((key, version) for key, version, _ in self.proxy.responses[since:])


@pytest.fixture(scope="module")
def stage(kafka: KafkaCluster) -> Iterator[Stage]:
    topics = {
        "customers": kafka.create_topic(config={"cleanup.policy": "compact"}),
        "orders": kafka.create_topic(),
        "payments": kafka.create_topic(),
    }
    with run_proxy(kafka.bootstrap_servers, topics=topic_rules(topics)) as proxy:
        yield Stage(kafka, proxy, topics)


def topic_rules(topics: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {"match": topics["orders"], "default_policies": "drop", "policies": ["json"]},
        {
            "match": topics["payments"],
            "default_policies": "drop",
            "policies": ["batch_integrity", "crc", CURRENCY],
        },
    ]


@pytest.fixture(scope="module")
def capped(stage: Stage) -> Iterator[RunningProxy]:
    """A kvproxy as the stage's, reached on RELAY_HOST through relays that offer Produce up to
    v12 only: the 4.4 client behind them sends v12."""
    rules, listen = topic_rules(stage.topics), {"advertised_host": RELAY_HOST}
    with (
        run_proxy(stage.kafka.bootstrap_servers, topics=rules, listen=listen) as proxy,
        capped_versions(RELAY_HOST, [proxy.port, proxy.broker_port(1)], PRODUCE, 12),
    ):
        yield proxy


def offered(host: str, port: int) -> dict[int, tuple[int, int]]:
    """The API version ranges an ApiVersions answer offers, by api key."""
    with RawKafkaClient(host, port) as client:
        return parse_api_versions_v0_response(client.request(api_versions_v0_request()))[2]


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> bool:
    """Ask `condition` until it holds or `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def produce(bootstrap: str, topic: str, values: list[str], **args: Any) -> list[dict[str, Any]]:
    props = args.pop("props", {})
    run = run_java_client(
        "produce", bootstrap, topic=topic, values="\n".join(values), props=props, **args
    )
    return run.result["results"]


def consume(bootstrap: str, topic: str, group: str, **args: Any) -> list[dict[str, Any]]:
    return run_java_client("consume", bootstrap, topic=topic, group=group, **args).result["members"]


def read_back(members: list[dict[str, Any]]) -> Counter[str]:
    return Counter(value for member in members for _key, value, _p, _o in member["records"])


def documented(stage: Stage, name: str, message: tuple[str, str]) -> None:
    """docs/clients.md quotes `class: message`, with the example's topic name in it."""
    quoted = f"{message[0]}: {message[1]}".replace(stage.topics[name], name)
    assert quoted in DOC.read_text(), quoted


def failure(result: dict[str, Any]) -> tuple[str, str]:
    """The exception of a record's future; its callback must have got the same."""
    assert result["error"] is not None, result
    assert result["callback_error"] == result["error"]
    return result["error"]["class"], result["error"]["message"]


# ---- producing --------------------------------------------------------------------------------


def test_idempotent_producer_records_read_back_exactly_once(stage: Stage) -> None:
    topic = stage.kafka.create_topic(partitions=2)
    values = [f"value-{i}" for i in range(200)]
    before = len(stage.proxy.responses)
    results = produce(stage.proxy.bootstrap, topic, values)
    answered = stage.answered(before)

    assert [r.get("error") for r in results] == [None] * len(values)
    assert len({(r["partition"], r["offset"]) for r in results}) == len(values)
    # enable.idempotence is the Java default: the producer asked for a producer id
    assert any(key == INIT_PRODUCER_ID for key, _ in answered)
    assert {version for key, version in answered if key == PRODUCE} == {13}

    members = consume(stage.proxy.bootstrap, topic, "idempotent-readers")
    assert read_back(members) == Counter(values)
    per_partition = Counter(r["partition"] for r in results)
    assert members[0]["committed"] == {str(p): n for p, n in per_partition.items()}


def test_produce_v13_through_kvproxy(stage: Stage) -> None:
    """Kafka 4.4 and its Java client speak Produce v13 (topics named by id), and so does kvproxy:
    the client sends v13 through it and its records are read back, as the test above shows for
    idempotence."""
    client_latest = run_java_client("versions", stage.proxy.bootstrap).result["produce_latest"]
    direct = offered(stage.kafka.host, stage.kafka.port)[PRODUCE]
    through = offered(stage.proxy.host, stage.proxy.port)[PRODUCE]
    assert (client_latest, direct, through) == (13, (0, 13), (0, 13))

    topic = stage.kafka.create_topic()
    before = len(stage.proxy.responses)
    results = produce(stage.proxy.bootstrap, topic, ["a", "b", "c"])
    assert [(r["partition"], r["offset"]) for r in results] == [(0, 0), (0, 1), (0, 2)]
    assert {v for k, v in stage.answered(before) if k == PRODUCE} == {13}
    members = consume(stage.proxy.bootstrap, topic, "v13-readers")
    assert read_back(members) == Counter(["a", "b", "c"])


@pytest.mark.parametrize("example", ["orders", "payments"])
def test_a_refusal_on_v13_is_the_refusal_on_v12(
    stage: Stage, capped: RunningProxy, example: str
) -> None:
    """The same records refused through kvproxy at Produce v13 and, from a client offered at
    most v12 (the same proxy's config behind a relay), at v12: the same exception class and
    message for every record."""
    values = {"orders": ['{"n": 1}', "not json", '{"n": 1}'], "payments": [GBP]}[example]
    outcomes = {}
    for version, proxy, host in ((13, stage.proxy, stage.proxy.host), (12, capped, RELAY_HOST)):
        before = len(proxy.responses)
        results = produce(
            f"{host}:{proxy.port}", stage.topics[example], values, props={"linger.ms": "1000"}
        )
        assert {v for k, v, _ in proxy.responses[before:] if k == PRODUCE} == {version}
        outcomes[version] = [failure(result) for result in results]
    assert outcomes[13] == outcomes[12]
    documented(stage, example, outcomes[13][-1])


def test_an_unknown_topic_id_is_answered_as_kafka_answers_it(stage: Stage) -> None:
    """A v13 request naming a topic id the cluster does not know: UNKNOWN_TOPIC_ID (100) with
    no message, straight from Kafka and through kvproxy."""
    body = ProduceRequestV13(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        topic_data=(
            TopicProduceData(
                topic_id=uuid.uuid4(),
                partition_data=(
                    PartitionProduceData(
                        index=i32(0), records=build_batch([(b"k", b"v", None, None)])
                    ),
                ),
            ),
        ),
    )
    frame = encode_request(make_request(PRODUCE, 13, 7, "v13", body))
    answers = []
    for host, port in ((stage.kafka.host, stage.kafka.port), (stage.proxy.host, stage.proxy.port)):
        with RawKafkaClient(host, port) as client:
            [topic] = decode_response(client.request(frame), PRODUCE, 13).body.responses
        [partition] = topic.partition_responses
        answers.append((topic.topic_id, int(partition.error_code), partition.error_message))
    unknown = (body.topic_data[0].topic_id, ErrorCode.unknown_topic_id.value, None)
    assert answers == [unknown, unknown]


def test_transactions_commit_and_abort(stage: Stage) -> None:
    topic = stage.kafka.create_topic()
    before = len(stage.proxy.responses)
    run_java_client(
        "transactions", stage.proxy.bootstrap, topic=topic, transactional_id=f"tx-{topic}",
        commit=5, abort=3,
    )  # fmt: skip
    answered = stage.answered(before)
    assert sum(n for (key, _), n in answered.items() if key == END_TXN) == 2
    # transactions v2 (KIP-890): Produce (v12+) adds the partition, EndTxn v5 ends it
    assert {v for k, v in answered if k == END_TXN} == {5}
    assert not any(key == ADD_PARTITIONS_TO_TXN for key, _ in answered)
    assert {v for k, v in answered if k == PRODUCE} == {13}

    committed = [f"committed-{i}" for i in range(5)]
    aborted = [f"aborted-{i}" for i in range(3)]
    readers = {"isolation.level": "read_committed"}
    members = consume(stage.proxy.bootstrap, topic, "committed-readers", props=readers)
    assert read_back(members) == Counter(committed)
    readers = {"isolation.level": "read_uncommitted"}
    members = consume(stage.proxy.bootstrap, topic, "uncommitted-readers", props=readers)
    assert read_back(members) == Counter(committed + aborted)
    # two commit markers after the records: the committed offset is past both
    assert members[0]["committed"] == {"0": 10}


# ---- consumer groups --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "group_api"),
    [("consumer", CONSUMER_GROUP_HEARTBEAT), ("classic", JOIN_GROUP)],
)
def test_consumer_group_of_two_members(stage: Stage, protocol: str, group_api: int) -> None:
    """The second member joins after the first holds both partitions: the group rebalances,
    each member ends with one partition, reads it and commits its offset."""
    topic = stage.kafka.create_topic(partitions=2)
    values = [f"{protocol}-{i}" for i in range(40)]
    results = produce(stage.proxy.bootstrap, topic, values)
    per_partition = Counter(r["partition"] for r in results)
    assert set(per_partition) == {0, 1}

    before = len(stage.proxy.responses)
    members = consume(
        stage.proxy.bootstrap, topic, f"group-{protocol}", members=2,
        props={"group.protocol": protocol},
    )  # fmt: skip
    answered = stage.answered(before)

    assert sorted(p for member in members for p in member["assignment"]) == [0, 1]
    assert all(len(member["assignment"]) == 1 for member in members)
    assert read_back(members) == Counter(values)
    for member in members:
        [partition] = member["assignment"]
        assert {r[2] for r in member["records"]} == {partition}
        assert member["committed"] == {str(partition): per_partition[partition]}
    assert any(key == group_api for key, _ in answered)
    if protocol == "classic":
        assert any(key == SYNC_GROUP for key, _ in answered)
        assert not any(key == CONSUMER_GROUP_HEARTBEAT for key, _ in answered)


# ---- client telemetry (KIP-714) ---------------------------------------------------------------


def test_telemetry_apis_follow_the_broker(stage: Stage) -> None:
    """A broker without a ClientTelemetry metrics reporter leaves GetTelemetrySubscriptions and
    PushTelemetry out of ApiVersions; kvproxy passes that on, so the Java client (metrics push
    on by default) sends neither and works."""
    direct = offered(stage.kafka.host, stage.kafka.port)
    through = offered(stage.proxy.host, stage.proxy.port)
    for key in (GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY):
        assert key not in direct
        assert key not in through

    topic = stage.kafka.create_topic()
    before = len(stage.proxy.responses)
    props = {"enable.metrics.push": "true"}
    results = produce(stage.proxy.bootstrap, topic, ["t"], props=props)
    assert results[0]["offset"] == 0
    answered = stage.answered(before)
    assert not {GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY} & {key for key, _ in answered}


def test_telemetry_reaches_a_broker_that_collects_it(tmp_path: Path) -> None:
    """With a ClientTelemetry reporter on the broker and a client-metrics subscription, the broker
    offers both APIs; kvproxy passes them through unchanged, and the Java client's pushes reach
    the broker's reporter."""
    pushes = tmp_path / "pushes.txt"
    reporter = {"metric.reporters": TELEMETRY_REPORTER, "kvproxy.telemetry.file": str(pushes)}
    with brokers_load_the_reporter(), run_kafka(properties=reporter) as kafka:
        kafka.tool(
            "org.apache.kafka.tools.ClientMetricsCommand", "--bootstrap-server", kafka.bootstrap,
            "--alter", "--name", "everything", "--metrics", "*", "--interval", "1000",
        )  # fmt: skip
        direct = offered(kafka.host, kafka.port)
        topic = kafka.create_topic()
        with run_proxy(kafka.bootstrap_servers) as proxy:
            through = offered(proxy.host, proxy.port)
            producer = held_producer(proxy.bootstrap, topic=topic, values="t", instance_id="true")
            with producer as report:
                instance = report["client_instance_id"]
                assert report["results"][0]["offset"] == 0
                pushed = wait_for(
                    lambda: instance in pushes.read_text() if pushes.exists() else False
                )
            answered = Counter(key for key, _, _ in proxy.responses)
        for key in (GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY):
            assert direct[key] == through[key]
        assert instance is not None
        assert pushed, f"no push from {instance} reached the broker's reporter"
        assert answered[GET_TELEMETRY_SUBSCRIPTIONS] >= 1
        assert answered[PUSH_TELEMETRY] >= 1
        [_, _, content_type, size] = next(
            line.split() for line in pushes.read_text().splitlines() if line.startswith(instance)
        )
        assert (content_type, int(size) > 0) == ("OTLP", True)


# ---- refusals ---------------------------------------------------------------------------------


def test_null_key_to_compacted_topic(stage: Stage) -> None:
    topic = stage.topics["customers"]
    [result] = produce(stage.proxy.bootstrap, topic, ["no key"], null_key="true")
    documented(stage, "customers", failure(result))
    assert failure(result) == (
        "org.apache.kafka.common.InvalidRecordException",
        f"Compacted topic cannot accept message without key in topic partition {topic}-0",
    )


def test_one_refused_record_in_a_batch(stage: Stage) -> None:
    """Three records in one batch (linger.ms 1000, one partition), the second not JSON."""
    topic = stage.topics["orders"]
    values = ['{"n": 1}', "not json", '{"n": 1}']
    before = len(stage.proxy.responses)
    first, refused, third = produce(
        stage.proxy.bootstrap, topic, values, props={"linger.ms": "1000"}
    )
    assert sum(n for (key, _), n in stage.answered(before).items() if key == PRODUCE) == 1
    assert failure(refused) == (
        "org.apache.kafka.common.InvalidRecordException",
        "Record value is not valid JSON (invalid literal, expected 'null': line 1 column 1) "
        f"in topic partition {topic}-0",
    )
    documented(stage, "orders", failure(refused))
    documented(stage, "orders", failure(first))
    assert failure(first) == BATCH_REFUSED
    assert failure(third) == BATCH_REFUSED
    assert read_back(consume(stage.proxy.bootstrap, topic, "orders-readers")) == Counter()


def test_policy_violation(stage: Stage) -> None:
    [result] = produce(stage.proxy.bootstrap, stage.topics["payments"], [GBP])
    documented(stage, "payments", failure(result))
    assert failure(result) == (
        "org.apache.kafka.common.errors.PolicyViolationException",
        "currency GBP is not allowed; allowed: EUR, USD",
    )


@contextlib.contextmanager
def flipping_relays(ports: list[int]) -> Iterator[None]:
    """On RELAY_HOST, each port relays to the proxy's same port, one bit of a request carrying
    MARK flipped on the way (a client never builds a bad CRC itself)."""
    relays = [FlippingRelay((RELAY_HOST, port), (PROXY_HOST, port)) for port in ports]
    try:
        yield
    finally:
        for relay in relays:
            relay.close()


def test_corrupt_batch_is_retried_until_delivery_timeout(kafka: KafkaCluster) -> None:
    """CORRUPT_MESSAGE is retriable for the Java client: the same bytes are sent again, refused
    again, until `delivery.timeout.ms` (shortened here) expires the record."""
    topic = kafka.create_topic()
    advertised = {"advertised_host": RELAY_HOST}
    with (
        run_proxy(kafka.bootstrap_servers, listen=advertised) as proxy,
        flipping_relays([proxy.port, proxy.broker_port(1)]),
    ):
        before = len(proxy.responses)
        run = run_java_client(
            "produce", f"{RELAY_HOST}:{proxy.port}", topic=topic, values="a flip-me",
            props={"delivery.timeout.ms": "3000", "request.timeout.ms": "1000",
                   "linger.ms": "0", "retry.backoff.ms": "100"},
        )  # fmt: skip
        produced = [frame for key, _, frame in proxy.responses[before:] if key == PRODUCE]
    [result] = run.result["results"]
    name, message = failure(result)
    assert name == "org.apache.kafka.common.errors.TimeoutException"
    assert re.fullmatch(
        rf"Expiring 1 record\(s\) for {topic}-0:\d+ ms has passed since batch creation\. The "
        r"request has not been sent, or no server response has been received yet\.",
        message,
    ), message
    assert len(produced) >= 2  # refused, sent again, refused again
    # every refused attempt is logged by the client at WARN, with kvproxy's message
    retry = re.compile(
        rf"WARN \[Producer clientId=producer-1\] Got error produce response with correlation id "
        rf"\d+ on topic-partition {topic}-0, retrying \(\d+ attempts left\)\. Error: "
        rf"CORRUPT_MESSAGE\. Error Message: Record is corrupt \(stored crc = \d+\) in topic "
        rf"partition {topic}-0\. \(org\.apache\.kafka\.clients\.producer\.internals\.Sender\)"
    )
    assert any(retry.fullmatch(line) for line in run.log.splitlines()), run.log


def test_timestamp_out_of_range(stage: Stage) -> None:
    """A record two hours ahead: the default `timestamps` check (Kafka 4's one hour ahead)."""
    topic = stage.kafka.create_topic()
    ahead = int(time.time() * 1000) + 2 * 3_600_000
    [result] = produce(stage.proxy.bootstrap, topic, ["late"], timestamp=ahead)
    name, message = failure(result)
    assert name == "org.apache.kafka.common.errors.InvalidTimestampException"
    assert re.fullmatch(
        rf"Timestamp {ahead} of message with offset 0 is out of range\. The timestamp should be "
        r"within \[-?\d+, \d+\]",
        message,
    ), message
