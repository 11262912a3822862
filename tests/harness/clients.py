"""Real-client helpers shared by the proxy tests: produce numbered values, read them back; a bad
and a good record sent with confluent-kafka, and the Produce answers the proxy sent."""

from __future__ import annotations

import time
from typing import Any

from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness.proxy import RunningProxy


def produce_through(bootstrap: str, topic: str, count: int = 5) -> None:
    """Produce v0..v{count-1} to partition 0 with confluent-kafka; every delivery must succeed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    errors: list[object] = []
    for n in range(count):
        producer.produce(
            topic, f"v{n}".encode(), partition=0, on_delivery=lambda e, m: errors.append(e)
        )
    assert producer.flush(20) == 0
    assert errors == [None] * count


def consume_through(bootstrap: str, topic: str, count: int, timeout: float = 20) -> list[bytes]:
    """Up to `count` values of partition 0 from the beginning (assign, no group join)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
    finally:
        consumer.close()
    return got


def produce_and_consume(bootstrap: str, topic: str, count: int = 5) -> list[bytes]:
    produce_through(bootstrap, topic, count)
    return consume_through(bootstrap, topic, count)


def sasl_plain_producer(bootstrap: str, password: str, errors: list[object]) -> object:
    """A confluent-kafka producer logging in as `alice` with SASL/PLAIN; errors go to `errors`."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": password,
            "message.timeout.ms": 3000,
            "error_cb": errors.append,
        }
    )


LINGER_MS = 1000
"""Long enough that records produced back to back form one request even on a loaded machine
(100 ms was not, once in five suite runs beside a CPU hog); each test flushes, which sends at
once, so only the aiokafka tests wait for it."""


def consume(
    bootstrap: str,
    topic: str,
    partitions: int = 2,
    *,
    settings: dict[str, Any] | None = None,
    timeout: float = 20,
) -> dict[int, list[bytes | None]]:
    """Every value of every partition, read from the beginning to the end with confluent-kafka
    (`settings`: the client's own, e.g. TLS, instead of the bootstrap alone)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **(settings or {"bootstrap.servers": bootstrap}),
            "group.id": "unused",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    got: dict[int, list[bytes | None]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
            elif error is None:
                got[message.partition()].append(message.value())
                at_end.discard(message.partition())
    finally:
        consumer.close()
    assert len(at_end) == partitions, f"consumer did not reach the end of {topic}: {got}"
    return got


def confluent_send(
    bootstrap: str, topic: str, bad: dict[str, Any], good: dict[str, Any], **conf: Any
) -> tuple[Any, Any]:
    """Produce `bad` to partition 0 and `good` to partition 1; return their delivery errors."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": LINGER_MS,
            "acks": "all",
            "message.timeout.ms": 5000,
            **conf,
        }
    )
    results: dict[str, Any] = {}

    def report(name: str) -> Any:
        return lambda error, _message: results.__setitem__(name, error)

    producer.produce(topic, partition=0, on_delivery=report("bad"), **bad)
    producer.produce(topic, partition=1, on_delivery=report("good"), **good)
    assert producer.flush(15) == 0
    return results["bad"], results["good"]


def produce_partitions(proxy: RunningProxy) -> list[list[tuple[str, int, int]]]:
    """(topic, partition, error code) of each Produce answer the proxy sent, in order."""
    out = []
    for api_key, version, frame in list(proxy.responses):
        if api_key == PRODUCE:
            body = decode_response(frame, PRODUCE, version).body
            out.append(
                [
                    (str(t.name), int(p.index), int(p.error_code))
                    for t in body.responses
                    for p in t.partition_responses
                ]
            )
    return out
