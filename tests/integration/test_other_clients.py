"""What franz-go, kafkajs, sarama and kafka-go tell their application when kvproxy refuses a
record, whether they send it again, and what becomes of the other records of the batch.

Each client is a program of `tests/harness/go_clients/` or `tests/harness/node_clients/`
(`tests/harness/client_programs.py` builds them) that produces through one kvproxy in front of
Tansu, then of Apache Kafka 4.4.0 (the clients see the same; franz-go uses a higher version).
Four refusals: one record without a key to a compacted topic (`customers`, the default checks:
INVALID_RECORD), three records in one batch to a topic with the `json` policy, the second
`not json` (`orders`: INVALID_RECORD, `record_errors` [1]), a GBP payment to a topic with the
currency policy of `examples/policies.py` (`payments`: POLICY_VIOLATION, the policy's message in
`error_message`), and a record with one bit flipped between the client and the proxy (`events`:
CORRUPT_MESSAGE; the proxy advertises 127.0.0.2, where a `tests/harness/flipping_relay.py` relay
flips a bit of any request carrying `flip-me`). Each test asserts the exact text and type the
application gets for each record, how many times the client sent the refused batch (the proxy's
rejection count for the topic), and what the topic holds after (read back from the beginning).
docs/clients.md quotes every text, with the run's topic names and CRC values replaced by the
ones the document shows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvproxy.protocol.messages import PRODUCE
from tests.harness.client_programs import ClientRun, go_program, node_program, run_program
from tests.harness.clients import consume
from tests.harness.flipping_relay import MARK, PROXY_HOST, RELAY_HOST, FlippingRelay
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.upstream import Upstream

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
NOT_JSON = b"not json"
GOOD_JSON = b'{"n": 1}'
ORDERS = [(b"k", GOOD_JSON), (b"k", NOT_JSON), (b"k", GOOD_JSON)]
CURRENCY = {
    "custom": {"class": "examples.policies:CurrencyPolicy", "config": {"allowed": ["EUR", "USD"]}}
}
GBP = b'{"amount": 5, "currency": "GBP"}'
DOC_CRC = "stored crc = 2618552119"

pytestmark = pytest.mark.upstreams("tansu", "kafka")


@dataclass
class Stage:
    proxy: RunningProxy
    upstream: Upstream

    def topics(self) -> tuple[str, str, str, str]:
        """Fresh topics: `customers` (compacted), `orders` (the `json` policy), `payments` (the
        currency policy) and `events` (the defaults)."""
        customers = self.upstream.create_topic(1, {"cleanup.policy": "compact"}, "customers")
        orders = self.upstream.create_topic(1, None, "orders")
        payments = self.upstream.create_topic(1, None, "payments")
        return customers, orders, payments, self.upstream.create_topic(1, None, "events")

    def rejections(self, topic: str) -> int:
        return sum(n for (t, _, _), n in self.proxy.server.sink.rejections.items() if t == topic)

    def produce_versions(self, since: int) -> set[int]:
        return {v for key, v, _ in list(self.proxy.responses)[since:] if key == PRODUCE}

    def stored(self, topic: str) -> list[bytes | None]:
        return consume(self.proxy.bootstrap, topic, partitions=1)[0]

    def run(
        self,
        argv: list[str],
        topic: str,
        records: Sequence[tuple[bytes | None, bytes]],
        env: dict[str, str] | None = None,
    ) -> ClientRun:
        return run_program(argv, self.proxy.bootstrap, topic, records, env=env)


@pytest.fixture(scope="module")
def stage(upstream: Upstream) -> Iterator[Stage]:
    rules = [
        {"match": "orders*", "policies": ["json"]},
        {"match": "payments*", "policies": ["batch_integrity", "crc", CURRENCY]},
    ]
    listen = {"advertised_host": RELAY_HOST}
    with run_proxy(upstream.bootstrap, topics=rules, listen=listen) as proxy:
        relays = [
            FlippingRelay((RELAY_HOST, port), (PROXY_HOST, port))
            for port in (proxy.port, proxy.broker_port(upstream.node_id))
        ]
        try:
            yield Stage(proxy, upstream)
        finally:
            for relay in relays:
                relay.close()


@dataclass(frozen=True)
class Seen:
    """What one client run showed, with the run's topic names as the document shows them."""

    errors: list[str | None]
    types: list[str | None]
    attempts: int
    """Produce requests the proxy refused for the topic: 1 when the client did not retry."""
    stored: list[bytes | None]
    log: str


def shown(text: str, topic: str, name: str) -> str:
    """`text` with the run's topic name and CRC value as the document shows them."""
    return re.sub(r"stored crc = \d+", DOC_CRC, text.replace(topic, name))


@dataclass(frozen=True)
class Refusals:
    null_key: Seen
    """One record without a key on `customers`."""
    batch: Seen
    """The three records of `orders`, the second not JSON."""
    payment: Seen
    """One GBP payment on `payments` (POLICY_VIOLATION)."""
    corrupt: Seen
    """One record on `events` with a bit flipped on the way (CORRUPT_MESSAGE)."""
    versions: set[int]
    """The Produce versions the client sent."""


def refusals(stage: Stage, argv: list[str], env: dict[str, str] | None = None) -> Refusals:
    """The client's view of the three refusals."""
    customers, orders, payments, events = stage.topics()
    start = len(stage.proxy.responses)
    seen = []
    cases = (
        (customers, [(None, b"no key")]),
        (orders, ORDERS),
        (payments, [(b"k", GBP)]),
        (events, [(b"k", b"a " + MARK)]),
    )
    for topic, records in cases:
        run = stage.run(argv, topic, records, env)
        name = topic.split("-")[0]
        seen.append(
            Seen(
                [None if e is None else shown(e, topic, name) for e in run.errors],
                run.types,
                stage.rejections(topic),
                stage.stored(topic),
                shown(run.log, topic, name),
            )
        )
    return Refusals(*seen, stage.produce_versions(start))


def assert_in_doc(*texts: str | None) -> None:
    doc = DOC.read_text()
    for text in texts:
        assert text is not None and text in doc, f"docs/clients.md does not quote:\n{text}"


FRANZ_GO_2 = (
    "CORRUPT_MESSAGE: This message has failed its CRC checksum, exceeds the valid size, has a "
    "null key for a compacted topic, or is otherwise corrupt."
)
FRANZ_GO_44 = "POLICY_VIOLATION: Request parameters do not satisfy the configured policy."
FRANZ_GO = (
    "INVALID_RECORD: This record has failed the validation on the broker and hence been rejected."
)


def test_franz_go(stage: Stage) -> None:
    """franz-go (idempotent by default; the highest Produce version offered: v11 in front of
    Tansu, v13 in front of Kafka) shows the code's generic text for every record of the batch
    and does not retry, not even CORRUPT_MESSAGE; nothing of the batch is stored."""
    seen = refusals(stage, [str(go_program("franz"))])
    assert seen.versions == ({13} if stage.upstream.is_kafka else {11})  # the highest offered
    assert seen.null_key.errors == [FRANZ_GO] and seen.null_key.types == ["*kerr.Error"]
    assert seen.batch.errors == [FRANZ_GO] * 3 and seen.batch.types == ["*kerr.Error"] * 3
    assert (seen.null_key.attempts, seen.batch.attempts) == (1, 1)
    assert seen.null_key.stored == seen.batch.stored == []
    assert seen.payment.errors == [FRANZ_GO_44] and seen.payment.attempts == 1
    assert seen.payment.stored == []
    assert seen.corrupt.errors == [FRANZ_GO_2] and seen.corrupt.attempts == 1
    assert seen.corrupt.stored == []
    assert_in_doc(FRANZ_GO, FRANZ_GO_44, FRANZ_GO_2)


KAFKAJS = (
    "KafkaJSProtocolError: This record has failed the validation on broker and hence be rejected"
)
KAFKAJS_2 = (
    "KafkaJSNumberOfRetriesExceeded: This message has failed its CRC checksum, exceeds the valid "
    "size, or is otherwise corrupt"
)
KAFKAJS_44 = "KafkaJSProtocolError: Request parameters do not satisfy the configured policy"
KAFKAJS_TYPE = "KafkaJSProtocolError type=INVALID_RECORD code=87 retriable=false"


def test_kafkajs(stage: Stage) -> None:
    """kafkajs 2.2.4 (Produce v7) rejects the send's promise with the code's generic text, does
    not retry INVALID_RECORD, and logs the refusal at ERROR; nothing of the batch is stored."""
    seen = refusals(stage, node_program("kafkajs"))
    assert seen.versions == {7}
    assert seen.null_key.errors == [KAFKAJS] and seen.batch.errors == [KAFKAJS] * 3
    assert seen.null_key.types == [KAFKAJS_TYPE] and seen.batch.types == [KAFKAJS_TYPE] * 3
    assert (seen.null_key.attempts, seen.batch.attempts) == (1, 1)
    assert seen.null_key.stored == seen.batch.stored == []
    error = "This record has failed the validation on broker and hence be rejected"
    response, retry = seen.batch.log.splitlines()[-2:]
    assert response.startswith("ERROR Response Produce(key: 0, version: 7) ")
    assert f'"error":"{error}"' in response
    assert retry.startswith(f'ERROR {error} {{"logger":"kafkajs","retryCount":0,')
    assert seen.payment.errors == [KAFKAJS_44] and seen.payment.attempts == 1
    assert seen.payment.types == [
        "KafkaJSProtocolError type=POLICY_VIOLATION code=44 retriable=false"
    ]
    assert seen.payment.stored == []
    assert seen.corrupt.errors == [KAFKAJS_2] and seen.corrupt.attempts == 6
    assert seen.corrupt.types == [
        "KafkaJSNumberOfRetriesExceeded type=undefined code=undefined retriable=false"
    ]
    assert seen.corrupt.stored == []
    assert_in_doc(KAFKAJS, KAFKAJS_TYPE, KAFKAJS_44, KAFKAJS_2)


SARAMA_2 = "kafka server: Message contents does not match its CRC"
SARAMA_44 = "kafka server: Request parameters do not satisfy the configured policy"
SARAMA = "kafka server: This record has failed the validation on broker and hence will be rejected"


def test_sarama(stage: Stage) -> None:
    """sarama (IBM/sarama, the current release, Produce v9 by default) fails every message of
    the batch on the AsyncProducer's Errors channel with the code's generic text, no retry."""
    seen = refusals(stage, [str(go_program("sarama"))])
    assert seen.versions == {9}
    assert seen.null_key.errors == [SARAMA] and seen.batch.errors == [SARAMA] * 3
    assert seen.null_key.types == ["sarama.KError"] and seen.batch.types == ["sarama.KError"] * 3
    assert (seen.null_key.attempts, seen.batch.attempts) == (1, 1)
    assert seen.null_key.stored == seen.batch.stored == []
    assert "validation" not in seen.null_key.log + seen.batch.log  # sarama.Logger: nothing about it
    retrying = "producer/broker/{} state change to [retrying] on events/0 because " + SARAMA_2
    assert retrying.format(stage.upstream.node_id) in seen.corrupt.log
    assert seen.payment.errors == [SARAMA_44] and seen.payment.attempts == 1
    assert seen.payment.stored == []
    assert seen.corrupt.errors == [SARAMA_2] and seen.corrupt.attempts == 4
    assert seen.corrupt.stored == []
    assert_in_doc(SARAMA, SARAMA_44, SARAMA_2)


KAFKA_GO = (
    "[87] Invalid Record: this record has failed the validation on broker and hence be rejected: "
)
KAFKA_GO_2 = (
    "[2] Invalid Message: the message contents does not match its CRC: Record is corrupt "
    f"({DOC_CRC}) in topic partition events-0."
)
KAFKA_GO_44 = (
    "[44] Policy Violation: the request parameters do not satisfy the configured policy: "
    "currency GBP is not allowed; allowed: EUR, USD"
)
KAFKA_GO_NULL_KEY = (
    KAFKA_GO + "One or more records have been rejected due to 1 record errors in total, and only "
    "showing the first three errors at most: [RecordError(batchIndex=0, message='Compacted topic "
    "cannot accept message without key in topic partition customers-0')]"
)
KAFKA_GO_ORDERS = (
    KAFKA_GO + "One or more records have been rejected due to 1 record errors in total, and only "
    "showing the first three errors at most: [RecordError(batchIndex=1, message='Record value is "
    "not valid JSON (invalid literal, expected 'null': line 1 column 1) in topic partition "
    "orders-0')]"
)


def test_kafka_go(stage: Stage) -> None:
    """kafka-go (segmentio/kafka-go, current, Produce v8) adds the answer's `error_message` to the
    code's text; every message of the WriteMessages call gets it; no retry."""
    seen = refusals(stage, [str(go_program("kafkago"))])
    assert seen.versions == {8}
    assert (
        seen.null_key.errors == [KAFKA_GO_NULL_KEY] and seen.batch.errors == [KAFKA_GO_ORDERS] * 3
    )
    assert seen.null_key.types == ["*fmt.wrapError"] and seen.batch.types == ["*fmt.wrapError"] * 3
    assert "WriteMessages returned kafka.WriteErrors" in seen.batch.log
    logged = f"error writing messages to orders (partition 0, attempt 0): {KAFKA_GO_ORDERS}"
    assert logged in seen.batch.log
    assert (seen.null_key.attempts, seen.batch.attempts) == (1, 1)
    assert seen.null_key.stored == seen.batch.stored == []
    assert seen.payment.errors == [KAFKA_GO_44] and seen.payment.attempts == 1
    assert seen.payment.stored == []
    assert seen.corrupt.errors == [KAFKA_GO_2] and seen.corrupt.attempts == 10
    for attempt in range(10):
        logged = f"error writing messages to events (partition 0, attempt {attempt}): {KAFKA_GO_2}"
        assert logged in seen.corrupt.log
    assert seen.corrupt.stored == []
    assert_in_doc(KAFKA_GO_NULL_KEY, KAFKA_GO_ORDERS, KAFKA_GO_44, KAFKA_GO_2)


SARAMA_1_22_CRC = "kafka server: Message contents does not match its CRC."
SARAMA_1_22_76 = (
    "kafka server: The requesting client does not support the compression type of given partition."
)
SARAMA_1_22_44 = "kafka server: Request parameters do not satisfy the configured policy."
SARAMA_1_22_87 = "Unknown error, how did this happen? Error code = 87"


def test_sarama_1_22(stage: Stage) -> None:
    """sarama 1.22 (github.com/Shopify/sarama) assumes Kafka 0.8.2 unless told: Produce v0, so
    every refusal is CORRUPT_MESSAGE, which it retries three times (Producer.Retry.Max). Told
    Kafka 2.2.0 (the highest it knows) it sends Produce v3 and has no text for code 87; with
    zstd on Produce v3 it gets UNSUPPORTED_COMPRESSION_TYPE (76), as from Kafka."""
    program = [str(go_program("sarama122"))]
    seen = refusals(stage, program)
    assert seen.versions == {0}
    assert seen.null_key.errors == [SARAMA_1_22_CRC] and seen.batch.errors == [SARAMA_1_22_CRC] * 3
    assert seen.null_key.types == ["sarama.KError"] and seen.batch.types == ["sarama.KError"] * 3
    assert (seen.null_key.attempts, seen.batch.attempts) == (4, 4)
    assert seen.null_key.stored == seen.batch.stored == []
    assert seen.payment.errors == [SARAMA_1_22_CRC] and seen.payment.attempts == 4
    assert seen.corrupt.errors == [SARAMA_1_22_CRC] and seen.corrupt.attempts == 4
    assert seen.payment.stored == seen.corrupt.stored == []

    seen = refusals(stage, program, {"SARAMA_VERSION": "2.2.0"})
    assert seen.versions == {3}
    assert seen.null_key.errors == [SARAMA_1_22_87] and seen.batch.errors == [SARAMA_1_22_87] * 3
    assert seen.null_key.types == ["sarama.KError"] and seen.batch.types == ["sarama.KError"] * 3
    assert (seen.null_key.attempts, seen.batch.attempts) == (1, 1)
    assert seen.null_key.stored == seen.batch.stored == []
    assert seen.payment.errors == [SARAMA_1_22_44] and seen.payment.attempts == 1
    assert seen.corrupt.errors == [SARAMA_1_22_CRC] and seen.corrupt.attempts == 4
    assert seen.payment.stored == seen.corrupt.stored == []

    # zstd needs Produce v7 (Kafka 2.1); sarama 1.22 sends it on v3, refused as Kafka refuses it
    zstd = stage.upstream.create_topic(1, None, "events")
    env = {"SARAMA_VERSION": "2.2.0", "SARAMA_ZSTD": "1"}
    run = stage.run(program, zstd, [(b"k", b"compressed")], env)
    assert run.errors == [SARAMA_1_22_76] and stage.rejections(zstd) == 1
    assert stage.stored(zstd) == []
    assert_in_doc(SARAMA_1_22_CRC, SARAMA_1_22_87, SARAMA_1_22_44, SARAMA_1_22_76)


KAFKA_GO_0_2 = "[2] Invalid Message: the message contents does not match its CRC"


@pytest.mark.upstreams("tansu")  # kvproxy answers whatever the broker; 10 tries take about 9 s
def test_kafka_go_0_2(stage: Stage) -> None:
    """kafka-go 0.2 sends Produce v2, so kvproxy answers every refusal CORRUPT_MESSAGE, which
    kafka-go retries: the `orders` batch is sent 10 times (MaxAttempts), then every message of the
    WriteMessages call fails with the code's generic text; nothing of it is stored."""
    _, orders, _, _ = stage.topics()
    start = len(stage.proxy.responses)
    run = stage.run([str(go_program("kafkago02"))], orders, ORDERS)
    assert stage.produce_versions(start) == {2}
    assert run.errors == [KAFKA_GO_0_2] * 3 and run.types == ["kafka.Error"] * 3
    assert stage.rejections(orders) == 10
    assert stage.stored(orders) == []
    assert_in_doc(KAFKA_GO_0_2)
