"""ResilientProducer through kvproxy in front of Tansu and of Apache Kafka 4.4: per-record
outcomes, resends, idempotence (which Kafka grants and Tansu, to aiokafka's InitProducerId v0,
does not)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from kvproxy.policies import ACCEPT, Verdict
from kvproxy.producer import (
    CommitFailedError,
    FailureType,
    IdempotenceUnavailableError,
    ProduceFailedError,
)
from kvproxy.producer.compat import enable_transactions
from kvproxy.producer.resilient import ResilientProducer
from kvproxy.producer.transactions import Transaction, run_transaction
from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.upstream import Upstream

KEYLESS_MESSAGE = "Compacted topic cannot accept message without key in topic partition {}-0"

pytestmark = pytest.mark.upstreams("tansu", "kafka")


class NotEnoughReplicasFirst:
    """A custom policy answering NOT_ENOUGH_REPLICAS (19, retriable) to the first `times`
    requests of each topic, then accepting: a cluster that recovers (or never does)."""

    name = "not_enough_replicas_first"

    def __init__(self, times: int) -> None:
        self.times = times
        self.seen: dict[str, int] = {}

    @classmethod
    def create(cls, context: Any, options: Mapping[str, Any]) -> NotEnoughReplicasFirst:
        return cls(int(options.get("times", 1)))

    def validate(self, topic: str, partition: int, batch: Any) -> Verdict:
        self.seen[topic] = self.seen.get(topic, 0) + 1
        if self.seen[topic] <= self.times:
            return Verdict(19, "Messages are rejected since there are fewer in-sync replicas")
        return ACCEPT

    def close(self) -> None:
        """Nothing to release."""


def flaky(topic: str, times: int) -> list[dict[str, Any]]:
    policy = {"class": f"{__name__}:NotEnoughReplicasFirst", "config": {"times": times}}
    return [{"match": topic, "default_policies": "drop", "policies": [{"custom": policy}]}]


async def test_retriable_errors_are_retried_as_usual(
    upstream: Upstream, make_topic: Callable[..., str]
) -> None:
    topic = make_topic()
    with run_proxy(upstream.bootstrap, topics=flaky(topic, 2)) as proxy:
        async with ResilientProducer(
            bootstrap_servers=proxy.bootstrap, retry_backoff_ms=50
        ) as producer:
            metadata = await producer.send_and_wait(topic, b"eventually", b"k")
    assert metadata.offset == 0
    assert read_values(upstream.bootstrap, topic, 1) == [b"eventually"]


async def test_retries_that_never_succeed_end_in_delivery_failed(
    upstream: Upstream, make_topic: Callable[..., str]
) -> None:
    topic = make_topic()
    with run_proxy(upstream.bootstrap, topics=flaky(topic, 10_000)) as proxy:
        async with ResilientProducer(
            bootstrap_servers=proxy.bootstrap, retry_backoff_ms=50, request_timeout_ms=1500
        ) as producer:
            future = await producer.send(topic, b"never", b"k")
            with pytest.raises(ProduceFailedError) as raised:
                await future
    assert raised.value.failure_type is FailureType.DELIVERY_FAILED
    assert read_values(upstream.bootstrap, topic, 0) == []


def read_values(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    """Every value in partition 0, in offset order (assigned: no group to join)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "resilient", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(values) < expected and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    # anything more would be a duplicate
    extra = consumer.poll(1.0)
    if extra is not None and extra.error() is None:
        values.append(extra.value())
    consumer.close()
    return values


def produce_answers(proxy: RunningProxy) -> list[Any]:
    return [
        decode_response(frame, PRODUCE, version).body
        for key, version, frame in proxy.responses
        if key == PRODUCE
    ]


async def send_ten(bootstrap: str, topic: str, **options: Any) -> list[Any]:
    """Records 0-9 in one batch; 2 and 7 without a key. Each future's result or exception."""
    async with ResilientProducer(bootstrap_servers=bootstrap, linger_ms=200, **options) as producer:
        futures = [
            await producer.send(topic, f"value-{i}".encode(), None if i in (2, 7) else b"k")
            for i in range(10)
        ]
        return list(await asyncio.gather(*futures, return_exceptions=True))


async def test_only_the_refused_records_fail_and_the_rest_are_resent(
    upstream: Upstream, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(config={"cleanup.policy": "compact"})
    with run_proxy(upstream.bootstrap) as proxy:
        outcomes = await send_ten(proxy.bootstrap, topic)
        answers = produce_answers(proxy)

    for i in (2, 7):
        failure = outcomes[i]
        assert isinstance(failure, ProduceFailedError), failure
        assert failure.failure_type is FailureType.MESSAGE_REJECTED
        assert failure.message == KEYLESS_MESSAGE.format(topic)
        assert failure.code == 87
    good = [i for i in range(10) if i not in (2, 7)]
    offsets = [outcomes[i].offset for i in good]
    assert offsets == sorted(offsets)
    assert read_values(upstream.bootstrap, topic, 8) == [f"value-{i}".encode() for i in good]
    # The ten went out together and came back with two record errors: the resend is real.
    refused = [
        p
        for answer in answers
        for t in answer.responses
        for p in t.partition_responses
        if p.error_code == 87
    ]
    assert len(refused) == 1
    assert [(e.batch_index, e.batch_index_error_message) for e in refused[0].record_errors] == [
        (2, KEYLESS_MESSAGE.format(topic)),
        (7, KEYLESS_MESSAGE.format(topic)),
    ]


async def test_a_refusal_without_record_errors_fails_the_whole_batch(
    upstream: Upstream, make_topic: Callable[..., str]
) -> None:
    topic = make_topic()
    acks_one = [
        {"match": topic, "default_policies": "drop", "policies": [{"acks": {"allowed": [1]}}]}
    ]
    with run_proxy(upstream.bootstrap, topics=acks_one) as proxy:
        outcomes = await send_ten(proxy.bootstrap, topic, acks="all")
    assert all(isinstance(o, ProduceFailedError) for o in outcomes), outcomes
    assert {(o.code, o.failure_type) for o in outcomes} == {(21, FailureType.DELIVERY_FAILED)}
    # the proxy's batch-level message (v8 error_message) reaches every record
    assert {o.message for o in outcomes} == {
        f"acks=-1 is not allowed for topic {topic} (allowed: 1)"
    }
    assert read_values(upstream.bootstrap, topic, 0) == []


async def test_idempotence_requested_is_granted_by_kafka_and_falls_back_on_tansu(
    upstream: Upstream, make_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = make_topic()
    with (
        run_proxy(upstream.bootstrap) as proxy,
        caplog.at_level(logging.WARNING, "kvproxy.producer"),
    ):
        async with ResilientProducer(
            bootstrap_servers=proxy.bootstrap, idempotence="requested"
        ) as producer:
            assert producer.idempotent is upstream.is_kafka
            metadata = await producer.send_and_wait(topic, b"one", b"k")
    assert metadata.offset == 0
    fell_back = any(
        "idempotence was requested but the cluster cannot provide it" in r.getMessage()
        for r in caplog.records
    )
    assert fell_back is upstream.is_tansu
    assert read_values(upstream.bootstrap, topic, 1) == [b"one"]


@pytest.mark.parametrize("idempotence", ["required", True])
async def test_idempotence_required_starts_on_kafka_and_refuses_to_start_on_tansu(
    upstream: Upstream, make_topic: Callable[..., str], idempotence: Any
) -> None:
    producer = ResilientProducer(bootstrap_servers=upstream.bootstrap, idempotence=idempotence)
    if upstream.is_tansu:
        with pytest.raises(IdempotenceUnavailableError, match="idempotence is required"):
            await producer.start()
        return
    topic = make_topic()
    async with producer:
        assert producer.idempotent is True
        metadata = await producer.send_and_wait(topic, b"one", b"k")
    assert metadata.offset == 0
    assert read_values(upstream.bootstrap, topic, 1) == [b"one"]


def test_constructor_refuses_mixed_idempotence_arguments() -> None:
    with pytest.raises(TypeError, match="idempotence="):
        ResilientProducer(bootstrap_servers="127.0.0.1:1", enable_idempotence=True)
    with pytest.raises(ValueError, match="idempotence must be"):
        ResilientProducer(bootstrap_servers="127.0.0.1:1", idempotence="sometimes")  # type: ignore[arg-type]


async def test_a_transactional_resilient_producer_with_run_transaction(
    upstream: Upstream, make_topic: Callable[..., str]
) -> None:
    """In a transaction nothing is resent: the refused record fails the transaction, which is
    aborted (CommitFailedError); the next transaction commits."""
    topic = make_topic(config={"cleanup.policy": "compact"})
    with run_proxy(upstream.bootstrap) as proxy:
        async with ResilientProducer(
            bootstrap_servers=proxy.bootstrap, transactional_id=f"resilient-{topic}", linger_ms=100
        ) as producer:

            async def bad(txn: Transaction) -> None:
                for i in range(4):
                    await txn.send(topic, f"bad-{i}".encode(), None if i == 2 else b"k")

            with pytest.raises(CommitFailedError) as raised:
                await run_transaction(producer, bad)
            cause = raised.value.cause
            assert isinstance(cause, ProduceFailedError)
            assert cause.failure_type in (
                FailureType.MESSAGE_REJECTED,
                FailureType.TRANSACTION_FAILED,
            )
            assert raised.value.code == 87

            async def good(txn: Transaction) -> int:
                for i in range(3):
                    await txn.send(topic, f"good-{i}".encode(), b"k")
                return 3

            assert await run_transaction(producer, good) == 3
    assert read_values(upstream.bootstrap, topic, 3)[-3:] == [b"good-0", b"good-1", b"good-2"]


def old_format(topic: str) -> list[dict[str, Any]]:
    """kvproxy answering as a broker whose topic keeps message format 1 (no producer ids)."""
    return [
        {
            "match": topic,
            "default_policies": "drop",
            "policies": [{"message_format": {"topic_magic": 1}}],
        }
    ]


async def test_requested_idempotence_gives_way_to_a_topic_that_cannot_store_it(
    upstream: Upstream, make_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = make_topic()
    with (
        run_proxy(upstream.bootstrap, topics=old_format(topic)) as proxy,
        caplog.at_level(logging.WARNING, "kvproxy.producer"),
    ):
        producer = ResilientProducer(bootstrap_servers=proxy.bootstrap, idempotence="requested")
        if upstream.is_tansu:  # InitProducerId v3: Tansu grants a producer id (v0: Kafka does)
            enable_transactions(producer.producer)
        async with producer:
            assert producer.idempotent is True
            metadata = await producer.send_and_wait(topic, b"one", b"k")
            assert producer.idempotent is False
            second = await producer.send_and_wait(topic, b"two", b"k")
    assert (metadata.offset, second.offset) == (0, 1)
    assert read_values(upstream.bootstrap, topic, 2) == [b"one", b"two"]
    assert any(
        f"idempotence was requested but topic {topic} cannot store producer ids" in r.getMessage()
        for r in caplog.records
    )


async def test_required_idempotence_fails_the_send_to_such_a_topic(
    upstream: Upstream, make_topic: Callable[..., str]
) -> None:
    topic = make_topic()
    with run_proxy(upstream.bootstrap, topics=old_format(topic)) as proxy:
        producer = ResilientProducer(bootstrap_servers=proxy.bootstrap, idempotence="required")
        if upstream.is_tansu:
            enable_transactions(producer.producer)
        async with producer:
            future = await producer.send(topic, b"one", b"k")
            with pytest.raises(ProduceFailedError) as raised:
                await future
    assert isinstance(raised.value.cause, IdempotenceUnavailableError)
    assert f"idempotence is required but topic {topic} cannot store producer ids" in str(
        raised.value.cause
    )
    assert read_values(upstream.bootstrap, topic, 0) == []
