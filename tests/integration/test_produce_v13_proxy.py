"""Produce v13 (topics by id) through kvproxy in front of Apache Kafka 4.4: the name's policies
run, the journal, the metrics and the rejection log say the topic's name, the valid partition's
records are stored, an id is learned from the Metadata answer the client got through the proxy
(nothing asked) or asked of the cluster once, and an id nobody has is answered
UNKNOWN_TOPIC_ID without the proxy asking again and again."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from kvproxy.journal import Journal, JournalReader
from kvproxy.protocol.messages import METADATA, PRODUCE, decode_response
from tests.harness.engine import batch
from tests.harness.fuzz import produce_request
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.metrics import scrape, value
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.quarantine import consume, journal_settings
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import metadata_request, topic_id_of

JSON_TOPIC = {"policies": ["json"]}


def _answer(client: RawKafkaClient, frame: bytes) -> dict[tuple[Any, int], Any]:
    body = decode_response(client.request(frame), PRODUCE, 13).body
    return {(t.topic_id, int(p.index)): p for t in body.responses for p in t.partition_responses}


def _proxy(kafka: KafkaCluster, topic: str, journal: Path) -> Any:
    return run_proxy(
        kafka.bootstrap_servers,
        topics=[{"match": topic, **JSON_TOPIC}],
        quarantine=journal_settings(journal),
    )


def _asked(proxy: RunningProxy) -> int:
    async def read() -> int:
        return proxy.server.decisions.topic_ids.asked

    return proxy.call(read())


@pytest.mark.parametrize("learned", ["from_metadata", "asked"])
def test_a_v13_refusal_names_the_topic_everywhere(
    kafka: KafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture, learned: str
) -> None:
    topic = kafka.create_topic(partitions=2)
    with RawKafkaClient(kafka.host, kafka.port) as direct:
        topic_id = topic_id_of(direct, topic)
    caplog.set_level(logging.INFO, logger="kvproxy")
    with (
        _proxy(kafka, topic, tmp_path / "journal") as proxy,
        RawKafkaClient(proxy.host, proxy.port) as client,
    ):
        if learned == "from_metadata":  # as a client does before it sends v13
            body = decode_response(
                client.request(metadata_request(12, 3, [topic])), METADATA, 12
            ).body
            assert body.topics[0].topic_id == topic_id
        frame = produce_request(
            13, 4, [(topic_id, 0, batch(b'{"ok": true}')), (topic_id, 1, batch(b"not json"))]
        )
        answers = _answer(client, frame)
        assert int(answers[(topic_id, 0)].error_code) == 0
        refused = answers[(topic_id, 1)]
        assert int(refused.error_code) == 87  # INVALID_RECORD
        assert "Record value is not valid JSON" in (refused.error_message or "")
        assert f"in topic partition {topic}-1" in (refused.error_message or "")
        assert _asked(proxy) == (0 if learned == "from_metadata" else 1)
        samples = scrape(proxy)
    assert (
        value(samples, "kvproxy_policy_rejections_total", topic=topic, policy="json", code="87")
        == 1
    )
    assert [m.value() for m in consume(kafka.bootstrap, topic, 0, 1)] == [b'{"ok": true}']
    journal = Journal(tmp_path / "journal")
    journal.open()
    try:
        entries = list(JournalReader(journal.directory).entries(kinds=None))
    finally:
        journal.close()
    assert [(e.topic, e.partition, e.produce_version) for e in entries] == [(topic, 1, 13)]
    logged = [r.getMessage() for r in caplog.records if "policy json" in r.getMessage()]
    assert logged and all(f"rejected {topic}-1" in line for line in logged), logged
    assert not any(str(topic_id) in line for line in logged)


def test_an_unknown_topic_id_is_asked_once_and_answered_unknown_topic_id(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    nobody = uuid.uuid4()
    with (
        _proxy(kafka, "none", tmp_path / "journal") as proxy,
        RawKafkaClient(proxy.host, proxy.port) as client,
    ):
        for correlation in (1, 2, 3):
            answers = _answer(client, produce_request(13, correlation, [(nobody, 0, batch(b"x"))]))
            (answer,) = answers.values()
            assert (int(answer.error_code), answer.error_message) == (100, None)
        assert _asked(proxy) == 1  # remembered as absent (topic_configs.absent_ttl_ms)
        samples = scrape(proxy)
    assert value(samples, "kvproxy_requests_total", api="produce", outcome="rejected") == 3
