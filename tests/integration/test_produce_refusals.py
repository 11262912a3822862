"""Requests the proxy refuses as a whole or partition by partition before anything reaches the
broker, sent as raw bytes through a proxy in front of Tansu and of Apache Kafka: each is answered
the way a Kafka broker answers it, logged, counted and journaled like every other refusal, and the
connection stays open for the next request.

Tansu drops the connection on magic 0/1 message sets and stores transactional batches without a
transactional id, and Kafka 4 refuses Produce v0-v2 altogether, so every partition here is refused
by the proxy and nothing is forwarded.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvproxy.journal import JournalReader
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.messages import PRODUCE, decode_response
from kvproxy.protocol.records import build_batch
from tests.harness.metrics import scrape, value
from tests.harness.processes import wait_until
from tests.harness.produce import (
    CLIENT_ID,
    CORRUPT_MESSAGE,
    batch,
    partitions_of,
    produce_frame,
    stored,
)
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.proxy_checks import assert_serves
from tests.harness.quarantine import dead_letter_counts, journal_settings
from tests.harness.raw_client import RawKafkaClient
from tests.harness.upstream import Upstream

TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
TRANSACTIONAL_BIT = 0x10

pytestmark = pytest.mark.upstreams("tansu", "kafka")


def garbage_wrapper(magic: int, codec: Codec) -> bytes:
    """A compressed magic 0/1 wrapper message whose payload is not `codec` data at all, with a
    valid outer CRC: its header reads well, its inner messages cannot be had."""
    payload = b"these bytes are not compressed by any codec" * 3
    body = struct.pack(">bb", magic, int(codec))
    if magic == 1:
        body += struct.pack(">q", 1_700_000_000_000)
    body += struct.pack(">i", -1) + struct.pack(">i", len(payload)) + payload
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


def bad_crc_message(magic: int) -> bytes:
    message = bytearray(build_batch([(b"k", b"value", None, None)], magic=magic))
    message[-1] ^= 0x01  # the value's last byte: still a message, its CRC32 no longer matches
    return bytes(message)


def rejection_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kvproxy.rejections"]


# ---- a legacy wrapper that does not decompress ----


@pytest.mark.parametrize(("version", "magic"), [(0, 0), (1, 0), (2, 1)])
def test_a_legacy_wrapper_that_does_not_decompress_is_corrupt_message_and_the_connection_stays(
    upstream: Upstream,
    make_topic: Callable[..., str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    *,
    version: int,
    magic: int,
) -> None:
    """docs/policies.md: records that do not decode are answered CORRUPT_MESSAGE (2), which is
    also the legacy code of Produce v0-v2. A gzip and a snappy wrapper whose payloads are garbage
    and a message with a bad CRC, in one request: three answers, three journal entries, three
    log lines, three dead letters (the undecodable ones as sent), and the connection serves
    the next request; the first batch sent again is answered again and kept once."""
    caplog.set_level(logging.WARNING, logger="kvproxy.rejections")
    topic = make_topic(3)
    upstream.create_topic(3, name=topic + ".dlq")
    journal_dir = tmp_path / "journal"
    parts = [
        (topic, 0, garbage_wrapper(magic, Codec.GZIP)),
        (topic, 1, garbage_wrapper(magic, Codec.SNAPPY)),
        (topic, 2, bad_crc_message(magic)),
    ]
    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": topic, "compacted": False}],
        quarantine=journal_settings(journal_dir, dead_letter_suffix=".dlq"),
    ) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            raw = client.request(produce_frame(version, 41, parts), timeout=15)
            assert struct.unpack_from(">i", raw)[0] == 41
            answers = partitions_of(decode_response(raw, PRODUCE, version).body)
            assert {tp: int(a.error_code) for tp, a in answers.items()} == {
                (topic, 0): CORRUPT_MESSAGE,
                (topic, 1): CORRUPT_MESSAGE,
                (topic, 2): CORRUPT_MESSAGE,
            }
            # the same connection answers the next request
            raw = client.request(produce_frame(version, 42, parts[:1]), timeout=15)
            assert struct.unpack_from(">i", raw)[0] == 42
            again = partitions_of(decode_response(raw, PRODUCE, version).body)
            assert int(again[(topic, 0)].error_code) == CORRUPT_MESSAGE
            assert not client.is_closed_by_peer(timeout=0.5)
        assert_serves(proxy)
        wait_until(lambda: dead_letter_counts(proxy) == (3, 0), "the dead letters to be written")
        assert proxy.server.journal is not None and proxy.server.journal.flush(10)
        assert value(scrape(proxy), "kvproxy_connections_closed_total", reason="malformed") == 0
    entries = list(JournalReader(journal_dir).entries())
    assert [(e.partition, e.code, e.produce_version, e.records) for e in entries] == [
        (0, CORRUPT_MESSAGE, version, parts[0][2]),
        (1, CORRUPT_MESSAGE, version, parts[1][2]),
        (2, CORRUPT_MESSAGE, version, parts[2][2]),
    ]  # the batch sent again is a retry: answered again, kept once (quarantine.repeat_window_ms)
    logged = [(r.partition, r.code) for r in rejection_lines(caplog)]  # type: ignore[attr-defined]
    assert logged == [(0, 2), (1, 2), (2, 2)]
    assert [stored(upstream, topic, p) for p in range(3)] == [[], [], []]
    assert stored(upstream, topic + ".dlq", 0) == [parts[0][2]]  # as sent, marked unreadable, once


# ---- a transactional batch in a request without a transactional id ----


def transactional_batch(value: bytes) -> bytes:
    return batch(value, producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True)


def produce_answers(
    proxy: RunningProxy, frame: bytes, version: int, correlation_id: int
) -> tuple[dict[tuple[str, int], Any], RawKafkaClient]:
    client = RawKafkaClient(proxy.host, proxy.port)
    raw = client.request(frame, timeout=15)
    assert struct.unpack_from(">i", raw)[0] == correlation_id
    return partitions_of(decode_response(raw, PRODUCE, version).body), client


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_a_transactional_batch_without_a_transactional_id_is_refused_for_every_partition(
    upstream: Upstream,
    make_topic: Callable[..., str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    version: int,
) -> None:
    """KafkaApis.handleProduceRequest: when the first batch of any partition is transactional
    and the request has no transactional id, every partition is answered
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), without an error message (the exception's text
    is the code's own), before any other check: the plain partition, the one with a bad CRC and
    the one in warn mode alike. Nothing is forwarded; the connection stays open."""
    caplog.set_level(logging.WARNING, logger="kvproxy.rejections")
    topic, relaxed = make_topic(2), make_topic(1)
    journal_dir = tmp_path / "journal"
    corrupt = bytearray(batch(b"corrupt"))
    corrupt[-2] ^= 0x01
    parts = [
        (topic, 0, batch(b"plain")),
        (topic, 1, transactional_batch(b"in a transaction")),
        (relaxed, 0, bytes(corrupt)),
    ]
    frame = produce_frame(version, 51, parts, transactional_id=None)
    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": relaxed, "mode": "warn"}, {"match": topic, "compacted": False}],
        quarantine=journal_settings(journal_dir),
    ) as proxy:
        answers, client = produce_answers(proxy, frame, version, 51)
        with client:
            assert set(answers) == {(topic, 0), (topic, 1), (relaxed, 0)}
            for answer in answers.values():
                assert int(answer.error_code) == TRANSACTIONAL_ID_AUTHORIZATION_FAILED, answer
                assert int(answer.base_offset) == -1
                if version >= 8:
                    assert answer.error_message is None, answer
                    assert list(answer.record_errors) == []
            # the next request on the same connection is forwarded
            raw = client.request(produce_frame(version, 52, parts[:1]), timeout=15)
            after = partitions_of(decode_response(raw, PRODUCE, version).body)
            assert int(after[(topic, 0)].error_code) == 0
        assert proxy.server.sink.rejections == {
            (topic, "transactional_id", TRANSACTIONAL_ID_AUTHORIZATION_FAILED): 2,
            (relaxed, "transactional_id", TRANSACTIONAL_ID_AUTHORIZATION_FAILED): 1,
        }
        samples = scrape(proxy)
        assert value(samples, "kvproxy_requests_total", api="produce", outcome="rejected") == 1
        assert proxy.server.journal is not None and proxy.server.journal.flush(10)
    entries = list(JournalReader(journal_dir).entries())
    assert [(e.topic, e.partition, e.policy, e.code, e.kind) for e in entries] == [
        (topic, 0, "transactional_id", 53, "rejected"),
        (topic, 1, "transactional_id", 53, "rejected"),
        (relaxed, 0, "transactional_id", 53, "rejected"),
    ]
    assert [e.records for e in entries] == [p[2] for p in parts]
    assert all(e.client_id == CLIENT_ID for e in entries)
    logged = [(r.topic, r.partition, r.code) for r in rejection_lines(caplog)]  # type: ignore[attr-defined]
    assert logged == [(topic, 0, 53), (topic, 1, 53), (relaxed, 0, 53)]
    assert stored(upstream, topic, 0) == [b"plain"]  # the second request's only
    assert stored(upstream, topic, 1) == [] and stored(upstream, relaxed, 0) == []


def test_a_transactional_batch_with_acks_0_and_no_transactional_id_closes_the_connection(
    upstream: Upstream, topic: str
) -> None:
    """ProduceRequest.getErrorResponse gives no answer for acks=0: the broker closes the
    connection instead, and nothing is appended."""
    frame = produce_frame(9, 61, [(topic, 0, transactional_batch(b"t"))], acks=0)
    with run_proxy(upstream.bootstrap, topics=[{"match": topic, "compacted": False}]) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(frame)
            assert client.is_closed_by_peer(timeout=5)
        assert proxy.server.sink.rejections == {
            (topic, "transactional_id", TRANSACTIONAL_ID_AUTHORIZATION_FAILED): 1
        }
    assert stored(upstream, topic) == []
