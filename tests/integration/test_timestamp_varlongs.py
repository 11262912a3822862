"""A record's timestamp delta written as a 10-byte varint whose raw value passes 64 bits, through
the proxy in front of Tansu (which checks nothing): the `timestamps` check sees the timestamp
Kafka reads (`ByteUtils.readVarlong` keeps the low 64 bits, Java's sum wraps), not the one the
70 bits of the varint would give, so the record it would hide is refused and never stored.

The same two batches go to Apache Kafka directly and through the proxy in the differential
corpus (`tests.harness.differential_cases.varlong_cases`)."""

from __future__ import annotations

import time

from tests.harness import Broker
from tests.harness.kafka_parity import v2_batch
from tests.harness.produce import produce, record_errors, stored
from tests.harness.proxy import run_proxy

INVALID_TIMESTAMP = 32
HOUR, DAY = 3_600_000, 86_400_000


def _refused_for(topic: str, batch: bytes, stamp: int, **proxy: object) -> None:
    with run_proxy(**proxy) as running:  # type: ignore[arg-type]
        answer = produce(running.host, running.port, 9, [(topic, 0, batch)])[topic, 0]
    assert answer.error_code == INVALID_TIMESTAMP, answer
    [(index, message)] = record_errors(answer)
    assert index == 0
    assert (message or "").startswith(f"Timestamp {stamp} of message with offset 0 is out of range")


def test_a_record_a_month_ahead_is_not_hidden_by_a_wide_delta(tansu: Broker, topic: str) -> None:
    """Raw delta 2**64 + 1: 70 bits read it as 2**63 + 1 ms before the first timestamp (no
    lower bound by default, so it passed); Kafka reads -1, a record 30 days ahead, past the
    default hour."""
    ahead = int(time.time() * 1000) + 30 * DAY
    batch = v2_batch(
        [(0, ahead + 1 - 2**63 - 1, b"k", b"v")], base_timestamp=ahead + 1, max_timestamp=ahead
    )
    assert len(batch) - 61 == 1 + 1 + 10 + 1 + 4 + 1  # length, attributes, the delta, ...
    _refused_for(topic, batch, ahead, bootstrap=tansu.bootstrap)
    assert stored(tansu, topic) == []


def test_a_record_from_long_ago_is_not_hidden_by_a_wide_delta(tansu: Broker, topic: str) -> None:
    """Raw delta 2**64 under a week's lower bound: 70 bits read it as now + 10 minutes, which
    passed; Kafka reads 0, a timestamp 2**63 ms before now, which Kafka 4.4 stores when nothing
    checks it."""
    ago = int(time.time() * 1000) + 10 * 60_000 - 2**63
    batch = v2_batch([(0, ago + 2**63, b"k", b"v")], base_timestamp=ago, max_timestamp=ago)
    defaults = {"policies": [{"timestamps": {"before_max_ms": 7 * DAY, "after_max_ms": HOUR}}]}
    _refused_for(topic, batch, ago, bootstrap=tansu.bootstrap, defaults=defaults)
    assert stored(tansu, topic) == []
