"""Kafka's order of checks and merged record errors, through kvproxy in front of Tansu and of
Apache Kafka.

Tansu validates nothing on produce, so there a case also shows that the broker behind would have
stored what the proxy refuses; on Kafka the same bytes sent straight to the broker are refused by
the broker itself, with the answer the proxy gave. A real client (confluent-kafka) shows what a
producer sees.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import crc32c
import pytest
from confluent_kafka import KafkaError, Producer

from kvproxy.protocol.records import build_batch
from tests.harness.produce import produce, record_errors, stored
from tests.harness.proxy import run_proxy
from tests.harness.upstream import Upstream

INVALID_RECORD = 87
CORRUPT_MESSAGE = 2
INVALID_TIMESTAMP = 32
HOUR = 3_600_000

pytestmark = pytest.mark.upstreams("tansu", "kafka")


def claiming(raw: bytes, count: int, *, fix_crc: bool = True) -> bytes:
    """The batch with a header claiming `count` records (lastOffsetDelta consistent with it)."""
    buf = bytearray(raw)
    struct.pack_into(">i", buf, 23, count - 1)
    struct.pack_into(">i", buf, 57, count)
    if fix_crc:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def three() -> bytes:
    return build_batch([(b"k", b"v%d" % i, None, None) for i in range(3)])


LOG_APPEND_TIME = {
    "policies": ["batch_integrity", "crc", {"timestamps": {"type": "LogAppendTime"}}]
}


def test_declared_count_over_the_records_is_invalid_record_with_no_decoding_policy(
    upstream: Upstream, make_topic: Any
) -> None:
    """A LogAppendTime topic: nothing but the count check reads records. The batch claiming 5
    records over 3 was forwarded before; Kafka answers 87 "premature EOF"."""
    topic = make_topic(3)
    fewer, more = claiming(three(), 5), claiming(three(), 1)
    with run_proxy(upstream.bootstrap, defaults=LOG_APPEND_TIME) as proxy:
        answers = produce(
            proxy.host, proxy.port, 9, [(topic, 0, fewer), (topic, 1, more), (topic, 2, three())]
        )
    assert (answers[topic, 0].error_code, answers[topic, 0].error_message) == (
        INVALID_RECORD,
        "Incorrect declared batch size, premature EOF reached",
    )
    assert (answers[topic, 1].error_code, answers[topic, 1].error_message) == (
        INVALID_RECORD,
        "Incorrect declared batch size, records still remaining in file",
    )
    assert record_errors(answers[topic, 0]) == []
    assert answers[topic, 2].error_code == 0
    assert stored(upstream, topic, 0) == [] and stored(upstream, topic, 1) == []
    assert stored(upstream, topic, 2) == [b"v0", b"v1", b"v2"]
    # straight to the broker: Kafka answers as the proxy did; Tansu takes the lying batch, so only
    # the proxy stands between it and the log
    direct = produce(upstream.host, upstream.port, 9, [(topic, 0, fewer), (topic, 1, more)])
    if upstream.is_kafka:
        for partition in (0, 1):
            kafka, proxied = direct[topic, partition], answers[topic, partition]
            assert kafka.error_code == proxied.error_code == INVALID_RECORD
            assert record_errors(kafka) == record_errors(proxied) == []
            # Kafka puts no error_message here; the proxy says why (docs/policies.md allows it)
            assert kafka.error_message in (None, proxied.error_message)
        assert stored(upstream, topic, 0) == [] and stored(upstream, topic, 1) == []
    else:
        assert direct[topic, 0].error_code == 0


def test_bad_fields_with_a_stale_crc_are_corrupt_message(
    upstream: Upstream, make_topic: Any
) -> None:
    """LogValidatorTest.testInconsistentCountAndOffset with the CRC left stale: the broker
    checks the CRC first and answers CORRUPT_MESSAGE, which clients retry; 87 would fail the
    batch for good over bytes damaged on the way."""
    topic = make_topic(2)
    stale = claiming(three(), 5, fix_crc=False)
    stale = stale[:23] + struct.pack(">i", 2) + stale[27:]  # lastOffsetDelta 2, count 5
    fixed = claiming(stale, 5)
    fixed = fixed[:23] + struct.pack(">i", 2) + fixed[27:]
    fixed = fixed[:17] + struct.pack(">I", crc32c.crc32c(fixed[21:])) + fixed[21:]
    with run_proxy(upstream.bootstrap) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, stale), (topic, 1, fixed)])
    assert answers[topic, 0].error_code == CORRUPT_MESSAGE
    assert answers[topic, 1].error_code == INVALID_RECORD
    assert answers[topic, 1].error_message == (
        f"Inconsistent batch offset range [0, 2] and count of records 5 in topic partition "
        f"{topic}-1"
    )


def test_key_and_timestamp_errors_together_reach_a_real_producer_as_invalid_timestamp(
    upstream: Upstream, make_topic: Any
) -> None:
    """A compacted topic with a one-hour lower bound: one batch with a null key and a record two
    hours old. Kafka reports both record errors and answers 32; a confluent-kafka producer sees
    the refused records as INVALID_RECORD, the other as refused for them, and nothing is stored."""
    topic = make_topic(1, config={"cleanup.policy": "compact"})
    defaults = {
        "policies": [
            "batch_integrity",
            "crc",
            {"timestamps": {"before_max_ms": HOUR}},
            "compacted_key",
        ]
    }
    now = int(time.time() * 1000)
    rows = [(None, b"a", None, now), (b"k", b"b", None, now - 2 * HOUR), (b"k", b"c", None, now)]
    with run_proxy(upstream.bootstrap, defaults=defaults) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, build_batch(rows))])
        partition = answers[topic, 0]
        assert partition.error_code == INVALID_TIMESTAMP
        assert partition.error_message == (
            "One or more records have been rejected due to invalid timestamp"
        )
        errors = record_errors(partition)
        assert [index for index, _ in errors] == [0, 1]
        assert errors[0][1] == (
            f"Compacted topic cannot accept message without key in topic partition {topic}-0"
        )
        assert errors[1][1] is not None and errors[1][1].startswith(
            f"Timestamp {now - 2 * HOUR} of message with offset 1 is out of range."
        )

        reports: list[KafkaError | None] = []
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "linger.ms": 100,
                "enable.idempotence": False,
                "message.timeout.ms": 20_000,
            }
        )
        for key, value, _, ts in rows:
            producer.produce(
                topic,
                value=value,
                key=key,
                timestamp=ts,
                on_delivery=lambda err, _msg: reports.append(err),
            )
        assert producer.flush(30) == 0
    assert len(reports) == 3
    # librdkafka reports a batch with record_errors per record, whatever the partition's code:
    # the listed records INVALID_RECORD with their message, the others "a different record"
    assert [None if err is None else err.code() for err in reports] == [
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_RECORD,
        KafkaError._INVALID_DIFFERENT_RECORD,
    ]
    assert stored(upstream, topic, 0) == []
