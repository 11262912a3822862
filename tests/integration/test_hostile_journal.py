"""The quarantine journal under a flood, and a refused batch its client keeps sending.

A client retrying a refusal whose code is retriable (CORRUPT_MESSAGE for a bad CRC) sends the
same bytes again and again: the dead-letter topic, read back by a consumer, holds the batch once,
the journal holds one entry (and a "repeated" mark with the attempts), the log one line, and
/metrics counts the repeats. A flood of bad-CRC requests keeps the journal's queue within
`quarantine.queue_bytes`: what is not kept is counted on /metrics.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kvproxy.journal.segments as journal_segments
from kvproxy.journal import JournalReader
from kvproxy.journal.reader import list_segments
from kvproxy.protocol.journal import iter_entries
from tests.harness import Broker, create_topic
from tests.harness.flipping_relay import FLIPPED, MARK, PROXY_HOST, RELAY_HOST, FlippingRelay
from tests.harness.metrics import scrape, value
from tests.harness.processes import wait_until
from tests.harness.produce import Part, batch, produce
from tests.harness.proxy import run_proxy
from tests.harness.quarantine import consume, dead_letter_counts, journal_settings
from tests.harness.upstream import Upstream

CORRUPT_MESSAGE = 2
ATTEMPTS = 5


def bad_crc(data: bytes) -> bytes:
    """`data` with its last byte flipped: inside the bytes the batch CRC covers."""
    return data[:-1] + bytes([data[-1] ^ 0x01])


def stored_metadata(directory: Path) -> list[dict[str, Any]]:
    """The metadata of every entry in the journal's segments, in write order."""
    found: list[dict[str, Any]] = []
    for _, path in list_segments(directory):
        for _, _, metadata, _ in iter_entries(path.read_bytes()):
            found.append(dict(metadata))
    return found


@pytest.mark.parametrize(("version", "magic"), [(3, 2), (2, 1)], ids=["v3-magic2", "v2-legacy"])
def test_a_refused_batch_sent_again_is_kept_once(
    *,
    version: int,
    magic: int,
    tansu: Broker,
    make_topic: Callable[..., str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = make_topic(1)
    create_topic(tansu.bootstrap, topic + ".dlq", 1)
    refused = bad_crc(batch(b"one", b"two", magic=magic))
    other = bad_crc(batch(b"three", magic=magic))
    journal_dir = tmp_path / "journal"
    caplog.set_level(logging.WARNING, logger="kvproxy")
    with run_proxy(
        tansu.bootstrap, quarantine=journal_settings(journal_dir, dead_letter_suffix=".dlq")
    ) as proxy:
        for _ in range(ATTEMPTS):  # a client retrying CORRUPT_MESSAGE: the same bytes each time
            answers = produce(proxy.host, proxy.port, version, [(topic, 0, refused)])
            assert answers[(topic, 0)].error_code == CORRUPT_MESSAGE
        answers = produce(proxy.host, proxy.port, version, [(topic, 0, other)])
        assert answers[(topic, 0)].error_code == CORRUPT_MESSAGE
        wait_until(lambda: sum(dead_letter_counts(proxy)) >= 2, "the dead letters to be sent")
        assert dead_letter_counts(proxy) == (2, 0), "one dead letter per distinct batch"
        samples = scrape(proxy)
        assert value(samples, "kvproxy_quarantine_repeated_batches_total") == ATTEMPTS - 1

    dead = consume(tansu.bootstrap, topic + ".dlq", 0, 2 if magic == 2 else 3)
    # magic 2 with a bad CRC travels as one unreadable record; a legacy message set is read
    expected = [refused, other] if magic == 2 else [b"one", b"twn", b"thred"]
    assert sorted(m.value() for m in dead) == sorted(expected), "each refused batch once"

    rejected = JournalReader(journal_dir).entries()
    kept = [e.records for e in rejected]
    assert kept == [refused, other], "one journal entry per distinct batch"
    first_id = next(iter(JournalReader(journal_dir).entries())).id
    marks = [m for m in stored_metadata(journal_dir) if m["kind"] == "repeated"]
    assert [(m["repeat_of"], m["attempts"]) for m in marks] == [(first_id, ATTEMPTS)]

    lines = [r for r in caplog.records if getattr(r, "event", None) == "rejection"]
    assert len(lines) == 2, [r.getMessage() for r in lines]


def test_a_bad_crc_flood_keeps_the_journal_queue_within_its_bytes(
    tansu: Broker,
    make_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The writer is held (a gate) while 20 requests of 16 x 256 KiB bad-CRC partitions arrive:
    the queue never holds more than `queue_bytes`; the rest is counted, and said once."""
    gate = threading.Event()
    real = journal_segments._write_all
    high_water = [0]

    def held(fd: int, data: bytes) -> None:
        gate.wait(60)
        real(fd, data)

    monkeypatch.setattr(journal_segments, "_write_all", held)
    topic = make_topic(16)
    queue_bytes = 64 * 1024 * 1024  # quarantine.queue_bytes' default
    caplog.set_level(logging.ERROR, logger="kvproxy")
    partition_bytes = 256 * 1024
    requests = 20  # 80 MiB of refused partitions
    with run_proxy(
        tansu.bootstrap,
        quarantine=journal_settings(tmp_path / "journal"),
    ) as proxy:
        journal = proxy.server.journal
        assert journal is not None
        for n in range(requests):
            parts: list[Part] = [
                (topic, p, bad_crc(batch(bytes([n, p]) * (partition_bytes // 2))))
                for p in range(16)
            ]
            answers = produce(proxy.host, proxy.port, 9, parts)
            assert {a.error_code for a in answers.values()} == {CORRUPT_MESSAGE}
            samples = scrape(proxy)
            queued = value(samples, "kvproxy_quarantine_queued_bytes")
            high_water[0] = max(high_water[0], int(queued))
            assert queued <= queue_bytes
        samples = scrape(proxy)
        dropped = value(samples, "kvproxy_quarantine_dropped_total", reason="queue_full")
        dropped_bytes = value(
            samples, "kvproxy_quarantine_dropped_bytes_total", reason="queue_full"
        )
        offered = requests * 16
        kept_at_most = queue_bytes // partition_bytes
        assert dropped >= offered - kept_at_most - 1
        assert dropped_bytes >= dropped * partition_bytes
        gate.set()
    lines = [r.getMessage() for r in caplog.records if "cannot keep up" in r.getMessage()]
    assert len(lines) == 1, lines  # once per interval (10 s by default), with the counts
    assert lines[0].startswith("quarantine journal ") and "1 entries" in lines[0]


def test_dead_letters_pending_stay_within_their_bytes(
    tansu: Broker,
    make_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Dead letters held (their send waits on a gate) while 80 MiB of refused partitions arrive:
    at most `dead_letter_pending_bytes` (64 MiB) of them wait; the rest are counted dropped,
    and said once."""
    import asyncio

    import kvproxy.proxy.refusals.dead_letter_sender as sender_module

    gate = threading.Event()
    sent: list[str] = []

    async def held(*args: Any, topic: str, **kwargs: Any) -> None:
        while not gate.is_set():  # the test opens the gate before the proxy stops
            await asyncio.sleep(0.01)
        sent.append(topic)

    monkeypatch.setattr(sender_module, "send_dead_letter", held)
    topic = make_topic(16)
    partition_bytes = 256 * 1024
    pending_bytes = 64 * 1024 * 1024  # quarantine.dead_letter_pending_bytes' default
    requests = 20
    caplog.set_level(logging.WARNING, logger="kvproxy")
    with run_proxy(tansu.bootstrap, quarantine={"dead_letter_suffix": ".dlq"}) as proxy:
        for n in range(requests):
            parts: list[Part] = [
                (topic, p, bad_crc(batch(bytes([n, p]) * (partition_bytes // 2))))
                for p in range(16)
            ]
            answers = produce(proxy.host, proxy.port, 9, parts)
            assert {a.error_code for a in answers.values()} == {CORRUPT_MESSAGE}
        samples = scrape(proxy)
        dropped = value(samples, "kvproxy_dead_letters_total", result="dropped")
        offered = requests * 16
        waiting_at_most = pending_bytes // partition_bytes
        assert dropped >= offered - waiting_at_most
        gate.set()
        wait_until(lambda: len(sent) == offered - dropped, "the dead letters held to be sent")
    lines = [r.getMessage() for r in caplog.records if "dead letters not sent" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("1 dead letters not sent since the last report")


def test_librdkafka_retrying_a_bad_crc_leaves_one_dead_letter_and_one_entry(
    upstream: Upstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """confluent-kafka (librdkafka) retries CORRUPT_MESSAGE until message.timeout.ms, sending the
    same batch each time (a relay flips one bit of it on the way, see tests/harness)."""
    from confluent_kafka import Producer

    topic = upstream.create_topic(1)
    upstream.create_topic(1, name=topic + ".dlq")
    journal_dir = tmp_path / "journal"
    caplog.set_level(logging.WARNING, logger="kvproxy")
    errors: list[Any] = []
    with run_proxy(
        upstream.bootstrap,
        listen={"advertised_host": RELAY_HOST},
        quarantine=journal_settings(journal_dir, dead_letter_suffix=".dlq"),
    ) as proxy:
        relays = [
            FlippingRelay((RELAY_HOST, port), (PROXY_HOST, port))
            for port in (proxy.port, proxy.broker_port(upstream.node_id))
        ]
        try:
            producer = Producer(
                {
                    "bootstrap.servers": f"{RELAY_HOST}:{proxy.port}",
                    "message.timeout.ms": 3000,
                    "retry.backoff.ms": 100,
                    "linger.ms": 0,
                }
            )
            producer.produce(
                topic, key=b"k", value=b"a " + MARK, on_delivery=lambda e, m: errors.append(e)
            )
            producer.flush(20)
        finally:
            for relay in relays:
                relay.close()
        samples = scrape(proxy)
        attempts = sum(
            count
            for (name, labels), count in samples.items()
            if name == "kvproxy_policy_rejections_total" and ("topic", topic) in labels
        )
        assert attempts >= 2, "librdkafka sent the refused batch again"
        repeats = value(samples, "kvproxy_quarantine_repeated_batches_total")
        wait_until(lambda: sum(dead_letter_counts(proxy)) >= 1, "the dead letter to be sent")
        assert dead_letter_counts(proxy) == (1, 0)
    assert len(errors) == 1 and errors[0] is not None  # timed out after its retries

    dead = consume(upstream.bootstrap, topic + ".dlq", 0, 1)
    assert len(dead) == 1, "the retried batch once in the dead-letter topic"
    assert FLIPPED in dead[0].value()
    entries = list(JournalReader(journal_dir).entries())
    assert len(entries) == 1
    marks = [m for m in stored_metadata(journal_dir) if m["kind"] == "repeated"]
    assert [(m["repeat_of"], m["attempts"]) for m in marks] == [(entries[0].id, attempts)]
    lines = [r for r in caplog.records if getattr(r, "event", None) == "rejection"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert repeats == attempts - 1
