"""Real-client helpers shared by the proxy tests: produce numbered values, read them back."""

from __future__ import annotations

import time


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
