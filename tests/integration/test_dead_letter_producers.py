"""Dead-letter copies of batches refused from idempotent and transactional producers.

Real clients (confluent-kafka idempotent and transactional, kafka-python idempotent) produce
through kvproxy to Tansu and to Apache Kafka, a `json` policy refuses some of their batches, and
the dead-letter topic is read back straight from the broker: every refused batch's records are
there exactly once, with their keys, values, headers and timestamps, in batches written as a plain
producer's (producer id, epoch and sequence -1, not transactional), which no broker fences, drops
as a duplicate or hides as aborted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.messages import decode_response
from kvproxy.protocol.records import RecordBatch
from tests.harness.metrics import scrape, value
from tests.harness.produce import stored_batches
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.upstream import Upstream

BASE_TIME = 1_700_000_000_000
Row = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]

pytestmark = pytest.mark.upstreams("tansu", "kafka")


def original_rows(batches: list[RecordBatch]) -> list[Row]:
    """Key, value, the record's own headers (the kvproxy.* ones left out) and timestamp."""
    return [
        (
            r.key,
            r.value,
            tuple((k, v) for k, v in r.headers if not k.startswith("kvproxy.")),
            r.timestamp,
        )
        for b in batches
        for r in b.records()
    ]


def dead_letters_written(proxy: RunningProxy) -> float:
    return value(scrape(proxy), "kvproxy_dead_letters_total", result="written")


def wait_for_dead_letters(proxy: RunningProxy, count: int) -> None:
    deadline = time.monotonic() + 15
    while dead_letters_written(proxy) < count:
        failed = value(scrape(proxy), "kvproxy_dead_letters_total", result="failed")
        assert failed == 0, f"{failed} dead letters not written"
        assert time.monotonic() < deadline, "timed out waiting for the dead letters"
        time.sleep(0.05)
    assert dead_letters_written(proxy) == count, "one dead letter per refused batch"


def rounds_of(prefix: str) -> list[list[Row]]:
    """Three rounds of records: the middle one holds a value that is not JSON."""
    rounds: list[list[Row]] = []
    for r in range(3):
        rows: list[Row] = []
        for i in range(3):
            n = r * 3 + i
            text = b"{not json" if (r, i) == (1, 1) else b'{"n": %d}' % n
            rows.append((f"{prefix}-{n}".encode(), text, (("trace", b"t%d" % n),), BASE_TIME + n))
        rounds.append(rows)
    return rounds


def assert_dead_letters_are(
    upstream: Upstream, topic: str, refused: list[Row], kept: list[Row]
) -> None:
    batches = stored_batches(upstream, topic + ".dlq")
    assert original_rows(batches) == refused, "each refused record exactly once, as sent"
    assert [
        (b.producer_id, b.producer_epoch, b.base_sequence, b.is_transactional) for b in batches
    ] == [(-1, -1, -1, False)] * len(batches), (
        "written as a plain producer's, outside any transaction"
    )
    stored = original_rows([b for b in stored_batches(upstream, topic) if not b.is_control])
    assert [row for row in stored if row in refused] == [], "refused records never stored"
    assert [row for row in stored if row in kept] == kept


def test_idempotent_confluent_kafka_batches_all_reach_the_dead_letter_topic(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    topic = make_topic(1)
    upstream.create_topic(1, name=topic + ".dlq")
    rounds = rounds_of("ck")
    failed: list[bytes | None] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failed.append(message.key())

    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": topic, "default_policies": "drop", "policies": ["json"]}],
        quarantine={"dir": str(tmp_path / "journal"), "dead_letter_suffix": ".dlq"},
    ) as proxy:
        producer = None
        for rows in rounds:
            # after a refusal librdkafka bumps its epoch (KIP-360): Kafka takes the next batches
            # from the same producer, Tansu answers them PRODUCER_FENCED (a producer per round)
            if producer is None or upstream.is_tansu:
                producer = Producer(
                    {
                        "bootstrap.servers": proxy.bootstrap,
                        "enable.idempotence": True,
                        "linger.ms": 100,
                        "message.timeout.ms": 10000,
                    }
                )
            for key, text, headers, timestamp in rows:
                producer.produce(
                    topic,
                    value=text,
                    key=key,
                    headers=list(headers),
                    timestamp=timestamp,
                    partition=0,
                    on_delivery=delivered,
                )
            assert producer.flush(15) == 0
        wait_for_dead_letters(proxy, 1)
    assert failed == [key for key, *_ in rounds[1]]
    assert_dead_letters_are(upstream, topic, rounds[1], rounds[0] + rounds[2])


def test_idempotent_kafka_python_batches_all_reach_the_dead_letter_topic(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    from kafka import KafkaProducer

    topic = make_topic(1)
    upstream.create_topic(1, name=topic + ".dlq")
    rounds = rounds_of("kp")
    failed: list[bytes | None] = []
    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": topic, "default_policies": "drop", "policies": ["json"]}],
        quarantine={"dir": str(tmp_path / "journal"), "dead_letter_suffix": ".dlq"},
    ) as proxy:
        for rows in rounds:
            producer = KafkaProducer(
                bootstrap_servers=proxy.bootstrap, enable_idempotence=True, linger_ms=100
            )
            try:
                futures = [
                    producer.send(
                        topic,
                        value=text,
                        key=key,
                        headers=list(headers),
                        timestamp_ms=timestamp,
                        partition=0,
                    )
                    for key, text, headers, timestamp in rows
                ]
                producer.flush(15)
                failed += [row[0] for row, f in zip(rows, futures, strict=True) if f.failed()]
            finally:
                producer.close(5)
        wait_for_dead_letters(proxy, 1)
    assert failed == [key for key, *_ in rounds[1]]
    assert_dead_letters_are(upstream, topic, rounds[1], rounds[0] + rounds[2])


def test_transactional_batches_reach_the_dead_letter_topic_outside_the_transaction(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The refused batch's transaction is aborted; its dead-letter copy is written outside any
    transaction, so it is neither aborted with it nor waiting for a commit."""
    from confluent_kafka import KafkaException, Producer

    topic = make_topic(1)
    upstream.create_topic(1, name=topic + ".dlq")
    rounds = rounds_of("tx")
    outcomes: list[str] = []
    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": topic, "default_policies": "drop", "policies": ["json"]}],
        quarantine={"dir": str(tmp_path / "journal"), "dead_letter_suffix": ".dlq"},
    ) as proxy:
        for number, rows in enumerate(rounds):
            producer = Producer(
                {
                    "bootstrap.servers": proxy.bootstrap,
                    "transactional.id": f"{topic}-{number}",
                    "linger.ms": 100,
                    "message.timeout.ms": 10000,
                }
            )
            producer.init_transactions(15)
            producer.begin_transaction()
            for key, text, headers, timestamp in rows:
                producer.produce(
                    topic,
                    value=text,
                    key=key,
                    headers=list(headers),
                    timestamp=timestamp,
                    partition=0,
                )
            try:
                producer.commit_transaction(15)
                outcomes.append("committed")
            except KafkaException:
                producer.abort_transaction(15)
                outcomes.append("aborted")
        wait_for_dead_letters(proxy, 1)
    assert outcomes == ["committed", "aborted", "committed"]
    assert_dead_letters_are(upstream, topic, rounds[1], rounds[0] + rounds[2])


def padded(n: int) -> bytes:
    """A JSON value that compresses well (librdkafka sends a batch that does not uncompressed)."""
    return b'{"n": %d, "pad": "%s"}' % (n, b"x" * 1000)


class ZstdFailingOnce:
    """cramjam.zstd whose first decompression fails to allocate, as cramjam reports it."""

    def __init__(self) -> None:
        import cramjam

        self.real = cramjam.zstd
        self.failures = 0

    def decompress_into(self, data: Any, out: Any) -> int:
        import cramjam

        if self.failures == 0:
            self.failures += 1
            raise cramjam.DecompressionError("Allocation error : not enough memory")
        return int(self.real.decompress_into(data, out))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_batch_the_proxy_had_no_memory_to_decompress_is_retried_and_stored_once(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path, monkeypatch: Any
) -> None:
    """Answered NOT_ENOUGH_REPLICAS (retriable), not CORRUPT_MESSAGE: the client sends the
    batch again and it is stored once; nothing is journaled or dead-lettered for it."""
    import cramjam
    from confluent_kafka import Producer

    from kvproxy.journal import JournalReader
    from kvproxy.protocol.messages import PRODUCE

    topic = make_topic(1)
    upstream.create_topic(1, name=topic + ".dlq")
    failing = ZstdFailingOnce()
    monkeypatch.setattr(cramjam, "zstd", failing)
    failed: list[Any] = []
    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": topic, "default_policies": "drop", "policies": ["json"]}],
        quarantine={"dir": str(tmp_path / "journal"), "dead_letter_suffix": ".dlq"},
    ) as proxy:
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "enable.idempotence": True,
                "compression.type": "zstd",
                "linger.ms": 50,
                "retry.backoff.ms": 50,
                "message.timeout.ms": 10000,
            }
        )
        for n in range(3):
            producer.produce(
                topic,
                value=padded(n),
                key=b"k%d" % n,
                partition=0,
                on_delivery=lambda error, message: failed.append(error) if error else None,
            )
        assert producer.flush(15) == 0
        assert proxy.server.journal is not None and proxy.server.journal.flush(10)
        samples = scrape(proxy)
        answers = [
            [
                (int(p.error_code), p.error_message)
                for t in body.responses
                for p in t.partition_responses
            ]
            for body in (
                decode_response(frame, PRODUCE, version).body
                for api_key, version, frame in list(proxy.responses)
                if api_key == PRODUCE
            )
        ]
    assert failing.failures == 1 and failed == []
    assert answers[0][0][0] == 19, answers  # NOT_ENOUGH_REPLICAS
    assert "ran out of memory" in (answers[0][0][1] or ""), answers
    assert [code for ((code, _),) in answers[1:]] == [0] * (len(answers) - 1), answers
    rows = original_rows(stored_batches(upstream, topic))
    assert [(key, text) for key, text, _, _ in rows] == [
        (b"k%d" % n, padded(n)) for n in range(3)
    ], "each record stored once"
    assert stored_batches(upstream, topic + ".dlq") == []
    assert list(JournalReader(tmp_path / "journal").entries()) == []
    assert value(samples, "kvproxy_dead_letters_total", result="written") == 0
    assert value(samples, "kvproxy_dead_letters_total", result="failed") == 0
